"""Convolution's CPU-only paths: Winograd, shifted GEMMs, per-sample columns.

Each is a `conv_paths.ConvPath` (forward, and one bottom's part of the layer's backward
skeleton) over a kernels module that does the work:

- `winograd-f2` / `winograd-f4` (kernels.winograd): top = A^T [(G g G^T) (x) (B^T d B)] A
  per output tile (+ bias), 16 or 36 GEMMs; keeps the transformed input V of each bottom
  for the weight gradient (4x the input for F(2x2), im2col's columns would be 9x).
- `shift` (kernels.shift_conv): per kernel offset one GEMM on a shifted view of the padded,
  channel-major input, split into fixed column blocks over the runner's threads; keeps the
  stacked input (kw copies of the padded input) unless told not to.
- `sample-columns` (kernels.sample_columns): each sample's columns built by a compiled loop,
  multiplied and dropped while in the cache, rebuilt in backward; keeps no column matrix.
"""

from __future__ import annotations

from ..kernels import sample_columns, shift_conv, winograd
from .choice.convolution import shift_geometry
from .conv_paths import ConvPath

#: Scratch slots of the Winograd temporaries (by kernels.winograd's names).
WINOGRAD_SLOTS = {"product": 0, "padded": 1, "columns": 4, "tiles": 5}


class WinogradPath(ConvPath):
    """3x3, stride 1, dilation 1 as Winograd F(2x2, 3x3) or F(4x4, 3x3) (the choice's
    `tile`)."""

    @property
    def kept(self):
        return ("winograd_input",)

    def setup(self, bottoms):
        layer = self.layer
        self.geometry = winograd.Geometry(layer.image_in, layer.pad, layer.num_output,
                                          layer.group, self.choice.option("tile"))
        # V of each bottom, kept for backward's weight gradient (then it takes dV).
        self.inputs = [layer.buffer(f"winograd_input{i}", (self.geometry.input_elements(),))
                       for i in range(bottoms)]
        self.hold_input = [False] * bottoms

    def buffer(self, name, shape):
        """kernels.winograd's temporaries, in the layer's scratch slots."""
        return self.layer.scratch(WINOGRAD_SLOTS[name], shape)

    def forward(self, bottom, top):
        layer, g = self.layer, self.geometry
        runner = layer.ctx.chunk_runner
        u = winograd.transform_weight(layer.blobs[0].data, layer.scratch(3, g.weight_shape()))
        bias = layer.blobs[1].data if layer.bias_term else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            winograd.forward(b.data.reshape(layer.image_in), u, g, self.inputs[i],
                             self.buffer, t.data.reshape((layer.num, layer.num_output)
                                                         + layer.out_hw), bias, runner)
            self.hold_input[i] = True

    def start_backward(self):
        self.u = None  # the transformed weight, made once for every bottom that wants a diff

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        """Weight gradient from the V forward kept (rebuilt after a backward took it for
        dV), input gradient through U^T; the adjoint transforms (kernels.winograd)."""
        layer, g = self.layer, self.geometry
        runner = layer.ctx.chunk_runner
        weight = layer.blobs[0]
        dm = winograd.output_grad(top_diff.reshape((layer.num, layer.num_output)
                                                   + layer.out_hw), g, self.buffer, runner)
        v = self.inputs[i]
        if want_weight:
            if not self.hold_input[i]:
                winograd.fill_input(b.data.reshape(layer.image_in), g, v, self.buffer, runner)
                self.hold_input[i] = True
            du = winograd.transformed_weight_grad(dm, v, g, layer.scratch(2, g.weight_shape()),
                                                  runner)
            diff, overwrite = weight.diff_for_write()
            winograd.weight_grad(du, diff.reshape(weight.shape), overwrite)
        if down:
            if self.u is None:
                self.u = winograd.transform_weight(weight.data,
                                                   layer.scratch(3, g.weight_shape()))
            self.hold_input[i] = False  # V's memory takes the tile gradients
            winograd.input_grad(dm, self.u, g, v, self.buffer,
                                b.diff.reshape(layer.image_in), runner)


class ShiftPath(ConvPath):
    """Stride 1 as shifted GEMMs on the padded input (kernels.shift_conv)."""

    @property
    def kept(self):
        return ("shift_input",) if self.choice.option("keep_input") else ()

    def setup(self, bottoms):
        layer = self.layer
        self.geometry = g = shift_geometry(layer.conv_geometry(), self.choice.option("stack"))
        self.inputs = [layer.buffer(f"shift_input{i}", (g.rows, g.row))
                       if self.choice.option("keep_input") else None
                       for i in range(bottoms)]

    def packed_weight(self):
        """The weight regrouped by kernel offset (shift_conv.pack_weight), in scratch 3."""
        layer, g = self.layer, self.geometry
        packed = layer.scratch(3, (g.kh, g.kw // g.stack, layer.num_output,
                                   layer.channels // layer.group * g.stack))
        shift_conv.pack_weight(layer.blobs[0].data, g, packed)
        return packed

    def stacked_input(self, b, kept):
        """Bottom b's stacked, shifted copies (shift_conv.fill_stacked_input), into `kept`
        or (not keeping them) into scratch 4."""
        layer, g = self.layer, self.geometry
        xs = kept if kept is not None else layer.scratch(4, (g.rows, g.row))
        shift_conv.fill_stacked_input(b.data.reshape(layer.image_in), xs, g,
                                      layer.ctx.chunk_runner)
        return xs

    def forward(self, bottom, top):
        """top = crop(sum over kernel offsets of W[i, j] @ shifted input) (+ bias)."""
        layer, g = self.layer, self.geometry
        runner = layer.ctx.chunk_runner
        packed = self.packed_weight()
        y_full = layer.scratch(0, (layer.num_output, g.length))
        bias = layer.blobs[1].data if layer.bias_term else None
        for b, t, kept in zip(bottom, top, self.inputs):
            xs = self.stacked_input(b, kept)
            shift_conv.forward_full(packed, xs, y_full, g, runner)
            out = t.data.reshape((layer.num, layer.num_output) + layer.out_hw)
            shift_conv.crop_output(y_full, g, out, bias, runner)

    def start_backward(self):
        self.packed = None  # the packed weight, made once for every bottom that wants a diff

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        """Weight and input gradients from the input forward kept (shift_conv)."""
        layer, g = self.layer, self.geometry
        runner = layer.ctx.chunk_runner
        weight = layer.blobs[0]
        top_diff = top_diff.reshape((layer.num, layer.num_output) + layer.out_hw)
        dy_ext = layer.scratch(0, (layer.num_output, g.row))  # zeros, then the full dy
        shift_conv.spread_output_grad(top_diff, g, dy_ext, runner)
        if want_weight:
            # Rebuilt from the bottom (as Caffe rebuilds its columns) unless kept.
            kept = self.inputs[i]
            xs = kept if kept is not None else self.stacked_input(b, None)
            grad = layer.scratch(2, shift_conv.grad_shape(g, layer.num_output))
            shift_conv.weight_grad_full(dy_ext[:, g.row - g.length:], xs, g, grad, runner)
            diff, overwrite = weight.diff_for_write()
            shift_conv.unpack_weight_grad(grad, g, diff.reshape(weight.shape), overwrite)
        if down:
            self.packed = self.packed_weight() if self.packed is None else self.packed
            dxs = layer.scratch(1, (g.rows, g.length))
            shift_conv.input_grad_full(self.packed, dy_ext, dxs, g, runner)
            shift_conv.fold_input_grad(dxs, g, b.diff.reshape(layer.image_in), runner)


class SampleColumnsPath(ConvPath):
    """im2col + GEMM sample by sample in the cache (kernels.sample_columns)."""

    def setup(self, bottoms):
        layer = self.layer
        self.geometry = sample_columns.Geometry(layer.image_in, layer.num_output, layer.group,
                                                layer.kernel, layer.pad, layer.stride,
                                                layer.dilation, layer.out_hw)

    def forward(self, bottom, top):
        layer, g = self.layer, self.geometry
        chunks = sample_columns.chunk_count(layer.num)
        columns = layer.scratch(0, sample_columns.columns_shape(g, chunks))
        bias = layer.blobs[1].data if layer.bias_term else None
        for b, t in zip(bottom, top):
            top3 = t.data.reshape(layer.num, layer.num_output, g.positions)
            sample_columns.forward(b.data.reshape(layer.image_in),
                                   layer.weight3(layer.blobs[0].data), top3, g, columns, bias,
                                   layer.ctx.chunk_runner)

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        layer, g = self.layer, self.geometry
        weight = layer.blobs[0]
        chunks = sample_columns.chunk_count(layer.num)
        columns = layer.scratch(0, sample_columns.columns_shape(g, chunks))
        partials = diff = None
        overwrite = False
        if want_weight:
            partials = layer.scratch(2, (chunks, layer.group, g.rows // layer.group,
                                         layer.num_output // layer.group))
            diff, overwrite = weight.diff_for_write()
            diff = layer.weight3(diff)
        sample_columns.backward(b.data.reshape(layer.image_in), top_diff,
                                layer.weight3(weight.data), g, columns, partials, diff,
                                overwrite, b.diff.reshape(layer.image_in) if down else None,
                                layer.ctx.chunk_runner)


#: The CPU-only paths by name.
PATHS = {"winograd-f2": WinogradPath, "winograd-f4": WinogradPath, "shift": ShiftPath,
         "sample-columns": SampleColumnsPath}

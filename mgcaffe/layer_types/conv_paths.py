"""The GEMM paths of Convolution and Deconvolution: im2col layouts, direct 1x1, N-D.

One object per path (`ConvPath`), made by the layer in `reshape` for the path its choice
names: `setup` sizes the arrays it keeps from forward to backward (the layer's buffers, by
role), `forward` runs every bottom, and `backward_bottom` one bottom's weight and input
gradients inside the layer's one backward skeleton (convolution.py), which adds the bias
gradient first. The layer's helpers (GEMMs, copies, buffers) are shared by all paths.

im2col layouts (Convolution): "whole batch" is one GEMM per group over columns
(C*kh*kw, N*P), P the output positions per sample, then one transposing copy to (N, O, P)
(and one back in backward); "batch last" the same with the columns ordered (P, N), so that
im2col and col2im copy runs of W_out*N rather than W_out; "per sample" one GEMM per sample
and group, each writing its sample's output in place, with no transposing copies (a
pointwise kernel's columns are then the input itself). Each layer keeps the columns of its
last forward per bottom, so backward needs no second im2col. `gpu-im2col-cuda` is the whole
batch layout with im2col and col2im as CUDA kernels (the choice's `cuda_kernels` option,
which the layer's im2col/col2im helpers follow).
"""

from __future__ import annotations

from ..cpu.parallel import for_each_chunk
from ..kernels.im2col import batch_last_image_shape, col2im_batch_last, im2col_batch_last
from . import convolution_nd


class ConvPath:
    """One way to run a convolution layer (see the module docstring)."""

    def __init__(self, layer, choice):
        self.layer = layer
        self.choice = choice

    @property
    def kept(self) -> tuple[str, ...]:
        """Role prefixes of the layer buffers this path keeps (the others are dropped)."""
        return ()

    def setup(self, bottoms: int) -> None:
        """Size what this path keeps for `bottoms` bottoms (after the layer's reshape)."""

    def forward(self, bottom, top) -> None:
        raise NotImplementedError

    def start_backward(self) -> None:
        """Forget what one backward call shares between its bottoms."""

    def add_bias_diff(self, top_diff) -> None:
        """bias.diff += top_diff (N, O, P) summed over N and P."""
        self.layer.add_bias_diff(top_diff)

    def backward_bottom(self, i, top_diff, b, want_weight: bool, down: bool) -> None:
        """Bottom i's part of backward: add the weight gradient (`want_weight`), overwrite
        b.diff (`down`); top_diff is (N, O, P)."""
        raise NotImplementedError


class NdPath(ConvPath):
    """Convolution over other than 2 spatial axes (convolution_nd.py)."""

    def forward(self, bottom, top):
        for b, t in zip(bottom, top):
            convolution_nd.conv_forward(self.layer, b, t)

    def add_bias_diff(self, top_diff):
        convolution_nd.bias_diff(self.layer, top_diff)

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        convolution_nd.conv_backward(self.layer, top_diff, b, want_weight, down)


class DeconvNdPath(NdPath):
    """Deconvolution over other than 2 spatial axes."""

    def forward(self, bottom, top):
        for b, t in zip(bottom, top):
            convolution_nd.deconv_forward(self.layer, b, t)

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        convolution_nd.deconv_backward(self.layer, top_diff, b, want_weight, down)


class Im2colPath(ConvPath):
    """im2col + GEMM in one of three layouts (the module docstring), by the choice's name."""

    @property
    def kept(self):
        return ("columns",)

    def setup(self, bottoms):
        layer = self.layer
        layout = self.choice.path.removeprefix("gpu-")
        self.per_sample = layout == "im2col-per-sample"
        self.batch_last = layout == "im2col-batch-last"
        pointwise = (layer.kernel == (1, 1) and layer.stride == (1, 1)
                     and layer.pad == (0, 0))
        rows = layer.channels * layer.kernel[0] * layer.kernel[1]
        # One column matrix per bottom: backward's weight gradient reads the forward's, then
        # the same buffer takes the column gradient (memory: one column matrix, not two).
        self.cols = [None if self.per_sample and pointwise
                     else layer.buffer(f"columns{i}", (rows, layer.num * layer.spatial))
                     for i in range(bottoms)]
        self.hold_input = [False] * bottoms

    def fill_columns(self, i, b):
        """im2col of bottom i into its column matrix (unless it already holds it)."""
        layer, cols = self.layer, self.cols[i]
        if cols is not None and not self.hold_input[i]:
            image = b.data.reshape(layer.image_in)
            if self.batch_last:
                im2col_batch_last(image, *layer.geometry(), out=cols,
                                  image=self.batch_last_image(),
                                  runner=layer.ctx.chunk_runner)
            else:
                layer.im2col(image, cols)
            self.hold_input[i] = True
        return cols

    def batch_last_image(self):
        """The (C, H + 2*ph, W + 2*pw, N) scratch of the batch-last layout."""
        layer = self.layer
        return layer.scratch(1, batch_last_image_shape(layer.image_in, layer.pad))

    def by_sample(self, matrix):
        """A (rows, N*P) GEMM operand or result, in this layout's column order, as an
        (N, rows, P) view: columns (n, p) in the whole-batch layout, (p, n) batch last."""
        rows, n, p = matrix.shape[0], self.layer.num, self.layer.spatial
        if self.batch_last:
            return matrix.reshape(rows, p, n).transpose(2, 0, 1)
        return matrix.reshape(rows, n, p).transpose(1, 0, 2)

    def sample_columns(self, b, cols):
        """The columns as (N, group, rows/group, P): per-sample GEMM operands (views)."""
        layer = self.layer
        n, g, p = layer.num, layer.group, layer.spatial
        if cols is None:  # 1x1, stride 1, pad 0: the input is its own column matrix
            return b.data.reshape(n, g, layer.channels // g, p)
        return cols.reshape(g, cols.shape[0] // g, n, p).transpose(2, 0, 1, 3)

    def forward(self, bottom, top):
        layer = self.layer
        xp, weight = layer.xp, layer.blobs[0].data
        o, n, p = layer.num_output, layer.num, layer.spatial
        for i, (b, t) in enumerate(zip(bottom, top)):
            self.hold_input[i] = False  # new data: the columns must be rebuilt
            cols = self.fill_columns(i, b)
            out = t.data.reshape(n, o, p)
            bias = layer.blobs[1].data[None, :, None] if layer.bias_term else None
            if self.per_sample:
                layer.sample_gemms(layer.weight3(weight), self.sample_columns(b, cols),
                                   out.reshape(n, layer.group, o // layer.group, p), out, bias)
                continue
            product = layer.scratch(0, (o, n * p))
            xp.matmul(layer.weight3(weight), layer.grouped(cols), out=layer.grouped(product))
            # The one transposing copy to (N, O, P), with the bias added on the way.
            layer.copy_by_sample(out, self.by_sample(product), bias)

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        # A second backward after one forward (the columns then hold a gradient) rebuilds
        # them, as Caffe's backward always does.
        cols = self.fill_columns(i, b) if want_weight else self.cols[i]
        if down and cols is not None:
            self.hold_input[i] = False  # about to take the column gradient
        if self.per_sample:
            self._backward_per_sample(top_diff, want_weight, down, b, cols)
        else:
            self._backward_whole_batch(top_diff, want_weight, down, b, cols)

    def _backward_whole_batch(self, top_diff, want_weight, down, b, cols):
        layer = self.layer
        o, n, p = layer.num_output, layer.num, layer.spatial
        diff_t = layer.scratch(0, (o, n * p))
        layer.copy_by_sample(self.by_sample(diff_t), top_diff)
        diff3 = layer.grouped(diff_t)
        if want_weight:
            layer.add_weight_diff(diff3, layer.grouped(cols).transpose(0, 2, 1))
        if down:
            col_diff = cols  # the weight gradient is done with the columns
            layer.xp.matmul(layer.weight3(layer.blobs[0].data).transpose(0, 2, 1), diff3,
                            out=layer.grouped(col_diff))
            if self.batch_last:
                col2im_batch_last(col_diff, layer.image_in, *layer.geometry(),
                                  out=b.diff.reshape(layer.image_in),
                                  image=self.batch_last_image(),
                                  runner=layer.ctx.chunk_runner)
            else:
                layer.col2im(col_diff, b.diff.reshape(layer.image_in))

    def _backward_per_sample(self, top_diff, want_weight, down, b, cols):
        layer = self.layer
        o, n, g, p = layer.num_output, layer.num, layer.group, layer.spatial
        diff4 = top_diff.reshape(n, g, o // g, p)
        columns = self.sample_columns(b, cols)
        if want_weight:
            layer.add_weight_diff_per_sample(diff4, columns)
        if down:
            w_t = layer.weight3(layer.blobs[0].data).transpose(0, 2, 1)
            if cols is None:
                layer.sample_gemms(w_t, diff4, b.diff.reshape(columns.shape))
                return
            col_diff = cols  # the weight gradient is done with the columns
            layer.sample_gemms(w_t, diff4, self.sample_columns(None, col_diff))
            layer.col2im(col_diff, b.diff.reshape(layer.image_in))


class DirectPath(ConvPath):
    """A 1x1, pad 0, dilation 1 kernel as per-sample GEMMs on the input itself (subsampled
    first for a stride, into a kept buffer backward reuses): no im2col or col2im."""

    @property
    def kept(self):
        return ("subsampled",)

    def setup(self, bottoms):
        layer = self.layer
        strided = layer.stride != (1, 1)
        self.subsampled = [layer.buffer(f"subsampled{i}",
                                        (layer.num, layer.channels, layer.spatial))
                           if strided else None for i in range(bottoms)]

    def input(self, i, b):
        """Bottom i as (N, group, C/group, P): its data (stride 1) or the subsampled copy
        forward made."""
        layer = self.layer
        n, g, p = layer.num, layer.group, layer.spatial
        sub = self.subsampled[i]
        if sub is None:
            return b.data.reshape(n, g, layer.channels // g, p)
        return sub.reshape(n, g, layer.channels // g, p)

    def subsample(self, i, b):
        """Copy every stride-th row and column of bottom i into its subsampled buffer."""
        layer = self.layer
        sh, sw = layer.stride
        image = b.data.reshape(layer.image_in)
        layer.copy_by_sample(self.subsampled[i].reshape((layer.num, layer.channels) +
                                                        layer.out_hw),
                             image[:, :, ::sh, ::sw])

    def forward(self, bottom, top):
        """top_n = W @ x_n per sample and group (Caffe's 1x1 GEMM, without the im2col)."""
        layer = self.layer
        o, n, g, p = layer.num_output, layer.num, layer.group, layer.spatial
        for i, (b, t) in enumerate(zip(bottom, top)):
            if self.subsampled[i] is not None:
                self.subsample(i, b)
            out = t.data.reshape(n, o, p)
            bias = layer.blobs[1].data[None, :, None] if layer.bias_term else None
            layer.sample_gemms(layer.weight3(layer.blobs[0].data), self.input(i, b),
                               out.reshape(n, g, o // g, p), out, bias)

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        """dW += dtop_n @ x_n^T, sample by sample as Caffe sums; dx_n = W^T @ dtop_n,
        scattered back onto the strided positions for a stride."""
        layer = self.layer
        o, n, g = layer.num_output, layer.num, layer.group
        diff4 = top_diff.reshape(n, g, o // g, layer.spatial)
        x4 = self.input(i, b)
        if want_weight:
            layer.add_weight_diff_per_sample(diff4, x4)
        if not down:
            return
        w_t = layer.weight3(layer.blobs[0].data).transpose(0, 2, 1)
        if self.subsampled[i] is None:
            layer.sample_gemms(w_t, diff4, b.diff.reshape(x4.shape))
            return
        product = layer.scratch(0, x4.shape)
        layer.sample_gemms(w_t, diff4, product)
        self.scatter_strided(product, b.diff.reshape(layer.image_in))

    def scatter_strided(self, values, image):
        """image = 0, then image[:, :, ::sh, ::sw] = values (N, ..., P): the strided
        convolution's input gradient (the skipped positions get none)."""
        layer = self.layer
        sh, sw = layer.stride
        grid = values.reshape((layer.num, layer.channels) + layer.out_hw)

        def samples(start, stop):
            image[start:stop] = 0
            image[start:stop, :, ::sh, ::sw] = grid[start:stop]

        for_each_chunk(layer.xp, layer.num, samples, item_elements=image[0].size,
                       cache_sized=False, runner=layer.ctx.chunk_runner)


class DeconvCol2imPath(ConvPath):
    """Deconvolution with 2 spatial axes: forward is the convolution's input gradient (a
    GEMM per group into columns, then col2im), backward the convolution's forward (im2col of
    the top diff, then a GEMM) and weight gradient. Keeps each bottom transposed for the
    weight gradient."""

    @property
    def kept(self):
        return ("input_t",)

    def setup(self, bottoms):
        layer = self.layer
        spatial_in = layer.in_hw[0] * layer.in_hw[1]
        self.inputs_t = [layer.buffer(f"input_t{i}", (layer.channels, layer.num * spatial_in))
                         for i in range(bottoms)]
        self.col_shape = (layer.num_output * layer.kernel[0] * layer.kernel[1],
                          layer.num * spatial_in)
        self.image_shape = (layer.num, layer.num_output) + layer.out_hw

    def forward(self, bottom, top):
        layer = self.layer
        weight = layer.blobs[0].data
        c, n = layer.channels, layer.num
        spatial_in = layer.in_hw[0] * layer.in_hw[1]
        cols = layer.scratch(3, self.col_shape)
        w3 = layer.grouped(weight.reshape(c, -1))
        for b, t, input_t in zip(bottom, top, self.inputs_t):
            layer.copy_by_sample(input_t.reshape(c, n, spatial_in).transpose(1, 0, 2),
                                 b.data.reshape(n, c, spatial_in))
            layer.xp.matmul(w3.transpose(0, 2, 1), layer.grouped(input_t),
                            out=layer.grouped(cols))
            image = t.data.reshape(self.image_shape)
            layer.col2im(cols, image)
            if layer.bias_term:
                image += layer.blobs[1].data[None, :, None, None]

    def backward_bottom(self, i, top_diff, b, want_weight, down):
        layer = self.layer
        weight = layer.blobs[0]
        c, n = layer.channels, layer.num
        spatial_in = layer.in_hw[0] * layer.in_hw[1]
        cols = layer.scratch(3, self.col_shape)
        layer.im2col(top_diff.reshape(self.image_shape), cols)
        cols3 = layer.grouped(cols)
        if want_weight:
            layer.add_weight_diff(layer.grouped(self.inputs_t[i]), cols3.transpose(0, 2, 1))
        if down:
            product = layer.scratch(0, (c, n * spatial_in))
            layer.xp.matmul(layer.grouped(weight.data.reshape(c, -1)), cols3,
                            out=layer.grouped(product))
            layer.copy_by_sample(b.diff.reshape(n, c, spatial_in),
                                 product.reshape(c, n, spatial_in).transpose(1, 0, 2))


def _both(paths: dict) -> dict:
    """Each path under its CPU name and its `gpu-` name (the same array code)."""
    return {**paths, **{f"gpu-{name}": cls for name, cls in paths.items()}}


#: Convolution's GEMM paths by name (conv_fast_paths has the CPU-only ones).
CONVOLUTION_PATHS = {**_both({"nd": NdPath, "direct": DirectPath,
                                 "im2col-per-sample": Im2colPath,
                                 "im2col-batch-last": Im2colPath,
                                 "im2col-whole-batch": Im2colPath}),
                     # the whole-batch layout, im2col and col2im as CUDA kernels
                     "gpu-im2col-cuda": Im2colPath}
#: Deconvolution's paths by name.
DECONVOLUTION_PATHS = _both({"nd": DeconvNdPath, "col2im": DeconvCol2imPath})

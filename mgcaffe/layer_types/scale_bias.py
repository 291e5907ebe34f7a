"""Scale and Bias: multiply or add a blob broadcast along a run of the input's axes.

The operand (a learned blob, or a second bottom) has the shape of the input's axes
axis .. axis+num_axes-1 (num_axes -1: to the end). Seen as (outer, dim, inner), the input is
scaled or shifted by operand[dim]. A scalar operand (0 axes) always uses axis 0, as Caffe does.
"""

from __future__ import annotations

import numpy as np

from ..cpu.parallel import for_each_chunk, runner_or_default
from ..kernels.cuda import norm as cuda_norm
from ..kernels.loops import scale as scale_loops
from .base import Layer
from .choice.normalization import choose_scale
from .layer_util import canonical_axis, count, ensure_param_blob, filler_param, in_place
from .registry import register_layer


def operand_shape(layer, input_shape, axis: int, num_axes: int) -> tuple[int, ...]:
    """The shape of a learned operand: input_shape[axis : axis+num_axes] (-1: to the end)."""
    axis = canonical_axis(layer, axis, len(input_shape))
    if num_axes < -1:
        raise layer.error(f"num_axes must be >= 0, or -1 for all axes from `axis` on; "
                          f"got {num_axes}")
    end = len(input_shape) if num_axes == -1 else axis + num_axes
    if end > len(input_shape):
        raise layer.error(f"the operand (axis {axis}, num_axes {num_axes}) extends past the "
                          f"input shape {tuple(input_shape)}")
    return tuple(input_shape[axis:end])


def broadcast_dims(layer, input_shape, operand, axis: int) -> tuple[int, int, int]:
    """(outer, dim, inner) for applying `operand` (an array) to an input of `input_shape`."""
    op_shape = tuple(operand.shape)
    axis = 0 if not op_shape else canonical_axis(layer, axis, len(input_shape))
    if tuple(input_shape[axis:axis + len(op_shape)]) != op_shape:
        raise layer.error(f"operand shape {op_shape} does not match the input shape "
                          f"{tuple(input_shape)} at axis {axis}")
    return (count(input_shape, 0, axis), count(op_shape),
            count(input_shape, axis + len(op_shape)))


class _BroadcastLayer(Layer):
    """Shared parts of Scale and Bias: top sizing and the (outer, dim, inner) views."""

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def _size_top(self, bottom, top, operand, axis):
        self._dims = broadcast_dims(self, bottom[0].shape, operand, axis)
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def _view(self, array):
        return array.reshape(self._dims)

    def _sum_to_operand(self, dy, operand_blob, accumulate: bool):
        """Sum an (outer, dim, inner) array over outer and inner into operand_blob.diff."""
        total = dy.sum(axis=(0, 2)).reshape(operand_blob.shape)
        if accumulate:
            operand_blob.diff[...] += total
        else:
            operand_blob.diff[...] = total


@register_layer
class BiasLayer(_BroadcastLayer):
    """y = x + b, b a learned blob (one bottom; filler default constant 0) or bottom[1]."""

    type = "Bias"

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        self.axis = int(p.axis)
        if len(bottom) == 1:
            shape = operand_shape(self, bottom[0].shape, self.axis, int(p.num_axes))
            ensure_param_blob(self, 0, shape, p.filler, "bias")

    def _operand(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self._size_top(bottom, top, self._operand(bottom).data, self.axis)

    def forward(self, bottom, top):
        b = self._operand(bottom).data.reshape(1, -1, 1)
        self.xp.add(self._view(bottom[0].data), b, out=self._view(top[0].data))

    def backward(self, top, propagate_down, bottom):
        dy = self._view(top[0].diff)
        param = len(bottom) == 1
        if (param and self.param_propagate_down[0]) or (not param and propagate_down[1]):
            self._sum_to_operand(dy, self._operand(bottom), accumulate=param)
        if propagate_down[0] and not in_place(bottom, top):
            self.xp.copyto(bottom[0].diff, top[0].diff)


@register_layer
class ScaleLayer(_BroadcastLayer):
    """y = x * s (+ b): s a learned blob (one bottom; filler default constant 1) or bottom[1].

    With bias_term, the bias is the layer's last blob (Caffe's layout), shaped like s
    (filler bias_filler, default constant 0).
    """

    type = "Scale"
    # How it runs is its path (choice.normalization.choose_scale, made in reshape): on the
    # CPU, forward and backward over cache-sized blocks of (outer, channel) rows, each block
    # making all its passes while it is in the cache (the in-place copy, the product and the
    # bias; the two sums and the bottom diff) on the chunk threads, as compiled loops
    # (kernels.scale_loops, sums float64) or numpy calls per block.

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        self.axis = int(p.axis)
        x_shape = bottom[0].shape
        if len(bottom) == 1:
            shape = operand_shape(self, x_shape, self.axis, int(p.num_axes))
            filler = filler_param(p.filler, p.HasField("filler"), "constant", 1.0)
            ensure_param_blob(self, 0, shape, filler, "scale")
        self.bias_index = None
        if p.bias_term:
            self.bias_index = 1 if len(bottom) == 1 else 0
            bias_axes = bottom[1].num_axes if len(bottom) > 1 else int(p.num_axes)
            shape = operand_shape(self, x_shape, self.axis, bias_axes)
            ensure_param_blob(self, self.bias_index, shape, p.bias_filler, "bias")
        self._input_copy = None
        self._input_copy_lent = False
        self._scratch = None

    def lend_input_copy(self, array):
        """From now on backward reads `array` as this layer's input when it runs in place:
        another layer's array holding the same values (a norm_chain's BatchNorm copy). The
        layer's own forward takes its own copy again."""
        self._input_copy, self._input_copy_lent = array, True
        return array

    def own_input_copy(self, shape):
        """This layer's own array for a copy of its input, (re)allocated for `shape`."""
        copy = self._input_copy
        if copy is None or self._input_copy_lent or copy.shape != tuple(shape):
            self._input_copy = self.xp.empty(shape, dtype=self.dtype)
            self._input_copy_lent = False
        return self._input_copy

    def _scale(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        scale = self._scale(bottom).data
        self._size_top(bottom, top, scale, self.axis)
        if self.bias_index is not None:
            bias = self.blobs[self.bias_index].data
            if self._dims != broadcast_dims(self, bottom[0].shape, bias, self.axis):
                raise self.error(f"bias shape {tuple(bias.shape)} does not match scale shape "
                                 f"{tuple(scale.shape)}")
        self.choice = choose_scale(self._dims[2], np.dtype(self.dtype).name,
                                   self.choice_target(), self.ctx.rules.scale)

    def _rows_backward(self) -> bool:
        """Whether backward goes by blocks of rows (forward too, but on row-blocks-backward)."""
        return self.choice.path in ("compiled-rows", "row-blocks", "row-blocks-backward")

    def _loops(self):
        """The compiled row loops where they apply (else None: numpy's calls per block)."""
        return scale_loops.load() if self.choice.path == "compiled-rows" else None

    def _per_row(self, values):
        """A (dim,) operand repeated for each of the `outer` blocks: one value per row."""
        return np.broadcast_to(values.reshape(1, -1), self._dims[:2]).reshape(-1)

    def _for_each_rows(self, body):
        outer, dim, inner = self._dims
        for_each_chunk(np, outer * dim, body, item_elements=max(1, inner),
                       runner=runner_or_default(self.ctx.chunk_runner))

    def forward(self, bottom, top):
        xp = self.xp
        if self.choice.path == "gpu-cuda-kernels":
            copy = self.own_input_copy(bottom[0].shape) if in_place(bottom, top) else None
            bias = None if self.bias_index is None else self.blobs[self.bias_index].data
            cuda_norm.scale_forward(bottom[0].data, top[0].data, self._scale(bottom).data, bias,
                                    self._dims, copy)
            return
        if self.choice.path in ("compiled-rows", "row-blocks"):
            self._forward_rows(bottom, top)
            return
        if in_place(bottom, top):
            # The scale gradient needs x, which the in-place forward overwrites.
            xp.copyto(self.own_input_copy(bottom[0].shape), bottom[0].data)
        s = self._scale(bottom).data.reshape(1, -1, 1)
        y = self._view(top[0].data)
        xp.multiply(self._view(bottom[0].data), s, out=y)
        if self.bias_index is not None:
            y += self.blobs[self.bias_index].data.reshape(1, -1, 1)

    def _forward_rows(self, bottom, top):
        """forward() over blocks of rows: the same operations per element, the same bits."""
        outer, dim, inner = self._dims
        rows = (outer * dim, inner)
        x = bottom[0].data.reshape(rows)
        y = top[0].data.reshape(rows)
        copy = None
        if in_place(bottom, top):
            copy = self.own_input_copy(bottom[0].shape).reshape(rows)
        s_rows = np.ascontiguousarray(self._per_row(self._scale(bottom).data))
        s = s_rows[:, None]
        b = b_rows = None
        if self.bias_index is not None:
            b_rows = np.ascontiguousarray(self._per_row(self.blobs[self.bias_index].data))
            b = b_rows[:, None]
        loops = self._loops()
        if loops is not None:
            # An absent operand's place takes a stand-in of the same type, never read.
            args = (x, y, y if copy is None else copy, s_rows,
                    s_rows if b_rows is None else b_rows, copy is not None, b_rows is not None)

            def body(start, stop):
                loops.forward(*args, start, stop)
        else:
            def body(start, stop):
                if copy is not None:
                    np.copyto(copy[start:stop], x[start:stop])
                    source = copy[start:stop]
                else:
                    source = x[start:stop]
                out = y[start:stop]
                np.multiply(source, s[start:stop], out=out)
                if b is not None:
                    out += b[start:stop]

        self._for_each_rows(body)

    def _backward_rows(self, top, propagate_down, bottom):
        """backward() over blocks of rows: per row, the bias and scale sums over `inner`
        (summed over `outer` at the end: another rounding order than the whole-array sums)
        and the bottom diff, which may overwrite the top diff (in place) once read."""
        outer, dim, inner = self._dims
        rows = (outer * dim, inner)
        dy = top[0].diff.reshape(rows)
        param = len(bottom) == 1
        loops = self._loops()
        sums = np.float64 if loops is not None else dy.dtype
        bias = None
        if self.bias_index is not None and self.param_propagate_down[self.bias_index]:
            bias = np.empty(outer * dim, dtype=sums)
        scale = x = None
        if (param and self.param_propagate_down[0]) or (not param and propagate_down[1]):
            scale = np.empty(outer * dim, dtype=sums)
            x = (self._input_copy if in_place(bottom, top) else bottom[0].data)
            x = x.reshape(rows)
        dx = s = s_rows = None
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(rows)
            s_rows = np.ascontiguousarray(self._per_row(self._scale(bottom).data))
            s = s_rows[:, None]
        if loops is not None:
            # An absent operand's place takes a stand-in of the same type, never read.
            unused = np.empty(1, dtype=sums)
            args = (dy, dy if x is None else x, dy if dx is None else dx,
                    np.empty(1, dy.dtype) if s_rows is None else s_rows,
                    unused if bias is None else bias, unused if scale is None else scale,
                    bias is not None, scale is not None, dx is not None)

            def body(start, stop):
                loops.backward(*args, start, stop)
        else:
            def body(start, stop):
                grad = dy[start:stop]
                if bias is not None:
                    grad.sum(axis=1, out=bias[start:stop])
                if scale is not None:
                    np.einsum("ij,ij->i", grad, x[start:stop], out=scale[start:stop])
                if dx is not None:
                    np.multiply(grad, s[start:stop], out=dx[start:stop])

        self._for_each_rows(body)
        if bias is not None:
            self.blobs[self.bias_index].add_to_diff(
                bias.reshape(outer, dim).sum(axis=0).astype(dy.dtype, copy=False)
                .reshape(self.blobs[self.bias_index].shape))
        if scale is not None:
            total = (scale.reshape(outer, dim).sum(axis=0).astype(dy.dtype, copy=False)
                     .reshape(self._scale(bottom).shape))
            if param:
                self.blobs[0].add_to_diff(total)
            else:
                bottom[1].diff[...] = total

    def _backward_kernels(self, top, propagate_down, bottom):
        """backward() as CUDA kernels (kernels.cuda_norm): the operand sums in one launch
        (into the diffs, added or, where a diff was cleared lazily, written), then the input
        gradient, which may overwrite the top diff."""
        param = len(bottom) == 1
        diffs, accumulate = [None, None], [True, False]
        if self.bias_index is not None and self.param_propagate_down[self.bias_index]:
            diffs[0], overwrite = self.blobs[self.bias_index].diff_for_write()
            accumulate[0] = not overwrite
        x = None
        if (param and self.param_propagate_down[0]) or (not param and propagate_down[1]):
            if param:
                diffs[1], overwrite = self.blobs[0].diff_for_write()
                accumulate[1] = not overwrite
            else:
                diffs[1] = bottom[1].diff
            x = self._input_copy if in_place(bottom, top) else bottom[0].data
        dx = bottom[0].diff if propagate_down[0] else None
        cuda_norm.scale_backward(top[0].diff, x, self._scale(bottom).data, self._dims,
                                 bias_diff=diffs[0], scale_diff=diffs[1],
                                 accumulate=tuple(accumulate), dx=dx)

    def backward(self, top, propagate_down, bottom):
        xp = self.xp
        if self.choice.path == "gpu-cuda-kernels":
            self._backward_kernels(top, propagate_down, bottom)
            return
        if self._rows_backward():
            self._backward_rows(top, propagate_down, bottom)
            return
        dy = self._view(top[0].diff)
        # Operand gradients first: in place, the bottom diff overwrites the top diff.
        if self.bias_index is not None and self.param_propagate_down[self.bias_index]:
            self._sum_to_operand(dy, self.blobs[self.bias_index], accumulate=True)
        param = len(bottom) == 1
        if (param and self.param_propagate_down[0]) or (not param and propagate_down[1]):
            x = self._input_copy if in_place(bottom, top) else bottom[0].data
            if self._scratch is None or self._scratch.shape != x.shape:
                # Allocated on first need, so nets that never backprop don't pay for it.
                self._scratch = xp.empty_like(x)
            product = self._view(self._scratch)
            xp.multiply(dy, self._view(x), out=product)
            self._sum_to_operand(product, self._scale(bottom), accumulate=param)
        if propagate_down[0]:
            s = self._scale(bottom).data.reshape(1, -1, 1)
            xp.multiply(dy, s, out=self._view(bottom[0].diff))

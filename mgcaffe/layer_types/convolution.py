"""Convolution and Deconvolution with Caffe's semantics.

Convolution: weight (num_output, channels/group, kh, kw), bias (num_output,), as in a
.caffemodel. Deconvolution (Caffe's transposed convolution): weight (channels,
num_output/group, kh, kw); its forward is the convolution's input-gradient computation, its
backward the convolution's forward and weight gradient. Output size: stride*(in-1) +
dilation*(kernel-1) + 1 - 2*pad.

The axes before the channel axis (`axis`, default 1) are batch axes. How a layer computes is
its path: `reshape` asks `choice.convolution` (a pure function of the geometry, the target
and the rules in `ctx.rules.convolution`) and keeps the answer as `layer.choice`; the path
objects (conv_paths.py, conv_fast_paths.py) run forward and each bottom's part of the one
backward skeleton below. What every path shares lives here: parameters, blobs, shapes, the
buffers a path keeps from forward to backward, and the GEMM helpers.
"""

from __future__ import annotations

from math import prod

import numpy as np

from ..blob import Blob
from ..cpu.parallel import for_each_chunk, runner_or_default
from ..errors import LayerError
from ..fillers import fill_blob, filler_rng
from ..kernels.cuda import im2col_pool as cuda_kernels
from ..kernels.gemm import GemmStack, gemm_accumulate
from ..kernels.im2col import col2im, conv_output_size, im2col
from ..kernels.sample_gemm import for_each_gemm
from . import conv_fast_paths, conv_paths
from .base import Layer
from .choice.convolution import (
    ConvGeometry,
    choose_convolution,
    choose_deconvolution,
    sample_grain,
)
from .registry import register_layer


def spatial_pair(layer, param, name: str, default: int | None, num_spatial: int = 2):
    """The (h, w) pair for `name` ("kernel", "pad", "stride", "dilation") with Caffe's rules.

    The repeated field (kernel_size, pad, stride, dilation) holds 1 value (every axis) or one
    per spatial axis; kernel, pad and stride may instead come as name_h and name_w (both, and
    not with the repeated field). `default` applies when nothing is given (None: required).
    """
    repeated_name = "kernel_size" if name == "kernel" else name
    values = [int(v) for v in getattr(param, repeated_name)]
    has_hw = name != "dilation" and (param.HasField(f"{name}_h") or param.HasField(f"{name}_w"))
    if has_hw:
        if num_spatial != 2:
            raise layer.error(f"{name}_h & {name}_w can only be used for 2D convolution "
                              f"(this one has {num_spatial} spatial axes)")
        if values:
            raise layer.error(f"either {repeated_name} or {name}_h/{name}_w may be given, "
                              f"not both (got {repeated_name}: {values})")
        if not (param.HasField(f"{name}_h") and param.HasField(f"{name}_w")):
            raise layer.error(f"{name}_h and {name}_w must be given together")
        return int(getattr(param, f"{name}_h")), int(getattr(param, f"{name}_w"))
    if not values:
        if default is None:
            raise layer.error(f"{repeated_name} (or {name}_h and {name}_w) is required")
        return (default,) * num_spatial
    if len(values) not in (1, num_spatial):
        raise layer.error(f"{repeated_name} must be given once or once per spatial axis "
                          f"({num_spatial}); got {len(values)} values {values}")
    return tuple(values) if len(values) == num_spatial else (values[0],) * num_spatial


class _ConvolutionBase(Layer):
    """What Convolution and Deconvolution share: parameters, blobs, shapes, buffers, the
    backward skeleton and the GEMM helpers their paths use."""

    min_bottom = 1
    min_top = 1
    equal_num_bottom_top = True
    #: path name -> the class that runs it (conv_paths, conv_fast_paths).
    paths: dict = {}

    # -- setup -----------------------------------------------------------------------------
    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        shape = bottom[0].shape
        if not -len(shape) <= p.axis < len(shape):
            raise self.error(f"axis {p.axis} out of range for bottom shape {shape}")
        self.axis = p.axis % len(shape)
        self.num_spatial = num_spatial = len(shape) - self.axis - 1
        if num_spatial < 1:
            raise self.error(f"needs at least 1 spatial axis after the channel axis (axis "
                             f"{p.axis}, bottom shape {shape})")
        #: Not 2 spatial axes: the generic N-D code (convolution_nd.py) runs this layer.
        self.nd = num_spatial != 2
        self.kernel = spatial_pair(self, p, "kernel", None, num_spatial)
        self.pad = spatial_pair(self, p, "pad", 0, num_spatial)
        self.stride = spatial_pair(self, p, "stride", 1, num_spatial)
        self.dilation = spatial_pair(self, p, "dilation", 1, num_spatial)
        for name, values in (("kernel", self.kernel), ("stride", self.stride),
                             ("dilation", self.dilation)):
            if min(values) <= 0:
                raise self.error(f"{name} dimensions must be positive, got {values}")
        self.num_output = int(p.num_output)
        self.group = int(p.group)
        self.channels = int(shape[self.axis])
        if self.num_output <= 0:
            raise self.error(f"num_output must be positive, got {self.num_output}")
        if self.group <= 0 or self.channels % self.group or self.num_output % self.group:
            raise self.error(f"group {self.group} must divide both the input channels "
                             f"({self.channels}) and num_output ({self.num_output})")
        self.bias_term = bool(p.bias_term)
        self.rules = self.ctx.rules.convolution
        self._setup_blobs(p)
        self._buffers = {}

    def _setup_blobs(self, p):
        shapes = [self.weight_shape()] + ([(self.num_output,)] if self.bias_term else [])
        if self.blobs:  # loaded weights: Caffe skips the fillers but checks the shapes
            found = [b.shape for b in self.blobs]
            if found != [tuple(s) for s in shapes]:
                raise self.error(f"expected parameter blobs of shapes {shapes} (weight, bias), "
                                 f"found {found}")
            return
        rng = filler_rng(self.ctx.seed, self.name)
        fillers = [p.weight_filler, p.bias_filler]
        for i, shape in enumerate(shapes):
            blob = Blob(shape, xp=self.xp, dtype=self.dtype, name=f"{self.name}[{i}]")
            fill_blob(blob, fillers[i], rng)
            self.blobs.append(blob)

    def weight_shape(self) -> tuple[int, ...]:
        """The weight blob's shape as Caffe lays it out."""
        raise NotImplementedError

    # -- shapes, the path and its buffers --------------------------------------------------
    def reshape(self, bottom, top):
        shape = bottom[0].shape
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != shape:
                raise self.error(f"all bottoms must have one shape: bottom[0] {shape}, "
                                 f"bottom[{i}] {b.shape}")
        if len(shape) != self.axis + 1 + self.num_spatial or shape[self.axis] != self.channels:
            raise self.error(f"expected a bottom with {self.channels} channels at axis "
                             f"{self.axis} and {self.num_spatial} spatial axes after it, got "
                             f"shape {shape}")
        self.num = prod(shape[:self.axis])
        self.in_hw = tuple(shape[self.axis + 1:])
        self.out_hw = self.output_hw(self.in_hw)
        if min(self.out_hw) <= 0:
            raise self.error(f"input {self.in_hw} gives an empty output {self.out_hw} with "
                             f"kernel {self.kernel}, pad {self.pad}, stride {self.stride}, "
                             f"dilation {self.dilation}")
        for t in top:
            t.reshape(shape[:self.axis] + (self.num_output,) + self.out_hw)
        #: The bottom as (N, C, *spatial).
        self.image_in = (self.num, self.channels) + self.in_hw
        #: Output positions per sample.
        self.spatial = prod(self.out_hw)
        try:
            self.choice = self.choose(self.conv_geometry())
        except LayerError as exc:
            raise self.error(str(exc)) from None
        path = self.paths[self.choice.path](self, self.choice)
        # A reshape can switch paths: the arrays the others kept go.
        self.drop_buffers_except(path.kept + ("ones",))
        path.setup(len(bottom))
        self.path = path

    def conv_geometry(self) -> ConvGeometry:
        """This layer's geometry as the path choice reads it."""
        return ConvGeometry(self.num, self.channels, self.num_output, self.group, self.kernel,
                            self.pad, self.stride, self.dilation, self.in_hw, self.out_hw,
                            self.dtype.name)

    def choose(self, geometry: ConvGeometry):
        """This layer type's path for `geometry` (choice.convolution)."""
        raise NotImplementedError

    def output_hw(self, in_hw) -> tuple[int, int]:
        """Spatial output size for a spatial input size."""
        raise NotImplementedError

    def buffer(self, role: str, shape):
        """An array this layer keeps (from forward to backward), named by its role and
        reallocated only when its shape changes."""
        shape = tuple(int(d) for d in shape)
        array = self._buffers.get(role)
        if array is None or array.shape != shape:
            array = self._buffers[role] = self.xp.empty(shape, dtype=self.dtype)
        return array

    def drop_buffers_except(self, prefixes: tuple[str, ...]) -> None:
        """Forget the kept arrays whose role starts with none of `prefixes` (their memory is
        freed)."""
        for role in [r for r in self._buffers if not r.startswith(prefixes)]:
            del self._buffers[role]

    # -- forward and the one backward skeleton ---------------------------------------------
    def forward(self, bottom, top):
        self.path.forward(bottom, top)

    def backward(self, top, propagate_down, bottom):
        """Per bottom: the bias gradient, then the path's weight and input gradients."""
        path = self.path
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        path.start_backward()
        for i, (t, down, b) in enumerate(zip(top, propagate_down, bottom)):
            top_diff = t.diff.reshape(self.num, self.num_output, self.spatial)
            if want_bias:
                path.add_bias_diff(top_diff)
            if want_weight or down:
                path.backward_bottom(i, top_diff, b, want_weight, down)

    # -- helpers the paths share -----------------------------------------------------------
    # Per-call temporaries (Layer.scratch) by slot: 0 the GEMM product / transposed top
    # diff, 1 the padded image im2col reads or col2im sums into, 2 the weight gradient
    # before it is added, 3 Deconvolution's columns.
    def padded_buffer(self, image_shape):
        """The scratch image im2col pads into (None when pad is 0; im2col zeroes its
        border)."""
        if self.pad == (0, 0):
            return None
        n, c, h, w = image_shape
        return self.scratch(1, (n, c, h + 2 * self.pad[0], w + 2 * self.pad[1]))

    def geometry(self):
        """kernel, pad, stride, dilation as im2col/col2im take them."""
        return self.kernel, self.pad, self.stride, self.dilation

    def im2col(self, image, out):
        """im2col of an (N, C, H, W) image into `out`, on this layer's chunk runner (as a
        CUDA kernel where the choice says `cuda_kernels`)."""
        if self.choice.option("cuda_kernels"):
            return cuda_kernels.im2col(image, *self.geometry(), out=out)
        return im2col(image, *self.geometry(), out=out,
                      padded=self.padded_buffer(image.shape), runner=self.ctx.chunk_runner)

    def col2im(self, columns, image):
        """col2im of `columns` overwriting `image` (N, C, H, W), on this layer's runner (as a
        CUDA kernel where the choice says `cuda_kernels`)."""
        if self.choice.option("cuda_kernels"):
            return cuda_kernels.col2im(columns, image.shape, *self.geometry(), out=image)
        return col2im(columns, image.shape, *self.geometry(), out=image,
                      runner=self.ctx.chunk_runner)

    def copy_by_sample(self, target, source, bias=None):
        """target[...] = source (+ bias), both (N, ...) arrays, the samples split over the CPU
        cores (kernels.parallel): the transposing copies between (N, O, P) and (O, N, P) are
        memory-bound loops that numpy runs on one core. `source` may be `target` (bias add)."""
        xp = self.xp

        def samples(start, stop):
            if bias is None:
                xp.copyto(target[start:stop], source[start:stop])
            else:
                xp.add(source[start:stop], bias, out=target[start:stop])

        count = target.shape[0]
        for_each_chunk(xp, count, samples, item_elements=target.size // max(1, count),
                       cache_sized=False, runner=self.ctx.chunk_runner)

    def grouped(self, matrix):
        """View a (rows, cols) matrix as (group, rows/group, cols) for one batched matmul."""
        rows, cols = matrix.shape
        return matrix.reshape(self.group, rows // self.group, cols)

    def weight3(self, array):
        """A weight-shaped array as (group, first axis/group, the rest)."""
        return self.grouped(array.reshape(array.shape[0], -1))

    def accumulate(self, a, b, c, overwrite=False):
        """c += a @ b for 2-D views: inside the BLAS GEMM (beta = 1) on numpy, no temporary;
        c = a @ b with `overwrite` (beta = 0)."""
        if self.xp is np:
            gemm_accumulate(a, b, c, lambda shape: self.scratch(2, shape), overwrite)
        elif overwrite:
            self.xp.matmul(a, b, out=c)
        else:
            c += self.xp.matmul(a, b)

    def sample_grain(self, count: int, flops_each: float) -> int:
        """Samples per chunk for `count` independent GEMMs of `flops_each` flops each."""
        return sample_grain(self.rules, count, flops_each,
                            runner_or_default(self.ctx.chunk_runner).threads)

    def sample_gemms(self, a3, x4, out4, out=None, bias=None):
        """out4[s] = a3 @ x4[s] for every sample s (numpy matmul broadcasting over groups),
        then out[s] += bias where given (`out`: out4 as (N, O, P))."""
        xp = self.xp

        def samples(start, stop):
            xp.matmul(a3, x4[start:stop], out=out4[start:stop])
            if bias is not None:
                xp.add(out[start:stop], bias, out=out[start:stop])

        if self.rules.split_sample_gemms:
            flops = 2.0 * a3.shape[0] * a3.shape[1] * a3.shape[2] * x4.shape[-1]
            for_each_gemm(xp, x4.shape[0], samples, self.ctx.chunk_runner,
                          grain=self.sample_grain(x4.shape[0], flops))
            return
        xp.matmul(a3, x4, out=out4)
        if bias is not None:
            self.copy_by_sample(out, out, bias)

    def _weight_diff_in_gemm(self) -> bool:
        """Whether this layer's weight gradient goes into the diff inside the GEMM (the
        choice's option)."""
        return bool(self.choice.option("weight_diff_in_gemm", False))

    def add_weight_diff_per_sample(self, diff4, columns):
        """weight.diff += sum over samples s of diff4[s] @ columns[s]^T, per group:
        diff4 (N, group, O/group, P), columns (N, group, K, P). Sample by sample, as Caffe
        sums: inside the GEMM, or as one stack of transposed products and a sum."""
        weight = self.blobs[0]
        n, g, og = diff4.shape[:3]
        diff, overwrite = weight.diff_for_write()  # lazily cleared: the first write overwrites
        grad = diff.reshape(g, og, -1)
        if self._weight_diff_in_gemm():
            if self.rules.split_sample_gemms and self.xp is np:
                self._split_weight_diff(diff4, columns, grad, overwrite)
                return
            for s in range(n):
                for k in range(g):
                    self.accumulate(diff4[s, k], columns[s, k].transpose(), grad[k],
                                    overwrite and s == 0)
            if n == 0 and overwrite:
                grad[...] = 0
            return
        # Formed transposed, as in add_weight_diff (the faster orientation there).
        per_sample = self.scratch(2, (n, g, columns.shape[2], og))
        diff4_t = diff4.transpose(0, 1, 3, 2)

        def samples(start, stop):
            self.xp.matmul(columns[start:stop], diff4_t[start:stop], out=per_sample[start:stop])

        if self.rules.split_sample_gemms:
            flops = 2.0 * g * og * columns.shape[2] * columns.shape[3]
            for_each_gemm(self.xp, n, samples, self.ctx.chunk_runner,
                          grain=self.sample_grain(n, flops))
        else:
            samples(0, n)
        total = per_sample.sum(axis=0).transpose(0, 2, 1)
        if overwrite:
            grad[...] = total
        else:
            grad[...] += total

    def _split_weight_diff(self, diff4, columns, grad, overwrite):
        """add_weight_diff_per_sample's in-GEMM sum with the gradient's columns cut into
        blocks, each block summed over the samples in order (as the unsplit loop does) on
        one runner thread: the blocks' GEMMs are independent (kernels.sample_gemm)."""
        n, g = diff4.shape[:2]
        width = grad.shape[2]
        runner = self.ctx.chunk_runner
        # A few blocks per thread, so that a thread on a busy core takes fewer; each block
        # at least 64 columns wide (a GEMM's packing cost grows with the block count).
        threads = runner.threads if runner is not None else 2
        block = max(64, -(-width // (2 * max(1, threads))))

        def blocks(start, stop):
            for first in range(start * block, min(width, stop * block), block):
                cut = slice(first, min(width, first + block))
                stack = GemmStack(diff4, columns[:, :, cut].transpose(0, 1, 3, 2),
                                  grad[:, :, cut])
                for s in range(n):
                    for k in range(g):
                        stack((s, k), (s, k), k, overwrite and s == 0)
            if n == 0 and overwrite:
                grad[:, :, start * block:stop * block] = 0

        for_each_gemm(self.xp, -(-width // block), blocks, runner)

    def add_bias_diff(self, top_diff):
        """bias.diff += top_diff (N, O, P) summed over N and P, as a GEMV against ones (what
        Caffe does; several times faster than a numpy sum over two axes). On a GPU one
        reduction, written into the diff where it was cleared lazily."""
        if self.xp is not np:
            diff, overwrite = self.blobs[1].diff_for_write()
            if overwrite:
                top_diff.sum(axis=(0, 2), out=diff)
            else:
                diff += top_diff.sum(axis=(0, 2))
            return
        ones = self.buffer("ones", (top_diff.shape[2],))
        ones[...] = 1
        self.blobs[1].add_to_diff((top_diff @ ones).sum(axis=0))

    def add_weight_diff(self, a3, b3_transposed):
        """weight.diff += a3 @ b3_transposed, group by group (Caffe accumulates).

        On the CPU the product is formed transposed, (b3_transposed^T @ a3^T)^T: OpenBLAS
        runs these long-reduction GEMMs with a few output rows faster when the short side is
        the output's columns."""
        weight = self.blobs[0]
        g = self.group
        rows, cols = weight.shape[0] // g, weight.count // weight.shape[0]
        diff, overwrite = weight.diff_for_write()  # lazily cleared: the first write overwrites
        grad = diff.reshape(g, rows, cols)
        if self._weight_diff_in_gemm():
            for k in range(g):
                self.accumulate(a3[k], b3_transposed[k], grad[k], overwrite)
            return
        if self.xp is not np:  # one batched GEMM, into the diff where it was cleared lazily
            if overwrite:
                self.xp.matmul(a3, b3_transposed, out=grad)
            else:
                grad += self.xp.matmul(a3, b3_transposed)
            return
        grad_t = self.scratch(2, (g, cols, rows))
        self.xp.matmul(b3_transposed.transpose(0, 2, 1), a3.transpose(0, 2, 1), out=grad_t)
        if overwrite:
            grad[...] = grad_t.transpose(0, 2, 1)
        else:
            grad[...] += grad_t.transpose(0, 2, 1)


@register_layer
class Convolution(_ConvolutionBase):
    """Caffe's Convolution: top = weight * bottom (+ bias), per group; the path by
    `choice.convolution.choose_convolution` (its module docstring lists them)."""

    type = "Convolution"
    paths = {**conv_paths.CONVOLUTION_PATHS, **conv_fast_paths.PATHS}

    def weight_shape(self):
        return (self.num_output, self.channels // self.group) + self.kernel

    def output_hw(self, in_hw):
        return tuple(conv_output_size(s, k, p, st, d) for s, k, p, st, d in
                     zip(in_hw, self.kernel, self.pad, self.stride, self.dilation))

    def choose(self, geometry):
        return choose_convolution(geometry, self.choice_target(), self.rules)


@register_layer
class Deconvolution(_ConvolutionBase):
    """Caffe's Deconvolution: the transpose of Convolution (its forward is conv's backward);
    the path `col2im` (2 spatial axes) or `nd`."""

    type = "Deconvolution"
    paths = conv_paths.DECONVOLUTION_PATHS

    def weight_shape(self):
        return (self.channels, self.num_output // self.group) + self.kernel

    def output_hw(self, in_hw):
        return tuple(st * (s - 1) + d * (k - 1) + 1 - 2 * p for s, k, p, st, d in
                     zip(in_hw, self.kernel, self.pad, self.stride, self.dilation))

    def choose(self, geometry):
        return choose_deconvolution(geometry, self.choice_target(), self.rules)

"""Convolution and Deconvolution with Caffe's semantics, each a few large GEMMs per minibatch.

Convolution: weight (num_output, channels/group, kh, kw), bias (num_output,), as in a
.caffemodel. im2col unrolls the whole minibatch into columns (C*kh*kw, N*H_out*W_out) and one
batched matmul call (one GEMM per group) multiplies them by the weight; backward reuses the
forward's columns for the weight gradient and folds the column gradient back with col2im.

Deconvolution (Caffe's transposed convolution): weight (channels, num_output/group, kh, kw);
its forward is the convolution's input-gradient computation, its backward the convolution's
forward and weight gradient. Output size: stride*(in-1) + dilation*(kernel-1) + 1 - 2*pad.

The axes before the channel axis (`axis`, default 1) are batch axes. With 2 spatial axes after
it the layers use the kernels below; other counts (1-D, 3-D, ...) go through the generic N-D
code in convolution_nd.py. Memory: each layer keeps, per bottom, the columns (Convolution) or
the transposed input (Deconvolution) of its last forward, so backward needs no second im2col;
that is N times the single-image buffer Caffe keeps. Stride-1 kxk convolutions where it
measures faster run as shifted GEMMs on the padded input instead (kernels.shift_conv): no
column matrix; they keep kw copies of the padded input. 3x3 stride-1 convolutions that
the rule picks run as Winograd F(2x2, 3x3) (kernels.winograd) and keep their transformed
input, 4x the input. Small planes at a large batch build one sample's columns at a time in
the cache (kernels.sample_columns) and keep none.
"""

from __future__ import annotations

from math import ceil, prod

import numpy as np

from ..blob import Blob
from ..cpu.parallel import for_each_chunk, runner_or_default
from ..fillers import fill_blob, filler_rng
from ..kernels import col2im, conv_output_size, im2col, sample_columns, shift_conv, winograd
from ..kernels.gemm import available as gemm_available
from ..kernels.gemm import gemm_accumulate
from ..kernels.im2col import batch_last_image_shape, col2im_batch_last, im2col_batch_last
from ..kernels.sample_gemm import for_each_gemm
from . import convolution_nd
from .base import Layer
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
    """What Convolution and Deconvolution share: parameters, blobs, shapes, buffers."""

    min_bottom = 1
    min_top = 1
    equal_num_bottom_top = True

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

    # -- shapes and buffers ----------------------------------------------------------------
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
        self.image_in = (self.num, self.channels) + self.in_hw

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

    def drop_buffers(self, prefix: str) -> None:
        """Forget the kept arrays whose role starts with `prefix` (their memory is freed)."""
        for role in [r for r in self._buffers if r.startswith(prefix)]:
            del self._buffers[role]

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
        """im2col of an (N, C, H, W) image into `out`, on this layer's chunk runner."""
        return im2col(image, *self.geometry(), out=out,
                      padded=self.padded_buffer(image.shape), runner=self.ctx.chunk_runner)

    def col2im(self, columns, image):
        """col2im of `columns` overwriting `image` (N, C, H, W), on this layer's runner."""
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

    def accumulate(self, a, b, c, overwrite=False):
        """c += a @ b for 2-D views: inside the BLAS GEMM (beta = 1) on numpy, no temporary;
        c = a @ b with `overwrite` (beta = 0)."""
        if self.xp is np:
            gemm_accumulate(a, b, c, lambda shape: self.scratch(2, shape), overwrite)
        elif overwrite:
            self.xp.matmul(a, b, out=c)
        else:
            c += self.xp.matmul(a, b)

    #: Spread independent per-sample GEMMs (and the row blocks of a per-sample weight
    #: gradient) over the chunk runner's threads, one BLAS thread each (kernels.sample_gemm):
    #: no wait inside a GEMM for a thread whose core is busy elsewhere.
    split_sample_gemms = True
    #: ... several samples to a chunk, so that a chunk's GEMMs do at least about this many
    #: flops (at most a quarter of the samples per thread, for balance on a busy core): a
    #: chunk costs ~10 us of Python and numpy calls, as much as one of LeNet conv1's GEMMs
    #: (forward, b64: 1.09-1.13 ms one sample per chunk, 0.82-0.99 ms seven). numpy runs a
    #: stacked matmul as one GEMM per sample, so the bits do not depend on it.
    #: 0: one sample per chunk.
    sample_chunk_flops = 4e6

    def sample_grain(self, count: int, flops_each: float) -> int:
        """Samples per chunk for `count` independent GEMMs of `flops_each` flops each."""
        if self.sample_chunk_flops <= 0 or flops_each <= 0:
            return 1
        threads = runner_or_default(self.ctx.chunk_runner).threads
        wanted = ceil(self.sample_chunk_flops / flops_each)
        return max(1, min(wanted, count // (4 * threads)))

    def sample_gemms(self, a3, x4, out4, out=None, bias=None):
        """out4[s] = a3 @ x4[s] for every sample s (numpy matmul broadcasting over groups),
        then out[s] += bias where given (`out`: out4 as (N, O, P))."""
        xp = self.xp

        def samples(start, stop):
            xp.matmul(a3, x4[start:stop], out=out4[start:stop])
            if bias is not None:
                xp.add(out[start:stop], bias, out=out[start:stop])

        if self.split_sample_gemms:
            flops = 2.0 * a3.shape[0] * a3.shape[1] * a3.shape[2] * x4.shape[-1]
            for_each_gemm(xp, x4.shape[0], samples, self.ctx.chunk_runner,
                          grain=self.sample_grain(x4.shape[0], flops))
            return
        xp.matmul(a3, x4, out=out4)
        if bias is not None:
            self.copy_by_sample(out, out, bias)

    #: Accumulate the weight gradient inside the GEMM (BLAS beta = 1; numpy only) where
    #: `_weight_diff_in_gemm` says it pays.
    weight_diff_in_gemm = True
    #: ... always from this many weight elements per group (the scratch-and-add's memory
    #: traffic then dominates), else only when the weight has at least as many rows as
    #: columns. Measured (bench_conv_paths.py): beta = 1 writes the (rows, cols) product,
    #: the orientation OpenBLAS runs 5-10% slower than the transposed one when there are few
    #: rows (64x256, 64x576, 96x800: backward +5-10%), while a 512x2048 or 2048x1024 weight
    #: gradient at 7x7 takes half the time.
    weight_diff_in_gemm_from = 1 << 18

    def _weight_diff_in_gemm(self) -> bool:
        """Whether this layer's weight gradient goes into the diff inside the GEMM."""
        if not self.weight_diff_in_gemm or self.xp is not np:
            return False
        weight = self.blobs[0]
        rows = weight.shape[0] // self.group
        cols = weight.count // weight.shape[0]
        return rows >= cols or rows * cols >= self.weight_diff_in_gemm_from

    def add_weight_diff_per_sample(self, diff4, columns):
        """weight.diff += sum over samples s of diff4[s] @ columns[s]^T, per group:
        diff4 (N, group, O/group, P), columns (N, group, K, P). Sample by sample, as Caffe
        sums: inside the GEMM, or as one stack of transposed products and a sum."""
        weight = self.blobs[0]
        n, g, og = diff4.shape[:3]
        diff, overwrite = weight.diff_for_write()  # lazily cleared: the first write overwrites
        grad = diff.reshape(g, og, -1)
        if self._weight_diff_in_gemm():
            if self.split_sample_gemms and self.xp is np:
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

        if self.split_sample_gemms:
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
        threads = runner.threads if runner is not None else 2
        # A few blocks per thread, so that a thread on a busy core takes fewer; each block
        # at least 64 columns wide (a GEMM's packing cost grows with the block count).
        block = max(64, -(-width // (2 * max(1, threads))))

        def blocks(start, stop):
            for first in range(start * block, min(width, stop * block), block):
                cut = slice(first, min(width, first + block))
                for s in range(n):
                    for k in range(g):
                        gemm_accumulate(diff4[s, k], columns[s, k, cut].transpose(),
                                        grad[k, :, cut], None, overwrite and s == 0)
            if n == 0 and overwrite:
                grad[:, :, start * block:stop * block] = 0

        for_each_gemm(self.xp, -(-width // block), blocks, runner)

    def add_bias_diff(self, top_diff):
        """bias.diff += top_diff (N, O, P) summed over N and P, as a GEMV against ones (what
        Caffe does; several times faster than a numpy sum over two axes)."""
        ones = self.buffer("ones", (top_diff.shape[2],))
        ones[...] = 1
        self.blobs[1].add_to_diff((top_diff @ ones).sum(axis=0))

    def add_weight_diff(self, a3, b3_transposed):
        """weight.diff += a3 @ b3_transposed, group by group (Caffe accumulates).

        The product is formed transposed, (b3_transposed^T @ a3^T)^T: OpenBLAS runs these
        long-reduction GEMMs with a few output rows 1.3-2x faster when the short side is the
        output's columns (measured on conv shapes with 16-64 output channels)."""
        weight = self.blobs[0]
        g = self.group
        rows, cols = weight.shape[0] // g, weight.count // weight.shape[0]
        diff, overwrite = weight.diff_for_write()  # lazily cleared: the first write overwrites
        grad = diff.reshape(g, rows, cols)
        if self._weight_diff_in_gemm():
            for k in range(g):
                self.accumulate(a3[k], b3_transposed[k], grad[k], overwrite)
            return
        grad_t = self.scratch(2, (g, cols, rows))
        self.xp.matmul(b3_transposed.transpose(0, 2, 1), a3.transpose(0, 2, 1), out=grad_t)
        if overwrite:
            grad[...] = grad_t.transpose(0, 2, 1)
        else:
            grad[...] += grad_t.transpose(0, 2, 1)


@register_layer
class Convolution(_ConvolutionBase):
    """Caffe's Convolution: top = weight * bottom (+ bias), per group, via im2col + GEMM.

    Three GEMM layouts, picked per shape in reshape. "whole batch": one GEMM per group over
    columns (C*kh*kw, N*P), P = output positions per sample, then one transposing copy to
    (N, O, P) (and one back in backward). "batch last": the same with the columns ordered
    (P, N) (kernels.im2col_batch_last), for small planes, where im2col and col2im then copy
    runs of W_out*N rather than W_out elements. "per sample": one GEMM per sample and group,
    each writing its sample's output in place, with no transposing copies; on OpenBLAS it
    wins from about 2048 output positions per sample, and from 196 for a 1x1, stride 1, pad 0
    convolution, which then needs no im2col at all (its columns are the input itself), and
    from 256 for a kernel of at most 32 column rows per group (few input channels).
    A 1x1 convolution (pad 0, dilation 1, any stride) with at least `direct_from` output
    positions runs "direct": per-sample GEMMs on the input (subsampled first for a stride),
    no im2col or col2im. On numpy every layout adds the weight gradient into the diff inside
    the GEMM (BLAS beta = 1, kernels.gemm) where that measures faster (`_weight_diff_in_gemm`),
    sample by sample where the GEMMs are per sample. The per-sample and direct layouts hand
    their GEMMs to the chunk runner's threads, one BLAS thread each (`split_sample_gemms`,
    kernels.sample_gemm). "shifted" (`shift_gemm`, stride 1, mid-size planes with at least
    32 channels per group): no im2col; per kernel offset one GEMM on a shifted view of the
    padded, channel-major input (kernels.shift_conv), split into fixed column blocks over
    the runner's threads. "Winograd" (`winograd`, 3x3, stride 1, dilation 1): F(2x2, 3x3)
    on 4x4 input tiles (kernels.winograd), 16 GEMMs with 2.25x fewer multiplications, or
    F(4x4, 3x3) on 6x6 tiles (`winograd_tile`), 36 GEMMs with 4x fewer.
    "Per-sample columns" (`sample_columns`): where the whole batch's columns would be far
    larger than the cache and one sample's fit in it (small planes at a large batch), each
    sample's columns are built by a compiled loop, multiplied and dropped while in the
    cache, and rebuilt in backward (kernels.sample_columns); no column matrix is kept.
    """

    type = "Convolution"
    #: Output positions per sample from which the per-sample layout is used (measured).
    per_sample_from = 2048
    per_sample_from_pointwise = 196
    #: ... and from `per_sample_from_few_rows` positions for a kxk kernel whose columns have
    #: at most `per_sample_upto_rows` rows per group (few channels: LeNet's conv1, 25 rows at
    #: 24x24, fwd+bwd 0.71-0.80 of whole batch; 3x3x3 at 32x32 0.80; at 8x8 it lost, 1.44).
    per_sample_upto_rows = 32
    per_sample_from_few_rows = 256
    #: A 1x1, pad 0, dilation 1 convolution with at least this many output positions per
    #: sample runs as direct GEMMs on its input (any stride; see _forward_direct).
    direct_from = 196
    #: Whole-batch columns are ordered batch last for outputs of at most this many positions
    #: per sample (measured, fwd+bwd: CIFAR-10 conv2 39 -> 32 ms, conv3 14.3 -> 10.8 ms,
    #: GoogleNet 7x7 and 14x14 layers 2-8% faster; the output transposes cost more than the
    #: im2col saves on larger planes, e.g. CIFAR-10 conv1 at 32x32 15.3 -> 17.3 ms).
    batch_last_upto = 256
    #: Shifted GEMMs on the padded input instead of im2col (kernels.shift_conv), for stride
    #: 1: None by the rule below, True forced (any stride-1 kernel), False never. Off by
    #: default: inside whole nets on a quiet node the layers the rule takes ran slower than
    #: on im2col (bench_vs_caffe.py, best idle fwd / bwd ms: AlexNet conv2 52.3 / 98.5
    #: against 33.8 / 65.6, GoogleNet inception_3b/3x3 30.4 / 64.5 against 27.5 / 44.8); they
    #: win only while other processes hold the cores (0.4-0.9) and keep no column matrix.
    shift_gemm = False
    #: The rule, measured (bench_conv_paths.py --compare shift, fwd+bwd): a kxk kernel (not
    #: 1x1) with at least this many input channels per group (3-channel conv1 layers lost,
    #: 1.0-1.6; GoogleNet's 16-channel 5x5 layers lost 1.1-1.5 on a quiet machine, won
    #: 0.5 on a loaded one) ...
    shift_from_channels = 32
    #: ... at most this many full-output positions computed per position kept (CIFAR-10
    #: conv3, 8x8 with pad 2, computes 2.25 and lost, 1.3-1.4) ...
    shift_max_waste = 2.0
    #: ... on planes the per-sample layout does not take (56x56 GoogleNet conv2/3x3 and
    #: ResNet res2a_branch2b: 0.8-1.2, no clear gain), with a full output of at least this
    #: many positions (N*Hp*Wp). Below it the shifted path won only while other processes
    #: held the cores (0.39-0.8) and lost on a quiet node, where im2col's one big GEMM is
    #: fast: AlexNet conv3-5 at batch 8 (1800) 1.40-1.80, GoogleNet inception_4e/3x3 (2048)
    #: 1.32-1.53, ResNet-50 res3a/res4a_branch2b at batch 4 (3600, 1024) 1.02-1.25 and
    #: 1.66-1.82, 7x7 planes (324, 648) 2.3-3.8. From 6000 (CIFAR-10 conv2 40000, AlexNet
    #: conv2 7688, GoogleNet's 28x28 layers 7200) it ties on a quiet node (0.94-1.16) and
    #: wins on a loaded one (0.5-0.9), and keeps no column matrix.
    shift_from_length = 6000
    #: Stack the kernel's width offsets into each GEMM's reduction (kw copies of the input
    #: kept, kh GEMMs) rather than one GEMM per offset (1 copy, kh*kw GEMMs).
    shift_stack = True
    #: Keep the stacked input from forward to backward (kw copies of the padded input per
    #: layer); off: a per-call scratch, rebuilt from the bottom in backward.
    shift_keep_input = True
    #: Winograd F(2x2, 3x3) (kernels.winograd) for 3x3, stride-1, dilation-1 kernels: None
    #: by the rule below, True forced where the geometry allows, False never; numpy only.
    #: It keeps the transformed input, 16/4 = 4x the input (im2col's columns: 9x).
    winograd = None
    #: The rule (bench_conv_paths.py --compare winograd, fwd+bwd Winograd / im2col, one
    #: thread and two, five runs on a 2-core machine with other work running): at least
    #: this many input channels per group (the benchmark nets' 3x3 layers all have >= 64;
    #: few channels make short GEMM reductions) ...
    winograd_from_channels = 32
    #: ... with output positions per sample from `winograd_from_positions` to below
    #: `winograd_below_positions`: 28x28 planes about tied on a quiet machine and won with
    #: other processes running (quiet: GoogleNet 3a/3x3 0.94-1.28, 3b/3x3 0.77-1.09,
    #: ResNet-50 res3a_branch2b 0.80-0.98; loaded 0.63-0.98); 56x56 planes take the
    #: per-sample im2col layout and tied either way (conv2/3x3 0.78-1.08, res2a_branch2b
    #: 0.92-1.19); 14x14 and 13x13 planes lost on a quiet machine (GoogleNet 4a-4e
    #: 1.10-1.40, AlexNet conv3-5 1.11-1.28, ResNet-50 res4a_branch2b 1.00-1.13) though they
    #: won under load (0.58-0.86); 7x7 lost (5a/5b 1.5-1.9, res5a_branch2b 1.5-1.9: the
    #: weight's transforms do not shrink with the plane).
    winograd_from_positions = 512
    winograd_below_positions = 2048
    #: ... at least this many 2x2 tiles in the batch (the weight's transforms, forward and
    #: backward, cost the same at any batch size) ...
    winograd_from_tiles = 256
    #: ... and at most this many positions computed per output position kept (odd sizes
    #: compute a partial last tile: 13x13 computes 1.16, 27x27 1.08, 3 x 200 1.33).
    winograd_max_waste = 1.1
    #: With the transforms as compiled loops (kernels.winograd_loops, numba importable) the
    #: rule is wider (positions from, below; tiles from; waste): fwd+bwd Winograd / im2col,
    #: two threads, two runs (load 1.3-1.7): 56x56 conv2/3x3 0.79-0.89, res2a 0.79-0.81;
    #: 28x28 3a/3b 0.56-0.86, res3a 0.83-0.91; 14x14 4a-4e 0.65-0.87, res4a (196 tiles)
    #: 0.78-0.92; 13x13 AlexNet conv3-5 (1.16 computed) 0.69-0.86; 7x7 still lost (5a/5b
    #: 1.08-1.15, res5a 1.15-1.24).
    winograd_compiled_rule = (169, 3200, 196, 1.2)
    #: The output tile of a Winograd layer: 4 (F(4x4, 3x3): 36 GEMMs on 6x6 tiles, 4x
    #: fewer multiplications than a direct convolution against 2.25x, and V and M 9/16 the
    #: size) where the compiled F(4x4) transforms load and the 4x4 tiles cover the output
    #: with at most `winograd4_max_waste` computed per output kept; else 2. 2 or 4 force it
    #: (4 only with the compiled transforms).
    winograd_tile = None
    winograd4_max_waste = 1.1
    _wino = None
    #: im2col + GEMM sample by sample, each sample's columns built and used in the cache
    #: and rebuilt in backward (kernels.sample_columns; numpy, numba importable): None by
    #: the rule below, True forced (any kernel but a 1x1 with pad 0; a layer Winograd takes
    #: stays Winograd's), False never. Winograd's rule is asked first.
    sample_columns = None
    #: The rule (bench_conv_paths.py --compare sample-columns, best of 15-16, fwd+bwd
    #: after/before, 2 threads; in-net figures from `mgcaffe time`, alternated): one
    #: sample's columns at most this many bytes (the cache). GoogleNet's and ResNet-50's
    #: 7x7 stride-2 conv1 (7.4 MB a sample) lost inside their nets, their weight-only
    #: backward 7-13 ms -> 12-25 ms (it rebuilds columns im2col had written once) ...
    sample_columns_upto_bytes = 4 << 20
    #: ... and whole-batch columns of at least this many bytes (far past the cache):
    #: CIFAR-10 quick at batch 100, conv1 (31 MB) 0.68 and conv2 (82 MB) 0.73 idle, 0.52
    #: and 0.60 with two busy processes; whole CIFAR-10 quick 105-113 -> 85-94 ms ...
    sample_columns_from_bytes = 24 << 20
    #: ... or a per-sample GEMM of at least this many flops (2 * weights * positions):
    #: GoogleNet's 28x28 5x5 layers (20-120 MFLOP) 0.69-0.77; LeNet's conv1 and conv2 (0.6
    #: and 3 MFLOP) lost, 1.1-1.3, CIFAR-10's conv3 (6.5) tied. Against Winograd the 3x3
    #: layers were not clear: ResNet-50's res3 layers 0.81-0.95 in one A/B, but GoogleNet's
    #: inception_3b/3x3 went from 0.83 to 1.23 of Caffe's time in bench_vs_caffe, so
    #: Winograd keeps the layers its rule takes. The partial-gradient limit keeps out 14x14
    #: and 7x7 3x3 layers (1.0-2.1 against Winograd in isolation).
    sample_columns_from_flops = 16e6
    _sample_cols = None

    def weight_shape(self):
        return (self.num_output, self.channels // self.group) + self.kernel

    def output_hw(self, in_hw):
        return tuple(conv_output_size(s, k, p, st, d) for s, k, p, st, d in
                     zip(in_hw, self.kernel, self.pad, self.stride, self.dilation))

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if self.nd:
            return
        self._spatial = self.out_hw[0] * self.out_hw[1]
        self._image_shape = (self.num, self.channels) + self.in_hw
        self._pointwise = (self.kernel == (1, 1) and self.stride == (1, 1)
                           and self.pad == (0, 0))
        self._sample_cols = None
        if self._reshape_winograd(len(bottom)):
            return
        self._sample_cols = self._sample_columns_geometry()
        if self._sample_cols is not None:  # columns per sample, in per-call scratch
            self._shift, self._direct = None, False
            for kept in ("columns", "shift_input", "subsampled"):
                self.drop_buffers(kept)
            return
        self._shift = self._shift_geometry()
        # The other path's kept arrays go (a reshape can switch paths).
        self.drop_buffers("columns" if self._shift is not None else "shift_input")
        if self._shift is not None:  # shifted GEMMs on the padded input, no columns
            self._direct = False
            if not self.shift_keep_input:
                self.drop_buffers("shift_input")
            self._shift_inputs = [self.buffer(f"shift_input{i}",
                                              (self._shift.rows, self._shift.row))
                                  if self.shift_keep_input else None
                                  for i in range(len(bottom))]
            return
        # 1x1, pad 0, dilation 1: plain GEMMs on the input (subsampled first for a stride),
        # no im2col/col2im (_forward_direct, _backward_direct).
        self._direct = (self.kernel == (1, 1) and self.pad == (0, 0)
                        and self.dilation == (1, 1)
                        and self._spatial >= self.direct_from)
        if self._direct:
            strided = self.stride != (1, 1)
            self._subsampled = [self.buffer(f"subsampled{i}",
                                            (self.num, self.channels, self._spatial))
                                if strided else None for i in range(len(bottom))]
            self._image_shape = (self.num, self.channels) + self.in_hw
            return
        self._per_sample = self._spatial >= (self.per_sample_from_pointwise if self._pointwise
                                             else self.per_sample_from)
        few_rows = (not self._pointwise and self.channels // self.group * self.kernel[0]
                    * self.kernel[1] <= self.per_sample_upto_rows)
        self._per_sample |= few_rows and self._spatial >= self.per_sample_from_few_rows
        self._batch_last = not self._per_sample and self._spatial <= self.batch_last_upto
        rows = self.channels * self.kernel[0] * self.kernel[1]
        # One column matrix per bottom: backward's weight gradient reads the forward's, then
        # the same buffer takes the column gradient (memory: one column matrix, not two).
        self._cols = [None if self._per_sample and self._pointwise
                      else self.buffer(f"columns{i}", (rows, self.num * self._spatial))
                      for i in range(len(bottom))]
        self._cols_hold_input = [False] * len(bottom)
        self._image_shape = (self.num, self.channels) + self.in_hw

    def _sample_columns_geometry(self):
        """The per-sample columns' shapes (kernels.sample_columns) where this layer runs
        them, else None: `sample_columns` True forces them (numpy, numba importable; any
        kernel but 1x1 with pad 0), False never; None by the rule, unless the shifted GEMMs
        are forced (Winograd's path is taken before this is asked)."""
        if self.xp is not np or self.sample_columns is False or \
                (self.kernel == (1, 1) and self.pad == (0, 0)) or not sample_columns.available():
            return None
        if not self.sample_columns and (self.shift_gemm or not self._sample_columns_rule()):
            return None
        return sample_columns.Geometry(self._image_shape, self.num_output, self.group,
                                       self.kernel, self.pad, self.stride, self.dilation,
                                       self.out_hw)

    def _sample_columns_rule(self) -> bool:
        """One sample's columns at most `sample_columns_upto_bytes`, the chunks' partial
        weight gradients at most a quarter of the whole batch's columns, and either those
        columns at least `sample_columns_from_bytes` or a GEMM of at least
        `sample_columns_from_flops` per sample."""
        item = np.dtype(self.dtype).itemsize
        one = self.channels * self.kernel[0] * self.kernel[1] * self._spatial * item
        partials = self._sample_chunks() * self.blobs[0].count * item
        flops = 2 * self.blobs[0].count * self._spatial
        return one <= self.sample_columns_upto_bytes and 4 * partials <= one * self.num and \
            (one * self.num >= self.sample_columns_from_bytes or
             flops >= self.sample_columns_from_flops)

    def _sample_chunks(self) -> int:
        return sample_columns.chunk_count(self.num)

    def _forward_sample_columns(self, bottom, top):
        g = self._sample_cols
        columns = self.scratch(0, sample_columns.columns_shape(g, self._sample_chunks()))
        bias = self.blobs[1].data if self.bias_term else None
        for b, t in zip(bottom, top):
            top3 = t.data.reshape(self.num, self.num_output, g.positions)
            sample_columns.forward(b.data.reshape(self._image_shape),
                                   self._weight3(self.blobs[0].data), top3, g, columns, bias,
                                   self.ctx.chunk_runner)

    def _backward_sample_columns(self, top, propagate_down, bottom):
        g = self._sample_cols
        weight = self.blobs[0]
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        chunks = self._sample_chunks()
        for t, down, b in zip(top, propagate_down, bottom):
            top_diff = t.diff.reshape(self.num, self.num_output, g.positions)
            if want_bias:
                self.add_bias_diff(top_diff)
            if not (want_weight or down):
                continue
            columns = self.scratch(0, sample_columns.columns_shape(g, chunks))
            partials = diff = None
            overwrite = False
            if want_weight:
                partials = self.scratch(2, (chunks, self.group, g.rows // self.group,
                                            self.num_output // self.group))
                diff, overwrite = weight.diff_for_write()
                diff = self._weight3(diff)
            sample_columns.backward(b.data.reshape(self._image_shape),
                                    top_diff, self._weight3(weight.data), g, columns,
                                    partials, diff, overwrite,
                                    b.diff.reshape(self._image_shape) if down else None,
                                    self.ctx.chunk_runner)

    def _reshape_winograd(self, bottoms: int) -> bool:
        """Take the Winograd path where `_winograd_geometry` says so (True), freeing the other
        paths' kept arrays; else free its own."""
        self._wino = self._winograd_geometry()
        if self._wino is None:
            self.drop_buffers("winograd_input")
            return False
        self.drop_buffers("columns")
        self.drop_buffers("shift_input")
        self._shift, self._direct = None, False
        # V of each bottom, kept for backward's weight gradient (then it takes dV).
        self._wino_inputs = [self.buffer(f"winograd_input{i}", (self._wino.input_elements(),))
                             for i in range(bottoms)]
        self._wino_hold_input = [False] * bottoms
        return True

    def _winograd_geometry(self):
        """The Winograd layout (kernels.winograd; its tile by `_winograd_tile`) where this
        layer runs it, else None: `winograd` True forces it (3x3, stride 1, dilation 1 only),
        False never; None by the rule, unless the shifted GEMMs were opted into."""
        if self.xp is not np or self.winograd is False or \
                not winograd.applies(self.kernel, self.stride, self.dilation):
            return None
        # The rule yields to a shifted-GEMM path the user opted into (shift_gemm None/True);
        # the tile is asked only then (it may import numba).
        if not (self.winograd or (self.shift_gemm is False and self._winograd_rule())):
            return None
        return winograd.Geometry(self._image_shape, self.pad, self.num_output, self.group,
                                 self._winograd_tile())

    def _winograd_tile(self) -> int:
        """4 or 2: see `winograd_tile`."""
        if self.winograd_tile in (2, 4):
            if self.winograd_tile == 4 and not winograd.compiled(4):
                raise self.error("winograd_tile 4 needs the compiled F(4x4, 3x3) transforms "
                                 "(numba)")
            return self.winograd_tile
        ho, wo = self.out_hw
        waste = (4 * -(-ho // 4)) * (4 * -(-wo // 4)) / max(1, ho * wo)
        return 4 if waste <= self.winograd4_max_waste and winograd.compiled(4) else 2

    def _winograd_rule(self) -> bool:
        """Whether the measured rule takes this (3x3, stride 1) layer onto Winograd."""
        if self.channels // self.group < self.winograd_from_channels:
            return False  # asked first: only layers that might take the path import numba
        th, tw = -(-self.out_hw[0] // 2), -(-self.out_hw[1] // 2)
        low, high, tiles, waste = (self.winograd_compiled_rule if winograd.compiled() else
                                   (self.winograd_from_positions, self.winograd_below_positions,
                                    self.winograd_from_tiles, self.winograd_max_waste))
        return (low <= self._spatial < high
                and self.num * th * tw >= tiles
                and 4 * th * tw <= waste * self._spatial)

    #: Scratch slots of the Winograd temporaries (by kernels.winograd's names).
    _wino_slots = {"product": 0, "padded": 1, "columns": 4, "tiles": 5}

    def _wino_buffer(self, name, shape):
        return self.scratch(self._wino_slots[name], shape)

    def _forward_winograd(self, bottom, top):
        """top = A^T [(G g G^T) (x) (B^T d B)] A per 2x2 output tile (+ bias)."""
        g, runner = self._wino, self.ctx.chunk_runner
        u = winograd.transform_weight(self.blobs[0].data, self.scratch(3, g.weight_shape()))
        bias = self.blobs[1].data if self.bias_term else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            winograd.forward(b.data.reshape(self._image_shape), u, g, self._wino_inputs[i],
                             self._wino_buffer, t.data.reshape((self.num, self.num_output)
                                                               + self.out_hw), bias, runner)
            self._wino_hold_input[i] = True

    def _backward_winograd(self, top, propagate_down, bottom):
        """Weight gradient from the V forward kept (rebuilt after a backward took it for
        dV), input gradient through U^T; the adjoint transforms (kernels.winograd)."""
        g, runner = self._wino, self.ctx.chunk_runner
        weight = self.blobs[0]
        u = None  # the transformed weight, made once for every bottom that wants a diff
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        for i, (t, down, b) in enumerate(zip(top, propagate_down, bottom)):
            top_diff = t.diff.reshape((self.num, self.num_output) + self.out_hw)
            if want_bias:
                self.add_bias_diff(top_diff.reshape(self.num, self.num_output, -1))
            if not (want_weight or down):
                continue
            dm = winograd.output_grad(top_diff, g, self._wino_buffer, runner)
            v = self._wino_inputs[i]
            if want_weight:
                if not self._wino_hold_input[i]:
                    winograd.fill_input(b.data.reshape(self._image_shape), g, v,
                                          self._wino_buffer, runner)
                    self._wino_hold_input[i] = True
                du = winograd.transformed_weight_grad(dm, v, g, self.scratch(2, g.weight_shape()),
                                                      runner)
                diff, overwrite = weight.diff_for_write()
                winograd.weight_grad(du, diff.reshape(weight.shape), overwrite)
            if down:
                if u is None:
                    u = winograd.transform_weight(weight.data, self.scratch(3, g.weight_shape()))
                self._wino_hold_input[i] = False  # V's memory takes the tile gradients
                winograd.input_grad(dm, u, g, v, self._wino_buffer,
                                    b.diff.reshape(self._image_shape), runner)

    def _shift_geometry(self):
        """The shifted-GEMM layout (kernels.shift_conv) where this layer runs it, else None:
        `shift_gemm` True forces it (stride 1 only), False never; None by the rule."""
        if self.xp is not np or self.stride != (1, 1) or self.shift_gemm is False:
            return None
        stack = self.kernel[1] if self.shift_stack else 1
        geometry = shift_conv.ShiftGeometry(self._image_shape, self.kernel, self.pad,
                                            self.dilation, self.group, stack)
        if self.shift_gemm:
            return geometry
        if self.kernel == (1, 1) or not gemm_available(self.dtype):
            return None
        if self.channels // self.group < self.shift_from_channels:
            return None
        if self._spatial >= self.per_sample_from or geometry.length < self.shift_from_length:
            return None
        return geometry if geometry.waste() <= self.shift_max_waste else None

    def _packed_weight(self):
        """The weight regrouped by kernel offset (shift_conv.pack_weight), in scratch 3."""
        g = self._shift
        packed = self.scratch(3, (g.kh, g.kw // g.stack, self.num_output,
                                  self.channels // self.group * g.stack))
        shift_conv.pack_weight(self.blobs[0].data, g, packed)
        return packed

    def _stacked_input(self, b, kept):
        """Bottom b's stacked, shifted copies (shift_conv.fill_stacked_input), into `kept`
        or (shift_keep_input off) into scratch 4."""
        g = self._shift
        xs = kept if kept is not None else self.scratch(4, (g.rows, g.row))
        shift_conv.fill_stacked_input(b.data.reshape(self._image_shape), xs, g,
                                      self.ctx.chunk_runner)
        return xs

    def _forward_shift(self, bottom, top):
        """top = crop(sum over kernel offsets of W[i, j] @ shifted input) (+ bias)."""
        g, runner = self._shift, self.ctx.chunk_runner
        packed = self._packed_weight()
        y_full = self.scratch(0, (self.num_output, g.length))
        bias = self.blobs[1].data if self.bias_term else None
        for b, t, kept in zip(bottom, top, self._shift_inputs):
            xs = self._stacked_input(b, kept)
            shift_conv.forward_full(packed, xs, y_full, g, runner)
            out = t.data.reshape((self.num, self.num_output) + self.out_hw)
            shift_conv.crop_output(y_full, g, out, bias, runner)

    def _backward_shift(self, top, propagate_down, bottom):
        """Weight and input gradients from the input forward kept (shift_conv)."""
        g, runner = self._shift, self.ctx.chunk_runner
        weight = self.blobs[0]
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        packed = None
        for t, down, b, kept in zip(top, propagate_down, bottom, self._shift_inputs):
            top_diff = t.diff.reshape((self.num, self.num_output) + self.out_hw)
            if want_bias:
                self.add_bias_diff(top_diff.reshape(self.num, self.num_output, -1))
            if not (want_weight or down):
                continue
            dy_ext = self.scratch(0, (self.num_output, g.row))  # zeros, then the full dy
            shift_conv.spread_output_grad(top_diff, g, dy_ext, runner)
            if want_weight:
                # Rebuilt from the bottom (as Caffe rebuilds its columns) unless kept.
                xs = kept if kept is not None else self._stacked_input(b, None)
                grad = self.scratch(2, shift_conv.grad_shape(g, self.num_output))
                shift_conv.weight_grad_full(dy_ext[:, g.row - g.length:], xs, g, grad,
                                            runner)
                diff, overwrite = weight.diff_for_write()
                shift_conv.unpack_weight_grad(grad, g, diff.reshape(weight.shape), overwrite)
            if down:
                packed = self._packed_weight() if packed is None else packed
                dxs = self.scratch(1, (g.rows, g.length))
                shift_conv.input_grad_full(packed, dy_ext, dxs, g, runner)
                shift_conv.fold_input_grad(dxs, g, b.diff.reshape(self._image_shape), runner)

    def _fill_columns(self, i, b):
        """im2col of bottom i into its column matrix (unless it already holds it)."""
        cols = self._cols[i]
        if cols is not None and not self._cols_hold_input[i]:
            image = b.data.reshape(self._image_shape)
            if self._batch_last:
                im2col_batch_last(image, *self.geometry(), out=cols,
                                  image=self._batch_last_image(), runner=self.ctx.chunk_runner)
            else:
                self.im2col(image, cols)
            self._cols_hold_input[i] = True
        return cols

    def _batch_last_image(self):
        """The (C, H + 2*ph, W + 2*pw, N) scratch of the batch-last layout."""
        return self.scratch(1, batch_last_image_shape(self._image_shape, self.pad))

    def _by_sample(self, matrix):
        """A (rows, N*P) GEMM operand or result, in this layout's column order, as an
        (N, rows, P) view: columns (n, p) in the whole-batch layout, (p, n) batch last."""
        rows, n, p = matrix.shape[0], self.num, self._spatial
        if self._batch_last:
            return matrix.reshape(rows, p, n).transpose(2, 0, 1)
        return matrix.reshape(rows, n, p).transpose(1, 0, 2)

    def _weight3(self, array):
        """A weight-shaped array as (group, num_output/group, channels/group*kh*kw)."""
        return self.grouped(array.reshape(self.num_output, -1))

    def _sample_columns(self, b, cols):
        """The columns as (N, group, rows/group, P): per-sample GEMM operands (views)."""
        n, g, p = self.num, self.group, self._spatial
        if cols is None:  # 1x1, stride 1, pad 0: the input is its own column matrix
            return b.data.reshape(n, g, self.channels // g, p)
        return cols.reshape(g, cols.shape[0] // g, n, p).transpose(2, 0, 1, 3)

    def forward(self, bottom, top):
        if self.nd:
            return convolution_nd.conv_forward(self, bottom, top)
        if self._wino is not None:
            return self._forward_winograd(bottom, top)
        if self._shift is not None:
            return self._forward_shift(bottom, top)
        if self._direct:
            return self._forward_direct(bottom, top)
        if self._sample_cols is not None:
            return self._forward_sample_columns(bottom, top)
        xp, weight = self.xp, self.blobs[0].data
        o, n, p = self.num_output, self.num, self._spatial
        for i, (b, t) in enumerate(zip(bottom, top)):
            self._cols_hold_input[i] = False  # new data: the columns must be rebuilt
            cols = self._fill_columns(i, b)
            out = t.data.reshape(n, o, p)
            bias = self.blobs[1].data[None, :, None] if self.bias_term else None
            if self._per_sample:
                self.sample_gemms(self._weight3(weight), self._sample_columns(b, cols),
                                  out.reshape(n, self.group, o // self.group, p), out, bias)
                continue
            product = self.scratch(0, (o, n * p))
            xp.matmul(self._weight3(weight), self.grouped(cols), out=self.grouped(product))
            # The one transposing copy to (N, O, P), with the bias added on the way.
            self.copy_by_sample(out, self._by_sample(product), bias)

    def backward(self, top, propagate_down, bottom):
        if self.nd:
            return convolution_nd.conv_backward(self, top, propagate_down, bottom)
        if self._wino is not None:
            return self._backward_winograd(top, propagate_down, bottom)
        if self._shift is not None:
            return self._backward_shift(top, propagate_down, bottom)
        if self._direct:
            return self._backward_direct(top, propagate_down, bottom)
        if self._sample_cols is not None:
            return self._backward_sample_columns(top, propagate_down, bottom)
        o, n, p = self.num_output, self.num, self._spatial
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        for i, (t, down, b) in enumerate(zip(top, propagate_down, bottom)):
            top_diff = t.diff.reshape(n, o, p)
            if want_bias:
                self.add_bias_diff(top_diff)
            if not (want_weight or down):
                continue
            # A second backward after one forward (the columns then hold a gradient) rebuilds
            # them, as Caffe's backward always does.
            cols = self._fill_columns(i, b) if want_weight else self._cols[i]
            if down and cols is not None:
                self._cols_hold_input[i] = False  # about to take the column gradient
            if self._per_sample:
                self._backward_per_sample(top_diff, want_weight, down, b, cols)
            else:
                self._backward_whole_batch(top_diff, want_weight, down, b, cols)

    def _backward_whole_batch(self, top_diff, want_weight, down, b, cols):
        o, n, p = self.num_output, self.num, self._spatial
        diff_t = self.scratch(0, (o, n * p))
        self.copy_by_sample(self._by_sample(diff_t), top_diff)
        diff3 = self.grouped(diff_t)
        if want_weight:
            self.add_weight_diff(diff3, self.grouped(cols).transpose(0, 2, 1))
        if down:
            col_diff = cols  # the weight gradient is done with the columns
            self.xp.matmul(self._weight3(self.blobs[0].data).transpose(0, 2, 1), diff3,
                           out=self.grouped(col_diff))
            if self._batch_last:
                col2im_batch_last(col_diff, self._image_shape, *self.geometry(),
                                  out=b.diff.reshape(self._image_shape),
                                  image=self._batch_last_image(), runner=self.ctx.chunk_runner)
            else:
                self.col2im(col_diff, b.diff.reshape(self._image_shape))

    def _backward_per_sample(self, top_diff, want_weight, down, b, cols):
        weight = self.blobs[0]
        o, n, g, p = self.num_output, self.num, self.group, self._spatial
        diff4 = top_diff.reshape(n, g, o // g, p)
        columns = self._sample_columns(b, cols)
        if want_weight:
            self.add_weight_diff_per_sample(diff4, columns)
        if down:
            w_t = self._weight3(weight.data).transpose(0, 2, 1)
            if cols is None:
                self.sample_gemms(w_t, diff4, b.diff.reshape(columns.shape))
                return
            col_diff = cols  # the weight gradient is done with the columns
            self.sample_gemms(w_t, diff4, self._sample_columns(None, col_diff))
            self.col2im(col_diff, b.diff.reshape(self._image_shape))


    # -- 1x1, pad 0, dilation 1: GEMMs on the input itself ---------------------------------
    def _direct_input(self, i, b):
        """Bottom i as (N, group, C/group, P): its data (stride 1) or the subsampled copy
        forward made (backward reuses it, as the other layouts reuse their columns)."""
        n, g, p = self.num, self.group, self._spatial
        sub = self._subsampled[i]
        if sub is None:
            return b.data.reshape(n, g, self.channels // g, p)
        return sub.reshape(n, g, self.channels // g, p)

    def _subsample(self, i, b):
        """Copy every stride-th row and column of bottom i into its subsampled buffer."""
        sh, sw = self.stride
        image = b.data.reshape(self._image_shape)
        self.copy_by_sample(self._subsampled[i].reshape((self.num, self.channels) +
                                                        self.out_hw),
                            image[:, :, ::sh, ::sw])

    def _forward_direct(self, bottom, top):
        """top_n = W @ x_n per sample and group (Caffe's 1x1 GEMM, without the im2col)."""
        o, n, g, p = self.num_output, self.num, self.group, self._spatial
        for i, (b, t) in enumerate(zip(bottom, top)):
            if self._subsampled[i] is not None:
                self._subsample(i, b)
            out = t.data.reshape(n, o, p)
            bias = self.blobs[1].data[None, :, None] if self.bias_term else None
            self.sample_gemms(self._weight3(self.blobs[0].data), self._direct_input(i, b),
                              out.reshape(n, g, o // g, p), out, bias)

    def _backward_direct(self, top, propagate_down, bottom):
        """dW += dtop_n @ x_n^T inside the GEMM (beta = 1), sample by sample as Caffe sums;
        dx_n = W^T @ dtop_n, scattered back onto the strided positions for a stride."""
        weight = self.blobs[0]
        o, n, g, p = self.num_output, self.num, self.group, self._spatial
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        for i, (t, down, b) in enumerate(zip(top, propagate_down, bottom)):
            top_diff = t.diff.reshape(n, o, p)
            if want_bias:
                self.add_bias_diff(top_diff)
            diff4 = top_diff.reshape(n, g, o // g, p)
            x4 = self._direct_input(i, b)
            if want_weight:
                self.add_weight_diff_per_sample(diff4, x4)
            if not down:
                continue
            w_t = self._weight3(weight.data).transpose(0, 2, 1)
            if self._subsampled[i] is None:
                self.sample_gemms(w_t, diff4, b.diff.reshape(x4.shape))
                continue
            product = self.scratch(0, x4.shape)
            self.sample_gemms(w_t, diff4, product)
            self._scatter_strided(product, b.diff.reshape(self._image_shape))

    def _scatter_strided(self, values, image):
        """image = 0, then image[:, :, ::sh, ::sw] = values (N, ..., P): the strided
        convolution's input gradient (the skipped positions get none)."""
        sh, sw = self.stride
        grid = values.reshape((self.num, self.channels) + self.out_hw)

        def samples(start, stop):
            image[start:stop] = 0
            image[start:stop, :, ::sh, ::sw] = grid[start:stop]

        for_each_chunk(self.xp, self.num, samples, item_elements=image[0].size,
                       cache_sized=False, runner=self.ctx.chunk_runner)


@register_layer
class Deconvolution(_ConvolutionBase):
    """Caffe's Deconvolution: the transpose of Convolution (its forward is conv's backward)."""

    type = "Deconvolution"

    def weight_shape(self):
        return (self.channels, self.num_output // self.group) + self.kernel

    def output_hw(self, in_hw):
        return tuple(st * (s - 1) + d * (k - 1) + 1 - 2 * p for s, k, p, st, d in
                     zip(in_hw, self.kernel, self.pad, self.stride, self.dilation))

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if self.nd:
            return
        spatial_in = self.in_hw[0] * self.in_hw[1]
        # The transposed input of each bottom, kept for the weight gradient.
        self._inputs_t = [self.buffer(f"input_t{i}", (self.channels, self.num * spatial_in))
                          for i in range(len(bottom))]
        self._col_shape = (self.num_output * self.kernel[0] * self.kernel[1],
                           self.num * spatial_in)
        self._image_shape = (self.num, self.num_output) + self.out_hw

    def forward(self, bottom, top):
        if self.nd:
            return convolution_nd.deconv_forward(self, bottom, top)
        weight = self.blobs[0].data
        c, n = self.channels, self.num
        spatial_in = self.in_hw[0] * self.in_hw[1]
        cols = self.scratch(3, self._col_shape)
        w3 = self.grouped(weight.reshape(c, -1))
        for b, t, input_t in zip(bottom, top, self._inputs_t):
            self.copy_by_sample(input_t.reshape(c, n, spatial_in).transpose(1, 0, 2),
                                b.data.reshape(n, c, spatial_in))
            self.xp.matmul(w3.transpose(0, 2, 1), self.grouped(input_t), out=self.grouped(cols))
            image = t.data.reshape(self._image_shape)
            self.col2im(cols, image)
            if self.bias_term:
                image += self.blobs[1].data[None, :, None, None]

    def backward(self, top, propagate_down, bottom):
        if self.nd:
            return convolution_nd.deconv_backward(self, top, propagate_down, bottom)
        weight = self.blobs[0]
        c, n = self.channels, self.num
        spatial_in = self.in_hw[0] * self.in_hw[1]
        want_weight = self.param_propagate_down[0]
        want_bias = self.bias_term and self.param_propagate_down[1]
        for t, down, b, input_t in zip(top, propagate_down, bottom, self._inputs_t):
            image_diff = t.diff.reshape(self._image_shape)
            if want_bias:
                self.add_bias_diff(image_diff.reshape(self.num, self.num_output, -1))
            if not (want_weight or down):
                continue
            cols = self.scratch(3, self._col_shape)
            self.im2col(image_diff, cols)
            cols3 = self.grouped(cols)
            if want_weight:
                self.add_weight_diff(self.grouped(input_t), cols3.transpose(0, 2, 1))
            if down:
                product = self.scratch(0, (c, n * spatial_in))
                self.xp.matmul(self.grouped(weight.data.reshape(c, -1)), cols3,
                               out=self.grouped(product))
                self.copy_by_sample(b.diff.reshape(n, c, spatial_in),
                                    product.reshape(c, n, spatial_in).transpose(1, 0, 2))

"""Convolution's and Deconvolution's path: a pure function of geometry, target and rules.

The 2-D CPU paths of Convolution, asked in this order (the first that takes the layer wins):

- `winograd-f4` / `winograd-f2`: 3x3, stride 1, dilation 1 as Winograd F(4x4, 3x3) on 6x6
  tiles or F(2x2, 3x3) on 4x4 tiles (kernels.winograd): 4x or 2.25x fewer multiplications;
  keeps its transformed input.
- `sample-columns`: im2col and GEMM one sample at a time in the cache, the columns rebuilt in
  backward (kernels.sample_columns): for small planes at a large batch, where the whole
  batch's columns are far past the cache; keeps no column matrix.
- `shift`: per kernel offset one GEMM on a shifted view of the padded input
  (kernels.shift_conv); off by default (it wins only on a loaded machine).
- `direct`: a 1x1, pad 0, dilation 1 kernel as per-sample GEMMs on the input itself.
- `im2col-per-sample`, `im2col-batch-last`, `im2col-whole-batch`: im2col + GEMM, one GEMM
  per sample (large planes: no transposing copies), or one per group over the whole batch's
  columns ordered sample-major or, for small planes, batch last.
- `nd`: any other number of spatial axes, the generic N-D im2col (convolution_nd.py).

On a GPU: `gpu-direct` for any 1x1, pad 0, dilation 1 kernel (batched GEMMs on the input);
other 2-D kernels `gpu-im2col-cuda`: im2col and col2im as one CUDA kernel each
(kernels.cuda_kernels) and one GEMM per group over the whole batch's columns, a fixed number
of device calls whatever the batch (float32 and float64; option `cuda_kernels`). With the
kernels off (`gpu_kernels`) or another dtype, the same array code as the CPU through
`gpu-im2col-*` and `gpu-direct` by the CPU's size rules; `gpu-nd` for other than 2 spatial
axes. The CPU-only paths never apply there.
The measurements behind each threshold are in benchmarks/README.md ("Convolution paths").
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

import numpy as np

from ...errors import LayerError
from ...kernels import sample_columns, shift_conv, winograd
from . import CUDA_KERNEL_TYPES, Choice, Target


@dataclass(frozen=True)
class ConvGeometry:
    """What the choice reads of a convolution: batch, channels, outputs, groups, kernel,
    pad, stride, dilation, spatial input and output sizes, and the blobs' dtype name."""

    num: int
    channels: int
    num_output: int
    group: int
    kernel: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    in_hw: tuple[int, ...]
    out_hw: tuple[int, ...]
    dtype: str = "float32"

    @property
    def positions(self) -> int:
        """Output positions per sample."""
        return prod(self.out_hw)

    @property
    def rows_per_group(self) -> int:
        """Column rows per group: channels/group * kernel area."""
        return self.channels // self.group * prod(self.kernel)

    @property
    def weight_count(self) -> int:
        """Elements of the weight blob."""
        return self.num_output * self.rows_per_group

    @property
    def image(self) -> tuple[int, ...]:
        """The bottom as (N, C, *spatial)."""
        return (self.num, self.channels, *self.in_hw)

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, pad 0: the input is its own column matrix."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.pad == (0, 0)


@dataclass(frozen=True)
class ConvolutionRules:
    """Convolution's thresholds; the defaults are the measured ones (benchmarks/README.md).

    A switch of None follows its rule, True forces the path where the geometry allows it,
    False never takes it.
    """

    #: im2col per sample from this many output positions per sample (no transposing copies;
    #: per-sample GEMMs pay from there on OpenBLAS) ...
    per_sample_from: int = 2048
    #: ... from this many for a pointwise kernel (no im2col at all then) ...
    per_sample_from_pointwise: int = 196
    #: ... and from `per_sample_from_few_rows` for a kernel whose columns have at most
    #: `per_sample_upto_rows` rows per group (few input channels: short GEMM reductions).
    per_sample_upto_rows: int = 32
    per_sample_from_few_rows: int = 256
    #: A 1x1, pad 0, dilation 1 kernel with at least this many output positions per sample
    #: runs `direct` (any stride).
    direct_from: int = 196
    #: Whole-batch columns ordered batch last up to this many output positions per sample
    #: (im2col then copies runs of W_out*N, not W_out).
    batch_last_upto: int = 256
    #: Shifted GEMMs (stride 1 only): False never (the default: slower than im2col inside
    #: whole nets on a quiet node), None by the rule below, True any stride-1 kernel.
    shift_gemm: bool | None = False
    #: The rule: a kxk kernel with at least this many input channels per group ...
    shift_from_channels: int = 32
    #: ... computing at most this many full-output positions per position kept ...
    shift_max_waste: float = 2.0
    #: ... with a full output of at least this many positions (N*Hp*Wp), on planes that
    #: `per_sample_from` leaves to whole-batch im2col.
    shift_from_length: int = 6000
    #: Stack the kernel's width offsets into each GEMM's reduction (kw copies of the input,
    #: kh GEMMs) rather than one GEMM per offset.
    shift_stack: bool = True
    #: Keep the stacked input from forward to backward (else rebuilt in backward).
    shift_keep_input: bool = True
    #: Winograd for 3x3, stride 1, dilation 1: None by the rule below, True forced, False
    #: never.
    winograd: bool | None = None
    #: The rule with the transforms as numpy GEMMs: at least this many input channels per
    #: group (few channels make short GEMM reductions) ...
    winograd_from_channels: int = 32
    #: ... output positions per sample in [from, below) ...
    winograd_from_positions: int = 512
    winograd_below_positions: int = 2048
    #: ... at least this many 2x2 tiles in the batch (the weight's transforms cost the same
    #: at any batch size) ...
    winograd_from_tiles: int = 256
    #: ... and at most this many positions computed per output position kept (a partial
    #: last tile on odd sizes).
    winograd_max_waste: float = 1.1
    #: The same rule (positions from, below; tiles from; waste) where the compiled
    #: transforms load: wider, they make the transforms cheap.
    winograd_compiled_rule: tuple[int, int, int, float] = (169, 3200, 196, 1.2)
    #: The output tile: None picks 4 where the compiled F(4x4) transforms load and 4x4 tiles
    #: waste at most `winograd4_max_waste`, else 2; 2 or 4 force it (4 needs the loops).
    winograd_tile: int | None = None
    winograd4_max_waste: float = 1.1
    #: Per-sample columns: None by the rule below, True forced (any kernel but 1x1 with pad
    #: 0; Winograd's rule is asked first), False never.
    sample_columns: bool | None = None
    #: The rule: one sample's columns at most this many bytes (they stay in the cache) ...
    sample_columns_upto_bytes: int = 4 << 20
    #: ... and the whole batch's columns at least this many bytes (far past the cache) ...
    sample_columns_from_bytes: int = 24 << 20
    #: ... or a per-sample GEMM of at least this many flops.
    sample_columns_from_flops: float = 16e6
    #: Spread independent per-sample GEMMs over the chunk runner's threads, one BLAS thread
    #: each (kernels.sample_gemm): no wait inside a GEMM for a busy core.
    split_sample_gemms: bool = True
    #: ... several samples to a chunk, so that a chunk does at least this many flops (a
    #: chunk costs ~10 us of Python); 0: one sample per chunk.
    sample_chunk_flops: float = 4e6
    #: Add the weight gradient into the diff inside the GEMM (BLAS beta = 1; CPU only) ...
    weight_diff_in_gemm: bool = True
    #: ... always from this many weight elements per group, else only when the weight has
    #: at least as many rows as columns (the orientation OpenBLAS runs fast).
    weight_diff_in_gemm_from: int = 1 << 18
    #: On a GPU, im2col and col2im as CUDA kernels and every 1x1 kernel direct (float32,
    #: float64); False: the CPU's layouts and size rules under `gpu-` names.
    gpu_kernels: bool = True


def _gpu_kernels(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> bool:
    """Whether the CUDA im2col/col2im kernels serve this layer."""
    return target.gpu and rules.gpu_kernels and g.dtype in CUDA_KERNEL_TYPES


def choose_convolution(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> Choice:
    """Convolution's path for geometry `g` on `target` under `rules` (module docstring).

    Raises LayerError for a forced combination the target cannot run (a Winograd tile of 4
    without the compiled transforms)."""
    if len(g.in_hw) != 2:
        return Choice("gpu-nd" if target.gpu else "nd",
                      f"{len(g.in_hw)} spatial axes: the generic N-D im2col")
    if target.gpu:
        return _gpu_layout(g, target, rules)
    return (_winograd(g, target, rules) or _sample_columns(g, target, rules)
            or _shift(g, target, rules) or _gemm_layout(g, target, rules, ""))


def choose_deconvolution(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> Choice:
    """Deconvolution's path: `col2im` (the convolution's input-gradient GEMM and col2im, for
    2 spatial axes) or `nd`; `gpu-` names on a GPU. `g` describes the deconvolution's own
    bottom and weight (channels x num_output/group x kernel)."""
    prefix = "gpu-" if target.gpu else ""
    if len(g.in_hw) != 2:
        return Choice(prefix + "nd", f"{len(g.in_hw)} spatial axes: the generic N-D im2col")
    weight_rows, weight_cols = g.channels // g.group, g.num_output // g.group * prod(g.kernel)
    options = _weight_diff_option(weight_rows, weight_cols, target, rules)
    if _gpu_kernels(g, target, rules):
        return Choice("gpu-col2im", "2 spatial axes: one GEMM per group and col2im, im2col "
                      "and col2im as CUDA kernels", options + (("cuda_kernels", True),))
    return Choice(prefix + "col2im", "2 spatial axes: one GEMM per group and col2im", options)


def _weight_diff_option(rows: int, cols: int, target: Target, rules: ConvolutionRules):
    """The `weight_diff_in_gemm` option of a GEMM path with a (rows, cols) weight per group."""
    on = (rules.weight_diff_in_gemm and not target.gpu
          and (rows >= cols or rows * cols >= rules.weight_diff_in_gemm_from))
    return (("weight_diff_in_gemm", bool(on)),)


def _gpu_layout(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> Choice:
    """A 2-D convolution on a GPU: `gpu-direct` or `gpu-im2col-cuda` with the CUDA kernels,
    else the CPU's size rules under `gpu-` names."""
    if not _gpu_kernels(g, target, rules):
        return _gemm_layout(g, target, rules, "gpu-")
    options = _weight_diff_option(g.num_output // g.group, g.rows_per_group, target, rules)
    if g.kernel == (1, 1) and g.pad == (0, 0) and g.dilation == (1, 1):
        return Choice("gpu-direct", "1x1 kernel: batched GEMMs on the input", options)
    return Choice("gpu-im2col-cuda", "im2col and col2im as CUDA kernels, one GEMM per group "
                  "over the batch", options + (("cuda_kernels", True),))


def _gemm_layout(g: ConvGeometry, target: Target, rules: ConvolutionRules,
                 prefix: str) -> Choice:
    """`direct` or one of the im2col layouts, by the size rules (CPU and GPU alike)."""
    options = _weight_diff_option(g.num_output // g.group, g.rows_per_group, target, rules)
    positions = g.positions
    if (g.kernel == (1, 1) and g.pad == (0, 0) and g.dilation == (1, 1)
            and positions >= rules.direct_from):
        return Choice(prefix + "direct", f"1x1 kernel, {positions} >= {rules.direct_from} "
                      "positions: GEMMs on the input", options)
    threshold = rules.per_sample_from_pointwise if g.pointwise else rules.per_sample_from
    if positions >= threshold:
        return Choice(prefix + "im2col-per-sample",
                      f"{positions} >= {threshold} positions per sample", options)
    if (not g.pointwise and g.rows_per_group <= rules.per_sample_upto_rows
            and positions >= rules.per_sample_from_few_rows):
        return Choice(prefix + "im2col-per-sample",
                      f"{g.rows_per_group} <= {rules.per_sample_upto_rows} column rows, "
                      f"{positions} >= {rules.per_sample_from_few_rows} positions", options)
    if positions <= rules.batch_last_upto:
        return Choice(prefix + "im2col-batch-last",
                      f"{positions} <= {rules.batch_last_upto} positions per sample", options)
    return Choice(prefix + "im2col-whole-batch",
                  f"{positions} positions per sample: one GEMM per group", options)


def _winograd(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> Choice | None:
    if rules.winograd is False or not winograd.applies(g.kernel, g.stride, g.dilation):
        return None
    if rules.winograd:
        reason = "forced by the rules"
    else:
        # The rule yields to a shifted-GEMM path the rules opted into.
        if rules.shift_gemm is not False:
            return None
        reason = _winograd_rule(g, target, rules)
        if reason is None:
            return None
    tile = _winograd_tile(g, target, rules)
    return Choice(f"winograd-f{tile}", reason, (("tile", tile),))


def _winograd_rule(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> str | None:
    """Why the rule takes this 3x3 stride-1 layer onto Winograd (None: it does not)."""
    per_group = g.channels // g.group
    if per_group < rules.winograd_from_channels:
        return None  # asked first: only layers that might take the path import numba
    th, tw = -(-g.out_hw[0] // 2), -(-g.out_hw[1] // 2)
    compiled = target.has("winograd-f2")
    low, high, tiles, waste = (rules.winograd_compiled_rule if compiled else
                               (rules.winograd_from_positions, rules.winograd_below_positions,
                                rules.winograd_from_tiles, rules.winograd_max_waste))
    positions = g.positions
    if low <= positions < high and g.num * th * tw >= tiles and \
            4 * th * tw <= waste * positions:
        kind = "compiled" if compiled else "numpy"
        return (f"{per_group} channels/group, {positions} positions in [{low}, {high}), "
                f"{g.num * th * tw} tiles: the {kind} transforms' rule")
    return None


def _winograd_tile(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> int:
    if rules.winograd_tile in (2, 4):
        if rules.winograd_tile == 4 and not target.has("winograd-f4"):
            raise LayerError("winograd_tile 4 needs the compiled F(4x4, 3x3) transforms "
                             "(numba)")
        return rules.winograd_tile
    ho, wo = g.out_hw
    waste = (4 * -(-ho // 4)) * (4 * -(-wo // 4)) / max(1, ho * wo)
    return 4 if waste <= rules.winograd4_max_waste and target.has("winograd-f4") else 2


def _sample_columns(g: ConvGeometry, target: Target, rules: ConvolutionRules
                    ) -> Choice | None:
    if rules.sample_columns is False or (g.kernel == (1, 1) and g.pad == (0, 0)) or \
            not target.has("sample-columns"):
        return None
    if rules.sample_columns:
        return Choice("sample-columns", "forced by the rules")
    if rules.shift_gemm is True:
        return None
    item = np.dtype(g.dtype).itemsize
    one = g.channels * prod(g.kernel) * g.positions * item
    partials = sample_columns.chunk_count(g.num) * g.weight_count * item
    flops = 2 * g.weight_count * g.positions
    if one > rules.sample_columns_upto_bytes or 4 * partials > one * g.num:
        return None
    if one * g.num >= rules.sample_columns_from_bytes:
        return Choice("sample-columns", f"whole-batch columns {one * g.num} >= "
                      f"{rules.sample_columns_from_bytes} bytes, one sample's {one}")
    if flops >= rules.sample_columns_from_flops:
        return Choice("sample-columns", f"{flops:g} >= {rules.sample_columns_from_flops:g} "
                      f"flops per sample, one sample's columns {one} bytes")
    return None


def shift_geometry(g: ConvGeometry, stack: bool) -> shift_conv.ShiftGeometry:
    """The shifted layout of `g` (kernel width offsets stacked or not)."""
    return shift_conv.ShiftGeometry(g.image, g.kernel, g.pad, g.dilation, g.group,
                                    g.kernel[1] if stack else 1)


def _shift(g: ConvGeometry, target: Target, rules: ConvolutionRules) -> Choice | None:
    if g.stride != (1, 1) or rules.shift_gemm is False:
        return None
    options = (("stack", rules.shift_stack), ("keep_input", rules.shift_keep_input))
    if rules.shift_gemm:
        return Choice("shift", "forced by the rules", options)
    if g.kernel == (1, 1) or not target.has(f"gemm-{g.dtype}"):
        return None
    per_group = g.channels // g.group
    if per_group < rules.shift_from_channels:
        return None
    layout = shift_geometry(g, rules.shift_stack)
    if g.positions >= rules.per_sample_from or layout.length < rules.shift_from_length:
        return None
    if layout.waste() > rules.shift_max_waste:
        return None
    return Choice("shift", f"{per_group} channels/group, full output {layout.length} >= "
                  f"{rules.shift_from_length}, waste {layout.waste():.2f}", options)


def sample_grain(rules: ConvolutionRules, count: int, flops_each: float, threads: int) -> int:
    """Samples per chunk for `count` independent GEMMs of `flops_each` flops each on a
    runner of `threads` threads (see `sample_chunk_flops`)."""
    if rules.sample_chunk_flops <= 0 or flops_each <= 0:
        return 1
    wanted = ceil(rules.sample_chunk_flops / flops_each)
    return max(1, min(wanted, count // (4 * threads)))

"""The paths of LRN, BatchNorm and Scale: pure functions of geometry, target and rules.

- LRN: `compiled-loops` (ACROSS_CHANNELS on the CPU as numba loops, kernels.lrn_loops: one
  pass per row over the channel window), else `passes` (whole-array numpy passes by chunk
  of samples; WITHIN_CHANNEL always); on a GPU `gpu-cuda-kernels` (ACROSS_CHANNELS in a
  type the CUDA kernels are compiled for: one kernel forward, one backward,
  kernels.cuda_lrn), else `gpu-passes`.
- BatchNorm: `compiled-rows` (the statistics, the normalisation and the input gradient as
  loops per (sample, channel) row, kernels.batch_norm_loops: one trip through memory for the
  statistics, one for y and its kept copy, two for the input gradient; their sums float64),
  else `passes` (numpy's whole-array passes); on a GPU `gpu-cuda-kernels` (float32/float64:
  two kernels each way, kernels.cuda_norm), else `gpu-passes`.
- Scale: `compiled-rows` (forward and backward as one loop per (outer, channel) row,
  kernels.scale_loops, sums float64), `row-blocks` (numpy calls per cache-sized block of rows,
  every pass of a block while it is in the cache), `row-blocks-backward` (rows too short for
  the blocks to pay forward: whole-array forward, blocks backward), `whole-array`; on a GPU
  `gpu-cuda-kernels` (float32/float64: one kernel forward, two backward, kernels.cuda_norm),
  else `gpu-whole-array`.

The measurements behind the rules are in benchmarks/README.md ("LRN, BatchNorm and Scale").
"""

from __future__ import annotations

from dataclasses import dataclass

from . import CUDA_KERNEL_TYPES, Choice, Target

_FLOATS = ("float32", "float64")


@dataclass(frozen=True)
class LRNRules:
    """LRN's switch."""

    #: ACROSS_CHANNELS as compiled loops on the CPU where numba imports. The `mgcaffe`
    #: commands turn it off with MGCAFFE_LRN_LOOPS=0 (rules.LayerRules.from_environment).
    compiled: bool = True


def choose_lrn(across_channels: bool, dtype, target: Target, rules: LRNRules) -> Choice:
    """LRN's path for its region (ACROSS_CHANNELS or not) and blobs of `dtype` on `target`
    under `rules`."""
    if target.gpu:
        name = str(dtype)
        if across_channels and name in CUDA_KERNEL_TYPES:
            return Choice("gpu-cuda-kernels", "ACROSS_CHANNELS: one CUDA kernel forward, one "
                          "backward")
        return Choice("gpu-passes", "array passes on the device" + (
            "" if across_channels else " (WITHIN_CHANNEL)") + (
            "" if name in CUDA_KERNEL_TYPES else f" (no CUDA kernel for {name})"))
    if not across_channels:
        return Choice("passes", "WITHIN_CHANNEL: whole-array passes")
    if rules.compiled and target.has("lrn"):
        return Choice("compiled-loops", "ACROSS_CHANNELS, numba loops load")
    return Choice("passes", "compiled loops off" if not rules.compiled else
                  "no compiled loops")


@dataclass(frozen=True)
class BatchNormRules:
    """BatchNorm's switch."""

    #: Statistics, normalisation and input gradient as compiled row loops on the CPU
    #: (float32/float64, numba importable).
    compiled_loops: bool = True


def choose_batch_norm(dtype: str, target: Target, rules: BatchNormRules) -> Choice:
    """BatchNorm's path for blobs of `dtype` (a numpy dtype name)."""
    if target.gpu:
        if dtype in CUDA_KERNEL_TYPES:
            return Choice("gpu-cuda-kernels", "CUDA kernels: statistics with the running sums "
                          "and normalisation forward, two backward")
        return Choice("gpu-passes", f"whole-array passes on the device (no CUDA kernel for "
                      f"{dtype})")
    if not rules.compiled_loops:
        return Choice("passes", "compiled loops off")
    if dtype not in _FLOATS:
        return Choice("passes", f"{dtype} blobs: the loops take float32/float64")
    if target.has("batch-norm") and target.has("scale"):
        return Choice("compiled-rows", "numba row loops load")
    return Choice("passes", "no compiled loops")


@dataclass(frozen=True)
class ScaleRules:
    """Scale's switches and threshold."""

    #: Forward and backward over cache-sized blocks of rows on the CPU, each block making all
    #: its passes while it is in the cache: one trip through memory per array.
    fused_rows: bool = True
    #: ... in forward, without the compiled loops, only for rows of at least this many
    #: elements (on short rows the whole-array passes measured faster).
    fused_forward_min_inner: int = 1024
    #: The blocks' passes as compiled loops, one loop per row (float32/float64).
    compiled_loops: bool = True


def choose_scale(inner: int, dtype: str, target: Target, rules: ScaleRules) -> Choice:
    """Scale's path for rows of `inner` elements of `dtype` (a numpy dtype name)."""
    if target.gpu:
        if dtype in CUDA_KERNEL_TYPES:
            return Choice("gpu-cuda-kernels", "CUDA kernels: one forward, the operand sums and "
                          "the input gradient backward")
        return Choice("gpu-whole-array", f"whole-array passes on the device (no CUDA kernel "
                      f"for {dtype})")
    if not rules.fused_rows or not dtype.startswith("float"):
        return Choice("whole-array", "row blocks off" if not rules.fused_rows else
                      f"{dtype} blobs")
    if rules.compiled_loops and dtype in _FLOATS and target.has("scale"):
        return Choice("compiled-rows", "numba row loops load")
    if inner >= rules.fused_forward_min_inner:
        return Choice("row-blocks", f"rows of {inner} >= {rules.fused_forward_min_inner}")
    return Choice("row-blocks-backward", f"rows of {inner} < {rules.fused_forward_min_inner}:"
                  " whole-array forward")

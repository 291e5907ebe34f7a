"""Pooling's path: a pure function of geometry, target and rules.

- `stochastic`: STOCHASTIC pooling (pooling_stochastic.py), any device.
- `whole-plane`: a window that spans the whole plane (global pooling) is a plain reduction;
  MAX leaves it to the compiled loops where they load (they treat NaN and -inf as Caffe).
- `window-gemm` (CPU): AVE over small planes as one GEMM with the (H*W, Ph*Pw) matrix of
  window weights, forward and backward: the BLAS beats the offset passes there.
- `compiled-loops` (CPU): MAX and AVE as numba loops (kernels.pool_loops).
- `offset-passes`: one vectorised pass per kernel offset over the stride phases of the padded
  input (kernels.windows); on the CPU MAX backward scatters each top diff to its winner's
  flat index (`max_backward` option `index-scatter`) rather than gathering offset by offset.

On a GPU: `gpu-stochastic` and `gpu-whole-plane` (the same array code); MAX and AVE as
`gpu-cuda-kernels`, one CUDA kernel per pass (kernels.cuda_kernels: a thread per output cell
forward, per input cell backward; float32 and float64), else `gpu-offset-passes` (the
offset passes' array code, one pass per kernel offset over the whole batch).
The measurements behind the rules are in benchmarks/README.md ("Pooling paths").
"""

from __future__ import annotations

from dataclasses import dataclass

from . import CUDA_KERNEL_TYPES, Choice, Target


@dataclass(frozen=True)
class PoolingGeometry:
    """What the choice reads of a pooling layer: the method ("MAX", "AVE" or "STOCHASTIC"),
    the plane, the pooled plane, the kernel in effect and the pad."""

    method: str
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    pad: tuple[int, int]
    dtype: str = "float32"


@dataclass(frozen=True)
class PoolingRules:
    """Pooling's switches and thresholds; the defaults are the measured ones."""

    #: MAX backward on the CPU scatters each top diff to its winner's flat bottom index (in
    #: output order, as Caffe adds) instead of gathering offset by offset.
    max_backward_by_index: bool = True
    #: AVE on the CPU over planes of at most this many cells (input times output cells per
    #: plane) is one GEMM with the window weights; 0 turns it off.
    ave_gemm_below: int = 1 << 16
    #: MAX and AVE as compiled loops on the CPU where numba imports. The `mgcaffe` commands
    #: turn it off with MGCAFFE_POOLING_LOOPS=0 (rules.LayerRules.from_environment): for
    #: short-lived processes, importing numba and loading the loops costs more than they save.
    compiled: bool = True
    #: The compiled MAX forward with stride 1 down the rows takes the row maxima first, then
    #: the maxima of kh rows (the same winners, fewer passes).
    separable_max: bool = True
    #: MAX and AVE on a GPU as one CUDA kernel per pass (float32 and float64 blobs); False:
    #: the offset passes, a few array calls per kernel offset.
    gpu_kernels: bool = True


def choose_pooling(g: PoolingGeometry, target: Target, rules: PoolingRules) -> Choice:
    """Pooling's path for geometry `g` on `target` under `rules` (module docstring)."""
    prefix = "gpu-" if target.gpu else ""
    if g.method == "STOCHASTIC":
        return Choice(prefix + "stochastic", "STOCHASTIC pooling")
    loops = rules.compiled and target.has("pooling")
    whole = g.out_hw == (1, 1) and g.kernel == g.in_hw and g.pad == (0, 0)
    if whole and not (g.method == "MAX" and loops):
        return Choice(prefix + "whole-plane", "the window spans the plane: a reduction")
    cells = g.in_hw[0] * g.in_hw[1] * g.out_hw[0] * g.out_hw[1]
    if g.method == "AVE" and not target.gpu and cells <= rules.ave_gemm_below:
        return Choice("window-gemm", f"AVE, {cells} <= {rules.ave_gemm_below} input x output "
                      "cells per plane")
    if loops:
        return Choice("compiled-loops", "numba loops load",
                      (("separable_max", rules.separable_max),))
    if target.gpu:
        if rules.gpu_kernels and g.dtype in CUDA_KERNEL_TYPES:
            return Choice("gpu-cuda-kernels", f"{g.method}: one CUDA kernel per pass")
        why = "CUDA kernels off" if not rules.gpu_kernels else f"no CUDA kernel for {g.dtype}"
        return Choice("gpu-offset-passes", f"{why}: one pass per kernel offset")
    why = "compiled loops off" if not rules.compiled else "no compiled loops"
    options = ()
    if g.method == "MAX":
        options = (("max_backward",
                    "index-scatter" if rules.max_backward_by_index else "gather"),)
    return Choice("offset-passes", f"{why}: one pass per kernel offset", options)

"""Which implementation a layer with several runs: a pure choice, made in one place.

A layer that can run several ways (Convolution, Deconvolution, Pooling, LRN, BatchNorm,
Scale, InnerProduct) asks one function of this package in `reshape`, from three explicit
inputs: its geometry (shapes, parameters, dtype), the `Target` it runs on, and a frozen
dataclass of rules (`rules.LayerRules`: thresholds whose defaults are the measured values;
benchmarks/README.md says where they come from). The answer is a `Choice`: a path name
anyone can print, the reason, and any options the path takes. The layer keeps it
(`layer.choice`, shown in its repr and by `mgcaffe time`); tests pick a path by passing rules.

The target says whether the layer runs on a GPU, whose paths carry names of their own
(`gpu-...`), and which compiled CPU loop sets load here. Asking the latter may import numba
(about a second of CPU), so a choice asks only where a rule needs the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...kernels import gemm, sample_columns, winograd
from ...kernels.loops import (
    batch_norm as batch_norm_loops,
)
from ...kernels.loops import (
    lrn as lrn_loops,
)
from ...kernels.loops import (
    pool as pool_loops,
)
from ...kernels.loops import (
    scale as scale_loops,
)

#: The compiled CPU loop sets a choice may ask for, and how to tell whether each loads.
LOOPS: dict[str, Callable[[], bool]] = {
    "winograd-f2": lambda: winograd.compiled(2),
    "winograd-f4": lambda: winograd.compiled(4),
    "sample-columns": sample_columns.available,
    "pooling": lambda: pool_loops.load() is not None,
    "lrn": lambda: lrn_loops.load() is not None,
    "batch-norm": lambda: batch_norm_loops.load() is not None,
    "scale": lambda: scale_loops.load() is not None,
    # numpy's own BLAS called directly (kernels.gemm), per dtype
    "gemm-float32": lambda: gemm.available(np.float32),
    "gemm-float64": lambda: gemm.available(np.float64),
}


def _host_loops(name: str) -> bool:
    """Whether the compiled loop set `name` (a key of LOOPS) loads in this process."""
    return LOOPS[name]()


@dataclass(frozen=True)
class Target:
    """Where a layer runs: on a GPU (CuPy) or the CPU, and which compiled loop sets load
    there (`loops(name)`, asked lazily; never on a GPU)."""

    gpu: bool = False
    loops: Callable[[str], bool] = field(default=_host_loops, compare=False, repr=False)

    def has(self, name: str) -> bool:
        """Whether the CPU loop set `name` is usable here (False on a GPU)."""
        return not self.gpu and self.loops(name)


def target_for(xp) -> Target:
    """The target of a layer whose array module is `xp`: numpy is the CPU, else a GPU."""
    return Target(gpu=xp is not np)


#: Blob types mgcaffe's CUDA kernels are compiled for (kernels/cuda_kernels.py's element
#: types; a test holds the two equal): a GPU path built on them is chosen only for these.
CUDA_KERNEL_TYPES = ("float32", "float64")


def cpu_with(*loops: str) -> Target:
    """A CPU target on which exactly the loop sets `loops` load (for tests and tables)."""
    unknown = set(loops) - set(LOOPS)
    if unknown:
        raise ValueError(f"unknown loop sets {sorted(unknown)}; known: {sorted(LOOPS)}")
    return Target(gpu=False, loops=frozenset(loops).__contains__)


@dataclass(frozen=True)
class Choice:
    """A layer's implementation: `path` (a name), the `reason`, and the path's `options`
    (name -> value, e.g. a Winograd tile)."""

    path: str
    reason: str
    options: tuple[tuple[str, object], ...] = ()

    def option(self, name: str, default=None):
        """The value of option `name` (`default` when the choice does not set it)."""
        return dict(self.options).get(name, default)

    def __str__(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in self.options)
        return f"{self.path} ({self.reason}{extra})"

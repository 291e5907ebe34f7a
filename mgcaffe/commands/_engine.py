"""What the commands that build nets (train, test, time, extract_features) pass to every Net.

The layers' path rules come from the environment here, in one place: the measured defaults,
with MGCAFFE_POOLING_LOOPS=0 and MGCAFFE_LRN_LOOPS=0 turning the compiled pooling and LRN
loops off (a short-lived process saves less than importing numba costs). Library code that
builds a Net itself gets the defaults unless it passes rules of its own.

The CPU engine (the nets' chunk runner and per-layer way) comes from the `--threads` choice
(which reads OPENBLAS/MKL/OMP_NUM_THREADS and the launcher's variables), also here: `cpu_engine`
applies the choice to the BLAS, logs it, and returns the engine the command's nets share.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..cpu import threads
from ..cpu.engine import CpuEngine
from ..layer_types.choice.rules import LayerRules


def layer_rules(environ=None) -> LayerRules:
    """The rules of this command's nets: the defaults with the environment's switches."""
    return LayerRules.from_environment(os.environ if environ is None else environ)


def cpu_engine(flag: int | str | None = None,
               node_ranks: Callable[[], int] | None = None) -> CpuEngine:
    """Choose, apply to the BLAS and log this process's thread count (`threads.configure`,
    once, before any net is built) and return the engine of the command's nets."""
    return CpuEngine.from_choice(threads.configure(flag, node_ranks))

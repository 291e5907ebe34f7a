"""A net's CPU execution, as one value passed in: its chunk runner, its per-layer way (all
threads or one) and whether a layer may drop the BLAS to one thread.

Why one value per net: a process can hold several nets with different settings (a library
user's two nets, a test next to a command's net), and a net built later must not change
how an earlier one runs. So nothing here is process-wide: the commands make a `CpuEngine`
from the thread choice they log (`CpuEngine.from_choice(threads.configure(...))`) and pass
it to the Net or Solver, which gives it to every layer's context through the net builder;
library code that passes none gets `CpuEngine.library_default()` per net (the count
`cores.choose` gives, adaptive off: results repeat bit for bit). A solver's train and test
nets share one engine (they run one after the other, and the command configured both).

The BLAS's own thread count is the process's (one library, one pool): `threads.configure`
sets it; a LayerWay that runs a call on one BLAS thread restores the count it found.
"""

from __future__ import annotations

from . import cores
from .layer_way import LayerWay
from .parallel import ChunkRunner


class CpuEngine:
    """`threads` chunk threads (`runner`: a given ChunkRunner instead of a new one, e.g. a
    test's tiny-chunk runner; its thread count wins) and `adaptive`: whether layer calls are
    timed on all threads and on one BLAS thread and run the faster way (`--threads
    adaptive`; off: plain calls). `layer_way` is the net's LayerWay: `threads` threads when
    adaptive, else 1 (a plain call)."""

    __slots__ = ("runner", "adaptive", "layer_way")

    def __init__(self, threads: int = 1, adaptive: bool = False, *,
                 runner: ChunkRunner | None = None):
        self.runner = runner if runner is not None else ChunkRunner(int(threads))
        self.adaptive = bool(adaptive)
        self.layer_way = LayerWay(self.runner.threads if self.adaptive else 1)

    @property
    def threads(self) -> int:
        """The chunk runner's thread count."""
        return self.runner.threads

    @classmethod
    def from_choice(cls, choice: cores.ThreadChoice) -> CpuEngine:
        """The engine of a command's nets, from the choice `threads.configure` applied."""
        return cls(choice.threads, choice.adaptive)

    @classmethod
    def library_default(cls, environ=None) -> CpuEngine:
        """pycaffe's default: `cores.choose()`'s count (the user's OPENBLAS/MKL/OMP_NUM_THREADS,
        else the usable cores / ranks on this node), read when the net is built; not
        adaptive."""
        return cls(cores.choose(environ=environ).threads)

    def describe(self) -> str:
        """One line, as the layers' path choices print: what runs how."""
        way = ("adaptive (each layer call on all threads or one BLAS thread, the faster)"
               if self.adaptive else "fixed")
        return f"{self.threads} chunk thread(s), BLAS threads {way}"

    def __repr__(self) -> str:
        return f"CpuEngine(threads={self.threads}, adaptive={self.adaptive})"

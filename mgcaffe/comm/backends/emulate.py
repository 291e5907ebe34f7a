"""Network emulation: every gradient all-reduce lasts at least the modelled a + b*M.

`--emulate-network NET.json --emulate-nodes N` wraps the real communicator: the all-reduce
still runs (real threads, queues and MPI calls, real sums), then the calling thread (the
communication thread) sleeps for whatever is left of T_ar(M) = a + b*M for N nodes. One machine
thus reproduces the timing of, say, an 8-node 10GbE cluster. Broadcasts, gathers, barriers and
the per-iteration agreement all-reduces are not slowed (they are not part of the model).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from .communicator import Communicator

__all__ = ["EmulatedCommunicator", "sleep_overshoot"]

log = logging.getLogger("mgcaffe.comm")


def sleep_overshoot(samples: int = 15, request: float = 2e-4) -> float:
    """How late time.sleep wakes up on this machine: the lower quartile of a few short sleeps
    (the low end, so a busy moment while measuring does not make every sleep too short)."""
    late = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(request)
        late.append(time.perf_counter() - t0 - request)
    late.sort()
    return max(0.0, late[len(late) // 4])


class EmulatedCommunicator(Communicator):
    """`inner`, with `allreduce_sum` of M bytes lasting at least `cost.time(M)` seconds.

    `cost` is any object with `time(nbytes)` and attributes `a`, `b` (a planner CostModel).
    `emulated_nodes` is only reported. `sleep`, `clock` and `overshoot` (seconds time.sleep
    oversleeps; measured when not given) are injectable for tests."""

    name = "emulated"

    def __init__(self, inner: Communicator, cost: Any, emulated_nodes: int, *,
                 sleep=time.sleep, clock=time.perf_counter, overshoot: float | None = None):
        self.inner = inner
        self.cost = cost
        self.emulated_nodes = emulated_nodes
        self.rank = inner.rank
        self.size = inner.size
        self.wires = inner.wires
        self._sleep = sleep
        self._clock = clock
        # time.sleep wakes up late (~0.1 ms on Linux); ask for that much less
        self.overshoot = sleep_overshoot() if overshoot is None else overshoot
        self.padded_s = 0.0  # total time slept, for the log
        self.calls = 0

    def describe(self) -> str:
        return (f"EMULATION: every gradient all-reduce of M bytes lasts at least "
                f"a + b*M = {self.cost.a * 1e6:.2f} us + {self.cost.b * 1e9:.4f} ns/B * M "
                f"({self.emulated_nodes} emulated nodes, {self.size} real ranks)")

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self._padded(self.inner.allreduce_sum, buf, 1.0)

    def _padded(self, run, buf: np.ndarray, share: float) -> None:
        """run(buf) on the real ranks, then sleep until `share` of T(buf's bytes) is over."""
        start = self._clock()
        run(buf)
        link = getattr(self.cost, "link_time", self.cost.time)  # the bytes as they travel
        left = share * link(buf.nbytes) - (self._clock() - start)
        self.calls += 1
        if left > 0:
            self.padded_s += left
            if left > self.overshoot:
                self._sleep(left - self.overshoot)

    def reduce_scatter_sum(self, buf: np.ndarray) -> None:
        """Half an all-reduce: lasts at least T(M) / 2 (a ring all-reduce is a reduce-scatter
        and an all-gather of equal cost)."""
        self._padded(self.inner.reduce_scatter_sum, buf, 0.5)

    def allgather_blocks(self, buf: np.ndarray) -> None:
        self._padded(self.inner.allgather_blocks, buf, 0.5)

    def allreduce_wire(self, buf: np.ndarray, fmt: str) -> None:
        """A compressed all-reduce lasts at least T of its payload's bytes."""
        self._padded(lambda b: self.inner.allreduce_wire(b, fmt), buf, 1.0)

    def reduce_scatter_wire(self, buf: np.ndarray, fmt: str) -> None:
        self._padded(lambda b: self.inner.reduce_scatter_wire(b, fmt), buf, 0.5)

    def allgather_wire(self, buf: np.ndarray, fmt: str) -> None:
        self._padded(lambda b: self.inner.allgather_wire(b, fmt), buf, 0.5)

    def duplicate(self) -> EmulatedCommunicator:
        """The same emulation over a duplicate of the real communicator."""
        return EmulatedCommunicator(self.inner.duplicate(), self.cost, self.emulated_nodes,
                                    sleep=self._sleep, clock=self._clock,
                                    overshoot=self.overshoot)

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        return self.inner.broadcast(obj, root)

    def allgather(self, obj: Any) -> list:
        return self.inner.allgather(obj)

    def barrier(self) -> None:
        self.inner.barrier()

    def abort(self, code: int = 1) -> None:
        self.inner.abort(code)

    def any_true(self, flags: list[bool]) -> list[bool]:
        return self.inner.any_true(flags)

    def close(self) -> None:
        self.inner.close()

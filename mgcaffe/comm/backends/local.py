"""In-process communicators: one rank alone, and a fake world of N ranks on threads.

`SingleCommunicator` is what a process started without a launcher uses (size 1: every
collective is a no-op), so one-process training never needs MPI.

`LocalWorld(n)` builds N `LocalCommunicator`s that meet through shared memory; each rank runs
in its own thread. It exists for tests: collectives check that every rank called the same
operation with compatible arguments, time out instead of hanging, and accept injected delays
and failures (`delay(rank, seq, op)` -> seconds to sleep before joining the collective,
`fail(rank, seq, op)` -> true to raise CommError there). Sums are taken in rank order, so
every rank gets bit-identical results.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import CommError
from .communicator import Communicator, check_buffer

__all__ = ["LocalCommunicator", "LocalWorld", "SingleCommunicator"]


class SingleCommunicator(Communicator):
    """A world of one rank: all-reduce, broadcast and barrier do nothing."""

    name = "single"

    def __init__(self):
        self.rank = 0
        self.size = 1

    def allreduce_sum(self, buf: np.ndarray) -> None:
        check_buffer(buf, self.rank)

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        if root != 0:
            raise CommError(f"rank 0: broadcast root {root} out of range (world size 1)")
        return obj

    def allgather(self, obj: Any) -> list:
        return [obj]

    def barrier(self) -> None:
        pass

    def abort(self, code: int = 1) -> None:
        raise CommError(f"rank 0: aborted with exit status {code}")

    def duplicate(self) -> SingleCommunicator:
        return SingleCommunicator()


class _Slot:
    """One collective in flight: each rank's contribution, and who has taken the result."""

    def __init__(self, op: str):
        self.op = op
        self.items: dict[int, Any] = {}
        self.taken = 0


class LocalWorld:
    """N ranks in one process; `communicators()` hands out one LocalCommunicator per rank."""

    def __init__(self, size: int, *, timeout: float = 30.0,
                 delay: Callable[[int, int, str], float] | None = None,
                 fail: Callable[[int, int, str], bool] | None = None):
        if size < 1:
            raise CommError(f"local world: size must be >= 1, got {size}")
        self.size = size
        self.timeout = timeout
        self.delay = delay
        self.fail = fail
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self.aborted: tuple[int, int] | None = None  # (rank, code) of the first abort
        self.calls: list[tuple[int, int, str]] = []  # (rank, seq, op), for tests

    def communicators(self) -> list[LocalCommunicator]:
        return [LocalCommunicator(self, r) for r in range(self.size)]

    def _check_aborted(self, rank: int) -> None:
        if self.aborted is not None:
            who, code = self.aborted
            raise CommError(f"rank {rank}: job aborted by rank {who} (exit status {code})")

    def abort(self, rank: int, code: int) -> None:
        with self._cond:
            if self.aborted is None:
                self.aborted = (rank, code)
            self._cond.notify_all()

    def collective(self, rank: int, seq: int, op: str, item: Any,
                   combine: Callable[[dict[int, Any]], Any]) -> Any:
        """Contribute `item` to collective number `seq`; return `combine(items by rank)` once
        every rank has contributed."""
        if self.delay is not None:
            pause = self.delay(rank, seq, op)
            if pause:
                time.sleep(pause)
        if self.fail is not None and self.fail(rank, seq, op):
            raise CommError(f"rank {rank}: injected failure in {op} #{seq}")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            self._check_aborted(rank)
            self.calls.append((rank, seq, op))
            slot = self._slots.setdefault(seq, _Slot(op))
            if slot.op != op:
                raise CommError(f"rank {rank}: collective #{seq} is {op} here but {slot.op} "
                                f"on rank {min(slot.items)}")
            slot.items[rank] = item
            self._cond.notify_all()
            while len(slot.items) < self.size:
                self._check_aborted(rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.size)) - set(slot.items))
                    raise CommError(f"rank {rank}: {op} #{seq} timed out after "
                                    f"{self.timeout:g} s waiting for rank(s) {missing}")
                self._cond.wait(left)
            result = combine(slot.items)
            slot.taken += 1
            if slot.taken == self.size:
                del self._slots[seq]
            return result


class LocalCommunicator(Communicator):
    """Rank `rank` of a LocalWorld; run each rank in its own thread."""

    name = "local"

    def __init__(self, world: LocalWorld, rank: int, channel: int = 0):
        self.world = world
        self.rank = rank
        self.size = world.size
        self.channel = channel  # a duplicate's collectives are numbered apart
        self._seq = 0
        self._duplicates = 0

    def _next(self):
        self._seq += 1
        return self._seq if not self.channel else (self.channel, self._seq)

    def duplicate(self) -> LocalCommunicator:
        """The same ranks, collectives numbered on a channel of their own (every rank's
        k-th duplicate shares one)."""
        self.barrier()
        self._duplicates += 1
        return LocalCommunicator(self.world, self.rank, self.channel * 1000 + self._duplicates)

    def allreduce_sum(self, buf: np.ndarray) -> None:
        check_buffer(buf, self.rank)

        def combine(items):
            shapes = {r: a.shape for r, a in items.items()}
            if len(set(shapes.values())) != 1:
                raise CommError(f"rank {self.rank}: all-reduce sizes differ across ranks: "
                                f"{shapes}")
            total = items[0].copy()
            for r in range(1, self.size):
                total += items[r]
            return total

        buf[...] = self.world.collective(self.rank, self._next(), "allreduce", buf.copy(),
                                         combine)

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        if not 0 <= root < self.size:
            raise CommError(f"rank {self.rank}: broadcast root {root} out of range "
                            f"(world size {self.size})")
        mine = copy.deepcopy(obj) if self.rank == root else None
        got = self.world.collective(self.rank, self._next(), f"broadcast(root={root})", mine,
                                    lambda items: items[root])
        if isinstance(obj, np.ndarray) and self.rank != root:
            if obj.shape != got.shape or obj.dtype != got.dtype:
                raise CommError(f"rank {self.rank}: broadcast array is {obj.shape} {obj.dtype} "
                                f"here but {got.shape} {got.dtype} on root {root}")
            obj[...] = got
            return obj
        return copy.deepcopy(got)

    def allgather(self, obj: Any) -> list:
        got = self.world.collective(self.rank, self._next(), "allgather", copy.deepcopy(obj),
                                    lambda items: [items[r] for r in range(self.size)])
        return copy.deepcopy(got)

    def barrier(self) -> None:
        self.world.collective(self.rank, self._next(), "barrier", None, lambda items: None)

    def abort(self, code: int = 1) -> None:
        self.world.abort(self.rank, code)
        raise CommError(f"rank {self.rank}: aborted with exit status {code}")

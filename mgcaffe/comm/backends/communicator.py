"""The communicator interface every backend implements (local threads, MPI, later NCCL).

A communicator connects `size` ranks; each rank holds one. Every method is a collective: all
ranks call it, in the same order. The gradient path needs only `allreduce_sum`; start-up and the
per-iteration agreements use `broadcast`, `allgather` and small all-reduces; faults end the job
through `abort`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ...errors import CommError

__all__ = ["Communicator", "check_buffer"]


def check_buffer(buf: Any, rank: int, what: str = "all-reduce buffer") -> None:
    """A reduction buffer must be a C-contiguous float32 numpy array (reduced in place)."""
    if not isinstance(buf, np.ndarray):
        raise CommError(f"rank {rank}: {what} must be a numpy array, got {type(buf).__name__}")
    if buf.dtype != np.float32:
        raise CommError(f"rank {rank}: {what} must be float32, got {buf.dtype}")
    if not buf.flags.c_contiguous:
        raise CommError(f"rank {rank}: {what} must be C-contiguous")


class Communicator(ABC):
    """A group of `size` ranks; this object is rank `rank` of it.

    - `allreduce_sum(buf)`: every rank's `buf` (contiguous float32) becomes the element-wise
      sum over ranks, in place; all ranks end with bit-identical contents.
    - `broadcast(obj, root)`: returns root's `obj` on every rank. A numpy array is sent as raw
      data into the caller's array (same shape and dtype on every rank) and returned; any other
      object is pickled.
    - `allgather(obj)`: the list of every rank's `obj`, indexed by rank.
    - `barrier()`: returns once every rank has entered it.
    - `abort(code)`: ends every rank with exit status `code` (MPI_Abort); does not return for
      a real launcher. Call it after logging the cause.
    """

    rank: int
    size: int
    name: str = "communicator"

    @abstractmethod
    def allreduce_sum(self, buf: np.ndarray) -> None:
        """Sum `buf` over all ranks, in place."""

    @abstractmethod
    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """Root's `obj` on every rank (arrays in place into the caller's array)."""

    @abstractmethod
    def allgather(self, obj: Any) -> list:
        """Every rank's `obj`, as a list indexed by rank."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank has entered the barrier."""

    @abstractmethod
    def abort(self, code: int = 1) -> None:
        """End every rank with exit status `code`."""

    def any_true(self, flags: list[bool]) -> list[bool]:
        """Agree on a few yes/no flags: flag i is true on return iff it was on some rank.

        A tiny all-reduce (one float per flag); used once per iteration for stop/snapshot
        requests and non-finite losses, so every rank takes the same decision."""
        buf = np.asarray([1.0 if f else 0.0 for f in flags], dtype=np.float32)
        self.allreduce_sum(buf)
        return [bool(v > 0) for v in buf]

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release resources (nothing for most backends)."""

    def __repr__(self) -> str:
        return f"<{self.name} rank {self.rank} of {self.size}>"

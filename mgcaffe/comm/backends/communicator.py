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
from .wire import HOST_WIRES, sum_payloads

__all__ = ["Communicator", "block_bounds", "check_buffer"]


def check_buffer(buf: Any, rank: int, what: str = "all-reduce buffer") -> None:
    """A reduction buffer must be a C-contiguous float32 numpy array (reduced in place)."""
    if not isinstance(buf, np.ndarray):
        raise CommError(f"rank {rank}: {what} must be a numpy array, got {type(buf).__name__}")
    if buf.dtype != np.float32:
        raise CommError(f"rank {rank}: {what} must be float32, got {buf.dtype}")
    if not buf.flags.c_contiguous:
        raise CommError(f"rank {rank}: {what} must be C-contiguous")


def block_bounds(elements: int, size: int) -> list[tuple[int, int]]:
    """Rank r's block of an `elements`-long buffer in a reduce-scatter or all-gather:
    [floor(r * elements / size), floor((r + 1) * elements / size))."""
    cuts = [r * elements // size for r in range(size + 1)]
    return list(zip(cuts, cuts[1:]))


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
    - `reduce_scatter_sum(buf)` then `allgather_blocks(buf)`: the two halves of an all-reduce
      (the pair leaves the same sum in `buf` on every rank); between them only this rank's
      block (`block_bounds`) is summed. The defaults do the whole all-reduce in the first
      and nothing in the second: a backend overrides both or neither.
    - `allreduce_wire(buf, fmt)`, `reduce_scatter_wire`, `allgather_wire`: the same three
      over a compressed payload (wire.py: float16, or bfloat16 bits in uint16): the sum is
      rounded to `fmt` and identical on every rank. `wires` lists the formats a backend
      reduces. The defaults gather every rank's payload and sum them in numpy, in rank order
      (whole in the first half, nothing left for the second); backends override them.
    - `duplicate()`: a communicator over the same ranks whose collectives are ordered apart
      from this one's (MPI_Comm_dup), so that two threads can each issue collectives; a
      collective.
    """

    rank: int
    size: int
    name: str = "communicator"
    #: Each rank is a process of its own (an os._exit on one leaves the others running).
    one_process_per_rank: bool = False
    #: The wire formats this communicator reduces (model.cost.WIRE_FORMATS).
    wires: tuple[str, ...] = HOST_WIRES

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

    def reduce_scatter_sum(self, buf: np.ndarray) -> None:
        """The first half of an all-reduce: this rank's block of `buf` becomes the sum over
        ranks (the default sums every block)."""
        self.allreduce_sum(buf)

    def allgather_blocks(self, buf: np.ndarray) -> None:
        """The second half: every rank's block of `buf` to every rank (the default has
        nothing left to do after the default `reduce_scatter_sum`)."""
        check_buffer(buf, self.rank)

    def allreduce_wire(self, buf: np.ndarray, fmt: str) -> None:
        """Sum the payload `buf` of format `fmt` over all ranks, in place, rounded to `fmt`."""
        if fmt == "float32":
            self.allreduce_sum(buf)
        elif self.size > 1:
            buf[...] = sum_payloads(self.allgather(buf), fmt)

    def reduce_scatter_wire(self, buf: np.ndarray, fmt: str) -> None:
        """`reduce_scatter_sum` of a payload (the default reduces all of it)."""
        self.allreduce_wire(buf, fmt)

    def allgather_wire(self, buf: np.ndarray, fmt: str) -> None:  # noqa: B027 - a default
        """`allgather_blocks` of a payload (the default has nothing left to do)."""

    def duplicate(self) -> Communicator:
        """A communicator over the same ranks with its own ordering of collectives."""
        raise CommError(f"rank {self.rank}: the {self.name} communicator cannot be duplicated "
                        f"(needed to overlap the next forward pass with communication)")

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

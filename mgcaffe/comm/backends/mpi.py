"""The MPI communicator (mpi4py), and how to tell whether a launcher started this process.

mpi4py is imported only when an MPI communicator is built, so a single process started
without mpiexec never initialises MPI. MPI is initialised with MPI_THREAD_MULTIPLE: the
communication thread all-reduces while the main thread computes, and a watchdog thread may
call MPI_Abort while another thread is blocked in a collective.

mpi4py releases the GIL inside MPI calls, so the main thread keeps running Python (and BLAS,
which releases it too) during an all-reduce; benchmarks/bench_distributed.py measures the
overlap and docs/distributed.md reports it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from ...errors import CommError
from .communicator import Communicator, block_bounds, check_buffer
from .wire import sum_payloads

__all__ = ["LAUNCHER_VARIABLES", "MpiCommunicator", "launched_by_mpi"]

# Set by the common launchers in every process they start (MPICH/Hydra and Intel MPI: PMI_*;
# Open MPI: OMPI_*; PMIx-based launchers and srun --mpi=pmix: PMIX_RANK; MVAPICH: MV2_*).
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                      "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi(environ: dict | None = None) -> bool:
    """True when an MPI launcher (mpiexec, mpirun, srun) started this process."""
    env = os.environ if environ is None else environ
    return any(name in env for name in LAUNCHER_VARIABLES)


def _import_mpi():
    try:
        import mpi4py  # noqa: PLC0415 - lazy: a lone process must not initialise MPI

        mpi4py.rc.threads = True
        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - mpi4py is a dependency
        raise CommError(f"MPI needs mpi4py: pip install 'mgcaffe[mpich]', or mpi4py built "
                        f"for the site's MPI (docs/cluster.md) ({exc})") from exc
    return MPI


#: How an MPI communicator sums float16 payloads (MpiCommunicator's docstring).
HALF_SUMS = ("mpi", "host")
#: Words of each block one all-to-all round moves: MPICH's all-to-all of large blocks over
#: TCP ran at a third of the link's rate (2 hosts at 1 Gbit/s: 13.4 MB each way in 469 ms,
#: in 1 MiB rounds 146 ms, as fast as one MPI_Sendrecv of the same bytes: 148 ms). Rounds of
#: 512 KB took as long as float32's all-reduce of the same bytes on the link, 1 MiB ones up
#: to a third longer (float16 payloads of 16.8 and 53.5 MB gradients, median of 5 and 7, in
#: two sweeps: 91/87 and 257/303 ms against 130/118 and 284/309 ms).
A2A_WORDS = 1 << 18

# Seconds between flushing the log and MPI_Abort (see MpiCommunicator.abort).
ABORT_DRAIN_SECONDS = 0.3


class MpiCommunicator(Communicator):
    """A rank of an MPI communicator (default: MPI_COMM_WORLD).

    `wait` says how `allreduce_sum` waits. "block": MPI_Allreduce, which in MPICH (and most
    MPIs) spins on a core until done. "poll" (default): MPI_Iallreduce, tested in a loop for
    `spin_s` seconds, then between sleeps growing to `poll_s`. A spinning thread stays
    runnable, so when the compute threads already fill the cores every step of the
    all-reduce waits for a scheduler tick. Measured on the 2-core CI machine, 2 ranks:
    - GoogleNet under emulation with 64 per-layer all-reduces (WFBP) while backward runs:
      the communication thread's CPU went from 104 to 65-71 ms per iteration and WFBP's
      excess over the modelled schedule from 53% to 20%;
    - idle machine (bench-comm): 4 B 4-8 us either way; 1 MB 240-530 us polling against
      360-850 us blocking; 16 MB 3.4-3.7 ms against 5.1 ms.

    Buffers over `chunk_bytes` (default 16 MiB) are reduced as consecutive pieces of at most
    that size, one after the other: MPICH's shared-memory all-reduce of one large message
    costs twice the time and CPU of the same bytes in pieces (2 ranks, 53.5 MB, the whole
    GoogleNet gradient: 22.8-24.4 ms in one call against 10.0-11.3 ms in 4-16 MiB pieces,
    12-14 ms in 0.25-1 MiB pieces; 33.5 MB still took 20 ms; in the distributed benchmark the
    communication thread's CPU per SyncEASGD iteration went from 36-37 to 23 ms with 16 MiB
    pieces, 26 ms with 4 MiB ones). Every element is still summed by one MPI all-reduce;
    `chunk_bytes=0` sends each buffer whole.

    Compressed payloads (`allreduce_wire`, wire.py): MPI has a float16 datatype
    (MPIX_C_FLOAT16 / MPI_FLOAT16_T, summed by the library) but none for bfloat16. `half_sum`
    says how float16 is summed: "mpi" (the library's all-reduce of float16) or "host" (an
    all-to-all of the payload's blocks, each rank summing its block in float32 itself with
    wire.sum_payloads, then an all-gather of the 16-bit blocks, the default); bfloat16
    always takes the second way. MPICH sums float16 element by element in software: three
    times float32's time on normal values and twenty times on the subnormal ones a mean
    gradient mostly holds (8M elements, 2 ranks on one host: 99 and 626 ms against 22-32 ms
    for float32)."""

    name = "mpi"
    one_process_per_rank = True

    def __init__(self, comm: Any = None, *, wait: str = "poll", poll_s: float = 1e-4,
                 spin_s: float = 5e-4, chunk_bytes: int = 16 << 20, half_sum: str = "host"):
        if wait not in ("block", "poll"):
            raise CommError(f"MPI communicator: wait must be 'block' or 'poll', got {wait!r}")
        if half_sum not in HALF_SUMS:
            raise CommError(f"MPI communicator: half_sum must be one of "
                            f"{', '.join(HALF_SUMS)}, got {half_sum!r}")
        self.half_sum = half_sum
        self.wait = wait
        self.poll_s = poll_s
        self.spin_s = spin_s
        self.chunk_bytes = int(chunk_bytes)
        MPI = _import_mpi()
        self._MPI = MPI
        self._comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.thread_level = MPI.Query_thread()
        if self.thread_level < MPI.THREAD_MULTIPLE and self.size > 1:
            raise CommError(f"rank {self.rank}: the MPI library gives thread level "
                            f"{self.thread_level}, the communication thread needs "
                            f"MPI_THREAD_MULTIPLE ({MPI.THREAD_MULTIPLE})")

    @property
    def library(self) -> str:
        """The MPI library's version line (for the log)."""
        return self._MPI.Get_library_version().splitlines()[0].strip()

    def allreduce_sum(self, buf: np.ndarray) -> None:
        check_buffer(buf, self.rank)
        if self.size == 1:
            return
        step = self.chunk_bytes // buf.itemsize
        if step <= 0 or buf.size <= step:
            self._allreduce(buf)
            return
        flat = buf.reshape(-1)
        for start in range(0, flat.size, step):
            self._allreduce(flat[start:start + step])

    def _allreduce(self, buf: np.ndarray) -> None:
        """One MPI all-reduce of `buf`, in place, waiting as `wait` says."""
        if self.wait == "block":
            self._comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
            return
        self._finish(self._comm.Iallreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM))

    def _finish(self, req: Any) -> None:
        """Wait for a non-blocking collective. MPICH waits by spinning, so a blocked thread
        stays runnable and competes with the compute threads for the cores; sleeping between
        tests lets it off the CPU."""
        if self.wait == "block":
            req.Wait()
            return
        spin_until = time.perf_counter() + self.spin_s
        while time.perf_counter() < spin_until:  # quick completions: peers already there
            if req.Test():
                return
        nap = 1e-5
        while not req.Test():
            time.sleep(nap)
            nap = min(2 * nap, self.poll_s)

    def reduce_scatter_sum(self, buf: np.ndarray) -> None:
        """MPI_Reduce_scatter in place; MPI leaves this rank's summed block at the start of
        the buffer, so it is moved to its own place (a copy of 1/size of the buffer)."""
        check_buffer(buf, self.rank)
        if self.size == 1:
            return
        bounds = block_bounds(buf.size, self.size)
        counts = [e - s for s, e in bounds]
        flat = buf.reshape(-1)
        self._finish(self._comm.Ireduce_scatter(self._MPI.IN_PLACE, flat, counts,
                                                op=self._MPI.SUM))
        start, stop = bounds[self.rank]
        if start:
            flat[start:stop] = flat[:stop - start].copy()

    def allgather_blocks(self, buf: np.ndarray) -> None:
        check_buffer(buf, self.rank)
        if self.size == 1:
            return
        bounds = block_bounds(buf.size, self.size)
        counts = [e - s for s, e in bounds]
        self._finish(self._comm.Iallgatherv(
            self._MPI.IN_PLACE, [buf.reshape(-1), (counts, [s for s, _ in bounds]),
                                 self._MPI.FLOAT]))

    def duplicate(self) -> MpiCommunicator:
        """MPI_Comm_dup of this communicator, waiting alike (a collective)."""
        return MpiCommunicator(self._comm.Dup(), wait=self.wait, poll_s=self.poll_s,
                               spin_s=self.spin_s, chunk_bytes=self.chunk_bytes,
                               half_sum=self.half_sum)

    # ------------------------------------------------------------ compressed payloads
    def _native(self, fmt: str) -> bool:
        return fmt == "float16" and self.half_sum == "mpi"

    def allreduce_wire(self, buf: np.ndarray, fmt: str) -> None:
        if fmt == "float32":
            self.allreduce_sum(buf)
            return
        if self.size == 1:
            return
        if not self._native(fmt):
            self.reduce_scatter_wire(buf, fmt)
            self.allgather_wire(buf, fmt)
            return
        flat = buf.reshape(-1)
        step = self.chunk_bytes // buf.itemsize if self.chunk_bytes > 0 else flat.size
        for start in range(0, flat.size, max(step, 1)):
            self._finish(self._comm.Iallreduce(
                self._MPI.IN_PLACE, [flat[start:start + step], self._MPI.FLOAT16_T],
                op=self._MPI.SUM))

    def reduce_scatter_wire(self, buf: np.ndarray, fmt: str) -> None:
        """This rank's block of the payload summed (in its own place in `buf`)."""
        if fmt == "float32":
            self.reduce_scatter_sum(buf)
            return
        if self.size == 1:
            return
        flat = buf.reshape(-1)
        bounds = block_bounds(flat.size, self.size)
        counts = [e - s for s, e in bounds]
        start, stop = bounds[self.rank]
        if self._native(fmt):
            self._finish(self._comm.Ireduce_scatter(
                self._MPI.IN_PLACE, [flat, self._MPI.FLOAT16_T], counts, op=self._MPI.SUM))
            if start:
                flat[start:stop] = flat[:stop - start].copy()
            return
        # every rank's copy of this rank's block, in rounds of at most `A2A_WORDS` words
        # per block, each round's copies summed here
        mine, step = stop - start, A2A_WORDS
        got = np.empty(min(mine, step) * self.size, np.uint16)
        words = flat.view(np.uint16)
        for k in range(0, max(counts), step):
            send = [max(0, min(e - s - k, step)) for s, e in bounds]
            m = send[self.rank]
            self._finish(self._comm.Ialltoallv(
                [words, (send, [min(s + k, e) for s, e in bounds]), self._MPI.UINT16_T],
                [got, ([m] * self.size, [r * m for r in range(self.size)]),
                 self._MPI.UINT16_T]))
            if m:
                sum_payloads(got[:self.size * m].reshape(self.size, m), fmt,
                             out=flat[start + k:start + k + m])

    def allgather_wire(self, buf: np.ndarray, fmt: str) -> None:
        """Every rank's block of the payload to every rank (16-bit words as they are)."""
        if fmt == "float32":
            self.allgather_blocks(buf)
            return
        if self.size == 1:
            return
        words = buf.reshape(-1).view(np.uint16)
        bounds = block_bounds(words.size, self.size)
        counts = [e - s for s, e in bounds]
        self._finish(self._comm.Iallgatherv(
            self._MPI.IN_PLACE, [words, (counts, [s for s, _ in bounds]),
                                 self._MPI.UINT16_T]))

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        if isinstance(obj, np.ndarray):
            if not obj.flags.c_contiguous:
                raise CommError(f"rank {self.rank}: broadcast array must be C-contiguous")
            # Agree on the layout first: a raw Bcast into a differently shaped array would
            # corrupt memory or hang.
            layout = self._comm.bcast((obj.shape, obj.dtype.str), root=root)
            if layout != (obj.shape, obj.dtype.str):
                raise CommError(f"rank {self.rank}: broadcast array is {obj.shape} {obj.dtype} "
                                f"here but {layout[0]} {np.dtype(layout[1])} on root {root}")
            self._comm.Bcast(obj, root=root)
            return obj
        return self._comm.bcast(obj, root=root)

    def allgather(self, obj: Any) -> list:
        return self._comm.allgather(obj)

    def barrier(self) -> None:
        self._comm.Barrier()

    def abort(self, code: int = 1) -> None:
        # Flush first: MPI_Abort kills the process without running Python's exit handlers.
        sys.stdout.flush()
        sys.stderr.flush()
        # The launcher kills every process, its own output forwarders included, as soon as
        # it hears of the abort; lines still in its pipes were seen lost under load. A moment's
        # pause lets the message that says which rank failed and why reach the user.
        time.sleep(ABORT_DRAIN_SECONDS)
        self._comm.Abort(code)
        # MPICH's MPI_Abort can return in a process with other threads (it has told the
        # launcher to kill the job); this process must not run on meanwhile.
        os._exit(code)

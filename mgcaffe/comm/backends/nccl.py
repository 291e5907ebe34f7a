"""The NCCL communicator: one process per GPU, gradients all-reduced on their own CUDA stream.

Set-up (`NcclCommunicator(host)`): `host` is the process's host communicator (MPI under a
launcher, `SingleCommunicator` alone). Each rank picks its GPU by its rank within the node
(MPI_COMM_TYPE_SHARED, or equal host names for other host communicators): local rank i uses
the i-th visible GPU, and more ranks on a node than GPUs is an error, since NCCL needs one GPU
per rank. Rank 0 creates the NCCL unique id and the host communicator broadcasts it; then
every rank joins the NCCL communicator (ncclCommInitRank) within `timeout` seconds.

Device collectives run on one dedicated non-blocking CUDA stream, `stream`, so they overlap
the compute stream. The gradient path (the executor's communication thread) uses:

    comm.mark_ready(k)          # main thread, right after learnable layer k's backward:
                                #   records event k on the compute (current) stream
    comm.wait_ready(k)          # communication thread: the NCCL stream waits on event k
    comm.pack(pairs)            #   copies diffs into the group's buffer, on the NCCL stream
    comm.allreduce_sum_async(buf)   # a message's all-reduce, queued on the NCCL stream
    comm.reduce_scatter_sum_async(buf), comm.allgather_blocks_async(buf)   # or its halves
    comm.unpack(pairs, divisor) #   buffer / divisor back into the diffs, on the NCCL stream
    comm.mark_done(k)           # a plan that updates per layer: event "k is final" on the
    comm.wait_done(k)           #   NCCL stream; main thread: the compute stream waits on it
    comm.synchronize(what)      # once per iteration, on the communication thread

so no host synchronisation happens per layer: the host only queues work, and the GPU orders
it through the events. `allreduce_sum(buf)` (the Communicator interface) is the same
all-reduce followed by `synchronize`, and so are `reduce_scatter_sum`, `allgather_blocks`.

The halves: NCCL's reduce-scatter and all-gather work on equal blocks, so rank r's block of
an n-element buffer is [r * n // size, (r + 1) * n // size) of its first size * (n // size)
elements (`nccl_blocks`), each collective in place; the last n % size elements (fewer than
the ranks) are all-reduced whole with the reduce-scatter. The pair leaves the sum everywhere,
as the Communicator interface asks.

Host buffers (numpy arrays: the per-iteration flags of `any_true`, start-up agreements) and
every other collective (broadcast of objects, allgather, barrier) go through the host
communicator; CuPy arrays are broadcast with NCCL.

Faults. NCCL reports asynchronous errors (a peer lost, a network error) through
ncclCommGetAsyncError, polled while waiting; a collective that makes no progress for `timeout`
seconds (a peer killed or stuck: NCCL kernels wait forever) is cut short by ncclCommAbort.
Both raise a CommError naming the rank, its GPU and the operation; the training command's
`fail_all` then ends every rank (MPI_Abort). `abort(code)` aborts NCCL, then the host job.

Nothing here imports CuPy at module level: a CPU-only install can import this module.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ...backend import _import_cupy, is_device_array
from ...errors import CommError, MgcaffeError
from .communicator import Communicator
from .mpi import MpiCommunicator, _import_mpi

__all__ = ["NcclCommunicator", "gpu_identities", "local_gpu", "local_views", "nccl_blocks",
           "node_local_rank", "poll_until_done", "select_gpu"]

log = logging.getLogger("mgcaffe.comm")

#: Polling while waiting for the NCCL stream starts this short and doubles up to the cap:
#: short waits stay cheap, long ones do not keep the GIL busy.
_POLL_FIRST_S = 20e-6
_POLL_MAX_S = 200e-6
DEFAULT_TIMEOUT_S = 300.0


# ---------------------------------------------------------------------------- pure helpers
def node_local_rank(host: Communicator) -> tuple[int, int]:
    """(this rank's index among the ranks on its node, the number of ranks on the node).

    An MPI host communicator splits by shared memory (MPI_COMM_TYPE_SHARED); any other
    compares host names through `allgather` (which is what a thread-based test world has).
    """
    mpi_comm = _mpi_comm_of(host)
    if mpi_comm is not None:

        MPI = _import_mpi()
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=host.rank)
        try:
            return local.Get_rank(), local.Get_size()
        finally:
            local.Free()
    names = host.allgather(socket.gethostname())
    mine = names[host.rank]
    return sum(1 for n in names[:host.rank] if n == mine), names.count(mine)


def local_views(host: Communicator, mine: list[str]) -> list[list[str]]:
    """Every rank of this node's list of visible GPUs (`mine` here), in local-rank order."""
    everything = host.allgather((socket.gethostname(), mine))
    node = everything[host.rank][0]
    return [list(view) for name, view in everything if name == node]


def _mpi_comm_of(host: Communicator) -> Any:
    """The mpi4py communicator behind an MpiCommunicator (None for other hosts)."""

    if not isinstance(host, MpiCommunicator):
        return None
    return getattr(host, "mpi_comm", None) or host._comm


def select_gpu(local_rank: int, local_size: int, device_count: int,
               devices: Sequence[int] | None = None, rank: int = 0,
               views: Sequence[Sequence[str]] | None = None) -> int:
    """The GPU (an ordinal among this rank's visible ones) of local rank `local_rank`.

    `views`: what each of the node's ranks sees, one list of GPU identities (PCI bus ids)
    per local rank, in local-rank order. Where every rank sees the same GPUs (or `views` is
    not given), local rank i takes the i-th of `devices` (default: every visible GPU), and
    more ranks than GPUs is an error. Where a launcher gave ranks different GPUs (Slurm's
    --gpus-per-task or --gpu-bind, a wrapper setting CUDA_VISIBLE_DEVICES per rank), each
    rank takes the first of its own GPUs that no lower local rank took; two ranks left to
    share one GPU is an error naming both (NCCL needs one GPU per rank).
    """
    ids = list(range(device_count)) if devices is None else [int(d) for d in devices]
    if not ids:
        raise CommError(f"rank {rank}: no CUDA device is visible (CUDA_VISIBLE_DEVICES?); the "
                        f"NCCL backend needs one GPU per rank")
    bad = [d for d in ids if not 0 <= d < device_count]
    if bad:
        raise CommError(f"rank {rank}: GPU ids {bad} do not exist; {device_count} visible "
                        f"(0..{device_count - 1})")
    if len(set(ids)) != len(ids):
        raise CommError(f"rank {rank}: GPU ids {ids} repeat; NCCL needs one GPU per rank")
    if views is not None and any(list(v) != list(views[0]) for v in views):
        return _bound_gpu(local_rank, ids, views, rank)
    if local_size > len(ids):
        raise CommError(f"rank {rank}: {local_size} ranks on this node but {len(ids)} GPU(s) "
                        f"{ids}; NCCL needs one GPU per rank: start at most {len(ids)} ranks "
                        f"per node")
    return ids[local_rank]


def _bound_gpu(local_rank: int, ids: list[int], views, rank: int) -> int:
    """The launcher-bound case of select_gpu: first free GPU of each rank, in rank order."""
    taken: dict[str, int] = {}
    choice = {}
    for r, view in enumerate(views):
        mine = [view[i] for i in ids if i < len(view)]
        free = [g for g in mine if g not in taken]
        if not free:
            other = taken[mine[0]] if mine else None
            raise CommError(f"rank {rank}: local ranks {other} and {r} of this node would share "
                            f"GPU {mine[0] if mine else '?'} (the launcher gave them the same "
                            f"GPUs: CUDA_VISIBLE_DEVICES, --gpus-per-task, --gpu-bind); NCCL "
                            f"needs one GPU per rank")
        taken[free[0]] = r
        choice[r] = free[0]
    return views[local_rank].index(choice[local_rank])


def local_gpu(host: Communicator, devices: Sequence[int] | None = None
              ) -> tuple[int, int, int]:
    """(this rank's GPU ordinal, local rank, ranks on the node): `select_gpu` with what every
    rank of the node sees (a collective over `host`)."""
    cupy = _import_cupy()
    local_rank, local_size = node_local_rank(host)
    count = cupy.cuda.runtime.getDeviceCount()
    views = local_views(host, gpu_identities(cupy, count))
    gpu = select_gpu(local_rank, local_size, count, devices, host.rank, views)
    return gpu, local_rank, local_size


def nccl_blocks(elements: int, size: int) -> tuple[int, int]:
    """(elements per rank's block, the tail all-reduced whole) of a reduce-scatter or
    all-gather of `elements` over `size` ranks (module docstring)."""
    block = elements // size
    return block, elements - block * size


def gpu_identities(cupy, count: int) -> list[str]:
    """The PCI bus id of each visible GPU (no context needed): what tells whether two ranks
    see the same physical GPU under different ordinals."""
    return [str(cupy.cuda.Device(i).pci_bus_id) for i in range(count)]


def poll_until_done(is_done: Callable[[], bool], check: Callable[[], None], timeout: float,
                    on_timeout: Callable[[], BaseException]) -> None:
    """Return once `is_done()`; call `check()` (which raises on an error) between polls.

    After `timeout` seconds without completion, raise what `on_timeout()` returns (it also
    cleans up: the NCCL communicator aborts there). Polls start at 20 us and back off to
    200 us, so the waiting thread leaves the GIL to the compute thread.
    """
    deadline = time.monotonic() + timeout
    pause = _POLL_FIRST_S
    while not is_done():
        check()
        if time.monotonic() >= deadline:
            if is_done():
                break
            raise on_timeout()
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX_S)
    check()


def _import_nccl(rank: int):
    try:
        cupy = _import_cupy()
    except MgcaffeError as exc:
        raise CommError(f"rank {rank}: the NCCL backend needs CuPy and a CUDA GPU: {exc}") from None
    try:
        from cupy.cuda import nccl  # noqa: PLC0415 - optional, GPU installs only
    except ImportError as exc:
        raise CommError(f"rank {rank}: CuPy cannot load NCCL ({exc}): install it with "
                        f"`pip install nvidia-nccl-cu12` (or cu13, matching CuPy) or "
                        f"`python -m cupyx.tools.install_library --library nccl`") from None
    if not getattr(nccl, "available", True):
        raise CommError(f"rank {rank}: this CuPy was built without NCCL; use the MPI backend")
    return cupy, nccl


# ---------------------------------------------------------------------------- communicator
class NcclCommunicator(Communicator):
    """A rank of an NCCL communicator over `host`'s ranks, one GPU each; see the module doc.

    `devices`: the GPU ids this node's ranks may use (default: all visible ones), local rank i
    taking the i-th. `timeout`: seconds a set-up or collective may go without completing
    before it is aborted with a CommError.
    """

    name = "nccl"
    #: Tells the executor that this backend reduces device arrays on its own stream (the
    #: mark_ready / wait_ready / pack / allreduce_sum_async / unpack / synchronize path).
    device_streams = True

    def __init__(self, host: Communicator, *, devices: Sequence[int] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S):
        self.host = host
        self.rank, self.size = host.rank, host.size
        if not timeout > 0:
            raise CommError(f"rank {self.rank}: NCCL timeout must be > 0, got {timeout}")
        self.timeout = float(timeout)
        self._cupy, self._nccl = _import_nccl(self.rank)
        cupy = self._cupy
        self.device_id, self.local_rank, self.local_size = local_gpu(host, devices)
        self.device = cupy.cuda.Device(self.device_id)
        # Each thread that works for this rank makes its GPU current once, with use():
        # `with device:` would set the thread's previous device (0 on a new thread) back on
        # exit, creating a context on GPU 0 from every rank (hundreds of MB each, and an
        # error on GPUs in exclusive-process mode).
        self._threads = threading.local()
        self._use_device()  # the calling (main) thread computes on this GPU from now on
        uid = self._nccl.get_unique_id() if self.rank == 0 else None
        uid = host.broadcast(uid, root=0)
        self._lock = threading.Lock()  # one NCCL call at a time (NCCL comms are not thread-safe)
        # Separate from _lock: an abort must get through while a call is stuck holding it.
        self._state_lock = threading.Lock()
        self._aborted: str | None = None
        self._comm = self._join(uid)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._done = cupy.cuda.Event(block=False, disable_timing=True)
        self._ready: dict[int, Any] = {}
        self._final: dict[int, Any] = {}
        self._dtypes = {np.dtype(np.float32): self._nccl.NCCL_FLOAT32,
                        np.dtype(np.float64): self._nccl.NCCL_FLOAT64,
                        np.dtype(np.float16): self._nccl.NCCL_FLOAT16}
        if self.rank == 0:
            log.info("NCCL %s: %d ranks, one GPU each; this node's ranks use GPUs by local "
                     "rank", self.version, self.size)
        log.debug("rank %d: local rank %d of %d, GPU %d", self.rank, self.local_rank,
                  self.local_size, self.device_id)

    @property
    def version(self) -> str:
        """NCCL's runtime version, e.g. '2.21.5'."""
        code = int(self._nccl.get_version())
        major, rest = divmod(code, 10000) if code >= 10000 else divmod(code, 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"

    def _where(self) -> str:
        return f"rank {self.rank} (GPU {self.device_id})"

    def _use_device(self) -> None:
        """Make this rank's GPU current for the calling thread (once per thread)."""
        if not getattr(self._threads, "current", False):
            self.device.use()
            self._threads.current = True

    def _join(self, uid):
        """ncclCommInitRank in a helper thread, so that a rank that never joins is reported
        after `timeout` instead of hanging every other rank forever."""
        result: dict[str, Any] = {}

        def init():
            try:
                self.device.use()  # a thread of its own: its device stays this rank's
                result["comm"] = self._nccl.NcclCommunicator(self.size, uid, self.rank)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                result["error"] = exc

        thread = threading.Thread(target=init, name=f"mgcaffe-nccl-init-{self.rank}",
                                  daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise CommError(f"{self._where()}: NCCL set-up (ncclCommInitRank, {self.size} "
                            f"ranks) not done after {self.timeout:g} s: a rank did not join")
        if "error" in result:
            exc = result["error"]
            raise CommError(f"{self._where()}: NCCL set-up failed: {type(exc).__name__}: "
                            f"{exc}") from exc
        return result["comm"]

    # -------------------------------------------------------------- checks and errors
    def _live(self, what: str) -> Any:
        if self._aborted is not None:
            raise CommError(f"{self._where()}: {what} on an NCCL communicator that is no "
                            f"longer usable ({self._aborted})")
        return self._comm

    def _check_device_buffer(self, buf, what: str):
        if not is_device_array(buf):
            raise CommError(f"{self._where()}: {what} must be a CuPy array, got "
                            f"{type(buf).__name__}")
        dtype = self._dtypes.get(np.dtype(buf.dtype))
        if dtype is None:
            raise CommError(f"{self._where()}: {what} must be float16, float32 or float64, got "
                            f"{buf.dtype}")
        if not buf.flags.c_contiguous:
            raise CommError(f"{self._where()}: {what} must be C-contiguous")
        if buf.device.id != self.device_id:
            raise CommError(f"{self._where()}: {what} lives on GPU {buf.device.id}")
        return dtype

    def _nccl_call(self, what: str, call: Callable[[Any], None]) -> None:
        with self._lock:
            comm = self._live(what)
            try:
                self._use_device()
                call(comm)
            except self._nccl.NcclError as exc:
                raise CommError(f"{self._where()}: NCCL {what} failed: {exc}") from exc

    def _check_async(self, what: str) -> None:
        comm = self._live(what)
        try:
            comm.check_async_error()
        except self._nccl.NcclError as exc:
            self._abort_nccl(f"asynchronous error during {what}")
            raise CommError(f"{self._where()}: NCCL {what} failed: {exc}") from exc

    def _abort_nccl(self, reason: str) -> None:
        """ncclCommAbort: stops this rank's pending NCCL kernels; the communicator is dead.

        Does not wait for `_lock`: a call stuck inside NCCL (connecting to a dead peer) holds
        it, and the abort is what unblocks that call."""
        with self._state_lock:
            if self._aborted is not None:
                return
            self._aborted = reason
            try:
                self._comm.abort()
            except Exception as exc:  # noqa: BLE001 - already failing; keep the first cause
                log.error("%s: ncclCommAbort failed: %s", self._where(), exc)

    # -------------------------------------------------------------- the gradient path
    def mark_ready(self, k: int) -> None:
        """Main thread: learnable layer k's gradients are queued on the current (compute)
        stream; record event k there. Reused every iteration: the executor's wait() orders
        this iteration's waits before the next iteration's records."""
        event = self._ready.get(k)
        if event is None:
            self._use_device()
            event = self._ready[k] = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record()

    def wait_ready(self, k: int) -> None:
        """Communication thread: NCCL-stream work queued from now on waits for event k."""
        event = self._ready.get(k)
        if event is None:
            raise CommError(f"{self._where()}: layer {k} was never marked ready "
                            f"(mark_ready({k}) must come first)")
        self.stream.wait_event(event)

    def mark_done(self, k: int) -> None:
        """Communication thread: layer k's final gradient is queued on the NCCL stream;
        record event k there (reused every iteration, as `mark_ready`'s)."""
        event = self._final.get(k)
        if event is None:
            self._use_device()
            event = self._final[k] = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)

    def wait_done(self, k: int) -> None:
        """Main thread: work queued on the current (compute) stream from now on waits for
        layer k's final gradient, on the device."""
        event = self._final.get(k)
        if event is None:
            raise CommError(f"{self._where()}: layer {k} was never marked done "
                            f"(mark_done({k}) must come first)")
        self._cupy.cuda.get_current_stream().wait_event(event)

    def pack(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        """Copy each (destination, source) pair on the NCCL stream: diffs into the buffer."""
        cupy = self._cupy
        self._use_device()
        with self.stream:
            for dst, src in pairs:
                cupy.copyto(dst, src)

    def unpack(self, pairs: Iterable[tuple[Any, Any]], divisor: float = 1) -> None:
        """dst = src / divisor for each (source, destination) pair, on the NCCL stream: the
        reduced buffer back into the diffs, averaged."""
        cupy = self._cupy
        self._use_device()
        with self.stream:
            for src, dst in pairs:
                if divisor == 1:
                    cupy.copyto(dst, src)
                else:
                    cupy.divide(src, divisor, out=dst)

    def allreduce_sum_async(self, buf) -> None:
        """Queue the in-place sum of `buf` (contiguous float32/64 CuPy array on this rank's
        GPU) over all ranks on the NCCL stream; returns at once."""
        dtype = self._check_device_buffer(buf, "all-reduce buffer")
        ptr, count, stream = buf.data.ptr, int(buf.size), self.stream.ptr
        self._nccl_call(f"all-reduce of {buf.nbytes} bytes", lambda comm: comm.allReduce(
            ptr, ptr, count, dtype, self._nccl.NCCL_SUM, stream))

    def reduce_scatter_sum_async(self, buf) -> None:
        """Queue the first half of the in-place all-reduce of `buf` on the NCCL stream: this
        rank's block summed (and the tail whole; module docstring); returns at once."""
        dtype = self._check_device_buffer(buf, "reduce-scatter buffer")
        block, tail = nccl_blocks(int(buf.size), self.size)
        ptr, item, stream = buf.data.ptr, buf.itemsize, self.stream.ptr
        what = f"reduce-scatter of {buf.nbytes} bytes"
        if block:  # in place: the receive buffer is this rank's block of the send buffer
            self._nccl_call(what, lambda comm: comm.reduceScatter(
                ptr, ptr + self.rank * block * item, block, dtype, self._nccl.NCCL_SUM, stream))
        if tail:
            start = ptr + block * self.size * item
            self._nccl_call(what, lambda comm: comm.allReduce(
                start, start, tail, dtype, self._nccl.NCCL_SUM, stream))

    def allgather_blocks_async(self, buf) -> None:
        """Queue the second half on the NCCL stream: every rank's block to every rank."""
        dtype = self._check_device_buffer(buf, "all-gather buffer")
        block, _ = nccl_blocks(int(buf.size), self.size)
        if not block:
            return
        ptr, item, stream = buf.data.ptr, buf.itemsize, self.stream.ptr
        self._nccl_call(f"all-gather of {buf.nbytes} bytes", lambda comm: comm.allGather(
            ptr + self.rank * block * item, ptr, block, dtype, stream))

    # NCCL sums float16 natively; CuPy has no bfloat16 arrays to hold NCCL's bfloat16 in
    wires = ("float32", "float16")

    def allreduce_wire(self, buf, fmt: str) -> None:
        """A compressed payload's sum: a CuPy float16 array queued on the NCCL stream (the
        data path waits for it, see `all_finite`), a numpy payload through the host."""
        if isinstance(buf, np.ndarray):
            self.host.allreduce_wire(buf, fmt)
        else:
            self.allreduce_sum_async(buf)

    def reduce_scatter_wire(self, buf, fmt: str) -> None:
        if isinstance(buf, np.ndarray):
            self.host.reduce_scatter_wire(buf, fmt)
        else:
            self.reduce_scatter_sum_async(buf)

    def allgather_wire(self, buf, fmt: str) -> None:
        if isinstance(buf, np.ndarray):
            self.host.allgather_wire(buf, fmt)
        else:
            self.allgather_blocks_async(buf)

    def all_finite(self, buf, what: str) -> bool:
        """Whether every value of `buf` (after what is queued on the NCCL stream) is finite:
        one reduction on the stream, then a host wait for its one-element answer."""
        cupy = self._cupy
        self._use_device()
        with self.stream:
            ok = cupy.isfinite(buf).all()
        self.synchronize(what)
        return bool(ok.get())

    def synchronize(self, what: str = "NCCL stream work", timeout: float | None = None) -> None:
        """Wait until everything queued on the NCCL stream is done, polling NCCL's
        asynchronous error; after `timeout` (default: the communicator's) abort NCCL and
        raise a CommError naming this rank, its GPU and `what`."""
        limit = self.timeout if timeout is None else float(timeout)
        self._live(what)
        self._use_device()
        self._done.record(self.stream)

        def is_done() -> bool:
            try:
                return self._done.done
            except Exception as exc:  # a CUDA error (e.g. an illegal address) is sticky
                raise CommError(f"{self._where()}: CUDA error while waiting for {what}: "
                                f"{exc}") from exc

        def expired() -> CommError:
            self._abort_nccl(f"{what} timed out")
            return CommError(f"{self._where()}: {what} not done after {limit:g} s: a peer "
                             f"rank died or is stuck; NCCL aborted")

        poll_until_done(is_done, lambda: self._check_async(what), limit, expired)

    # -------------------------------------------------------------- Communicator interface
    def allreduce_sum(self, buf) -> None:
        """Sum `buf` over all ranks in place: a CuPy array with NCCL (returns when done), a
        numpy array through the host communicator."""
        if isinstance(buf, np.ndarray):
            self.host.allreduce_sum(buf)
            return
        self.allreduce_sum_async(buf)
        self.synchronize(f"all-reduce of {buf.nbytes} bytes")

    def reduce_scatter_sum(self, buf) -> None:
        """The first half of an all-reduce (module docstring): a CuPy array with NCCL
        (returns when done), a numpy array through the host communicator."""
        if isinstance(buf, np.ndarray):
            self.host.reduce_scatter_sum(buf)
            return
        self.reduce_scatter_sum_async(buf)
        self.synchronize(f"reduce-scatter of {buf.nbytes} bytes")

    def allgather_blocks(self, buf) -> None:
        """The second half, as `reduce_scatter_sum`."""
        if isinstance(buf, np.ndarray):
            self.host.allgather_blocks(buf)
            return
        self.allgather_blocks_async(buf)
        self.synchronize(f"all-gather of {buf.nbytes} bytes")

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        """Root's `obj` everywhere: a CuPy array in place with NCCL, anything else through
        the host communicator."""
        if not is_device_array(obj):
            return self.host.broadcast(obj, root)
        dtype = self._check_device_buffer(obj, "broadcast array")
        layout = self.host.broadcast((obj.shape, obj.dtype.str), root)
        if layout != (obj.shape, obj.dtype.str):
            raise CommError(f"{self._where()}: broadcast array is {obj.shape} {obj.dtype} here "
                            f"but {layout[0]} {np.dtype(layout[1])} on root {root}")
        ptr, count, stream = obj.data.ptr, int(obj.size), self.stream.ptr
        # The array may have just been written on the compute stream: order after it.
        self._use_device()
        self.stream.wait_event(self._cupy.cuda.get_current_stream().record())
        self._nccl_call(f"broadcast of {obj.nbytes} bytes from rank {root}",
                        lambda comm: comm.bcast(ptr, count, dtype, root, stream))
        self.synchronize(f"broadcast of {obj.nbytes} bytes from rank {root}")
        return obj

    def allgather(self, obj: Any) -> list:
        return self.host.allgather(obj)

    def barrier(self) -> None:
        self.host.barrier()

    def abort(self, code: int = 1) -> None:
        """Abort NCCL (pending kernels stop), then end every rank through the host."""
        self._abort_nccl(f"abort({code})")
        self.host.abort(code)

    def close(self) -> None:
        """Finish queued work and release the NCCL communicator (idempotent)."""
        if self._aborted is not None:
            return
        try:
            self.synchronize("work queued before close()")
        finally:
            with self._lock, self._state_lock:
                if self._aborted is None:
                    self._aborted = "closed"
                    self._comm.destroy()

    def __repr__(self) -> str:
        return f"<nccl rank {self.rank} of {self.size}, GPU {self.device_id}>"

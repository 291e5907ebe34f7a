"""`cupy.cuda` of the double: devices, streams, events, pinned memory, the runtime, NCCL.

Per thread, as in CUDA: the current device (0 until `Device.use()`; `with Device(i):` restores
on exit the device that was current when it began) and the current stream of each device
(the legacy default stream `null` until a `with stream:` or `stream.use()`). Work is done at
once on numpy arrays; what the double keeps is where and on which stream each call would
have run, which devices got a context, and every host wait.

The visible devices follow CUDA_VISIBLE_DEVICES (read once, as the CUDA runtime does) over
the `devices` the double was installed with.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
import types

import numpy as np

from .counters import Counters

__all__ = ["Device", "Event", "State", "Stream", "make_cuda_module"]

_ids = itertools.count(0x7000)


class State:
    """One installed double: counters, device count, per-thread device and stream, pinned
    ranges and the in-process NCCL worlds."""

    def __init__(self, devices: int):
        self.physical = int(devices)
        self.counters = Counters()
        self.local = threading.local()
        self.pinned: list[tuple[int, int]] = []
        self.nccl_worlds: dict[bytes, dict] = {}
        self.lock = threading.Lock()
        self._visible: int | None = None

    # -- devices
    def visible(self) -> int:
        """How many devices this process sees (CUDA_VISIBLE_DEVICES applied)."""
        if self._visible is None:
            text = os.environ.get("CUDA_VISIBLE_DEVICES")
            if text is None:
                self._visible = self.physical
            else:
                count = 0
                for item in text.split(","):
                    item = item.strip()
                    if not item.isdigit() or int(item) >= self.physical:
                        break  # the runtime stops at the first invalid entry
                    count += 1
                self._visible = count
        return self._visible

    def physical_id(self, ordinal: int) -> int:
        """The installed device behind visible ordinal `ordinal`."""
        self.check_device(ordinal)
        text = os.environ.get("CUDA_VISIBLE_DEVICES")
        return int(ordinal) if text is None else int(text.split(",")[int(ordinal)])

    def current_device(self) -> int:
        return getattr(self.local, "device", 0)

    def set_device(self, index: int) -> None:
        """cudaSetDevice: since CUDA 12 it also creates the device's context."""
        self.check_device(index)
        self.local.device = int(index)
        self.counters.context(int(index))

    def enter_device(self, index: int) -> int:
        """What `with Device(index):` does on entry: the device current before."""
        previous = self.current_device()
        if previous != index:
            self.set_device(index)
        return previous

    def check_device(self, index: int) -> None:
        if not 0 <= int(index) < self.visible():
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {index} "
                               f"({self.visible()} visible)")

    # -- streams
    def current_stream(self) -> Stream:
        streams = getattr(self.local, "streams", None)
        if streams is None:
            streams = self.local.streams = {}
        device = self.current_device()
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = Stream._null_of(self, device)
        return stream

    def set_stream(self, stream: Stream) -> None:
        if not hasattr(self.local, "streams"):
            self.local.streams = {}
        self.local.streams[stream.device_id] = stream

    def launch(self, name: str, count: int = 1) -> None:
        """Account `count` device calls on the current device and stream."""
        device = self.current_device()
        self.counters.context(device)
        self.counters.launch(name, self.current_stream().label, count)

    # -- pinned memory
    def add_pinned(self, address: int, nbytes: int) -> None:
        with self.lock:
            self.pinned.append((address, address + nbytes))

    def is_pinned(self, array: np.ndarray) -> bool:
        if array.size == 0:
            return True
        start = array.ctypes.data
        return any(lo <= start < hi for lo, hi in self.pinned)


class Device:
    """cupy.cuda.Device: `id`, `use()`, `synchronize()`, a context manager."""

    _state: State

    def __init__(self, device=None):
        state = self._state
        self.id = state.current_device() if device is None else int(device)
        state.check_device(self.id)
        self._previous: list[int] = []

    def use(self) -> None:
        """Make this device current for the calling thread (until changed)."""
        self._state.set_device(self.id)

    def __enter__(self):
        self._previous.append(self._state.enter_device(self.id))
        return self

    def __exit__(self, *exc):
        # CuPy sets the previous device back, which on a thread that never chose one is
        # device 0: a context there (the reason to prefer `use()` once per thread).
        self._state.set_device(self._previous.pop())

    def synchronize(self) -> None:
        """Wait for all work on this device: a host synchronisation."""
        self._state.counters.context(self.id)
        self._state.counters.sync("Device.synchronize")

    @property
    def pci_bus_id(self) -> str:
        """The physical GPU behind this ordinal (CUDA_VISIBLE_DEVICES maps ordinals)."""
        return f"0000:{self._state.physical_id(self.id) + 1:02x}:00.0"

    @property
    def compute_capability(self) -> str:
        return "90"

    @property
    def mem_info(self) -> tuple[int, int]:
        return (140 << 30, 141 << 30)

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("device", self.id))

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class Stream:
    """cupy.cuda.Stream: `ptr`, a context manager that makes it current, `use()`,
    `synchronize()` (a host wait), `record()`, `wait_event()`, `done`."""

    _state: State

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False,
                 priority: int | None = None):
        state = self._state
        self.device_id = state.current_device()
        state.counters.context(self.device_id)
        self.ptr = 0 if null else next(_ids)
        self.non_blocking = bool(non_blocking)
        self._previous: list[Stream] = []
        self.waited: list[Event] = []

    @classmethod
    def _null_of(cls, state: State, device: int) -> Stream:
        stream = cls.__new__(cls)
        stream.device_id, stream.ptr, stream.non_blocking = device, 0, False
        stream._previous, stream.waited = [], []
        return stream

    @property
    def label(self) -> str:
        """'null' (the legacy default stream) or 'stream 0x...'."""
        return f"null:{self.device_id}" if self.ptr == 0 else f"stream {self.ptr:#x}"

    def __enter__(self):
        state = self._state
        self._previous.append(state.current_stream())
        state.set_stream(self)
        return self

    def __exit__(self, *exc):
        self._state.set_stream(self._previous.pop())

    def use(self) -> Stream:
        self._state.set_stream(self)
        return self

    def synchronize(self) -> None:
        self._state.counters.sync("Stream.synchronize")

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Work queued on this stream from now on waits for `event` (on the device)."""
        self.waited.append(event)

    @property
    def done(self) -> bool:
        return True

    def __eq__(self, other):
        return isinstance(other, Stream) and (other.ptr, other.device_id) == (
            self.ptr, self.device_id)

    def __hash__(self):
        return hash((self.ptr, self.device_id))

    def __repr__(self):
        return f"<Stream {self.label}>"


class Event:
    """cupy.cuda.Event: `record(stream)`, `synchronize()` (a host wait), `done`."""

    _state: State

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False):
        self.device_id = self._state.current_device()
        self.ptr = next(_ids)
        self.disable_timing = disable_timing
        self.stream: Stream | None = None
        self.time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.stream = self._state.current_stream() if stream is None else stream
        self.time = time.perf_counter()

    def synchronize(self) -> None:
        self._state.counters.sync("Event.synchronize")

    @property
    def done(self) -> bool:
        return True


def _get_elapsed_time(start: Event, end: Event) -> float:
    if start.time is None or end.time is None:
        raise RuntimeError("cudaErrorInvalidResourceHandle: an event was never recorded")
    if start.disable_timing or end.disable_timing:
        raise RuntimeError("cudaErrorInvalidResourceHandle: timing is disabled on an event")
    return 1e3 * (end.time - start.time)


class MemoryPointer:
    """An array's `data`: `ptr` (the numpy buffer's address: real memory, so the NCCL double
    can read it) and `device_id`."""

    def __init__(self, ptr: int, device_id: int, mem=None):
        self.ptr, self.device_id, self.mem = int(ptr), int(device_id), mem

    @property
    def device(self) -> Device:
        return Device(self.device_id)


class PinnedMemoryPointer:
    """alloc_pinned_memory's result: page-locked host memory (`ptr`, `size`; a buffer)."""

    def __init__(self, state: State, nbytes: int):
        self.mem = np.empty(max(int(nbytes), 1), dtype=np.uint8)
        self.ptr, self.size = self.mem.ctypes.data, int(nbytes)
        state.add_pinned(self.ptr, self.mem.nbytes)

    def __buffer__(self, flags):
        return memoryview(self.mem)[:self.size]


def _properties(index: int) -> dict:
    return {"name": b"CuPy double (numpy)", "totalGlobalMem": 141 << 30, "major": 9,
            "minor": 0, "multiProcessorCount": 132, "warpSize": 32,
            "maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64),
            "maxGridSize": (2147483647, 65535, 65535), "clockRate": 1980000,
            "sharedMemPerBlock": 49152, "regsPerBlock": 65536, "memPitch": 2147483647,
            "totalConstMem": 65536, "textureAlignment": 512, "deviceOverlap": 1,
            "kernelExecTimeoutEnabled": 0, "pciBusID": index + 1}


def make_cuda_module(state: State, checked) -> types.ModuleType:
    """The double's `cupy.cuda` (and `.runtime`, `.nccl`) bound to `state`; `checked(module,
    namespace)` wraps a module so that names CuPy lacks raise AttributeError."""
    for cls in (Device, Stream, Event):
        cls._state = state

    def get_current_stream(device_id=None):
        return state.current_stream()

    def alloc_pinned_memory(nbytes):
        return PinnedMemoryPointer(state, nbytes)

    def get_device_id():
        return state.current_device()

    runtime = checked("cupy.cuda.runtime", {
        "getDeviceCount": state.visible,
        "getDeviceProperties": lambda i: (state.check_device(i), _properties(i))[1],
        "runtimeGetVersion": lambda: 12080,
        "driverGetVersion": lambda: 12080,
        "getDevice": state.current_device,
        "setDevice": state.set_device,
        "deviceSynchronize": lambda: state.counters.sync("runtime.deviceSynchronize"),
        "memGetInfo": lambda: (140 << 30, 141 << 30),
        "CUDARuntimeError": RuntimeError,
    })
    nccl = checked("cupy.cuda.nccl", make_nccl_namespace(state))
    Stream.null = Stream._null_of(state, 0)
    return checked("cupy.cuda", {
        "Device": Device, "Stream": Stream, "Event": Event, "MemoryPointer": MemoryPointer,
        "PinnedMemoryPointer": PinnedMemoryPointer, "runtime": runtime, "nccl": nccl,
        "get_current_stream": get_current_stream, "get_elapsed_time": _get_elapsed_time,
        "alloc_pinned_memory": alloc_pinned_memory, "get_device_id": get_device_id,
        "is_available": lambda: state.visible() > 0,
    })


# ---------------------------------------------------------------------------- NCCL
class NcclError(RuntimeError):
    """cupy.cuda.nccl.NcclError."""


_NCCL_TYPES = {0: None, 6: np.float16, 7: np.float32, 8: np.float64}  # NCCL's codes


def make_nccl_namespace(state: State) -> dict:
    """The NCCL double: ranks of one world are threads of this process (joined by the
    unique id) or, under MPI, the processes of MPI_COMM_WORLD (the sums through a duplicate
    of it: NCCL's collectives are ordered apart from the host communicator's, as a real
    NCCL communicator's are)."""

    class NcclCommunicator:
        """ncclComm: `allReduce`, `reduceScatter`, `allGather`, `bcast` on device pointers
        (in place where NCCL allows it: the receive buffer this rank's block of the send
        buffer, or the other way round), `check_async_error`, `abort`, `destroy`."""

        def __init__(self, ndev: int, commId, rank: int):
            self._size, self._rank = int(ndev), int(rank)
            self.device_id = state.current_device()
            state.counters.context(self.device_id)
            world = _mpi_world(self._size)
            self._mpi = world.Dup() if world is not None else None
            if self._mpi is None:
                with state.lock:
                    world = state.nccl_worlds.setdefault(bytes(commId), {
                        "barrier": threading.Barrier(self._size, timeout=60), "slots": {}})
                self._world = world
            self._closed = False

        def rank_id(self):
            return self._rank

        def size(self):
            return self._size

        def _view(self, ptr, count, datatype):
            dtype = _NCCL_TYPES[datatype]
            ctype = {np.float16: ctypes.c_uint16, np.float32: ctypes.c_float,
                     np.float64: ctypes.c_double}[dtype]
            return np.ctypeslib.as_array((ctype * int(count)).from_address(int(ptr))).view(
                dtype)

        def _launch(self, name, stream_ptr):
            if self._closed:
                raise NcclError("ncclInvalidUsage: the communicator was destroyed")
            if state.current_device() != self.device_id:
                raise NcclError(f"ncclInvalidUsage: communicator of device {self.device_id} "
                                f"used while device {state.current_device()} is current")
            state.counters.context(self.device_id)
            label = "null" if not stream_ptr else f"stream {stream_ptr:#x}"
            state.counters.launch(f"nccl.{name}", label)

        def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
            self._launch("allReduce", stream)
            send = self._view(sendbuf, count, datatype)
            recv = self._view(recvbuf, count, datatype)
            if self._mpi is not None:
                from mpi4py import MPI  # noqa: PLC0415 - only under mpiexec

                data = send.copy()
                self._mpi.Allreduce(data, recv, op=MPI.SUM)
                return
            self._exchange(send.copy(), lambda parts: np.sum(parts, axis=0), recv)

        def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
            self._launch("reduceScatter", stream)
            send = self._view(sendbuf, recvcount * self._size, datatype).copy()
            recv = self._view(recvbuf, recvcount, datatype)
            if self._mpi is not None:
                from mpi4py import MPI  # noqa: PLC0415 - only under mpiexec

                self._mpi.Reduce_scatter_block(send, recv, op=MPI.SUM)
                return
            block = slice(self._rank * recvcount, (self._rank + 1) * recvcount)
            self._exchange(send, lambda parts: np.sum(parts, axis=0)[block], recv)

        def allGather(self, sendbuf, recvbuf, count, datatype, stream):
            self._launch("allGather", stream)
            send = self._view(sendbuf, count, datatype).copy()
            recv = self._view(recvbuf, count * self._size, datatype)
            if self._mpi is not None:
                self._mpi.Allgather(send, recv)
                return
            self._exchange(send, np.concatenate, recv)

        def bcast(self, buff, count, datatype, root, stream):
            self._launch("bcast", stream)
            view = self._view(buff, count, datatype)
            if self._mpi is not None:
                self._mpi.Bcast(view, root=root)
                return
            self._exchange(view.copy(), lambda parts: parts[root], view)

        def _exchange(self, mine, combine, out):
            world = self._world
            world["slots"][self._rank] = mine
            world["barrier"].wait()
            result = combine([world["slots"][r] for r in range(self._size)])
            world["barrier"].wait()
            out[...] = result

        def check_async_error(self):
            return None

        def abort(self):
            self._closed = True

        def destroy(self):
            self._closed = True

    def get_unique_id():
        return tuple(os.urandom(16))

    return {"NcclCommunicator": NcclCommunicator, "NcclError": NcclError,
            "get_unique_id": get_unique_id, "get_version": lambda: 22105,
            "NCCL_FLOAT16": 6, "NCCL_FLOAT32": 7, "NCCL_FLOAT64": 8, "NCCL_SUM": 0,
            "available": True}


def _mpi_world(size: int):
    """MPI_COMM_WORLD when this process runs under MPI with `size` ranks, else None."""
    try:
        from mpi4py import MPI  # noqa: PLC0415 - only present with the mpich extra
    except ImportError:
        return None
    if not MPI.Is_initialized() or MPI.COMM_WORLD.Get_size() != size or size == 1:
        return None
    return MPI.COMM_WORLD

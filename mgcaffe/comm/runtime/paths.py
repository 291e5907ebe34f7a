"""The data paths: where a message's bytes are packed, reduced and unpacked.

One object per executor, chosen from the diffs and the communicator (`data_path`), with one
interface the communication thread calls without knowing which it has:

- `mark_ready(k)` (main thread, right after layer k's backward) and `arrive(k, segments)`
  (the thread, when it takes k): the layer's gradient may be read from here on; packed
  layers are copied into the packing buffer (`segments`).
- `send(run, guard)`: one collective ("ar", "rs" or "ag") over a run of messages: their
  bytes gathered into scratch when they do not lie side by side, the collective (under
  `guard(run)`, the watchdog's deadline), the result scattered back. This is the seam a wire
  format (fp16 and such) goes into: what travels is decided here, per path.
- `divide(piece)`, `unpack(segments)`: the reduced sum becomes the mean: in place, or while
  copying back from the packing buffer into the diffs.
- `completed(layers)`, `gate(k)`: per-layer completion (device paths: an event after the
  layer's last copy, that the compute stream waits on; the host has nothing to wait for).
- `end_iteration(what)`: the iteration's one host wait where the work was queued on a device.

Paths:
- "host": numpy diffs over a host communicator (MPI, local threads, the network emulation).
  Division of reduced groups may be left to the main thread waiting for them (`defers`).
- "staged": device (CuPy) diffs over a host communicator: copies through pinned host memory
  on a copy stream of their own (staging.py); always packed.
- "stream": device diffs over a communicator with `device_streams` (NCCL, nccl.py): pack,
  collective and unpack queued on the communicator's stream, ordered after each layer's
  gradient by an event; no host wait until `end_iteration`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...backend import get_array_module, is_device_array
from ...errors import CommError
from ..backends.communicator import Communicator
from .layout import GradientLayout, Run, Segment
from .staging import DeviceStaging

__all__ = ["DATA_PATHS", "DataPath", "HostPath", "StagedPath", "StreamPath", "data_path"]

DATA_PATHS = ("host", "staged", "stream")


class DataPath:
    """The host path; the device paths override what differs (module docstring)."""

    name = "host"
    #: Whether the main thread, idle in wait(), may divide reduced groups (barrier plans):
    #: otherwise the thread takes that CPU from backward on busy cores.
    defers = True

    def __init__(self, comm: Communicator, layout: GradientLayout):
        self.comm = comm
        self.layout = layout
        self.size = comm.size
        self._buffer: Any = None
        self._scratch: Any = None

    # -- buffers
    def _zeros(self, elements: int) -> Any:
        return np.zeros(elements, np.float32)

    def packing(self) -> Any:
        """The packing buffer: every layer's place in the packing layout; allocated once."""
        if self._buffer is None:
            self._buffer = self._zeros(self.layout.total)
        return self._buffer

    @property
    def buffer(self) -> Any:
        """The packing buffer, or None while no group has needed one."""
        return self._buffer

    def scratch(self, elements: int) -> Any:
        """A buffer for runs whose parts do not lie side by side; grown, never shrunk (the
        executor grows it for each plan on the main thread, whose device is the rank's)."""
        if elements and (self._scratch is None or self._scratch.size < elements):
            self._scratch = self._zeros(elements)
        return self._scratch[:elements] if elements else None

    # -- the gradient path
    def enter_thread(self) -> None:
        """The communication thread's first call: a device path makes the rank's device the
        thread's current one, once (a thread starts on device 0)."""

    def mark_ready(self, k: int) -> None:
        """Main thread: layer k's gradient is computed (nothing to record on the host)."""

    def arrive(self, k: int, segments: list[Segment] | None) -> None:
        """Thread: layer k's gradient may be read; copy it into the packing buffer."""
        for seg in segments or ():
            np.copyto(seg.view, seg.blob.diff)

    #: the communicator's method for each kind of message
    methods = {"ar": "allreduce_sum", "rs": "reduce_scatter_sum", "ag": "allgather_blocks"}

    def _copy(self, pairs: list[tuple[Any, Any]]) -> None:
        """(destination, source) copies, in order."""
        for dst, src in pairs:
            np.copyto(dst, src)

    def send(self, run: Run, guard) -> tuple[float, float]:
        """The run's collective (module docstring); (start, end) of the collective call."""
        piece = run.joined
        places = []  # (the message's piece, its place in scratch)
        if piece is None:
            piece, offset = self.scratch(run.elements), 0
            for m in run.messages:
                places.append((m.piece, piece[offset:offset + m.piece.size]))
                offset += m.piece.size
            self._copy([(place, own) for own, place in places])
        collective = getattr(self.comm, self.methods[run.kind])
        t0 = time.perf_counter()
        with guard(run):
            collective(piece)
        t1 = time.perf_counter()
        if places:
            self._copy(places)
        return t0, t1

    def divide(self, piece: Any) -> None:
        """A reduced piece of the net's own buffer, divided by the world size in place."""
        if self.size != 1:  # x / 1 == x exactly: nothing to do for one rank
            np.divide(piece, self.size, out=piece)

    def unpack(self, segments: list[Segment]) -> None:
        """Reduced packed layers back into their diffs, divided by the world size."""
        for seg in segments:
            np.divide(seg.view, self.size, out=seg.blob.diff)

    def completed(self, layers: list[int]) -> None:
        """Thread: these layers' final gradients are written (or queued)."""

    def gate(self, k: int) -> None:
        """Main thread: what reads layer k's gradient next waits for it (the host: done)."""

    def end_iteration(self, what: str) -> None:
        """Thread: after the iteration's last message (a device path waits here)."""


HostPath = DataPath


class _DevicePath(DataPath):
    """What both device paths share: the diffs' device, current on the thread."""

    defers = False

    def __init__(self, comm: Communicator, layout: GradientLayout):
        super().__init__(comm, layout)
        self.first = next((d for ds in layout.diffs.values() for d in ds), None)
        self.device_id = getattr(getattr(self.first, "device", None), "id", 0)

    def enter_thread(self) -> None:
        if self.first is not None:
            get_array_module(self.first).cuda.Device(self.device_id).use()


class StagedPath(_DevicePath):
    """Device diffs reduced on the host through pinned memory (staging.py)."""

    name = "staged"

    def __init__(self, comm: Communicator, layout: GradientLayout):
        super().__init__(comm, layout)
        self.staging: DeviceStaging | None = None

    def packing(self) -> Any:
        if self._buffer is None:
            self.staging = DeviceStaging(self.device_id, self.layout.total)
            self._buffer = self.staging.buffer
        return self._buffer

    def mark_ready(self, k: int) -> None:
        self.staging.mark_ready(k)

    def arrive(self, k: int, segments: list[Segment] | None) -> None:
        self.staging.to_host(k, [(seg.view, seg.blob.diff) for seg in segments or ()])

    def send(self, run: Run, guard) -> tuple[float, float]:
        self.staging.wait()  # the run's bytes are on the host
        return super().send(run, guard)

    def unpack(self, segments: list[Segment]) -> None:
        for seg in segments:
            if self.size != 1:
                np.divide(seg.view, self.size, out=seg.view)
        self.staging.to_device([(seg.view, seg.blob.diff) for seg in segments])

    def completed(self, layers: list[int]) -> None:
        for k in layers:
            self.staging.mark_done(k)

    def gate(self, k: int) -> None:
        self.staging.wait_done(k)

    def end_iteration(self, what: str) -> None:
        if self.staging is not None:
            self.staging.wait()  # the update (main thread) must see the diffs


class StreamPath(_DevicePath):
    """Device diffs reduced on the communicator's own stream (nccl.py's protocol)."""

    name = "stream"

    def enter_thread(self) -> None:
        if is_device_array(self.first):  # (tests drive this path with host arrays)
            super().enter_thread()

    def _zeros(self, elements: int) -> Any:
        xp = get_array_module(self.first) if self.first is not None else np
        return xp.zeros(elements, dtype=np.float32)

    def mark_ready(self, k: int) -> None:
        self.comm.mark_ready(k)  # an event on the compute stream: k's diffs are queued

    def arrive(self, k: int, segments: list[Segment] | None) -> None:
        self.comm.wait_ready(k)
        if segments:
            self.comm.pack([(seg.view, seg.blob.diff) for seg in segments])

    methods = {"ar": "allreduce_sum_async", "rs": "reduce_scatter_sum_async",
               "ag": "allgather_blocks_async"}

    def _copy(self, pairs: list[tuple[Any, Any]]) -> None:
        self.comm.pack(pairs)

    def divide(self, piece: Any) -> None:
        if self.size != 1:
            self.comm.unpack([(piece, piece)], self.size)  # queued on the stream, in place

    def unpack(self, segments: list[Segment]) -> None:
        self.comm.unpack([(seg.view, seg.blob.diff) for seg in segments], self.size)

    def completed(self, layers: list[int]) -> None:
        for k in layers:
            self.comm.mark_done(k)

    def gate(self, k: int) -> None:
        self.comm.wait_done(k)

    def end_iteration(self, what: str) -> None:
        # The one host wait of the iteration, on this thread: everything queued on the
        # stream is done (and NCCL's errors polled) before the iteration counts as done.
        self.comm.synchronize(what)


def data_path(comm: Communicator, layout: GradientLayout, forced: str | None = None
              ) -> DataPath:
    """The path for these diffs over `comm`: host for numpy diffs, stream for device diffs
    over a communicator with `device_streams`, staged for device diffs over any other;
    `forced` (tests drive the stream path with host arrays) overrides."""
    name = forced
    if name is None:
        name = ("host" if not layout.on_device else
                "stream" if getattr(comm, "device_streams", False) else "staged")
    if name not in DATA_PATHS:
        raise CommError(f"rank {layout.rank}: data_path must be host, staged or stream, got "
                        f"{name!r}")
    return {"host": HostPath, "staged": StagedPath, "stream": StreamPath}[name](comm, layout)

"""The data paths: where a message's bytes are packed, reduced and unpacked.

One object per executor, chosen from the diffs and the communicator (`data_path`), with one
interface the communication thread calls without knowing which it has:

- `mark_ready(k)` (main thread, right after layer k's backward) and `arrive(k, segments)`
  (the thread, when it takes k): the layer's gradient may be read from here on; packed
  layers are copied into the packing buffer (`segments`).
- `send(run, guard)`: one collective ("ar", "rs" or "ag") over a run of messages: their
  bytes gathered into scratch when they do not lie side by side, the collective (under
  `guard(run)`, the watchdog's deadline), the result scattered back. A compressed run (the
  plan's format for its group: float16 or bfloat16) is divided by the world size while cast
  into its wire buffer, reduced in that format and cast back, already the mean; where the
  reduced payload holds an inf or a NaN (identical on every rank, so every rank decides
  alike) the message is sent again in float32 this iteration (`fallbacks` counts them).
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
from dataclasses import replace
from typing import Any

import numpy as np

from ...backend import get_array_module, is_device_array
from ...errors import CommError
from ..backends.communicator import Communicator
from ..backends.wire import all_finite, from_wire, to_wire, wire_dtype
from .layout import GradientLayout, Message, Run, Segment
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
        self._wires: dict[str, Any] = {}  # format -> a payload buffer of the packing layout
        self.fallbacks = 0  # compressed messages sent again in float32 (overflow)

    #: the wire formats this path can cast to (a device path: what its array library has)
    def formats(self) -> tuple[str, ...]:
        return tuple(f for f in ("float32", "float16", "bfloat16") if f in self.comm.wires)

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

    def wire_buffer(self, fmt: str) -> Any:
        """The payload buffer of format `fmt` (the packing layout's size); allocated once, by
        the executor on the main thread."""
        found = self._wires.get(fmt)
        if found is None:
            if fmt not in self.formats():
                raise CommError(f"rank {self.layout.rank}: wire format {fmt} is not available "
                                f"on the {self.name} path over {self.comm.name} (available: "
                                f"{', '.join(self.formats())}): use --compress=none or "
                                f"{'fp16' if 'float16' in self.formats() else 'none'}")
            found = self._wires[fmt] = self._wire_zeros(self.layout.total, fmt)
        return found

    def _wire_zeros(self, elements: int, fmt: str) -> Any:
        return np.zeros(elements, wire_dtype(fmt))

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
        if run.wire != "float32":
            return self._send_wire(run, guard)
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

    # -- compressed runs
    def _send_wire(self, run: Run, guard) -> tuple[float, float]:
        """A compressed run: its messages' payloads in the wire buffer, reduced as one
        collective where they lie side by side there (else one each)."""
        fmt, t0, t1 = run.wire, None, 0.0  # the first collective's start, the last's end
        wire = self.wire_buffer(fmt)
        method = {"ar": "allreduce_wire", "rs": "reduce_scatter_wire",
                  "ag": "allgather_wire"}[run.kind]
        for part in _adjacent(run.messages):
            first = part[0]
            payload = wire[first.wire_at:first.wire_at + sum(m.piece.size for m in part)]
            if run.kind != "ag":
                for m in part:
                    self._cast_in(m.piece, wire[m.wire_at:m.wire_at + m.piece.size], fmt)
            start = time.perf_counter()
            with guard(Run(part, None)):
                getattr(self.comm, method)(payload, fmt)
            t0, t1 = (start if t0 is None else t0), time.perf_counter()
            if run.kind != "rs":
                if self._finite(payload, fmt):
                    for m in part:
                        self._cast_out(wire[m.wire_at:m.wire_at + m.piece.size], m.piece, fmt)
                else:  # the message again, in float32: its pieces are untouched so far
                    self.fallbacks += len(part)
                    for m in part:
                        self.send(Run([replace(m, kind="ar", wire="float32")], m.piece),
                                  guard)
                        self.divide(m.piece)
        return t0, t1

    def _cast_in(self, piece: Any, payload: Any, fmt: str) -> None:
        """payload = format(piece / world size)."""
        to_wire(piece, self.size, fmt, payload)

    def _cast_out(self, payload: Any, piece: Any, fmt: str) -> None:
        from_wire(payload, fmt, piece)

    def _finite(self, payload: Any, fmt: str) -> bool:
        return all_finite(payload, fmt)

    def divide(self, piece: Any) -> None:
        """A reduced piece of the net's own buffer, divided by the world size in place."""
        if self.size != 1:  # x / 1 == x exactly: nothing to do for one rank
            np.divide(piece, self.size, out=piece)

    def unpack(self, segments: list[Segment], averaged: bool = False) -> None:
        """Reduced packed layers back into their diffs, divided by the world size (copied:
        `averaged`, a compressed message's)."""
        for seg in segments:
            if averaged:
                np.copyto(seg.blob.diff, seg.view)
            else:
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

    def unpack(self, segments: list[Segment], averaged: bool = False) -> None:
        for seg in segments:
            if self.size != 1 and not averaged:
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

    def formats(self) -> tuple[str, ...]:
        # CuPy has no bfloat16 array type: the device casts are float16's only
        return tuple(f for f in super().formats() if f != "bfloat16")

    def _wire_zeros(self, elements: int, fmt: str) -> Any:
        xp = get_array_module(self.first) if self.first is not None else np
        return xp.zeros(elements, dtype=np.float16)

    def _cast_in(self, piece: Any, payload: Any, fmt: str) -> None:
        self.comm.unpack([(piece, payload)], self.size)  # one kernel on the stream

    def _cast_out(self, payload: Any, piece: Any, fmt: str) -> None:
        self.comm.pack([(piece, payload)])  # one kernel on the stream

    def _finite(self, payload: Any, fmt: str) -> bool:
        # one reduction queued on the stream, and a host wait for its answer: the decision
        # to send again must be every rank's before the next collective is queued
        return self.comm.all_finite(payload, "the overflow check of a compressed message")

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

    def unpack(self, segments: list[Segment], averaged: bool = False) -> None:
        self.comm.unpack([(seg.view, seg.blob.diff) for seg in segments],
                         1 if averaged else self.size)

    def completed(self, layers: list[int]) -> None:
        for k in layers:
            self.comm.mark_done(k)

    def gate(self, k: int) -> None:
        self.comm.wait_done(k)

    def end_iteration(self, what: str) -> None:
        # The one host wait of the iteration, on this thread: everything queued on the
        # stream is done (and NCCL's errors polled) before the iteration counts as done.
        self.comm.synchronize(what)


def _adjacent(messages: list[Message]) -> list[list[Message]]:
    """Consecutive messages whose payloads lie side by side in the wire buffer."""
    out: list[list[Message]] = []
    for m in messages:
        if out and out[-1][-1].wire_at + out[-1][-1].piece.size == m.wire_at:
            out[-1].append(m)
        else:
            out.append([m])
    return out


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

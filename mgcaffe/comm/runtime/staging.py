"""Device gradients staged through host memory for a host communicator (MPI on GPUs).

The executor's "staged" path: each layer's diffs are copied to a page-locked (pinned) host
buffer as they become ready, the group is all-reduced on the host, and the averaged values
are copied back. The copies run on a stream of their own, ordered after the layer's
gradient by an event recorded on the compute stream, so a copy waits for that gradient
only, not for all compute queued after it (as a copy on the legacy default stream would),
and from pinned memory they are one asynchronous DMA each. The communication thread makes
the device current once (`Device.use()`), so it creates no context on another GPU.

Host waits, all on the communication thread: before a message's collective (its bytes must
be on the host) and after the iteration's last copy back (the update must see the diffs).
A plan that updates layer by layer has the compute stream wait for each layer's copy back on
the device instead (`mark_done`, `wait_done`): no host wait on the main thread.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ...backend import _import_cupy, _import_cupyx

__all__ = ["DeviceStaging"]


class DeviceStaging:
    """Pinned host buffer, copy stream and per-layer ready events of one executor."""

    def __init__(self, device_id: int, elements: int):
        cupy = _import_cupy()
        self._cupy = cupy
        self.device_id = int(device_id)
        self.buffer = _import_cupyx().zeros_pinned((elements,), dtype=np.float32)
        self._threads = threading.local()
        self._use_device()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._ready: dict[int, Any] = {}
        self._done: dict[int, Any] = {}

    def _use_device(self) -> None:
        if not getattr(self._threads, "current", False):
            self._cupy.cuda.Device(self.device_id).use()
            self._threads.current = True

    def _event(self, events: dict, k: int) -> Any:
        event = events.get(k)
        if event is None:
            event = events[k] = self._cupy.cuda.Event(block=False, disable_timing=True)
        return event

    def mark_ready(self, k: int) -> None:
        """Main thread, right after layer k's backward: an event on the compute stream."""
        self._event(self._ready, k).record()

    def mark_done(self, k: int) -> None:
        """Communication thread: layer k's copies back are queued; an event after them."""
        self._use_device()
        self._event(self._done, k).record(self.stream)

    def wait_done(self, k: int) -> None:
        """Main thread: work queued on the current stream from now on waits for layer k's
        copies back (on the device)."""
        self._cupy.cuda.get_current_stream().wait_event(self._done[k])

    def to_host(self, k: int, pairs) -> None:
        """Communication thread: queue (host view, device diff) copies after layer k's
        gradient, on the copy stream."""
        self._use_device()
        self.stream.wait_event(self._ready[k])
        for view, diff in pairs:
            diff.get(out=view, stream=self.stream, blocking=False)

    def wait(self) -> None:
        """Communication thread: every queued copy is done (a host wait)."""
        self._use_device()
        self.stream.synchronize()

    def to_device(self, pairs) -> None:
        """Communication thread: queue (host view, device diff) copies back."""
        self._use_device()
        for view, diff in pairs:
            diff.set(view, stream=self.stream)

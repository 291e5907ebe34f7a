"""A background thread that keeps a bounded queue of ready batches (Caffe's prefetching).

The producer is any callable returning the next batch. An exception in it is delivered to
the consumer in order: the `get` that would have returned the failed batch raises it (an
mgcaffe error unchanged, anything else wrapped in a DataError naming the prefetcher), and
every later `get` raises it again. Each wait on the queue is bounded and checks that the
thread is alive, so a producer that died for any reason cannot hang the consumer.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import DataError, MgcaffeError


class _Failure:
    """Queue marker carrying the producer's exception."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher:
    """Runs `produce()` repeatedly on a daemon thread, keeping up to `depth` results ready.

    name: how errors refer to the owner (e.g. "layer 'data' (Data)"). poll_s: the bounded
    wait between liveness checks.
    """

    def __init__(self, produce: Callable[[], Any], depth: int = 4, name: str = "prefetcher",
                 poll_s: float = 0.2):
        if depth < 1:
            raise DataError(f"{name}: prefetch depth must be at least 1, got {depth}")
        self.name = name
        self._produce = produce
        self._poll_s = poll_s
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"prefetch {name}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the producer thread is running."""
        return self._thread.is_alive()

    def _put(self, item) -> bool:
        """Put with bounded waits so that close() can always stop a blocked producer."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=self._poll_s)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._put(self._produce()):
                    return
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the consumer
            self._error = exc
            self._put(_Failure(exc))

    def _raise(self, exc: BaseException):
        if isinstance(exc, MgcaffeError):
            raise exc
        raise DataError(f"{self.name}: prefetch thread failed: {type(exc).__name__}: "
                        f"{exc}") from exc

    def get(self, timeout: float | None = None):
        """The next batch, in production order; raises the producer's error in its place.

        timeout: give up with a DataError after this many seconds even if the thread is
        alive (None: wait as long as it lives).
        """
        if self._closed:
            raise DataError(f"{self.name}: prefetcher is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                item = self._queue.get(timeout=self._poll_s)
            except queue.Empty:
                if not self._thread.is_alive():
                    try:  # it may have queued something just before exiting
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        if self._error is not None:
                            self._raise(self._error)
                        raise DataError(f"{self.name}: prefetch thread stopped without a "
                                        "batch or an error") from None
                elif deadline is not None and time.monotonic() > deadline:
                    raise DataError(f"{self.name}: no batch after {timeout:g} s (prefetch "
                                    "thread alive but not producing)") from None
                else:
                    continue
            if isinstance(item, _Failure):
                self._raise(item.exc)
            return item

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and drop queued batches; safe to call more than once."""
        self._closed = True
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

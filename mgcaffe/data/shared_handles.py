"""Database handles opened once per database and process, shared by counted readers.

Neither database library lets one process open a database twice (py-lmdb raises; LevelDB
holds a lock), yet a train and a test net, or ranks run as threads, may read the same one.
Each store acquires the handle for its database's identity and releases it when done; the
handle is closed with the last release.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any


class SharedHandles:
    """key -> [handle, reference count], under one lock."""

    def __init__(self):
        self._entries: dict[Hashable, list] = {}
        self._lock = threading.Lock()

    def acquire(self, key: Hashable, open_handle: Callable[[], Any]) -> Any:
        """The handle for `key`, opened with `open_handle()` if no one holds it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [open_handle(), 0]
            entry[1] += 1
            return entry[0]

    def release(self, key: Hashable) -> None:
        """Give back one share of `key`'s handle; the last one closes it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._entries[key]
                entry[0].close()

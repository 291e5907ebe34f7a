"""What the CuPy double counts: device calls ("launches"), host synchronisations with the
line that caused them, bytes copied each way, per stream and per device context.

Counts are deterministic (they depend on the code and the shapes, never on timing), so tests
may assert them and benchmarks may set budgets on them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Counters", "call_site"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_NUMPY = os.path.dirname(os.path.abspath(sys.modules["numpy"].__file__))
_SKIP = (_HERE, _NUMPY, os.path.dirname(threading.__file__) + os.sep + "threading.py")


def call_site() -> str:
    """'path:line function' of the nearest caller outside the double, numpy and the
    standard library's threading (the line in mgcaffe that asked for the work)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_SKIP):
            path = name
            for marker in ("/mgcaffe/", "/tests/", "/tools/", "/benchmarks/"):
                at = name.rfind(marker)
                if at >= 0:
                    path = name[at + 1:]
                    break
            return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


@dataclass
class Counters:
    """Running totals since the double was installed (or `reset()`)."""

    launches: int = 0
    syncs: int = 0
    h2d_bytes: int = 0
    h2d_pageable_bytes: int = 0  # the part of h2d_bytes copied from pageable host memory
    d2h_bytes: int = 0
    d2h_pageable_bytes: int = 0
    d2d_bytes: int = 0
    launches_by_name: Counter = field(default_factory=Counter)
    launches_by_stream: Counter = field(default_factory=Counter)
    sync_sites: Counter = field(default_factory=Counter)
    copy_sites: Counter = field(default_factory=Counter)  # "h2d/d2h site" -> bytes
    contexts: set = field(default_factory=set)  # devices on which work was done
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def launch(self, name: str, stream: str, count: int = 1) -> None:
        """`count` device calls of `name` on `stream`."""
        if count <= 0:
            return
        with self._lock:
            self.launches += count
            self.launches_by_name[name] += count
            self.launches_by_stream[stream] += count

    def sync(self, what: str) -> None:
        """A host wait for the device (`what`: e.g. 'float()', 'Stream.synchronize')."""
        site = call_site()
        with self._lock:
            self.syncs += 1
            self.sync_sites[f"{site} ({what})"] += 1

    def copy(self, direction: str, nbytes: int, pinned: bool) -> None:
        """`nbytes` copied 'h2d', 'd2h' or 'd2d' (pinned: the host side is page-locked)."""
        nbytes = int(nbytes)
        with self._lock:
            if direction == "h2d":
                self.h2d_bytes += nbytes
                if not pinned:
                    self.h2d_pageable_bytes += nbytes
            elif direction == "d2h":
                self.d2h_bytes += nbytes
                if not pinned:
                    self.d2h_pageable_bytes += nbytes
            else:
                self.d2d_bytes += nbytes
        if direction != "d2d":
            self.copy_sites[f"{direction} {call_site()}"] += nbytes

    def context(self, device: int) -> None:
        """Work was done on `device` (a CUDA context exists there)."""
        if device not in self.contexts:
            with self._lock:
                self.contexts.add(device)

    def reset(self) -> None:
        """Zero every count (the contexts stay: they exist until the process ends)."""
        with self._lock:
            self.launches = self.syncs = 0
            self.h2d_bytes = self.h2d_pageable_bytes = 0
            self.d2h_bytes = self.d2h_pageable_bytes = self.d2d_bytes = 0
            for c in (self.launches_by_name, self.launches_by_stream, self.sync_sites,
                      self.copy_sites):
                c.clear()

    def totals(self) -> dict:
        """The scalar counts as a dict (for differences and JSON)."""
        return {"launches": self.launches, "syncs": self.syncs, "h2d_bytes": self.h2d_bytes,
                "h2d_pageable_bytes": self.h2d_pageable_bytes, "d2h_bytes": self.d2h_bytes,
                "d2h_pageable_bytes": self.d2h_pageable_bytes, "d2d_bytes": self.d2d_bytes}

"""Timeline traces in the Chrome trace-event format (chrome://tracing, ui.perfetto.dev).

Each rank records complete events ("ph": "X") with its rank as `pid` and a row as `tid`:
`compute` (forward and backward of layers, the update, waits for the gradients) and `comm`
(one event per all-reduce, with its group, layers and bytes). Times are microseconds from a
common origin taken right after a barrier, so the ranks' rows line up. At the end rank 0
gathers every rank's events and writes one file:

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "metadata": {"world_size": N, "predicted_iteration_s": ..., "plan": {...}}}

Categories: "forward", "backward", "grad" (instant: a learnable layer's gradient is ready),
"allreduce", "wait", "update", "iteration".
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...errors import CommError
from ...formats.jsonio import read_json

__all__ = ["COMM", "COMPUTE", "Tracer", "iteration_times", "load_trace", "merge_traces",
           "save_trace"]

COMPUTE = "compute"
COMM = "comm"
_TIDS = {COMPUTE: 0, COMM: 1}


class Tracer:
    """Collects one rank's events; cheap enough to leave on for a whole run (a list append)."""

    def __init__(self, rank: int = 0, clock=time.perf_counter):
        self.rank = rank
        self.clock = clock
        self.origin = clock()
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self.iteration = 0  # the solver's iteration, stamped on every event

    def set_origin(self, t: float | None = None) -> None:
        """Times are measured from here (call it on every rank right after a barrier)."""
        self.origin = self.clock() if t is None else t

    def now(self) -> float:
        return self.clock()

    def span(self, name: str, cat: str, row: str, start: float, end: float,
             **args: Any) -> None:
        """A complete event from `start` to `end` (clock seconds) on `row` (compute/comm)."""
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": _TIDS[row],
                 "ts": (start - self.origin) * 1e6, "dur": max(0.0, end - start) * 1e6,
                 "args": {"iter": self.iteration, **args}}
        with self._lock:  # the communication thread and the main thread both record
            self.events.append(event)

    def instant(self, name: str, cat: str, row: str, at: float, **args: Any) -> None:
        event = {"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.rank,
                 "tid": _TIDS[row], "ts": (at - self.origin) * 1e6,
                 "args": {"iter": self.iteration, **args}}
        with self._lock:
            self.events.append(event)

    @contextmanager
    def region(self, name: str, cat: str, row: str = COMPUTE, **args: Any):
        """Record the enclosed block as one event."""
        start = self.clock()
        try:
            yield
        finally:
            self.span(name, cat, row, start, self.clock(), **args)

    def metadata_events(self) -> list[dict]:
        """Name this rank's process and rows in the viewer."""
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank,
                 "args": {"name": f"rank {self.rank}"}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank,
                 "args": {"sort_index": self.rank}}]
        for row, tid in _TIDS.items():
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                         "args": {"name": row}})
        return meta

    def snapshot(self) -> list[dict]:
        with self._lock:
            return self.metadata_events() + list(self.events)


def merge_traces(per_rank: Iterable[list[dict]], metadata: dict | None = None) -> dict:
    """One trace document from every rank's events."""
    events: list[dict] = []
    for evs in per_rank:
        events.extend(evs)
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": dict(metadata or {})}


def save_trace(doc: dict, path: str | Path) -> None:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    tmp.replace(path)


def load_trace(path: str | Path) -> dict:
    """Read a trace written by `save_trace` (or any trace-event JSON: a list or a document)."""

    doc = read_json(path, CommError, "JSON trace")
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise CommError(f"{path}: not a trace-event document (no traceEvents list)")
    return doc


def iteration_times(doc: dict, rank: int = 0, skip: int = 0) -> list[float]:
    """Durations (seconds) of the "iteration" events of `rank`, after skipping `skip`."""
    its = sorted((e for e in doc["traceEvents"]
                  if e.get("cat") == "iteration" and e.get("pid") == rank and e.get("ph") == "X"),
                 key=lambda e: e["ts"])
    return [e["dur"] / 1e6 for e in its[skip:]]

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

A trace keeps a window of iterations (`TraceWindow`, `--timeline-iters`), so that its size
does not grow with the run: by default the last `DEFAULT_LAST` iterations (the ones that ran
the final plan), or `A:B` (iterations A <= i < B), `A:B:K` (every K-th of those), `A:` (from A
on, to the end of the run: unbounded).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import CommError
from ...formats.jsonio import read_json

__all__ = ["COMM", "COMPUTE", "DEFAULT_LAST", "TraceWindow", "Tracer", "iteration_times",
           "load_trace", "merge_traces", "save_trace"]

COMPUTE = "compute"
COMM = "comm"
_TIDS = {COMPUTE: 0, COMM: 1}
DEFAULT_LAST = 100  # iterations a trace keeps by default: the last ones


@dataclass(frozen=True)
class TraceWindow:
    """The iterations a trace keeps: first <= i < stop (None: no end), every `every`-th from
    `first`, and of those only the last `last` (None: all)."""

    first: int = 0
    stop: int | None = None
    every: int = 1
    last: int | None = DEFAULT_LAST

    def keeps(self, iteration: int) -> bool:
        """Whether events of this iteration are recorded (`last` prunes afterwards)."""
        return (iteration >= self.first and (self.stop is None or iteration < self.stop)
                and (iteration - self.first) % self.every == 0)

    def describe(self) -> str:
        if self.last is not None and (self.first, self.stop, self.every) == (0, None, 1):
            return f"the last {self.last} iterations"
        span = f"iterations {self.first}..{'' if self.stop is None else self.stop - 1}"
        if self.stop is None:
            span = f"iterations from {self.first} on"
        return span + (f", every {self.every}th" if self.every > 1 else "")

    @classmethod
    def parse(cls, text: str, flag: str = "--timeline-iters") -> TraceWindow:
        """`A:B` (A <= i < B), `A:B:K` (every K-th), `A:` (from A on), `:B`, `::K`; the
        ends may be left out. CommError naming `flag` on anything else."""
        m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*(?::\s*(\d*)\s*)?", str(text))
        if not m:
            raise CommError(f"{flag}: expected A:B (iterations A to B-1), A:B:K (every K-th "
                            f"of them) or A: (from A on), got {text!r}")
        first = int(m.group(1) or 0)
        stop = int(m.group(2)) if m.group(2) else None
        every = int(m.group(3)) if m.group(3) else 1
        if stop is not None and stop <= first:
            raise CommError(f"{flag} {text}: the end ({stop}) must be after the start "
                            f"({first})")
        if every < 1:
            raise CommError(f"{flag} {text}: the step must be >= 1")
        return cls(first, stop, every, None)


class Tracer:
    """Collects one rank's events of the iterations its `window` keeps; cheap enough to leave
    on for a whole run (a list append, and at most the window's iterations in memory)."""

    def __init__(self, rank: int = 0, clock=time.perf_counter,
                 window: TraceWindow | None = None):
        self.rank = rank
        self.clock = clock
        self.origin = clock()
        self.window = TraceWindow() if window is None else window
        self._by_iteration: dict[int, list[dict]] = {}  # in the order iterations began
        self._lock = threading.Lock()
        self.iteration = 0  # the solver's iteration, stamped on every event

    @property
    def events(self) -> list[dict]:
        """The events kept, oldest iteration first."""
        with self._lock:
            return [e for evs in self._by_iteration.values() for e in evs]

    def _add(self, event: dict) -> None:
        it = event["args"]["iter"]
        with self._lock:  # the communication thread and the main thread both record
            bucket = self._by_iteration.get(it)
            if bucket is None:
                bucket = self._by_iteration[it] = []
                last = self.window.last
                while last is not None and len(self._by_iteration) > last:
                    del self._by_iteration[next(iter(self._by_iteration))]
            bucket.append(event)

    def set_origin(self, t: float | None = None) -> None:
        """Times are measured from here (call it on every rank right after a barrier)."""
        self.origin = self.clock() if t is None else t

    def now(self) -> float:
        return self.clock()

    def span(self, name: str, cat: str, row: str, start: float, end: float,
             iteration: int | None = None, **args: Any) -> None:
        """A complete event from `start` to `end` (clock seconds) on `row` (compute/comm),
        of `iteration` (default: the current one; a message of the previous iteration that
        runs beside the next forward names its own)."""
        it = self.iteration if iteration is None else iteration
        if not self.window.keeps(it):
            return
        self._add({"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": _TIDS[row],
                   "ts": (start - self.origin) * 1e6, "dur": max(0.0, end - start) * 1e6,
                   "args": {"iter": it, **args}})

    def instant(self, name: str, cat: str, row: str, at: float, **args: Any) -> None:
        it = self.iteration
        if not self.window.keeps(it):
            return
        self._add({"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.rank,
                   "tid": _TIDS[row], "ts": (at - self.origin) * 1e6,
                   "args": {"iter": it, **args}})

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
        return self.metadata_events() + self.events

    def kept_iterations(self) -> list[int]:
        """The iterations whose events are held, oldest first."""
        with self._lock:
            return list(self._by_iteration)


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

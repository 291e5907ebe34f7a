"""A communication thread that runs a plan's schedule: parts, order, credit, reduce-scatter
and all-gather, and the per-layer completion the next forward waits on.

`GradientExecutor` (executor.py) sends each group whole, in order, and the update waits for
the last. This one runs any plan with a `schedule` (comm/model/schedule.py; a plan without one
runs as the barrier schedule of its groups):

- Backward calls `on_learnable_done(k)` (a queue put). The thread takes the ids in backward
  order; each makes the messages whose input-most layer it is ready (their bytes copied into
  the packing buffer first where a group is not one slice of the net's flat gradient buffer).
- Whenever no message is on the wire the thread first takes every id already queued, then
  sends: with policy "sequence" the next message of the order once it is ready; with
  "priority" the first ready one in the order, and behind it, up to `credit` bytes, the next
  ready all-reduce parts, in one collective over their concatenation (one slice of the buffer
  when they lie side by side, else copied into a scratch buffer and back). A message is never
  interrupted: preemption is between messages.
- "ar" is an all-reduce of the part, "rs" the reduce-scatter of a part, "ag" its all-gather
  (`Communicator.reduce_scatter_sum`, `allgather_blocks`). After an all-reduce or all-gather
  the part is divided by the world size; once every message holding a layer is done, the
  layer's gradient is final (copied back to its diffs when packed) and `wait_layer(k)`
  returns for it. `wait()` returns when every layer is.
- With per-layer updates the thread's work of one iteration runs on while the main thread
  starts the next forward; every layer's forward waits for it, so all of it is done before the
  next backward. Its collectives must therefore not share an ordering with the main thread's
  (the trainer's agreements): pass a `Communicator.duplicate()`.

Host (numpy) gradients only: a GPU rank trains these schemes through the merge planner's
executor (the trainer says so). No wait is unbounded: queue gets inside an iteration, `wait`
and `wait_layer` give up after `timeout` seconds without progress, naming what was awaited;
a `Watchdog` guards each collective.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import CommError
from ..backends.communicator import Communicator
from ..model.schedule import Schedule, barrier_schedule, part_bounds, part_layers
from .executor import check_plan_layers, contiguous_span, plan_groups, set_thread_nice
from .trace import COMM, COMPUTE

__all__ = ["ScheduledExecutor"]

log = logging.getLogger("mgcaffe.comm")

_STOP = -1
_POLL_S = 0.5


@dataclass
class _Message:
    index: int  # position in the schedule's order
    group: int
    part: int
    kind: str  # "ar", "rs", "ag"
    piece: Any  # the part's slice of the net's flat buffer or of the packing buffer
    start: int  # the part's place in the packing layout (elements), for batching
    layers: tuple[int, ...]
    ready_layer: int  # the input-most layer it holds
    after: int = -1  # "ag": the order position of its "rs"

    @property
    def nbytes(self) -> int:
        return self.piece.nbytes


class ScheduledExecutor:
    """The solver's `gradient_sync` for a scheduled plan (module docstring). Arguments as
    `GradientExecutor`'s: `layers` (objects with index 1..L, name, param_ids), `params`
    (blobs with float32 numpy `.diff`), `plan`, `comm`; `timeout`, `tracer`, `watchdog`,
    `in_place`, `thread_nice`. `per_layer`: whether the running plan updates per layer."""

    def __init__(self, layers: Sequence[Any], params: Sequence[Any], plan: Any,
                 comm: Communicator, *, timeout: float = 120.0, tracer: Any = None,
                 watchdog: Any = None, in_place: bool = True, thread_nice: int | None = None):
        self.comm = comm
        self.rank = comm.rank
        self.timeout = float(timeout)
        self.tracer = tracer
        self.watchdog = watchdog
        self._layers = {int(layer.index): layer for layer in layers}
        self.L = len(self._layers)
        if sorted(self._layers) != list(range(1, self.L + 1)):
            raise CommError(f"rank {self.rank}: learnable layer indices must be 1..{self.L}, "
                            f"got {sorted(self._layers)}")
        self._names = [self._layers[k].name for k in range(1, self.L + 1)]
        self._params = params
        for layer in self._layers.values():
            for p in layer.param_ids:
                diff = params[p].diff
                if not isinstance(diff, np.ndarray) or diff.dtype != np.float32:
                    raise CommError(f"rank {self.rank}: layer {layer.name!r}: scheduled "
                                    f"communication needs float32 numpy gradients (a GPU rank "
                                    f"trains with the merge planner's schemes), got "
                                    f"{type(diff).__name__} {getattr(diff, 'dtype', '')}")
        self.mode = "host"
        self._diffs = {k: [params[p].diff for p in layer.param_ids]
                       for k, layer in self._layers.items()}
        self._sizes = {k: sum(int(d.size) for d in ds) for k, ds in self._diffs.items()}
        self._offsets: dict[int, int] = {}
        offset = 0
        for k in range(self.L, 0, -1):  # the packing layout: backward order
            self._offsets[k] = offset
            offset += self._sizes[k]
        self._total = offset
        self._in_place = in_place
        self.buffer: np.ndarray | None = None
        self._scratch = np.zeros(0, np.float32)
        self.packed_bytes = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False
        self._last_progress = time.monotonic()
        self._issued = 0  # iterations whose gradients backward has handed over
        self._done_iter = [0] * (self.L + 1)  # per layer: the last iteration it is final for
        self._sending: _Message | None = None
        self._thread_iter = 0  # the iteration the thread works on (from 1)
        self.iterations = 0
        self.allreduce_seconds = 0.0
        self.cpu_seconds = 0.0
        self.intervals: list[tuple[float, float, int]] | None = None
        self.set_plan(plan)
        self._thread = threading.Thread(target=self._run, name=f"mgcaffe-comm-{self.rank}",
                                        daemon=True)
        self._thread.start()
        self.favoured = (thread_nice is not None and
                         set_thread_nice(self._thread.native_id, thread_nice))

    @classmethod
    def from_net(cls, net: Any, plan: Any, comm: Communicator, **options: Any):
        return cls(net.learnable_layers, net.learnable_params, plan, comm, **options)

    # ------------------------------------------------------------------ set-up
    def set_plan(self, plan: Any) -> None:
        """Use `plan` from the next iteration on (between iterations only)."""
        if getattr(self, "_pos", 0):
            raise CommError(f"rank {self.rank}: plan changed in the middle of an iteration")
        groups = plan_groups(plan)
        check_plan_layers(groups, self._names, self.rank)
        by_name = {self._layers[k].name: k for k in self._layers}
        ks = [[by_name[n] for n in g] for g in groups]
        schedule: Schedule = getattr(plan, "schedule", None) or barrier_schedule(len(groups))
        schedule.check([sum(self._sizes[k] for k in g) for g in ks],
                       f"rank {self.rank}: plan schedule")
        if schedule.policy != "sequence":
            raise CommError(f"rank {self.rank}: a plan to train sends a fixed sequence (every "
                            f"rank the same collectives in the same order); this one has "
                            f"policy {schedule.policy!r}: make it with the planner, which "
                            f"freezes priorities into their predicted sequence")
        self.plan, self.schedule = plan, schedule
        self.per_layer = schedule.update == "per-layer"
        self.groups = ks
        pieces = []
        self._packed_groups: set[int] = set()
        for gi, g in enumerate(ks):
            flat = (contiguous_span([d for k in g for d in self._diffs[k]])
                    if self._in_place else None)
            if flat is None:
                self._packed_groups.add(gi)
                if self.buffer is None:
                    self.buffer = np.zeros(self._total, np.float32)
                start = self._offsets[g[0]]
                flat = self.buffer[start:start + sum(self._sizes[k] for k in g)]
            pieces.append(flat)
        self.in_place_groups = len(ks) - len(self._packed_groups)
        self._group_of = {k: gi for gi, g in enumerate(ks) for k in g}
        msgs: list[_Message] = []
        position = {m: i for i, m in enumerate(schedule.order)}
        for i, (gi, p, kind) in enumerate(schedule.order):
            g = ks[gi]
            n = sum(self._sizes[k] for k in g)
            s, e = part_bounds(n, schedule.parts[gi])[p]
            held = tuple(g[j] for j in part_layers([self._sizes[k] for k in g],
                                                   schedule.parts[gi])[p]) or (min(g),)
            msgs.append(_Message(i, gi, p, kind, pieces[gi][s:e], self._offsets[g[0]] + s,
                                 held, min(held),
                                 position[(gi, p, "rs")] if kind == "ag" else -1))
        self.messages = msgs
        self._opens: dict[int, list[int]] = {}  # layer -> messages it makes ready
        self._holders = [0] * (self.L + 1)  # layer -> messages that complete it
        for m in msgs:
            if m.kind != "ag":
                self._opens.setdefault(m.ready_layer, []).append(m.index)
            if m.kind != "rs":
                for k in m.layers:
                    self._holders[k] += 1
        self._ag_of = {m.after: m.index for m in msgs if m.kind == "ag"}
        self._runs = schedule.runs()
        widest = max((sum(msgs[i].piece.size for i in range(a, b)) for a, b in self._runs
                      if b - a > 1), default=0)
        if widest > self._scratch.size:  # batches of parts that do not lie side by side
            self._scratch = np.zeros(widest, np.float32)
        self._pos = 0

    # ------------------------------------------------------------------ main thread
    def on_learnable_done(self, k: int) -> None:
        if self._error is not None:
            self._raise()
        if self.tracer is not None:
            self.tracer.instant(self._layers[k].name if k in self._layers else str(k), "grad",
                                COMPUTE, self.tracer.now(), layer=k)
        if k == 1:
            self._issued += 1
        self._queue.put(k)

    def wait_layer(self, k: int) -> None:
        """Block until layer k's gradient of the latest iteration is reduced and averaged."""
        self._wait(lambda: self._done_iter[k] >= self._issued, f"layer "
                   f"{self._layers[k].name!r}")

    def wait(self) -> None:
        """Block until every layer's gradient of the latest iteration is reduced."""
        t0 = time.perf_counter()
        self._wait(lambda: min(self._done_iter[1:]) >= self._issued, "every layer")
        self.iterations += 1
        if self.tracer is not None:
            self.tracer.span("wait for gradients", "wait", COMPUTE, t0, time.perf_counter())

    def _wait(self, done, what: str) -> None:
        since = time.monotonic()
        with self._cond:
            while not done():
                if self._error is not None:
                    break
                if self._closed:
                    raise CommError(f"rank {self.rank}: gradient sync used after close()")
                left = max(self._last_progress, since) + self.timeout - time.monotonic()
                if left <= 0 and self._sending is not None and \
                        getattr(self.watchdog, "liveness", None) is not None:
                    left = _POLL_S  # a collective in flight: the watchdog judges the peers
                elif left <= 0:
                    raise CommError(self._stall_message(what))
                self._cond.wait(min(left, _POLL_S))
        if self._error is not None:
            self._raise()

    def _stall_message(self, what: str) -> str:
        m = self._sending
        if m is not None:
            return (f"rank {self.rank}: {_KIND_NAMES[m.kind]} of group {m.group} part "
                    f"{m.part} ({m.nbytes} bytes) not done after {self.timeout:g} s: a peer "
                    f"rank died or is stuck")
        if self._pos == 0:
            return (f"rank {self.rank}: no gradient arrived within {self.timeout:g} s while "
                    f"waiting for {what}")
        k = self.L - self._pos
        return (f"rank {self.rank}: waited {self.timeout:g} s for the gradient of layer "
                f"{self._layers[k].name!r} (waiting for {what})")

    def _raise(self) -> None:
        exc = self._error
        if isinstance(exc, CommError):
            raise CommError(str(exc)) from exc
        raise CommError(f"rank {self.rank}: communication thread failed: "
                        f"{type(exc).__name__}: {exc}") from exc

    def close(self, join: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        if join:
            self._thread.join(timeout=min(self.timeout, 10.0))
        with self._cond:
            self._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by the waits
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            log.error("rank %d: communication thread: %s: %s", self.rank, type(exc).__name__,
                      exc)

    def _loop(self) -> None:
        while True:
            if self._pos and self._sendable():
                while True:  # every id already there first: a more urgent part may be ready
                    try:
                        k = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if k == _STOP:
                        return
                    self._take(k)
                self._send(self._next_batch())
                continue
            k = self._next_id()
            if k == _STOP:
                return
            cpu = time.thread_time()
            self._take(k)
            self.cpu_seconds += time.thread_time() - cpu

    def _next_id(self) -> int:
        deadline = time.monotonic() + self.timeout
        while True:
            within = self._pos > 0
            wait = min(_POLL_S, deadline - time.monotonic()) if within else _POLL_S
            try:
                return self._queue.get(timeout=max(wait, 0.0))
            except queue.Empty:
                if self._closed:
                    return _STOP
                if within and time.monotonic() >= deadline:
                    k = self.L - self._pos
                    raise CommError(f"rank {self.rank}: waited {self.timeout:g} s for the "
                                    f"gradient of layer {self._layers[k].name!r}: backward "
                                    f"stalled") from None

    def _take(self, k: int) -> None:
        """Layer k's gradient is complete: start the iteration on its first id, pack k where
        its group is packed, and make the messages it opens ready."""
        expected = self.L - self._pos
        if self._pos == 0:
            self._begin()
        if k != expected:
            got = self._layers[k].name if k in self._layers else f"#{k}"
            raise CommError(f"rank {self.rank}: backward reported layer {got!r} but layer "
                            f"{self._layers[expected].name!r} comes next in backward order")
        layer = self._layers[k]
        for p, diff in zip(layer.param_ids, self._diffs[k]):
            if self._params[p].diff is not diff:
                raise CommError(f"rank {self.rank}: layer {layer.name!r} parameter {p}: its "
                                f"diff is no longer the array the communication works on "
                                f"(replaced instead of written in place, or the net was "
                                f"flattened again)")
        if self._group_of[k] in self._packed_groups:
            start = self._offsets[k]
            for d in self._diffs[k]:
                np.copyto(self.buffer[start:start + d.size], d.reshape(-1))
                start += d.size
            self.packed_bytes += 4 * self._sizes[k]
        for i in self._opens.get(k, ()):
            self._make_ready(i)
        self._pos += 1
        self._last_progress = time.monotonic()

    def _begin(self) -> None:
        self._thread_iter += 1
        self._left = list(self._holders)
        self._is_ready = [False] * len(self.messages)
        self._next = 0  # the sequence's next collective
        self._sent = 0
        self._stamp = getattr(self.tracer, "iteration", 0)

    def _make_ready(self, i: int) -> None:
        self._is_ready[i] = True

    def _sendable(self) -> bool:
        if self._next == len(self._runs):
            return False
        a, b = self._runs[self._next]
        return all(self._is_ready[i] for i in range(a, b))

    def _next_batch(self) -> list[_Message]:
        a, b = self._runs[self._next]
        self._next += 1
        return self.messages[a:b]

    def _send(self, batch: list[_Message]) -> None:
        cpu = time.thread_time()
        kind = batch[0].kind
        if len(batch) == 1:
            piece, copied = batch[0].piece, False
        elif batch[0].piece.base is not None and all(
                a.piece.base is b.piece.base and _address(b.piece) == _address(a.piece) +
                a.piece.nbytes for a, b in zip(batch, batch[1:])):
            # side by side in one buffer: one slice of it, no copies
            base = batch[0].piece.base
            first = (_address(batch[0].piece) - _address(base)) // 4
            piece, copied = base[first:first + sum(m.piece.size for m in batch)], False
        else:
            n = sum(m.piece.size for m in batch)
            piece, copied = self._scratch[:n], True
            offset = 0
            for m in batch:
                np.copyto(piece[offset:offset + m.piece.size], m.piece)
                offset += m.piece.size
        with self._cond:
            self._sending = batch[0]
        what = (f"{_KIND_NAMES[kind]} of group {batch[0].group} part {batch[0].part}"
                + (f" and {len(batch) - 1} more part(s)" if len(batch) > 1 else "")
                + f" ({piece.nbytes} bytes)")
        run = {"ar": self.comm.allreduce_sum, "rs": self.comm.reduce_scatter_sum,
               "ag": self.comm.allgather_blocks}[kind]
        t0 = time.perf_counter()
        if self.watchdog is not None:
            with self.watchdog.guard(what):
                run(piece)
        else:
            run(piece)
        t1 = time.perf_counter()
        if kind != "rs" and self.comm.size != 1:
            np.divide(piece, self.comm.size, out=piece)
        if copied:
            offset = 0
            for m in batch:
                np.copyto(m.piece, piece[offset:offset + m.piece.size])
                offset += m.piece.size
        self.allreduce_seconds += t1 - t0
        if self.intervals is not None:
            self.intervals.append((t0, t1, piece.nbytes))
        if self.tracer is not None:
            for m in batch:
                self.tracer.span(f"{_KIND_NAMES[kind]} g{m.group}.{m.part}", "allreduce", COMM,
                                 t0, t1, iteration=self._stamp, group=m.group, part=m.part,
                                 kind=m.kind, layers=[self._layers[k].name for k in m.layers],
                                 bytes=m.nbytes)
        finished = []
        for m in batch:
            self._sent += 1
            if m.kind == "rs":
                self._make_ready(self._ag_of[m.index])
                continue
            for k in m.layers:
                self._left[k] -= 1
                if self._left[k] == 0:
                    finished.append(k)
        for k in finished:
            if self._group_of[k] in self._packed_groups:
                start = self._offsets[k]
                for d in self._diffs[k]:
                    np.copyto(d.reshape(-1), self.buffer[start:start + d.size])
                    start += d.size
        self.cpu_seconds += time.thread_time() - cpu
        with self._cond:
            self._sending = None
            if self._sent == len(self.messages):
                self._pos = 0  # before the last layers show done: set_plan may follow
            for k in finished:
                self._done_iter[k] = self._thread_iter
            self._last_progress = time.monotonic()
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (f"<ScheduledExecutor rank {self.rank}: {len(self.groups)} groups, "
                f"{len(self.messages)} messages, {self.schedule.policy}, "
                f"{self.schedule.update}>")


_KIND_NAMES = {"ar": "all-reduce", "rs": "reduce-scatter", "ag": "all-gather"}


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])

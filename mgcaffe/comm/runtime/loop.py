"""The communication thread's loop: one thread for every plan and every data path.

Backward (the main thread) hands each learnable layer's id over a queue as its gradient is
complete, in backward order (L, L-1, ..., 1). The thread takes the ids; each marks the
messages whose input-most layer it is ready (their bytes packed first where packed), and as
soon as the sequence's next run is ready the thread sends it (`DataPath.send`). A message is
never interrupted: the next waits for the previous.

After an "ar" or an "ag" the run's bytes are divided by the world size (in place, or while
copying a packed layer back once every message holding it is done): a unit of finishing work.
With a barrier plan on the host path these units are left to the main thread, idle in
`wait()` (the thread's CPU would be taken from backward on busy cores); both share what is
left after the iteration's last message. Otherwise the thread does them itself. Once every
message holding a layer is finished, the layer's gradient is final: `done[k]` (and, on a
device, an event the next forward's stream waits on). After the last message comes the
data path's end of the iteration (a device path's one host wait, on this thread) and the
iteration is `complete`.

A plan that updates per layer lets the thread's work of one iteration run on while the main
thread starts the next forward: each layer's forward waits for that layer only.

No wait is unbounded: the thread's queue gets have a deadline while an iteration is under way
(backward stalled: a CommError naming the rank, the layer and its group); the main thread's
waits give up after `timeout` seconds without progress (`stall_message`, naming the message
in flight or the layer awaited); a `Watchdog` guards each collective.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ...errors import CommError
from ..model.cost import WIRE_BYTES
from .layout import GradientLayout, Program, Run
from .paths import DataPath
from .trace import COMM, COMPUTE

__all__ = ["CommThread", "Stats"]

log = logging.getLogger("mgcaffe.comm")

STOP = -1
POLL_S = 0.5  # how often an idle thread looks at the stop flag between iterations


@dataclass
class Stats:
    """What the thread measured: its own CPU time, the bytes it packed, and (when a list)
    every collective's (start, end, bytes), perf_counter seconds, for the in-situ
    interference measurement."""

    cpu_seconds: float = 0.0
    packed_bytes: int = 0
    fallbacks: int = 0  # compressed messages sent again in float32 (reported so far)
    intervals: list[tuple[float, float, int]] | None = None


@dataclass
class _Iteration:
    """The thread's state within one iteration."""

    number: int
    program: Program
    ready: list[bool]
    left: list[int]  # per layer: messages still to finish it
    stamp: int  # the tracer's iteration when it began
    next_run: int = 0
    taken: int = 0  # ids taken
    open_units: int = 0  # finishing units made but not done
    sent_all: bool = False


@dataclass
class _Unit:
    """Finishing work of one run: its in-place pieces divided, its finished layers unpacked."""

    iteration: _Iteration
    run: Run | None  # None after a reduce-scatter: nothing to divide
    finished: list[int] = field(default_factory=list)


class CommThread:
    """The loop (module docstring) over `layout` with `path`, running `program` (replaced
    between iterations by `use`). Shared with the main thread under `cond`: `done`,
    `complete`, `error`, `pending`, `sending`, `last_progress`."""

    def __init__(self, layout: GradientLayout, path: DataPath, program: Program, *,
                 timeout: float, tracer: Any = None, watchdog: Any = None):
        self.layout, self.path, self.program = layout, path, program
        self.rank = layout.rank
        self.timeout = float(timeout)
        self.tracer, self.watchdog = tracer, watchdog
        self.stats = Stats()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.closed = False
        self.last_progress = time.monotonic()
        self.done = [0] * (layout.L + 1)  # per layer: the latest iteration it is final for
        self.complete = 0  # the latest iteration whose every message is finished
        self.sending: Run | None = None
        self.pending: deque[_Unit] = deque()
        self.now: _Iteration | None = None  # None between iterations
        self.count = 0  # iterations begun
        self.thread = threading.Thread(target=self._run, name=f"mgcaffe-comm-{self.rank}",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            self.path.enter_thread()
            while True:
                k = self._next_id()
                if k == STOP:
                    return
                cpu = time.thread_time()
                self._take(k)
                while self._sendable():
                    self._send(self.now)
                # CPU this thread takes from the cores backward runs on (copies, MPI)
                self.stats.cpu_seconds += time.thread_time() - cpu
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by the waits
            with self.cond:
                self.error = exc
                self.cond.notify_all()
            log.error("rank %d: communication thread: %s: %s", self.rank, type(exc).__name__,
                      exc)

    def _next_id(self) -> int:
        """The next layer id; between iterations wait indefinitely (but wake to see a close),
        within an iteration for at most `timeout` seconds."""
        deadline = time.monotonic() + self.timeout
        while True:
            within = self.now is not None
            wait = min(POLL_S, deadline - time.monotonic()) if within else POLL_S
            try:
                return self.queue.get(timeout=max(wait, 0.0))
            except queue.Empty:
                if self.closed:
                    return STOP
                if within and time.monotonic() >= deadline:
                    raise CommError(f"rank {self.rank}: waited {self.timeout:g} s for "
                                    f"{self._awaited()}: backward stalled") from None

    def _awaited(self) -> str:
        """'the gradient of layer 'fc1' (group 1)': what the thread waits for next."""
        now = self.now
        k = self.layout.L - (now.taken if now is not None else 0)
        program = now.program if now is not None else self.program
        return (f"the gradient of layer {self.layout.name(k)!r} (group "
                f"{program.group_of.get(k, '?')})")

    def _take(self, k: int) -> None:
        """Layer k's gradient is complete: begin the iteration on its first id, pack k where
        its group is packed, and ready the messages it opens."""
        if self.now is None:
            self._begin()
        now = self.now
        expected = self.layout.L - now.taken
        if k != expected:
            raise CommError(f"rank {self.rank}: backward reported layer "
                            f"{self.layout.name(k)!r} but layer "
                            f"{self.layout.name(expected)!r} comes next in backward order")
        segments = None
        if now.program.packed(k):
            segments = self.layout.segments(k, self.path.packing())
            self.layout.check_shapes(k, segments)
            self.stats.packed_bytes += 4 * self.layout.sizes[k]
        else:
            self.layout.check_in_place(k)
        self.path.arrive(k, segments)
        for i in now.program.opens.get(k, ()):
            now.ready[i] = True
        now.taken += 1
        self.last_progress = time.monotonic()

    def _begin(self) -> None:
        with self.cond:  # `use` swaps the program only between iterations
            program = self.program
            self.count += 1
        self.now = _Iteration(self.count, program, [False] * len(program.messages),
                              list(program.holders), getattr(self.tracer, "iteration", 0))

    def _sendable(self) -> bool:
        now = self.now
        if now is None or now.next_run == len(now.program.runs):
            return False
        return all(now.ready[m.index] for m in now.program.runs[now.next_run].messages)

    def _guard(self, run: Run):
        """The watchdog's deadline on one collective (none without a watchdog)."""
        return self.watchdog.guard(run.describe()) if self.watchdog is not None else \
            nullcontext()

    def _send(self, now: _Iteration) -> None:
        """The sequence's next run, then its finishing work (here or handed over)."""
        run = now.program.runs[now.next_run]
        now.next_run += 1
        with self.cond:
            self.sending = run
        t0, t1 = self.path.send(run, self._guard)
        if self.stats.intervals is not None:  # the bytes that travelled (T's own sizes)
            self.stats.intervals.append((t0, t1, run.nbytes * WIRE_BYTES[run.wire] // 4))
        if self.tracer is not None:
            for m in run.messages:
                self.tracer.span(m.label, "allreduce", COMM, t0, t1, iteration=now.stamp,
                                 group=m.group, part=m.part, kind=m.kind,
                                 layers=list(m.names), bytes=m.nbytes)
        unit = _Unit(now, None if run.kind == "rs" else run)
        for m in run.messages:
            if m.kind == "rs":
                now.ready[now.program.ag_of[m.index]] = True
                continue
            for k in m.layers:
                now.left[k] -= 1
                if now.left[k] == 0:
                    unit.finished.append(k)
        last = now.next_run == len(now.program.runs)
        defer = self.path.defers and not now.program.per_layer
        with self.cond:
            self.sending = None
            now.open_units += 1
            if defer:
                self.pending.append(unit)
            self.last_progress = time.monotonic()
            self.cond.notify_all()
        if not defer:
            self.finish(unit, COMM)
        if last:
            self._report_fallbacks(now)
            self.finish_pending(COMM)  # what the main thread has not divided yet
            self.path.end_iteration(f"the gradients of iteration {now.number}")
            with self.cond:
                now.sent_all = True
                self.now = None  # before the last layers show done: `use` may follow
                self._maybe_complete(now)

    def _report_fallbacks(self, now: _Iteration) -> None:
        """One line for an iteration whose compressed messages overflowed their format (and
        were sent again in float32); the same on every rank (the reduced payloads are)."""
        fell = self.path.fallbacks - self.stats.fallbacks
        if fell:
            self.stats.fallbacks = self.path.fallbacks
            log.warning("rank %d: iteration %d: %d compressed message(s) held an inf or NaN "
                        "after the sum (overflow of %s); sent again in float32", self.rank,
                        now.number, fell, "/".join(sorted(now.program.wires)))

    def finish(self, unit: _Unit, row: str) -> None:
        """Divide and unpack one unit's bytes (either thread), then mark its layers final."""
        t0 = time.perf_counter()
        now = unit.iteration
        program = now.program
        if unit.run is not None and unit.run.wire == "float32":  # (compressed: averaged)
            in_place = [m for m in unit.run.messages if not m.packed]
            if len(in_place) == len(unit.run.messages) and unit.run.joined is not None:
                self.path.divide(unit.run.joined)
            else:
                for m in in_place:
                    self.path.divide(m.piece)
        packing = self.path.buffer
        for k in unit.finished:
            if program.packed(k):
                self.path.unpack(self.layout.segments(k, packing), program.averaged(k))
        if program.per_layer and unit.finished:
            self.path.completed(unit.finished)
        if self.tracer is not None and unit.run is not None:
            m = unit.run.messages[0]
            word = "unpack" if m.packed else "average"
            self.tracer.span(f"{word} {m.label.split()[-1]}", "unpack", row, t0,
                             time.perf_counter(), iteration=now.stamp, group=m.group)
        with self.cond:
            for k in unit.finished:
                self.done[k] = now.number
            now.open_units -= 1
            self._maybe_complete(now)
            self.last_progress = time.monotonic()
            self.cond.notify_all()

    def _maybe_complete(self, now: _Iteration) -> None:
        """(Under `cond`.) The iteration is complete once sent, ended and finished."""
        if now.sent_all and now.open_units == 0 and self.complete < now.number:
            self.complete = now.number
            self.cond.notify_all()

    def finish_pending(self, row: str) -> bool:
        """Run the handed-over units until none is left (either thread; each once); whether
        there was any."""
        ran = False
        while True:
            with self.cond:
                if not self.pending:
                    return ran
                unit = self.pending.popleft()
            self.finish(unit, row)
            ran = True

    # ------------------------------------------------------------------ main thread
    def use(self, program: Program) -> None:
        """Run `program` from the next iteration on (the thread is between iterations)."""
        with self.cond:
            self.program = program

    def stall_message(self, what: str) -> str:
        """Why a wait for `what` has seen no progress for `timeout` seconds."""
        run = self.sending
        if run is not None:
            return (f"rank {self.rank}: {run.describe()} not done after {self.timeout:g} s: "
                    f"a peer rank died or is stuck")
        if self.now is None or self.now.taken == 0:
            return (f"rank {self.rank}: no gradient arrived within {self.timeout:g} s while "
                    f"waiting for {what} (called before backward?)")
        return (f"rank {self.rank}: waited {self.timeout:g} s for {self._awaited()} (waiting "
                f"for {what})")

    def wait_for(self, done, what: str, work: bool = False) -> None:
        """Block until `done()` (under `cond`), running handed-over units meanwhile when
        `work`; re-raise the thread's failure; give up after `timeout` without progress."""
        since = time.monotonic()
        while True:
            with self.cond:
                while not done() and not (work and self.pending):
                    if self.error is not None:
                        break
                    if self.closed:
                        raise CommError(f"rank {self.rank}: gradient sync used after close()")
                    left = max(self.last_progress, since) + self.timeout - time.monotonic()
                    if left <= 0 and self.sending is not None and \
                            getattr(self.watchdog, "liveness", None) is not None:
                        # A collective in flight under a watchdog that judges it by the
                        # peers' progress (a peer busy snapshotting is waited for).
                        left = POLL_S
                    elif left <= 0:
                        raise CommError(self.stall_message(what))
                    self.cond.wait(min(left, POLL_S))
                if self.error is not None or done():
                    break
            self.finish_pending(COMPUTE)
        if self.error is not None:
            self.raise_error()

    def raise_error(self) -> None:
        exc = self.error
        if isinstance(exc, CommError):
            raise CommError(str(exc)) from exc
        raise CommError(f"rank {self.rank}: communication thread failed: "
                        f"{type(exc).__name__}: {exc}") from exc

    def close(self, join: bool = True) -> None:
        """Stop the thread (after the current iteration's work); idempotent. `join=False`
        (the failure path) does not wait: the thread may be stuck in a collective."""
        if self.closed:
            return
        self.closed = True
        self.queue.put(STOP)
        if join:
            self.thread.join(timeout=min(self.timeout, 10.0))
        with self.cond:
            self.cond.notify_all()

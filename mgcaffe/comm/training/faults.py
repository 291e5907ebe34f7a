"""Faults end every rank, quickly, with the cause in the log; requests are agreed by all ranks.

- `Watchdog`: a thread that aborts the job when a guarded blocking operation (a collective in
  the communication thread or the main thread) outlives its deadline, e.g. because a peer was
  killed with SIGKILL or is stuck. An MPI collective cannot be interrupted, so MPI_Abort is the
  only way out; it ends every rank. With a `progress.Liveness` the deadline is judged by
  progress: `timeout` seconds after the last progress of the ranks that have not reached the
  collective (those are named in the message), so a slow but live rank is waited for.
- `fail_all`: log an exception with the rank and abort every rank (an exception on any rank).
- `LeaveGuard`: a rank that leaves training early, even with status 0 (a Python layer or a
  library calling os._exit(0) or sys.exit(0)), ends the job non-zero; it and every other
  rank say which rank left and where.
- Stop/snapshot requests (SIGINT/SIGHUP) and the agreement on them: distributed.py, which
  OR-s every rank's request once per iteration (`Communicator.any_true`).
- `weights_checksum` / `check_in_sync`: compare the weights of every rank (--check-sync K).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ...errors import CommError, MgcaffeError
from ..backends.communicator import Communicator

__all__ = ["ABORT_EXCEPTION", "ABORT_TIMEOUT", "LeaveGuard", "Watchdog", "check_in_sync",
           "describe_failure", "fail_all", "weights_checksum"]

log = logging.getLogger("mgcaffe.comm")

_REAL_EXIT = os._exit  # (as the process started: LeaveGuard stands in for it a while)

ABORT_EXCEPTION = 1  # exit status of every rank after an exception on one of them
ABORT_TIMEOUT = 3  # exit status after a watchdog timeout (a peer lost or stuck)


def describe_failure(rank: int, exc: BaseException) -> str:
    """`rank R: <what went wrong>`, naming the rank once: an exception's own leading
    `rank R: ` is not repeated, and mgcaffe's error types (whose text is the whole message)
    are not named; other exceptions keep their type (`RuntimeError: ...`)."""
    text = str(exc)
    own = f"rank {rank}: "
    while text.startswith(own):
        text = text[len(own):]
    if not isinstance(exc, MgcaffeError):
        text = f"{type(exc).__name__}: {text}"
    return own + text


def fail_all(comm: Communicator, exc: BaseException, code: int = ABORT_EXCEPTION) -> None:
    """Log `exc` as this rank's failure, then end every rank with `code` (MPI_Abort).

    With one rank there is nobody to stop; the exception is left to the caller."""
    log.error("%s; aborting all %d ranks", describe_failure(comm.rank, exc), comm.size)
    if comm.size > 1:
        comm.abort(code)


class LeaveGuard:
    """While installed, a rank leaving training before the others ends the job non-zero,
    with every rank saying which rank left, how, and where.

    `os._exit(0)` (from a Python layer, a hook, a library) ends a process at once: no
    exception, no exit handler. Under MPICH's Hydra every other rank is then killed within
    milliseconds and mpiexec returns 0, so a batch system records a finished training that
    did 20 of 3000 iterations. While installed, `os._exit` on this rank is this guard's
    `leave`: it logs `rank R (pid P): left before the others: os._exit(0) at iteration I
    (phase); aborting all N ranks`, tells the peers through the heartbeats (`liveness`:
    each logs it with its own rank), waits for their answers (`ack_wait` seconds at most)
    and aborts every rank with ABORT_EXCEPTION (or the status given, when not 0).
    `leave(how)` also serves sys.exit (failing_together's SystemExit). A C library's own
    `exit()` or `_exit()` does not pass through Python and is not caught."""

    def __init__(self, comm: Communicator, liveness: Any = None, ack_wait: float = 2.0):
        self.comm = comm
        self.liveness = liveness
        self.ack_wait = float(ack_wait)
        self._real_exit: Callable[[int], Any] | None = None
        self._pid = os.getpid()
        self._leaving = threading.Lock()
        self.message: str | None = None  # the line logged, once a rank left

    def install(self) -> LeaveGuard:
        """Catch os._exit from now on (until `restore`): for a rank that is a process of its
        own (not thread-ranks: they share one os module). A forked child of the rank exits
        as it asks (`_exit` looks at the pid)."""
        if self._real_exit is None:
            self._pid = os.getpid()
            self._real_exit = os._exit
            os._exit = self._exit
        return self

    def restore(self) -> None:
        """Put os._exit back."""
        if self._real_exit is not None:
            if os._exit == self._exit:
                os._exit = self._real_exit
            self._real_exit = None

    def _exit(self, status: int) -> None:
        real = self._real_exit or _REAL_EXIT
        if os.getpid() != self._pid or not self._leaving.acquire(blocking=False):
            real(status)  # a forked child, the abort's own os._exit, a second thread leaving
        try:
            self.leave(f"os._exit({status})")
            self.comm.abort(status or ABORT_EXCEPTION)
        finally:
            real(status or ABORT_EXCEPTION)

    def leave(self, how: str) -> str:
        """Log this rank's early leaving (`how`: "os._exit(0)", "sys.exit(0)") and tell the
        peers, waiting for their answers; the caller then aborts every rank."""
        here = f" {self.liveness.here()}" if self.liveness is not None else ""
        self.message = (f"rank {self.comm.rank} (pid {os.getpid()}): left before the others: "
                        f"{how}{here}; aborting all {self.comm.size} ranks")
        log.error("%s", self.message)
        if self.liveness is not None and self.comm.size > 1:
            self.liveness.leave(f"{how}{here}", self.ack_wait)
        return self.message


class Watchdog:
    """Ends the job when a guarded operation does not finish within `timeout` seconds.

    `with watchdog.guard("all-reduce of group 3 (1.2 MB)"): comm.allreduce_sum(buf)`.
    On expiry the watchdog logs the rank and what was stuck, then calls `on_expire(what)`
    (default: `comm.abort(ABORT_TIMEOUT)`). One daemon thread serves every guard.

    With `liveness` (a progress.Liveness; it may be set after construction) each guard is
    numbered as on every rank, and it expires only `timeout` seconds after the last progress
    of the peers that have not reached it; the message names them."""

    def __init__(self, comm: Communicator, timeout: float, *,
                 on_expire: Callable[[str], None] | None = None, liveness: Any = None):
        if not timeout > 0:
            raise CommError(f"rank {comm.rank}: watchdog timeout must be > 0, got {timeout}")
        self.comm = comm
        self.timeout = float(timeout)
        self.liveness = liveness
        self._on_expire = on_expire or (lambda what: comm.abort(ABORT_TIMEOUT))
        self._cond = threading.Condition()
        # token -> (start, timeout, what, collective number or 0)
        self._active: dict[int, tuple[float, float, str, int]] = {}
        self._tokens = itertools.count()
        self._wake_at = float("inf")  # when the watchdog thread next looks (monotonic)
        self.checks = 0  # times the thread has looked at the guards (a cost per look)
        self._closed = False
        self.expired: str | None = None  # what the watchdog fired on, if it did
        self.message: str | None = None  # the line it logged
        self.error: BaseException | None = None  # raised by on_expire, kept for the caller
        self._thread = threading.Thread(target=self._run, name="mgcaffe-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str, timeout: float | None = None):
        """Watch the enclosed block: if it lasts longer than the timeout, the job ends."""
        limit = self.timeout if timeout is None else float(timeout)
        start = time.monotonic()
        token = next(self._tokens)
        seq = self.liveness.enter(what) if self.liveness is not None else 0
        with self._cond:
            self._active[token] = (start, limit, what, seq)
            # Wake the thread only when it would look too late: a guard per all-reduce must
            # not cost a thread switch per all-reduce. start + limit is the earliest the
            # guard can expire (progress of lagging peers only moves it later).
            if start + limit < self._wake_at:
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                del self._active[token]

    def _deadline(self, start: float, limit: float, seq: int, now: float
                  ) -> tuple[float, list[int]]:
        """When a guard expires, and the ranks that have not reached it (when known)."""
        liveness = self.liveness
        if liveness is None or not seq:
            return start + limit, []
        lagging = liveness.lagging(seq)
        if not lagging:  # every rank is in it: the collective itself is stuck
            return start + limit, []
        return max(start, liveness.last_progress(lagging, now)) + limit, lagging

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    self.checks += 1
                    now = time.monotonic()
                    due = [(self._deadline(st, lim, seq, now), lim, what)
                           for st, lim, what, seq in self._active.values()]
                    late = [d for d in due if d[0][0] <= now]
                    if not late:
                        earliest = min((d[0][0] for d in due), default=now + 1.0)
                        # Sleep exactly to the earliest deadline: the detection keeps it.
                        self._wake_at = earliest
                        self._cond.wait(max(0.0, earliest - now))
                        continue
                    (_, lagging), limit, what = min(late, key=lambda d: d[0][0])
                    self._closed = True
                self.expired = what
                self.message = self._expiry_message(what, limit, lagging)
                log.error("%s", self.message)
                self._on_expire(what)
                return
        except BaseException as exc:  # noqa: BLE001 - kept and logged, never swallowed
            self.error = exc
            log.error("rank %d: watchdog: %s", self.comm.rank, exc)

    def _expiry_message(self, what: str, limit: float, lagging: list[int]) -> str:
        head = f"rank {self.comm.rank}: {what} made no progress for {limit:g} s"
        tail = f"; aborting all {self.comm.size} ranks"
        if self.liveness is None:
            return f"{head} (a peer rank died or is stuck){tail}"
        if lagging:
            who = ", ".join(f"rank {r}" for r in lagging)
            verb = "has" if len(lagging) == 1 else "have"
            return (f"{head}: {who} {verb} not reached it ({self.liveness.behind(lagging)})"
                    f"{tail}")
        return f"{head}: every rank reached it (stuck inside the communication library){tail}"

    def close(self) -> None:
        """Stop watching (the thread exits); guards after this are not watched."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5.0)


def weights_checksum(arrays: Sequence[np.ndarray]) -> int:
    """CRC32 of the raw bytes of every array, in order: equal iff the weights are bit-identical
    (up to CRC collisions)."""
    crc = 0
    for a in arrays:
        crc = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), crc)
    return crc


def check_in_sync(comm: Communicator, arrays: Sequence[np.ndarray], iteration: int) -> None:
    """Raise CommError on every rank if any rank's weights differ from rank 0's, naming the
    ranks that diverged. A collective: every rank calls it at the same iteration."""
    sums = comm.allgather(weights_checksum(arrays))
    diverged = [r for r, s in enumerate(sums) if s != sums[0]]
    if diverged:
        raise CommError(f"rank {comm.rank}: weights diverged at iteration {iteration}: rank(s) "
                        f"{diverged} differ from rank 0 (checksums "
                        f"{', '.join(f'{s:08x}' for s in sums)})")

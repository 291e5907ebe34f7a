"""Faults end every rank, quickly, with the cause in the log; requests are agreed by all ranks.

- `Watchdog`: a thread that aborts the job when a guarded blocking operation (a collective in
  the communication thread or the main thread) outlives its deadline, e.g. because a peer was
  killed with SIGKILL or is stuck. An MPI collective cannot be interrupted, so MPI_Abort is the
  only way out; it ends every rank.
- `fail_all`: log an exception with the rank and abort every rank (an exception on any rank).
- Stop/snapshot requests (SIGINT/SIGHUP) and the agreement on them: distributed.py, which
  OR-s every rank's request once per iteration (`Communicator.any_true`).
- `weights_checksum` / `check_in_sync`: compare the weights of every rank (--check-sync K).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np

from ..errors import CommError
from .communicator import Communicator

__all__ = ["ABORT_EXCEPTION", "ABORT_TIMEOUT", "Watchdog", "check_in_sync", "fail_all",
           "weights_checksum"]

log = logging.getLogger("mgcaffe.comm")

ABORT_EXCEPTION = 1  # exit status of every rank after an exception on one of them
ABORT_TIMEOUT = 3  # exit status after a watchdog timeout (a peer lost or stuck)


def fail_all(comm: Communicator, exc: BaseException, code: int = ABORT_EXCEPTION) -> None:
    """Log `exc` as this rank's failure, then end every rank with `code` (MPI_Abort).

    With one rank there is nobody to stop; the exception is left to the caller."""
    log.error("rank %d: %s: %s; aborting all %d ranks", comm.rank, type(exc).__name__, exc,
              comm.size)
    if comm.size > 1:
        comm.abort(code)


class Watchdog:
    """Ends the job when a guarded operation does not finish within `timeout` seconds.

    `with watchdog.guard("all-reduce of group 3 (1.2 MB)"): comm.allreduce_sum(buf)`.
    On expiry the watchdog logs the rank and what was stuck, then calls `on_expire(what)`
    (default: `comm.abort(ABORT_TIMEOUT)`). One daemon thread serves every guard."""

    def __init__(self, comm: Communicator, timeout: float, *,
                 on_expire: Callable[[str], None] | None = None):
        if not timeout > 0:
            raise CommError(f"rank {comm.rank}: watchdog timeout must be > 0, got {timeout}")
        self.comm = comm
        self.timeout = float(timeout)
        self._on_expire = on_expire or (lambda what: comm.abort(ABORT_TIMEOUT))
        self._cond = threading.Condition()
        self._active: dict[int, tuple[float, str]] = {}
        self._tokens = itertools.count()
        self._wake_at = float("inf")  # when the watchdog thread next looks (monotonic)
        self.checks = 0  # times the thread has looked at the guards (a cost per look)
        self._closed = False
        self.expired: str | None = None  # what the watchdog fired on, if it did
        self.error: BaseException | None = None  # raised by on_expire, kept for the caller
        self._thread = threading.Thread(target=self._run, name="mgcaffe-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str, timeout: float | None = None):
        """Watch the enclosed block: if it lasts longer than the timeout, the job ends."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        token = next(self._tokens)
        with self._cond:
            self._active[token] = (deadline, what)
            # Wake the thread only when it would look too late: a guard per all-reduce must
            # not cost a thread switch per all-reduce.
            if deadline < self._wake_at:
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                del self._active[token]

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    self.checks += 1
                    now = time.monotonic()
                    late = [(d, w) for d, w in self._active.values() if d <= now]
                    if not late:
                        earliest = min((d for d, _ in self._active.values()), default=now + 1.0)
                        self._wake_at = earliest + 0.001
                        self._cond.wait(max(0.0, earliest - now) + 0.001)
                        continue
                    what = min(late)[1]
                    self._closed = True
                self.expired = what
                log.error("rank %d: %s made no progress for %g s (a peer rank died or is "
                          "stuck); aborting all %d ranks", self.comm.rank, what, self.timeout,
                          self.comm.size)
                self._on_expire(what)
                return
        except BaseException as exc:  # noqa: BLE001 - kept and logged, never swallowed
            self.error = exc
            log.error("rank %d: watchdog: %s", self.comm.rank, exc)

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

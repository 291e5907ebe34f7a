"""Progress lines for long work: the time left at each display, and test passes that say
they are still running. Their wording avoids what Caffe's log parsers look for
("Iteration N", "Testing net", ", loss = ", "lr = ", "net output #"), so parsers skip them.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("mgcaffe.solvers")


def clock(seconds: float) -> str:
    """H:MM:SS (or D days, H:MM:SS)."""
    total = max(int(round(seconds)), 0)
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    text = f"{h}:{m:02d}:{s:02d}"
    return f"{days} days, {text}" if days else text


def time_left(remaining_iters: int, iters_per_s: float) -> str:
    """The display's estimate line: remaining iterations at the last display's rate."""
    if iters_per_s <= 0:
        return f"Estimated time left: unknown ({remaining_iters} iterations to go)"
    return (f"Estimated time left: {clock(remaining_iters / iters_per_s)} "
            f"({remaining_iters} iterations to go)")


class Ticker:
    """Logs "<what>: i of n batches done" at most every `every_s` seconds of a long loop."""

    every_s = 10.0

    def __init__(self, what: str, total: int, every_s: float | None = None):
        self.what = what
        self.total = total
        self.every = self.every_s if every_s is None else every_s
        self._next = time.monotonic() + self.every

    def tick(self, done: int) -> None:
        """Call before each batch with the number already done."""
        now = time.monotonic()
        if done and now >= self._next:
            log.info("%s: %d of %d batches done", self.what, done, self.total)
            self._next = now + self.every

"""Logging in Caffe's glog format, so Caffe's log parsers and users' habits keep working.

Line format: `I1129 13:03:19.123456 12345 solver.py:123] message`
(severity letter, month+day, time with microseconds, thread id, source file:line).
In distributed runs every rank but 0 logs only warnings and errors, prefixed by its rank.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_LETTERS = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "F"}


class GlogFormatter(logging.Formatter):
    """Formats records as glog lines; `rank_prefix` (e.g. "[rank 3] ") goes before the text."""

    def __init__(self, rank_prefix: str = ""):
        super().__init__()
        self.rank_prefix = rank_prefix

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1e6)
        head = (f"{_LETTERS.get(record.levelname, 'I')}{t.tm_mon:02d}{t.tm_mday:02d} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d} "
                f"{record.thread % 100000:5d} {os.path.basename(record.pathname)}:"
                f"{record.lineno}] ")
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return head + self.rank_prefix + text


def configure(level: str = "INFO", rank: int = 0, world_size: int = 1) -> None:
    """Send mgcaffe's log to stderr in glog format; non-zero ranks log warnings and up."""
    logger = logging.getLogger("mgcaffe")
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    prefix = f"[rank {rank}] " if world_size > 1 else ""
    handler.setFormatter(GlogFormatter(prefix))
    logger.addHandler(handler)
    lvl = getattr(logging, str(level).upper(), logging.INFO)
    logger.setLevel(lvl if rank == 0 else max(lvl, logging.WARNING))
    logger.propagate = False

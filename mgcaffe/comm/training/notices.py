"""When the distributed trainer and `bench-comm` warn, and when they only inform.

A WARNING says that something is wrong for this setting and that the user can act on it; what
is expected in the setting is said at INFO (its one-line summary) or at the verbose level
(details: tables, profiles; `GLOG_v=1` or `--log-level DEBUG` shows them). The rules live
here, apart from the lines they grade, so that every command grades alike.
"""

from __future__ import annotations

import logging

__all__ = ["fit_quality_level", "one_host_note"]


def fit_quality_level(poor: bool, hosts: int) -> int:
    """The logging level of the all-reduce fit's quality line. A poor fit among ranks of one
    host is expected: their all-reduce goes through shared memory, whose protocols change
    with the message size, and no straight line a + b*M follows that (INFO, with
    `one_host_note`). A poor fit across hosts, where a + b*M should hold, is a WARNING: the
    plans made from it may be far from the best."""
    return logging.WARNING if poor and hosts > 1 else logging.INFO


def one_host_note(hosts: int) -> str:
    """What to add to a poor fit's line on one host ('' across hosts)."""
    if hosts > 1:
        return ""
    return ("; expected with every rank on one host (a shared-memory all-reduce is not a "
            "straight line): nothing to do for this run")

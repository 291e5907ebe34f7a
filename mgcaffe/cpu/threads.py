"""This process's CPU threads, applied: the BLAS's (threadpoolctl) and the chunk runner's.

`configure` takes the count `cores.choose` gives (the user's setting, else the usable cores
divided by the ranks on this node), applies it to the BLAS libraries numpy loaded, and logs one
line saying what it chose and why; the command passes the choice to its nets as a
`engine.CpuEngine` (their chunk runner and per-layer way). `add_argument`
is the `--threads` flag of train, test and time.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

import numpy  # noqa: F401 - loads the BLAS, so that threadpoolctl finds it
from threadpoolctl import threadpool_info, threadpool_limits

from .cores import ADAPTIVE, ThreadChoice, choose

log = logging.getLogger("mgcaffe.cpu.threads")


def describe_blas(info: dict) -> str:
    """One BLAS library as the log line names it: library, version, threading, threads and the
    kernel it runs (OpenBLAS's core type; OPENBLAS_CORETYPE can pin an older one)."""
    text = " ".join(str(part) for part in (info.get("internal_api"), info.get("version"),
                                           info.get("threading_layer")) if part)
    text += f" x{info.get('num_threads')}"
    if info.get("architecture"):
        text += f", kernel {info['architecture']}"
        pinned = os.environ.get("OPENBLAS_CORETYPE")
        if pinned and info.get("internal_api") == "openblas":
            text += f" (OPENBLAS_CORETYPE={pinned})"
    return text


def apply(choice: ThreadChoice) -> ThreadChoice:
    """Set the BLAS libraries' threads (threadpoolctl): the process's, one library. The
    chunk runner's count goes to the nets in their `CpuEngine.from_choice(choice)`."""
    threadpool_limits(limits=choice.threads, user_api="blas")
    choice.blas = [describe_blas(i) for i in threadpool_info() if i.get("user_api") == "blas"]
    return choice


def configure(flag: int | str | None = None,
              node_ranks: Callable[[], int] | None = None) -> ThreadChoice:
    """Choose, apply and log (one INFO line) this process's thread count; call it once at
    start, after the distributed world exists and before any net is built. `node_ranks`:
    counts the ranks on this node when no launcher variable says (see cores.choose)."""
    choice = apply(choose(flag, node_ranks))
    log.info("%s", choice.describe())
    return choice


def add_argument(parser) -> None:
    """The `--threads N` flag of train, test and time."""
    parser.add_argument("--threads", type=_threads_flag, default=None, metavar="N|adaptive",
                        help="threads for the BLAS and mgcaffe's own CPU work (default: the "
                             "usable cores divided by the ranks on this node, unless "
                             "OPENBLAS_NUM_THREADS/MKL_NUM_THREADS/OMP_NUM_THREADS is set); "
                             "`adaptive`: that count, but each layer runs on one BLAS thread "
                             "when that is faster (steadier on a busy node; results then may "
                             "differ from run to run in the last bits)")


def _threads_flag(text: str) -> int | str:
    if text == ADAPTIVE:
        return ADAPTIVE
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count or `{ADAPTIVE}`, found {text!r}") from None

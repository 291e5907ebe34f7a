"""Ctrl-C while the `mgcaffe` program starts: one line and a quiet exit, on every rank.

Imported first by the package. When the process is the command-line program (`mgcaffe ...`
or `python -m mgcaffe ...`), a SIGINT before training installs its own handlers (the module
imports take about half a second, MPI's start-up more) no longer raises KeyboardInterrupt
inside an import or inside MPI_Init: a traceback on every rank, and under mpiexec a
half-initialised MPI library that can crash at exit (the launcher then reports a
segmentation fault). Instead the process writes `mgcaffe: interrupted` and exits at once,
without running exit handlers (MPI_Finalize among them): status 0 under an MPI launcher (a
stop was asked for and every rank stops, as later in training), 130 alone.

Once MPI's start-up begins (`defer()`, called by comm.distributed.world), leaving at once
would strand the ranks that are further on inside a collective; from then on a SIGINT is
only recorded, and the training loop's SignalHandler takes it over (`take_pending()`): every
rank stops at the same iteration, as a Ctrl-C later in training does.

Imported as a library (`import mgcaffe` in a program), nothing is changed. The training
loop's SignalHandler replaces this handler while it runs and puts it back after.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["command_line_launch", "defer", "install", "take_pending"]

_pending = False  # a SIGINT arrived after defer()

# Set by the common MPI launchers (see comm/mpi.py; repeated so that nothing else loads).
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                       "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def command_line_launch(orig_argv: list[str] | None = None) -> bool:
    """Whether this process runs the mgcaffe program (the console script or `-m mgcaffe`)."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if orig_argv is None else orig_argv)
    if "-m" in argv:
        i = argv.index("-m")
        return argv[i + 1:i + 2] == ["mgcaffe"]
    return any(os.path.basename(a) == "mgcaffe" for a in argv[:2])


def _interrupted(signum, frame) -> None:
    os.write(2, b"mgcaffe: interrupted\n")
    os._exit(0 if any(v in os.environ for v in _LAUNCHER_VARIABLES) else 130)


def _record(signum, frame) -> None:
    global _pending
    _pending = True


def defer() -> None:
    """From now on a SIGINT at start-up is recorded for the training loop, not acted on."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, _record)


def take_pending() -> bool:
    """Whether a SIGINT arrived after defer() (and forget it)."""
    global _pending
    was, _pending = _pending, False
    return was


def install() -> bool:
    """Install the quiet handler if this is a command-line launch still holding Python's
    default SIGINT handler (main thread only); True when installed."""
    if threading.current_thread() is not threading.main_thread() or not command_line_launch():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False  # someone chose another handler: keep it
    signal.signal(signal.SIGINT, _interrupted)
    return True


install()

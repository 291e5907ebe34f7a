"""Ctrl-C while the `mgcaffe` program starts: one line and a quiet exit, on every rank.

Imported first by the package. When the process is the command-line program (`mgcaffe ...`
or `python -m mgcaffe ...`), a SIGINT before training installs its own handlers (the module
imports take about half a second, MPI's start-up more) no longer raises KeyboardInterrupt
inside an import or inside MPI_Init, which printed a traceback on every rank and, under
mpiexec, could leave a half-initialised MPI library that crashed at exit (the launcher then
reported a segmentation fault).

- Alone (no MPI launcher): the process writes `mgcaffe: interrupted` and exits at once (130).
- Under a launcher: leaving at once would strand the ranks that are further on inside MPI's
  start-up (a Ctrl-C reaches ranks that are at different points). The SIGINT is recorded;
  every rank goes on to `comm.distributed.world()`, which OR-s the records of all ranks once
  MPI is up: if any rank was interrupted, every rank writes the line and exits with status
  130. A SIGINT that arrives after that exchange is handed to the training loop's
  SignalHandler (`take_pending()`), so every rank stops at the same iteration, as a Ctrl-C
  later in training does. After start-up (`resume()`) SIGINT raises KeyboardInterrupt again;
  `train` skips that and keeps recording until its SignalHandler takes over, so that no rank
  is interrupted alone in between.

Imported as a library (`import mgcaffe` in a program), nothing is changed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["LINE", "command_line_launch", "defer", "install", "pending", "resume",
           "take_pending"]

_pending = False  # a SIGINT arrived after defer()

# Set by the common MPI launchers (see comm/backends/mpi.py; repeated so that nothing else loads).
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                       "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def command_line_launch(orig_argv: list[str] | None = None) -> bool:
    """Whether this process runs the mgcaffe program (the console script or `-m mgcaffe`)."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if orig_argv is None else orig_argv)
    if "-m" in argv:
        i = argv.index("-m")
        return argv[i + 1:i + 2] == ["mgcaffe"]
    return any(os.path.basename(a) == "mgcaffe" for a in argv[:2])


LINE = "mgcaffe: interrupted"


def _interrupted(signum, frame) -> None:
    global _pending
    if any(v in os.environ for v in _LAUNCHER_VARIABLES):
        _pending = True  # the ranks decide together, in world()
        return
    os.write(2, LINE.encode() + b"\n")
    os._exit(130)


def _record(signum, frame) -> None:
    global _pending
    _pending = True


def defer() -> None:
    """From now on a SIGINT at start-up is recorded, not acted on."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, _record)


def pending() -> bool:
    """Whether a SIGINT was recorded (and not yet taken)."""
    return _pending


def resume() -> None:
    """MPI's start-up is over: SIGINT raises KeyboardInterrupt again (the commands' own
    handling); a SIGINT recorded meanwhile stays for `take_pending`."""
    if signal.getsignal(signal.SIGINT) is _record:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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

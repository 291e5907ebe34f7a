"""A deadline on MPI's start-up, armed before MPI is initialised.

MPI_Init waits for every rank of the job; a rank stopped (or stuck) before it leaves the
others blocked inside `from mpi4py import MPI`, a C call that holds the GIL, so no Python
thread or signal handler of this process can act. The deadline is therefore kept by a tiny
watcher process: it waits on a pipe from this process; if the pipe is not closed within the
deadline, it prints one line naming this rank and what was awaited, and kills this process
(SIGKILL: the only signal a process blocked in C cannot postpone). The launcher then ends
the other ranks. If this process dies first, the pipe closes and the watcher leaves. The
watcher runs in a session of its own, out of reach of the terminal's Ctrl-C, and ignores
SIGINT sent to it directly (`scancel --signal=INT`, a `kill` of every process of the job):
the ranks answer such a signal with their own line, and the watcher leaves with them when
the pipe closes. It is started with SIGINT blocked, so that a SIGINT that arrives while its
interpreter starts waits until the ignoring is in place (and is then discarded).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from .mpi import LAUNCHER_VARIABLES

__all__ = ["DEFAULT_STARTUP_TIMEOUT", "StartupDeadline", "launcher_rank"]

DEFAULT_STARTUP_TIMEOUT = 120.0

# The watcher: argv = pid, seconds, message. `-S -I`: no site packages, no environment: it
# starts in a few milliseconds and imports nothing of the project.
_WATCHER = """
import os, select, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


def launcher_rank(environ: dict | None = None) -> str:
    """This process's rank as the launcher set it ("?" when it says nothing)."""
    env = os.environ if environ is None else environ
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                 "SLURM_PROCID"):
        if name in env:
            return env[name]
    return "?"


class StartupDeadline:
    """`with StartupDeadline(seconds): <MPI start-up>`: ends this process, with a message,
    if the block has not finished after `seconds`. Without a launcher (no MPI) or when the
    watcher cannot start, the block runs unwatched."""

    def __init__(self, seconds: float, what: str = "MPI start-up (MPI_Init and the exchange "
                 "of the rank map)"):
        self.seconds = float(seconds)
        self.what = what
        self._watcher: subprocess.Popen | None = None

    def __enter__(self) -> StartupDeadline:
        if not any(name in os.environ for name in LAUNCHER_VARIABLES):
            return self
        message = (f"mgcaffe: rank {launcher_rank()} ({socket.gethostname()}, pid "
                   f"{os.getpid()}): {self.what} did not complete within {self.seconds:g} s "
                   f"(--comm-timeout): a rank stopped, died or was not started before "
                   f"MPI_Init; ending this rank")
        # The child inherits this thread's signal mask: SIGINT stays blocked in it until its
        # first lines have set SIGINT to be ignored (a pending one is then discarded).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._watcher = subprocess.Popen(
                [sys.executable, "-S", "-I", "-c", _WATCHER, str(os.getpid()),
                 str(self.seconds), message], stdin=subprocess.PIPE, close_fds=True,
                # its own session: a Ctrl-C meant for the job does not reach it
                start_new_session=True)
        except OSError:
            self._watcher = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return self

    def __exit__(self, *exc) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        watcher.stdin.close()  # the watcher wakes on end-of-file and leaves
        try:
            watcher.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            watcher.kill()

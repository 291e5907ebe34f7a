"""`mgcaffe train --gpu 0,1,2,3` outside a launcher: one rank per listed GPU, started here.

Caffe trains on every listed GPU in one command; mgcaffe trains one process per GPU (each
drives its GPU from its own interpreter, gradients over NCCL). So this process runs its own
command line again under mpiexec, once per GPU (`restart_command`), and supervises the job.
Each rank then finds itself under a launcher and trains as under any mpiexec (docs/gpu.md):
rank i on the i-th listed GPU, rank 0's log, every rank stopped together.

Why mpiexec, the MPICH that `pip install mgcaffe[mpich]` puts beside Python
(`launcher.local_mpiexec`): every rank needs MPI anyway (the host communicator: start-up
agreements, the per-iteration stop votes, NCCL's unique id), and a job started so is the
job `mpiexec -n 4 mgcaffe train ...` starts, which the distributed tests cover.

What this process adds to mpiexec's own handling:
- signals: SIGINT and SIGTERM go to mpiexec, which hands them to every rank (their vote
  stops all at one iteration, with one snapshot); SIGHUP, which mpiexec would die of, goes
  to rank 0 itself, and the vote hands it on (Caffe's --sighup_effect: by default one
  snapshot, and training goes on; sent to every rank, two ranks getting it an iteration
  apart would make two). mpiexec runs in a session of its own, so a Ctrl-C at the terminal
  reaches it once, from here (a second one makes it kill the ranks at once, without a
  snapshot);
- the exit status: the worst rank's (a failure over a stop by signal over 0), from a file
  each rank writes as it ends (`RankReport`). mpiexec's own status OR-s the ranks' statuses
  and reports a rank killed by signal N as N; a rank that left no status (killed, or it
  aborted the job) is named, and mpiexec's status counts for it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..backend import gpu_count
from ..comm.backends.launcher import launcher_size, local_mpiexec
from ..comm.backends.mpi import launched_by_mpi
from ..errors import SolverError

__all__ = ["STATUS_DIR", "RankReport", "exit_status_of", "gpus_to_start", "is_mgcaffe",
           "job_status", "restart_command", "run_ranks"]

log = logging.getLogger("mgcaffe.commands.train")

#: Where the ranks of a job started here write their pid and exit status (set for them).
STATUS_DIR = "MGCAFFE_RANKS_STATUS_DIR"
_MAIN = Path(__file__).resolve().parents[1] / "__main__.py"
#: Statuses of a training a signal stopped (SIGHUP, SIGINT, SIGTERM): less bad than a failure.
_STOPPED = {128 + int(s) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)}


def restart_command(arguments: list[str], program: Callable[[str], bool]) -> list[str] | None:
    """The command that started this process, with `arguments` in place of its own: the
    interpreter, its options and the program (`python -m mgcaffe`, `.../bin/mgcaffe`,
    `python -m cupy_double --devices 4 -m mgcaffe`) from `sys.orig_argv`. None unless
    `program(sys.argv[0])` says this process runs the program meant (a call from other
    Python code, pytest's say, has another command line)."""
    orig = list(getattr(sys, "orig_argv", ()))
    own = sys.argv[1:]
    if (not sys.argv or not program(sys.argv[0]) or not orig or len(own) >= len(orig)
            or (own and orig[-len(own):] != own)):
        return None
    head = orig[:len(orig) - len(own)]
    return [sys.executable, *head[1:], *arguments]


def is_mgcaffe(path: str) -> bool:
    """Whether `path` (a sys.argv[0]) is the mgcaffe program: its console script or
    `python -m mgcaffe`'s __main__.py."""
    return Path(path).name == "mgcaffe" or Path(path).resolve() == _MAIN


def gpus_to_start(flag: str | None, environ=None) -> list[int] | None:
    """The GPUs to start one rank each on: `--gpu` lists several (or says `all` where
    several are visible) and no launcher started this process. None otherwise: one process
    (the flag's only GPU; none usable is device_from_flag's error) or the ranks a launcher
    started, which choose their GPUs as they always did."""
    env = os.environ if environ is None else environ
    if flag in (None, "") or launched_by_mpi(env) or launcher_size(env) is not None:
        return None
    ids = None
    if flag != "all":
        try:
            ids = [int(s) for s in flag.split(",") if s.strip()]
        except ValueError:
            return None  # device_from_flag says what is wrong
        if len(ids) < 2 or min(ids) < 0:
            return None
        if len(set(ids)) != len(ids):
            raise SolverError(f"--gpu {flag}: a GPU is listed twice; NCCL needs one GPU per "
                              f"rank")
    count = gpu_count()
    if count == 0:
        return None
    if ids is None:
        return list(range(count)) if count > 1 else None
    missing = [i for i in ids if i >= count]
    if missing:
        raise SolverError(f"--gpu {flag}: no GPU {', '.join(map(str, missing))} here; "
                          f"{count} visible (0..{count - 1})")
    return ids


def exit_status_of(exc: BaseException) -> int:
    """The exit status the program ends with when `exc` leaves a command (mgcaffe.cli)."""
    if isinstance(exc, SystemExit):
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


class RankReport:
    """A rank's pid and, at its end, its exit status, written where the supervising process
    reads them (`STATUS_DIR`); does nothing in a job not started by `run_ranks`."""

    def __init__(self, rank: int, environ=None):
        folder = (os.environ if environ is None else environ).get(STATUS_DIR)
        self.folder = None if not folder else Path(folder)
        self.rank = rank
        if self.folder is not None:
            _write(self.folder / f"rank{rank}.pid", str(os.getpid()))

    def ended(self, status: int) -> int:
        """Record `status` as this rank's exit status; returns it."""
        if self.folder is not None:
            _write(self.folder / f"rank{self.rank}.status", str(int(status)))
        return status


def _write(path: Path, text: str) -> None:
    part = path.with_suffix(path.suffix + ".part")
    part.write_text(text)
    os.replace(part, path)  # the supervisor never reads half a number


def _read_numbers(folder: Path, suffix: str, ranks: int) -> dict[int, int]:
    found = {}
    for rank in range(ranks):
        try:
            found[rank] = int((folder / f"rank{rank}.{suffix}").read_text())
        except (OSError, ValueError):
            continue
    return found


def job_status(statuses: dict[int, int], ranks: int, mpiexec_status: int) -> int:
    """The worst rank's status: a failure over a stop by signal (128 + SIGHUP/SIGINT/SIGTERM)
    over 0, the higher status between two of a kind. A rank that reported none counts with
    mpiexec's status (1 if that was 0)."""
    values = list(statuses.values())
    if len(statuses) < ranks:
        values.append(mpiexec_status if mpiexec_status > 0 else 1)
    return max(values, key=lambda s: (0 if s == 0 else 1 if s in _STOPPED else 2, s))


def run_ranks(gpus: list[int], command: list[str]) -> int:
    """Run `command` (this program's command line) as one rank per GPU of `gpus` under
    mpiexec, relaying signals; the job's exit status (`job_status`)."""
    mpiexec = local_mpiexec()
    if not (os.path.isfile(mpiexec) or shutil.which(mpiexec)):
        raise SolverError(f"--gpu {','.join(map(str, gpus))}: one rank per GPU is started "
                          f"with mpiexec, and none was found; pip install 'mgcaffe[mpich]', "
                          f"or start the ranks with your MPI's launcher (mpiexec -n "
                          f"{len(gpus)} mgcaffe train ...)")
    with tempfile.TemporaryDirectory(prefix="mgcaffe-ranks-") as folder:
        argv = [mpiexec, "-n", str(len(gpus)), *command]
        log.info("Training on GPUs %s: one rank each, started by %s (rank 0's log follows)",
                 ", ".join(map(str, gpus)), " ".join(argv[:3]))
        with _Relay(Path(folder)) as relay:
            relay.start(argv, {**os.environ, STATUS_DIR: folder})
            returned = relay.process.wait()  # the ranks keep deadlines of their own
        statuses = _read_numbers(Path(folder), "status", len(gpus))
    returned = _shell_status(returned)
    status = job_status(statuses, len(gpus), returned)
    silent = [r for r in range(len(gpus)) if r not in statuses]
    if silent:
        log.error("rank%s %s (GPU %s) ended without an exit status (killed, or the job was "
                  "aborted); mpiexec's status %d", "s" if len(silent) > 1 else "",
                  ", ".join(map(str, silent)), ", ".join(str(gpus[r]) for r in silent),
                  returned)
    elif status != 0 and status not in _STOPPED:
        failed = [r for r, s in statuses.items() if s == status]
        log.error("rank %d (GPU %d) ended with status %d", failed[0], gpus[failed[0]], status)
    return status


def _shell_status(returned: int) -> int:
    """subprocess' returncode as a shell reports it (-N: killed by signal N -> 128 + N)."""
    return 128 - returned if returned < 0 else returned


class _Relay:
    """While the job runs: SIGINT and SIGTERM go to mpiexec, SIGHUP to rank 0 (one that came
    before mpiexec started is sent once it has); the handlers are put back after."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.process: subprocess.Popen | None = None
        self.early: list[int] = []
        self.saved: dict = {}

    def __enter__(self) -> _Relay:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.saved[signum] = signal.signal(signum, self._relay)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)

    def start(self, argv: list[str], env: dict) -> None:
        # a session of its own: the terminal's Ctrl-C reaches mpiexec from here only, once
        self.process = subprocess.Popen(argv, env=env, start_new_session=True)
        for signum in self.early:
            self._relay(signum, None)

    def _relay(self, signum, frame) -> None:
        if self.process is None:
            self.early.append(signum)
        elif signum == signal.SIGHUP:
            pid = _read_numbers(self.folder, "pid", 1).get(0)
            if pid is None:
                log.warning("SIGHUP before rank 0 started: nothing to snapshot yet, ignored")
            else:
                _signal(pid, signum)
        else:
            self.process.send_signal(signum)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # that rank has ended: so does the job

"""The process as a rank of a distributed program: its world, its GPU, failing together.

`world()` starts MPI when a launcher started this process (and only then), under a deadline;
`rank_device()` picks this rank's GPU among its node's; `failing_together()` turns an
exception, or an early exit, on any rank into the end of every rank.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from contextlib import contextmanager

from ... import _launch
from ...backend import Device, gpu_available
from ...errors import CommError
from ...log import configure
from ..backends.communicator import Communicator
from ..backends.launcher import check_world, launcher_size
from ..backends.local import SingleCommunicator
from ..backends.mpi import MpiCommunicator, launched_by_mpi
from ..backends.nccl import local_gpu
from ..backends.startup_deadline import DEFAULT_STARTUP_TIMEOUT, StartupDeadline
from .faults import ABORT_EXCEPTION, fail_all
from .liveness import describe_rank_map, rank_map

__all__ = ["failing_together", "rank_device", "world"]

log = logging.getLogger("mgcaffe.comm")


def world(log_level: str | None = "INFO", *, mpi_wait: str = "poll",
          startup_timeout: float | None = None,
          keep_deferred: bool = False) -> tuple[Communicator, int, int]:
    """(communicator, rank, size) of this process: MPI when a launcher started it, else a
    world of one rank without touching MPI. With `log_level`, logging is configured so that
    only rank 0 logs below WARNING and every other rank's lines carry its rank. `mpi_wait`:
    how MPI all-reduces wait ("poll" or "block", see MpiCommunicator). Under a launcher,
    MPI's start-up and the exchange of the rank map (rank 0 logs it) must end within
    `startup_timeout` seconds (default 120), or this process ends with a message.
    `keep_deferred`: a Ctrl-C after start-up stays recorded (`_launch.take_pending()`) for
    the SignalHandler the caller installs next, instead of raising KeyboardInterrupt: a rank
    interrupted between the two would leave alone, and the others wait for it."""
    if not (launched_by_mpi() or launcher_size() is not None):
        comm: Communicator = SingleCommunicator()
        return comm, comm.rank, comm.size
    _launch.defer()  # a Ctrl-C from here on stops every rank together, after start-up
    # armed before MPI_Init: a peer stopped before it would block this process there
    with StartupDeadline(startup_timeout or DEFAULT_STARTUP_TIMEOUT):
        comm = MpiCommunicator(wait=mpi_wait)
        check_world(comm.size, comm.library)  # a launcher of another MPI: N lone trainings
        if log_level is not None and comm.size > 1:
            configure(log_level, rank=comm.rank, world_size=comm.size)
        if comm.size > 1:
            ranks = rank_map(comm)
            if comm.rank == 0:
                log.info("%s", describe_rank_map(ranks))
        if any(comm.allgather(_launch.pending())):  # a Ctrl-C while the ranks started
            _launch.take_pending()
            print(_launch.LINE, file=sys.stderr, flush=True)
            # on every rank: MPI_Finalize at exit; 130 as alone (a stop by signal is not 0)
            raise SystemExit(130)
    if not keep_deferred:
        _launch.resume()
    return comm, comm.rank, comm.size


def rank_device(comm: Communicator, gpu_flag: str | None = None,
                solver_mode_gpu: bool = False) -> Device | None:
    """This rank's GPU when several ranks train: asked for by `--gpu` (`gpu_flag`: "all" or
    a list of ids "0,1,2,3") or by the solver file's `solver_mode: GPU`; None when neither
    asks (the CPU). A collective over the node's ranks: the node's i-th rank takes the i-th
    GPU, or, where the launcher bound ranks to GPUs (CUDA_VISIBLE_DEVICES per rank), the
    first of its own that no lower rank took (nccl.select_gpu). A GPU asked for and not
    usable here is an error under a launcher (a rank on the CPU would hold up the others)."""
    if comm.size == 1 or (gpu_flag in (None, "") and not solver_mode_gpu):
        return None
    ids = None
    if gpu_flag not in (None, "", "all"):
        try:
            ids = [int(x) for x in str(gpu_flag).split(",") if x.strip()]
        except ValueError:
            raise CommError(f"--gpu: expected ids or `all`, found {gpu_flag!r}") from None
    if not gpu_available():
        asked = f"--gpu {gpu_flag}" if gpu_flag not in (None, "") else "solver_mode: GPU"
        raise CommError(f"rank {comm.rank}: {asked}, but no GPU is usable on "
                        f"{socket.gethostname()} "
                        f"(CuPy missing or no CUDA device); under a launcher every rank needs "
                        f"its GPU (leave out --gpu and set solver_mode: CPU to train on CPUs)")
    gpu, _, _ = local_gpu(comm, ids)
    return Device("gpu", gpu)


@contextmanager
def failing_together(comm: Communicator):
    """Any exception inside ends every rank: logged with this rank, then MPI_Abort. So does
    a SystemExit (a hook calling sys.exit(0)): a rank that leaves before the others fails
    the job, saying which."""
    try:
        yield comm
    except SystemExit as exc:
        if comm.size > 1:
            if not getattr(exc, "rank_reported", False):  # (the trainer's LeaveGuard says more)
                log.error("rank %d (pid %d): left before the others: sys.exit(%r); aborting "
                          "all %d ranks", comm.rank, os.getpid(), exc.code, comm.size)
            comm.abort(ABORT_EXCEPTION)
        raise
    except BaseException as exc:
        if comm.size > 1 and not isinstance(exc, GeneratorExit):
            fail_all(comm, exc, ABORT_EXCEPTION)
        raise

"""Distributed training start-up: the world, the plan, the identical start, and the guards.

(Being written: `world()` first; `add_arguments` / `attach` follow.)
"""

from __future__ import annotations

import logging

from ..log import configure
from .communicator import Communicator
from .local import SingleCommunicator
from .mpi import MpiCommunicator, launched_by_mpi

log = logging.getLogger("mgcaffe.comm")


def world(log_level: str | None = "INFO") -> tuple[Communicator, int, int]:
    """(communicator, rank, size) of this process: MPI when a launcher started it, else a
    world of one rank without touching MPI. With `log_level`, logging is configured so that
    only rank 0 logs below WARNING and every other rank's lines carry its rank."""
    comm: Communicator = MpiCommunicator() if launched_by_mpi() else SingleCommunicator()
    if log_level is not None and comm.size > 1:
        configure(log_level, rank=comm.rank, world_size=comm.size)
    return comm, comm.rank, comm.size

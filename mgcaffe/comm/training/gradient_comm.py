"""Which communicator carries the gradients: NCCL on GPUs, MPI, or MPI under an emulated
network. A collective where it must agree (NCCL is used only when every rank can load it);
`executor_comm`: the communication thread's own ordering of it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ...errors import CommError
from ..backends.communicator import Communicator
from ..backends.emulate import EmulatedCommunicator
from ..backends.nccl import NcclCommunicator, _import_nccl
from ..model.cost import CostModel, cost_for, load_network
from .options import Options

log = logging.getLogger("mgcaffe.comm")

#: guard(what, timeout=None): a context manager that bounds a collective (faults.Watchdog).
Guard = Callable[..., AbstractContextManager]


@dataclass
class GradientChannel:
    """The gradients' communicator, and the modelled cost when it emulates a network."""

    comm: Communicator
    emulated_cost: CostModel | None = None


def gradient_channel(base: Communicator, device: Any, options: Options,
                     guard: Guard) -> GradientChannel:
    """The gradient all-reduce's communicator: NCCL, MPI (`base`), or MPI under emulation."""
    rank = base.rank
    if _use_nccl(base, device, options, guard):
        nccl = NcclCommunicator(base, timeout=options.timeout)
        if device.index != nccl.device_id:
            raise CommError(f"rank {rank}: the solver runs on GPU {device.index} but "
                            f"this rank's GPU is {nccl.device_id} (local rank "
                            f"{nccl.local_rank}): build the solver on rank_device(comm)")
        if rank == 0:
            log.info("Gradients all-reduced with NCCL on each GPU's own stream")
        return GradientChannel(nccl)
    if options.emulate_network is None:
        return GradientChannel(base)
    cost = cost_for(load_network(options.emulate_network), options.emulate_nodes)
    emulated = EmulatedCommunicator(base, cost, options.emulate_nodes)
    if rank == 0:  # asked for: information, not a warning
        log.info("%s [from %s]", emulated.describe(), options.emulate_network)
    return GradientChannel(emulated, cost)


def executor_comm(comm: Communicator, overlaps_forward: bool) -> Communicator:
    """The communicator the communication thread issues its collectives on (a collective
    where it duplicates). A plan that updates per layer (`overlaps_forward`) has the thread's
    work run on beside the main thread's agreements, so they must not share an ordering: a
    duplicate of a host communicator (MPI_Comm_dup). A barrier plan's thread is idle while
    the main thread agrees, and NCCL's device collectives are that thread's alone (the
    agreements go through the host communicator): `comm` as it is."""
    if not overlaps_forward or getattr(comm, "device_streams", False):
        return comm
    return comm.duplicate()


def _use_nccl(base: Communicator, device: Any, options: Options, guard: Guard) -> bool:
    """--comm-backend nccl, or auto on GPUs when EVERY rank can load NCCL (agreed, so that no
    rank waits in an NCCL set-up the others skip)."""
    rank = base.rank
    on_gpu = getattr(device, "kind", "cpu") == "gpu"
    if options.backend == "mpi" or (options.backend == "auto"
                                    and (not on_gpu or options.emulate_network)):
        return False
    if not on_gpu:
        raise CommError(f"rank {rank}: --comm-backend nccl needs the solver on a GPU (--gpu)")
    try:
        _import_nccl(rank)
        problem = None
    except CommError as exc:
        problem = exc
    with guard("agreement on the NCCL backend"):
        missing = base.any_true([problem is not None])[0]
    if not missing:
        return True
    if options.backend == "nccl":
        raise problem or CommError(f"rank {rank}: another rank cannot load NCCL")
    if rank == 0:
        log.warning("NCCL is not usable on every rank (%s): GPU gradients go through host "
                    "buffers over MPI", problem or "see the other ranks' logs")
    return False

"""Stop and snapshot requests agreed by every rank, with the signal that asked for the stop.

Once per iteration each rank votes with what its own signal handler asks (a SolverAction
value) and, for a stop, the signal that asked; one tiny all-reduce (`Communicator.any_true`)
gives every rank the same answer, so all snapshot and stop at the same iteration and end
with the same exit status, whichever rank the signal reached.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from ..backends.communicator import Communicator

__all__ = ["NONE", "SNAPSHOT", "SNAPSHOT_AND_STOP", "STOP", "STOPS", "Agreed",
           "agree_on_requests"]

# SolverAction's values (communication does not import the solvers)
NONE, STOP, SNAPSHOT, SNAPSHOT_AND_STOP = "none", "stop", "snapshot", "snapshot_and_stop"
STOPS = (STOP, SNAPSHOT_AND_STOP)

#: The signals a vote can name, in the order a tie is settled (a SIGTERM from a batch system
#: first: its exit status is what job chains look at).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP")
                     if hasattr(signal, name))


@dataclass(frozen=True)
class Agreed:
    """What every rank does after this iteration; `signal`: the signal of the stop (None
    when there is none, or another rank's hook asked without a signal)."""

    action: str
    signal: int | None
    asked_elsewhere: bool  # the stop came from another rank only


def agree_on_requests(comm: Communicator, local: str, local_signal: int | None) -> Agreed:
    """Every rank's `local` action and stop signal OR-ed (a collective)."""
    stops = local in STOPS
    flags = [stops, local in (SNAPSHOT, SNAPSHOT_AND_STOP)]
    flags += [stops and local_signal == s for s in STOP_SIGNALS]
    agreed = comm.any_true(flags)
    stop, snapshot = agreed[0], agreed[1]
    signum = next((s for s, on in zip(STOP_SIGNALS, agreed[2:]) if on), None)
    action = (SNAPSHOT_AND_STOP if stop and snapshot else STOP if stop else
              SNAPSHOT if snapshot else NONE)
    return Agreed(action, signum if stop else None, stop and not stops)

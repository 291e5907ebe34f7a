"""When the distributed trainer and `bench-comm` warn, and when they only inform.

A WARNING says that something is wrong for this setting and that the user can act on it; what
is expected in the setting is said at INFO (its one-line summary) or at the verbose level
(details: tables, profiles; `GLOG_v=1` or `--log-level DEBUG` shows them). The rules live
here, apart from the lines they grade, so that every command grades alike.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["CAP_RHO", "CAP_SIGMA", "fit_notices", "fit_quality_level", "in_situ_summary",
           "likely_causes", "one_host_note", "overrun_warning"]

CAP_RHO = 19.0  # insitu.MAX_X = 0.95: backward at most 20x slower beside an all-reduce
CAP_SIGMA = 20.0  # an all-reduce at most 20x slower beside backward


def fit_quality_level(poor: bool, hosts: int) -> int:
    """The logging level of the all-reduce fit's quality line. A poor fit among ranks of one
    host is expected: their all-reduce goes through shared memory, whose protocols change
    with the message size, and no straight line a + b*M follows that (its line goes to the
    verbose level, `one_host_note` says so at INFO). A poor fit across hosts, where a + b*M
    should hold, is a WARNING: the plans made from it may be far from the best."""
    return logging.WARNING if poor and hosts > 1 else logging.DEBUG if poor else logging.INFO


def one_host_note(worst_error: float) -> str:
    """The INFO line that replaces a poor fit's warning when every rank is on one host."""
    return (f"the all-reduce fit misses some sizes by up to {100 * worst_error:.0f}%: "
            "expected with every rank on one host (shared memory changes protocol with the "
            "message size, so no straight line a + b*M follows it); nothing to fix")


def fit_notices(warning: str | None, worst_error: float, hosts: int) -> list[tuple[int, str]]:
    """(level, line) to log for a fit's quality `warning` (None when the fit is good)."""
    if warning is None:
        return []
    if hosts > 1:
        return [(logging.WARNING, warning)]
    return [(logging.DEBUG, warning), (logging.INFO, one_host_note(worst_error))]


def in_situ_summary(rho: float | None, sigma: float | None, ranks: int) -> str:
    """One line, in words, of what the re-plan window measured: rho (backward takes 1 + rho
    times as long while an all-reduce is in flight) and sigma (an all-reduce takes sigma
    times its T(M) while backward runs); an estimate at its cap says so."""
    parts = []
    if rho is not None:
        parts.append(f"backward takes {1 + rho:.2f}x as long while an all-reduce is in flight "
                     f"(rho = {rho:.2f}{', at its cap' if rho >= CAP_RHO * 0.999 else ''})")
    if sigma is not None:
        parts.append(f"an all-reduce takes {sigma:.2f}x its T(M) while backward runs "
                     f"(sigma = {sigma:.2f}{', at its cap' if sigma >= CAP_SIGMA * 0.999 else ''})")
    capped = "; a capped estimate means at least that much" if any(
        (rho is not None and rho >= CAP_RHO * 0.999, sigma is not None
         and sigma >= CAP_SIGMA * 0.999)) else ""
    return (f"Measured in situ on {ranks} ranks: {'; '.join(parts)}; the model "
            f"now uses {'them' if len(parts) > 1 else 'it'}{capped}")


def overrun_warning(measured: float, predicted: float, causes: list[str]) -> str | None:
    """The warning when the measured iteration exceeds the prediction by more than half, with
    the likeliest cause first (`causes`, most specific first); None otherwise."""
    if not predicted > 0 or measured <= 1.5 * predicted:
        return None
    cause = causes[0] if causes else ("the machine was busier than while it was profiled "
                                      "(other processes on these cores)")
    return (f"the measured iteration is {100 * (measured / predicted - 1):.0f}% above the "
            f"prediction; likely cause: {cause}")


def likely_causes(options: Any, plan_nodes: int | None, nodes: int, cores: int, load: float,
                  ranks_here: int, interferes: bool, machine_cores: int | None = None
                  ) -> list[str]:
    """Why a run's iterations may take far longer than its plan predicts, the most specific
    first: a saved plan made for another number of nodes, a profile given from elsewhere, a
    busy machine, and ranks that share their host's cores (`cores`, this rank's) with their
    communication threads while the model has no interference term. The load average counts
    every thread of the machine, this host's ranks' own two each (compute and communication)
    included, so the machine is busy when what is left of it exceeds 3/4 of the machine's
    cores (`machine_cores`, default `cores`): emulated hosts that share one machine then do
    not count each other's ranks as a busy machine, whose load is theirs."""
    causes = []
    if options.plan and plan_nodes not in (None, nodes):
        causes.append(f"{options.named('plan')} {options.plan} was made for {plan_nodes} "
                      f"nodes, this run has {nodes}; plan again for {nodes}")
    if options.profile:
        causes.append(f"the profile {options.profile} was measured elsewhere or under another "
                      "load than this run's; leave --profile out to measure it here")
    if load - 2 * ranks_here > 0.75 * (machine_cores or cores):
        causes.append(f"the machine is busy (load average {load:.1f} on "
                      f"{machine_cores or cores} cores): other "
                      "processes take the cores backward needs")
    if not interferes and 2 * ranks_here > cores:
        causes.append(f"{ranks_here} ranks and their communication threads share {cores} "
                      "cores, which a model without an interference term does not count; use "
                      "a --network from `mgcaffe bench-comm --interference`")
    return causes

"""Weak-scaling predictions: every scheme's iteration time, speed-up and efficiency per N.

Pure functions returning data (the `simulate` command formats them). Weak scaling as the paper
defines it: each of N workers processes the single worker's batch, a single worker needs
t_f + t_b per iteration (no communication), so

    speed-up(N) = N * (t_f + t_b) / t_iter(N)        efficiency(N) = speed-up(N) / N.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...errors import PlanError
from .cost import CostModel, Network, cost_for
from .plan import Plan
from .profile import Profile, as_int
from .schedule_search import lower_bound
from .schemes import SCHEMES, canonical_scheme, make_plan, scheme_named

__all__ = ["SchemePoint", "ScalingPoint", "Scaling", "efficiency", "ratio_pairs", "speedup",
           "simulate_nodes", "weak_scaling"]


def ratio_pairs(schemes) -> list[tuple[str, str]]:
    """(faster, slower) pairs worth a speed-up column: every scheme that merges over each of
    the two extremes (the registry's baselines, wfbp and synceasgd), as the paper reports
    MG-WFBP over WFBP and over SyncEASGD. Read from the registry: a new scheme gets its own."""
    schemes = list(schemes)
    baselines = [s for s in schemes if scheme_named(s).baseline]
    return [(f, s) for f in schemes if not scheme_named(f).baseline for s in baselines]


def speedup(plan: Plan, nodes: int) -> float:
    """Weak-scaling speed-up of `nodes` workers over one: N * (t_f + t_b) / t_iter."""
    return nodes * plan.ideal / plan.iteration_time


def efficiency(plan: Plan) -> float:
    """Scaling efficiency: (t_f + t_b) / t_iter (= speed-up / N)."""
    return plan.ideal / plan.iteration_time


@dataclass(frozen=True)
class SchemePoint:
    """One scheme at one N."""

    scheme: str
    iteration_time: float
    non_overlapped_comm: float
    speedup: float
    efficiency: float
    messages: int

    def to_dict(self) -> dict:
        return {"iteration_time": self.iteration_time,
                "non_overlapped_comm": self.non_overlapped_comm, "speedup": self.speedup,
                "efficiency": self.efficiency, "messages": self.messages}


@dataclass(frozen=True)
class ScalingPoint:
    """Every scheme at one N, with the cost model used and the plans themselves."""

    nodes: int
    cost: CostModel
    ideal: float
    schemes: dict[str, SchemePoint]
    plans: dict[str, Plan] = field(repr=False, compare=False)
    # the lower bound on the iteration of any schedule under `cost` (scheduler.lower_bound)
    bound: float = 0.0

    @property
    def bound_speedup(self) -> float:
        """The weak-scaling speed-up no schedule can beat: N (t_f + t_b) / bound."""
        return self.nodes * self.ideal / self.bound if self.bound else 0.0

    def ratio(self, faster: str, slower: str) -> float:
        """How many times faster `faster` is than `slower`: t_iter(slower) / t_iter(faster)."""
        return self.schemes[slower].iteration_time / self.schemes[faster].iteration_time

    def above_best(self, scheme: str) -> float:
        """t_iter(scheme) / (the fastest scheme's t_iter) - 1 (0 for the fastest)."""
        best = min(p.iteration_time for p in self.schemes.values())
        return self.schemes[scheme].iteration_time / best - 1

    def ratios(self) -> dict[str, float]:
        """{"<faster>_over_<slower>": speed-up} for `ratio_pairs`."""
        return {f"{f}_over_{s}": self.ratio(f, s) for f, s in ratio_pairs(self.schemes)}

    def to_dict(self) -> dict:
        d = {"nodes": self.nodes, "a": self.cost.a, "b": self.cost.b,
             "cost_origin": self.cost.origin, "ideal": self.ideal, "lower_bound": self.bound,
             "schemes": {s: p.to_dict() for s, p in self.schemes.items()},
             "ratios": self.ratios(),
             "above_best": {s: self.above_best(s) for s in self.schemes}}
        if self.cost.interference:
            d["interference"] = [[m, rho] for m, rho in self.cost.interference]
        if self.cost.comm_slowdown:
            d["comm_slowdown"] = [[m, sigma] for m, sigma in self.cost.comm_slowdown]
        return d


@dataclass(frozen=True)
class Scaling:
    """Weak-scaling predictions of one model on one network for several N."""

    model: str
    num_layers: int
    total_params: int
    ideal: float
    schemes: tuple[str, ...]
    points: tuple[ScalingPoint, ...]
    network: str = ""
    bucket_bytes: int | None = None

    def point(self, nodes: int) -> ScalingPoint:
        for p in self.points:
            if p.nodes == nodes:
                return p
        raise KeyError(nodes)

    def to_dict(self) -> dict:
        return {"model": self.model, "layers": self.num_layers, "params": self.total_params,
                "network": self.network, "ideal": self.ideal, "schemes": list(self.schemes),
                "bucket_bytes": self.bucket_bytes,
                "nodes": [p.nodes for p in self.points],
                "points": [p.to_dict() for p in self.points]}


def simulate_nodes(profile: Profile, cost: CostModel, nodes: int,
                   schemes: Iterable[str] = SCHEMES,
                   bucket_bytes: int | None = None) -> ScalingPoint:
    """Plan every scheme for one N under `cost` and summarise it, with the lower bound."""
    plans: dict[str, Plan] = {}
    for s in schemes:
        plan = make_plan(profile, cost, s, bucket_bytes, nodes=nodes)
        plans[plan.scheme] = plan
    points = {s: SchemePoint(s, p.iteration_time, p.non_overlapped_comm, speedup(p, nodes),
                             efficiency(p), p.num_messages) for s, p in plans.items()}
    ideal = next(iter(plans.values())).ideal if plans else profile.ideal_time
    return ScalingPoint(nodes, cost, ideal, points, plans, lower_bound(profile, cost).value)


def weak_scaling(profile: Profile, network: Network | None, nodes: Sequence[int],
                 schemes: Iterable[str] = SCHEMES, *, use_formula: bool = False,
                 a: float | None = None, b: float | None = None,
                 bucket_bytes: int | None = None, model: str | None = None,
                 wires: tuple[str, ...] = (), cast: tuple = ()) -> Scaling:
    """Speed-up and efficiency of every scheme for each N in `nodes` (cost per N from
    `cost_for(network, N, use_formula, a=a, b=b, model=model)`, offering the wire formats
    `wires` with their `cast` costs: cost.py)."""
    schemes = tuple(dict.fromkeys(canonical_scheme(s) for s in schemes))
    if not schemes:
        raise PlanError("simulate: no scheme to simulate")
    nodes = [as_int(n, "simulate", "nodes", minimum=1) for n in nodes]
    if not nodes:
        raise PlanError("simulate: nodes: give at least one number of nodes")
    points = []
    for n in nodes:
        cost = cost_for(network, n, use_formula, a=a, b=b, model=model)
        if wires:
            cost = dataclasses.replace(cost, wires=tuple(wires), cast=tuple(cast))
        points.append(simulate_nodes(profile, cost, n, schemes, bucket_bytes))
    bucket = next((points[0].plans[s].bucket_bytes for s in schemes
                   if scheme_named(s).bucket), None)
    return Scaling(profile.model, profile.num_layers, profile.total_params,
                   points[0].ideal, schemes, tuple(points),
                   network.source if network is not None else "--a/--b", bucket)

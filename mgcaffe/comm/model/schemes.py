"""The schemes: every way `--comm` can group, order and send the gradients, in one registry.

A scheme's name is exactly its `mgcaffe train --comm` value, and the same name is used in
logs, `plan`/`simulate` rows, plans on disk and pictures. The schemes (`REGISTRY`, the one
list every command renders; `SCHEMES` holds their names):

- `wfbp`: every layer its own message (wait-free backpropagation).
- `synceasgd`: one message of every gradient, after backward ends.
- `mgwfbp` (the default): the best grouping of consecutive layers under the paper's cost
  model (mgwfbp.py; under interference, interference_search.py).
- `mgwfbp-paper`: the paper's Algorithm 1 exactly (mgwfbp.py). Greedy, so not always optimal.
- `threshold`: buckets of at least B bytes filled in backward order (PyTorch DDP's 25 MB
  buckets, Horovod's fusion buffer).
- `overlap`: groups, parts of groups and the send order chosen together
  (comm/model/schedule_search.py) so that communication also overlaps the next forward pass,
  each layer updated right before its forward; never predicted slower than any scheme here.
- `bytescheduler`, `dear`: ByteScheduler's and DeAR's schedules with their defaults, in the
  same format (schedule_search.py), for comparison; they train too.

A new scheme is one more `Scheme` entry in `REGISTRY` (its name, a one-line summary and the
function that groups the layers): `plan`, `simulate`, the pictures, `--comm` and the demo
render whatever that list holds. Every plan's times come from timeline.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ...errors import PlanError
from .cost import CostModel
from .interference_search import optimal_extended_runs
from .mgwfbp import algorithm1_runs, groups_from_runs, optimal_runs, threshold_runs, wfbp_runs
from .plan import Plan
from .profile import Profile, as_int
from .schedule import Schedule
from .schedule_search import (
    barrier_candidates,
    bytescheduler_schedule,
    dear_schedule,
    overlap_schedule,
)
from .timeline import timeline

__all__ = ["DEFAULT_BUCKET_BYTES", "DEFAULT_SCHEME", "REGISTRY", "SCHEMES", "Scheme",
           "canonical_scheme", "make_plan", "make_plans", "scheme_named"]

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # PyTorch DDP's bucket_cap_mb = 25


def _optimum(profile: Profile, cost: CostModel, bucket_bytes: int | None
             ) -> tuple[list[tuple[int, int]], bool]:
    if not getattr(cost, "interferes", False):
        return optimal_runs(profile, cost), True
    return optimal_extended_runs(profile, cost)


def _overlap(profile: Profile, cost: CostModel, bucket_bytes: int | None):
    """`overlap`: groups, parts and order chosen together (comm/model/schedule_search.py), starting
    from this module's groupings and beating every other scheme's schedule."""
    L = profile.num_layers
    optimum = optimal_runs(profile, cost)
    ddp = threshold_runs(profile, DEFAULT_BUCKET_BYTES)
    groupings = {"mgwfbp": optimum, "wfbp": wfbp_runs(L), "synceasgd": [(L, 1)],
                 "threshold": ddp, "mgwfbp-paper": algorithm1_runs(profile, cost)}
    if getattr(cost, "interferes", False):
        groupings["mgwfbp"] = _optimum(profile, cost, None)[0]
    candidates = {"bytescheduler": bytescheduler_schedule(profile),
                  "dear": dear_schedule(profile), **barrier_candidates(profile, groupings)}
    choice = overlap_schedule(profile, cost, [optimum, groupings["mgwfbp-paper"], ddp],
                              candidates)
    return choice.runs, choice.schedule, choice.exact


@dataclass(frozen=True)
class Scheme:
    """One way of grouping the layers into messages.

    `name` is the scheme's one name: the `--comm` value that trains it, the plan's `scheme`,
    the row of `plan` and `simulate`, the label of pictures. `summary` says in a few words
    what it sends (help texts and tables). `runs(profile, cost, bucket_bytes)` returns the
    groups as (high, low) 1-based layer runs, output side first, and whether the grouping
    is proven optimal where the scheme promises that (`schedule`, for a scheme that also
    decides parts, order and updates, returns a Schedule beside them). `baseline`: one of
    the two extremes
    (no merging, or all in one) that the others are compared with. `bucket`: the scheme
    takes a bucket size (`--bucket-mb`). `aliases`: other spellings `canonical_scheme`
    accepts."""

    name: str
    summary: str
    runs: Callable[[Profile, CostModel, int | None], tuple[list[tuple[int, int]], bool]] | None
    baseline: bool = False
    bucket: bool = False
    aliases: tuple[str, ...] = ()
    # a scheme that decides more than groups (parts, order, per-layer updates: schedule.py):
    # (profile, cost, bucket bytes) -> (runs, Schedule, proven optimal); `runs` is then None
    schedule: Callable[[Profile, CostModel, int | None],
                       tuple[list[tuple[int, int]], Schedule, bool]] | None = None

    @property
    def fixed(self) -> bool:
        """Whether the groups are fixed by the scheme (and the bucket size) whatever the cost
        model says: the two extremes and the bucket schemes."""
        return self.baseline or self.bucket


REGISTRY: tuple[Scheme, ...] = (
    Scheme("wfbp", "one all-reduce per layer, each as soon as its gradient is ready",
           lambda p, c, b: (wfbp_runs(p.num_layers), True), baseline=True,
           aliases=("layerwise",)),
    Scheme("synceasgd", "one all-reduce of every gradient after backward",
           lambda p, c, b: ([(p.num_layers, 1)], True), baseline=True,
           aliases=("sync_easgd", "single")),
    Scheme("mgwfbp", "merged groups: the exact optimum of the paper's cost model", _optimum,
           aliases=("mg_wfbp", "optimal", "exact", "dp")),
    Scheme("mgwfbp-paper", "merged groups by the paper's Algorithm 1 (greedy)",
           lambda p, c, b: (algorithm1_runs(p, c), True),
           aliases=("paper", "infocom", "greedy", "algorithm1")),
    Scheme("threshold", "buckets of at least --bucket-mb, filled in backward order",
           lambda p, c, b: (threshold_runs(p, DEFAULT_BUCKET_BYTES if b is None else b),
                            True), bucket=True,
           aliases=("bucket", "buckets", "ddp")),
    Scheme("overlap", "groups, parts and send order chosen together: the next forward waits "
           "per layer, so communication also overlaps it", None, schedule=_overlap,
           aliases=("sched", "mgwfbp-overlap")),
    Scheme("bytescheduler", "each layer in parts of at most 1M parameters, 4M in flight, the "
           "input side first; the next forward waits per layer (ByteScheduler)", None,
           schedule=lambda p, c, b: (*bytescheduler_schedule(p), True),
           aliases=("byteps", "p3")),
    Scheme("dear", "buckets of at least --bucket-mb reduce-scattered during backward and "
           "all-gathered before their next forward (DeAR)", None,
           schedule=lambda p, c, b: (*dear_schedule(
               p, DEFAULT_BUCKET_BYTES if b is None else b), True), bucket=True),
)
DEFAULT_SCHEME = "mgwfbp"
SCHEMES = tuple(s.name for s in REGISTRY)  # the names, in the order tables show them


def _key(name: str) -> str:
    return str(name).strip().lower().replace("-", "_")


_BY_KEY = {_key(alias): s for s in REGISTRY for alias in (s.name, *s.aliases)}


def scheme_named(name: str) -> Scheme:
    """The Scheme a name or alias stands for; PlanError naming the choices otherwise."""
    found = _BY_KEY.get(_key(name))
    if found is None:
        raise PlanError(f"scheme: unknown scheme {name!r} (choose from "
                        f"{', '.join(SCHEMES)})")
    return found


def canonical_scheme(name: str) -> str:
    """The scheme's one name (see SCHEMES) for a name or alias (`optimal` = mgwfbp,
    `paper`/`infocom` = mgwfbp-paper, `ddp` = threshold); PlanError otherwise."""
    return scheme_named(name).name


def make_plan(profile: Profile, cost: CostModel, scheme: str, bucket_bytes: int | None = None,
              *, nodes: int | None = None) -> Plan:
    """Plan one scheme (a name of SCHEMES or an alias); `bucket_bytes` is the bucket size of
    the schemes that take one (default 25 MiB) and is ignored by the others. `nodes`
    (default `cost.nodes`) is recorded only."""
    chosen = scheme_named(scheme)
    if not isinstance(profile, Profile):
        raise PlanError(f"make_plan: expected a Profile, got {type(profile).__name__}")
    bucket = None
    if chosen.bucket:
        bucket = DEFAULT_BUCKET_BYTES if bucket_bytes is None else as_int(
            bucket_bytes, chosen.name, "bucket_bytes")
    if chosen.schedule is not None:
        runs, schedule, exact = chosen.schedule(profile, cost, bucket)
        plan = timeline(profile, cost, groups_from_runs(profile, runs), schedule,
                        scheme=chosen.name, nodes=nodes, exact=exact)
        return plan if bucket is None else replace(plan, bucket_bytes=bucket)
    runs, exact = chosen.runs(profile, cost, bucket)
    return timeline(profile, cost, groups_from_runs(profile, runs), scheme=chosen.name,
                    nodes=nodes, bucket_bytes=bucket, exact=exact)


def make_plans(profile: Profile, cost: CostModel, schemes=SCHEMES,
               bucket_bytes: int | None = None, *, nodes: int | None = None) -> dict[str, Plan]:
    """make_plan for several schemes: {scheme: Plan}, in the order given."""
    out: dict[str, Plan] = {}
    for s in schemes:
        plan = make_plan(profile, cost, s, bucket_bytes, nodes=nodes)
        out[plan.scheme] = plan
    return out

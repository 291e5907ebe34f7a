"""Merge planner: which consecutive learnable layers share one all-reduce message.

Pure functions of a `Profile` (per-layer sizes and backward times) and a `CostModel`
(T_ar(M): the paper's a + b*M, or a measured curve; every scheme is exact for any T_ar that
never decreases with the size); docs/planner.md states the model. A scheme's name is exactly its
`mgcaffe train --comm` value, and the same name is used in logs, `plan`/`simulate` rows, plans
on disk and pictures. The schemes (`REGISTRY`, the one list every command renders; `SCHEMES`
holds their names):

- `wfbp`: every layer its own message (wait-free backpropagation).
- `synceasgd`: one message of every gradient, after backward ends.
- `mgwfbp` (the default): the best grouping of consecutive layers under the paper's cost
  model, by the exact dynamic programme: F(L+1) = 0, F(j) = min_{k>=j} max(F(k+1), ready(j))
  + T_ar(bytes j..k), t_iter = F(1); O(L^2) in the worst case.
- `mgwfbp-paper`: the paper's Algorithm 1 (INFOCOM 2019) exactly: walk l = L..2 and make l a
  merged-gradient layer (sent with l-1) iff ready(l-1) < tau_c(l) + a (Theorem 1),
  recomputing the communication start times after each merge; O(L^2). Greedy, so not always
  optimal. With a measured T_ar, `a` is the start-up of the line fitted to the same points.
- `threshold`: buckets of at least B bytes filled in backward order (PyTorch DDP's 25 MB
  buckets, Horovod's fusion buffer); the last bucket may be smaller.
- `overlap`: groups, parts of groups and the send order chosen together by the scheduler
  (comm/model/scheduler.py) so that communication also overlaps the next forward pass, each
  layer updated right before its forward; never predicted slower than any scheme here.
- `bytescheduler`, `dear`: ByteScheduler's and DeAR's schedules with their defaults, in the
  same format (scheduler.py), for comparison; they train too.

A new scheme is one more `Scheme` entry in `REGISTRY` (its name, a one-line summary and the
function that groups the layers): `plan`, `simulate`, the pictures, `--comm` and the demo
render whatever that list holds.

Every scheme's groups go through the same `timeline()` (the recurrences of the model):
backward of layer l runs [tau_b(l), ready(l)) with tau_b(L) = t_f; messages go one at a time in
backward order, a group starting at max(end of the previous message, ready of its
input-most layer) and lasting T_ar(its bytes); t_iter = end of the last message (times from the
start of the forward pass).

A `Plan` is data: groups (in the order they are communicated, output side first; each group
a list of layer names in backward order), their sizes, the predicted timeline, the iteration
time and its non-overlapped communication. It serialises to JSON (`save`, `load_plan`) and
has a `digest()` that ranks compare before training together. Plans written before the
schemes were renamed (format `mgcaffe-plan/1`, where `mgwfbp` meant Algorithm 1 and
`optimal` the optimum) load under the new names.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import PlanError
from .cost import CostModel
from .profile import Profile, as_float, as_int, read_json, require, require_mapping
from .schedule import Schedule, cycle, freeze
from .scheduler import (
    barrier_candidates,
    bytescheduler_schedule,
    dear_schedule,
    overlap_schedule,
)

__all__ = ["DEFAULT_BUCKET_BYTES", "DEFAULT_SCHEME", "PLAN_FORMAT", "REGISTRY",
           "SCHEDULED_FORMAT", "SCHEMES", "Plan", "Scheme", "canonical_scheme", "load_plan",
           "make_plan", "make_plans", "scheduled_timeline", "scheme_named", "timeline"]

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # PyTorch DDP's bucket_cap_mb = 25
PLAN_FORMAT = "mgcaffe-plan/2"
# a plan with a schedule (parts, order, per-layer updates: comm/model/schedule.py)
SCHEDULED_FORMAT = "mgcaffe-plan/3"
# format 1 named Algorithm 1 `mgwfbp` and the optimum `optimal`
_FORMAT_1 = "mgcaffe-plan/1"
_FORMAT_1_NAMES = {"mgwfbp": "mgwfbp-paper", "optimal": "mgwfbp"}


# ----------------------------------------------------------------------------- the Plan
@dataclass(frozen=True)
class Plan:
    """A grouping of the learnable layers into messages, with its predicted timeline.

    layers / layer_bytes / backward_start / backward_end: per layer, input side first (layer
    1 .. L), as in the profile. groups / group_sizes / comm_start / comm_end: per message, in
    the order messages are sent (output side first); each group lists layer names in backward
    order. Times are seconds from the start of the forward pass."""

    scheme: str
    model: str
    layers: tuple[str, ...]
    layer_bytes: tuple[int, ...]
    groups: tuple[tuple[str, ...], ...]
    group_sizes: tuple[int, ...]
    forward_time: float
    backward_start: tuple[float, ...]
    backward_end: tuple[float, ...]
    comm_start: tuple[float, ...]
    comm_end: tuple[float, ...]
    iteration_time: float
    ideal: float
    a: float
    b: float
    nodes: int | None = None
    bucket_bytes: int | None = field(default=None)
    interference: tuple[tuple[int, float], ...] = ()  # the cost model's (bytes, slowdown)
    comm_slowdown: tuple[tuple[int, float], ...] = ()  # the cost model's (bytes, sigma)
    times: tuple[tuple[int, float], ...] = ()  # the cost model's measured (bytes, seconds)
    # False only for an `mgwfbp` plan whose search was cut (FRONT_BUDGET), or an `overlap`
    # plan above its lower bound: not proven optimal
    exact: bool = True
    # what the schedule decides beyond the groups (parts, order, update); None: each group
    # whole, in order, one update after the last (comm_start/comm_end are then per group,
    # else per message of schedule.order)
    schedule: Schedule | None = None

    # -- derived
    @property
    def non_overlapped_comm(self) -> float:
        """Communication not hidden behind backward: t_iter - (t_f + t_b), >= 0."""
        return max(0.0, self.iteration_time - self.ideal)

    @property
    def num_messages(self) -> int:
        return len(self.groups) if self.schedule is None else self.schedule.num_messages

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def group_index(self) -> dict[str, int]:
        """Layer name -> index (into `groups`) of the message that carries it."""
        return {name: g for g, group in enumerate(self.groups) for name in group}

    @cached_property
    def layer_index(self) -> dict[str, int]:
        """Layer name -> its 1-based learnable-layer index (1 = input side .. L)."""
        return {name: i + 1 for i, name in enumerate(self.layers)}

    def cost(self) -> CostModel:
        """The cost model the plan was made with (T_ar, rho and sigma as recorded)."""
        return CostModel(self.a, self.b, self.nodes, "plan", self.interference,
                         self.comm_slowdown, self.times)

    def group_layer_indices(self) -> list[list[int]]:
        """`groups` as 1-based learnable-layer indices (each group descending)."""
        return [[self.layer_index[n] for n in group] for group in self.groups]

    @property
    def merged_layers(self) -> frozenset[str]:
        """The paper's merged-gradient layers (Algorithm 2): every layer that is not the last
        of its group in backward order; its gradient only joins the pending message."""
        return frozenset(n for group in self.groups for n in group[:-1])

    def digest(self) -> str:
        """sha256 (hex) of the layer list, layer sizes, groups and group sizes: two ranks with
        equal digests pack and all-reduce the same messages in the same order."""
        canon = {"layers": list(self.layers), "layer_bytes": list(self.layer_bytes),
                 "groups": [list(g) for g in self.groups], "group_sizes": list(self.group_sizes)}
        if self.schedule is not None:
            canon["schedule"] = self.schedule.canon()
        blob = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    # -- (de)serialisation
    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT if self.schedule is None else SCHEDULED_FORMAT,
            "scheme": self.scheme,
            "model": self.model,
            "nodes": self.nodes,
            "a": self.a,
            "b": self.b,
            "bucket_bytes": self.bucket_bytes,
            "forward_time": self.forward_time,
            "ideal": self.ideal,
            "iteration_time": self.iteration_time,
            "non_overlapped_comm": self.non_overlapped_comm,
            "layers": [{"name": n, "bytes": nb, "backward_start": s, "backward_end": e}
                       for n, nb, s, e in zip(self.layers, self.layer_bytes,
                                              self.backward_start, self.backward_end)],
            "groups": [list(g) for g in self.groups],
            "group_sizes": list(self.group_sizes),
            "comm_start": list(self.comm_start),
            "comm_end": list(self.comm_end),
            "digest": self.digest(),
            **({"interference": [[m, r] for m, r in self.interference]}
               if self.interference else {}),
            **({"comm_slowdown": [[m, r] for m, r in self.comm_slowdown]}
               if self.comm_slowdown else {}),
            **({"times": [[m, t] for m, t in self.times]} if self.times else {}),
            **({} if self.exact else {"exact": False}),
            **({} if self.schedule is None else {"schedule": self.schedule.to_dict()}),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "plan") -> Plan:
        """Validate a plan read from JSON: every layer in exactly one group, groups consecutive
        in backward order, sizes consistent, digest (if present) matching."""
        source = str(source)
        d = require_mapping(d, source)
        fmt = d.get("format", PLAN_FORMAT)
        if fmt not in (PLAN_FORMAT, SCHEDULED_FORMAT, _FORMAT_1):
            raise PlanError(f"{source}: format: expected {PLAN_FORMAT!r}, got {fmt!r} (or "
                            f"{SCHEDULED_FORMAT!r}, a plan with a schedule)")
        scheme = require(d, "scheme", source)
        if not isinstance(scheme, str):
            raise PlanError(f"{source}: scheme: must be a string, got {scheme!r}")
        if fmt == _FORMAT_1:
            scheme = _FORMAT_1_NAMES.get(scheme, scheme)
        model = d.get("model", "")
        raw_layers = require(d, "layers", source)
        if not isinstance(raw_layers, list) or not raw_layers:
            raise PlanError(f"{source}: layers: must be a non-empty list")
        names, nbytes, bstart, bend = [], [], [], []
        for i, raw in enumerate(raw_layers):
            at = f"layers[{i}]"
            raw = require_mapping(raw, source, at)
            name = require(raw, "name", source, f"{at}.")
            if not isinstance(name, str) or not name:
                raise PlanError(f"{source}: {at}.name: must be a non-empty string")
            names.append(name)
            nbytes.append(as_int(require(raw, "bytes", source, f"{at}."), source, f"{at}.bytes"))
            bstart.append(as_float(require(raw, "backward_start", source, f"{at}."), source,
                                   f"{at}.backward_start"))
            bend.append(as_float(require(raw, "backward_end", source, f"{at}."), source,
                                 f"{at}.backward_end"))
        raw_groups = require(d, "groups", source)
        if not isinstance(raw_groups, list) or not all(isinstance(g, list) for g in raw_groups):
            raise PlanError(f"{source}: groups: must be a list of lists of layer names")
        groups = tuple(tuple(g) for g in raw_groups)
        _check_groups(names, groups, source)
        sizes = require(d, "group_sizes", source)
        if not isinstance(sizes, list) or len(sizes) != len(groups):
            raise PlanError(f"{source}: group_sizes: must list one size per group")
        sizes = [as_int(s, source, f"group_sizes[{g}]") for g, s in enumerate(sizes)]
        by_name = dict(zip(names, nbytes))
        for g, group in enumerate(groups):
            want = sum(by_name[n] for n in group)
            if sizes[g] != want:
                raise PlanError(f"{source}: group_sizes[{g}]: {sizes[g]} bytes, but its layers "
                                f"hold {want}")

        schedule = None
        if fmt == SCHEDULED_FORMAT:
            schedule = Schedule.from_dict(require(d, "schedule", source), f"{source}: schedule")
            schedule.check([sizes[g] // schedule.dtype_bytes for g in range(len(groups))],
                           f"{source}: schedule")
        messages = len(groups) if schedule is None else schedule.num_messages

        def floats(key):
            v = require(d, key, source)
            if not isinstance(v, list) or len(v) != messages:
                raise PlanError(f"{source}: {key}: must list one time per "
                                f"{'group' if schedule is None else 'message'}")
            return tuple(as_float(x, source, f"{key}[{i}]") for i, x in enumerate(v))

        nodes = d.get("nodes")
        if nodes is not None:
            nodes = as_int(nodes, source, "nodes", minimum=1)
        bucket = d.get("bucket_bytes")
        if bucket is not None:
            bucket = as_int(bucket, source, "bucket_bytes")
        plan = cls(
            scheme=scheme, model=str(model), layers=tuple(names), layer_bytes=tuple(nbytes),
            groups=groups, group_sizes=tuple(sizes),
            forward_time=as_float(require(d, "forward_time", source), source, "forward_time"),
            backward_start=tuple(bstart), backward_end=tuple(bend),
            comm_start=floats("comm_start"), comm_end=floats("comm_end"),
            iteration_time=as_float(require(d, "iteration_time", source), source,
                                    "iteration_time"),
            ideal=as_float(require(d, "ideal", source), source, "ideal"),
            a=as_float(require(d, "a", source), source, "a"),
            b=as_float(require(d, "b", source), source, "b"),
            nodes=nodes, bucket_bytes=bucket,
            interference=_interference_from(d.get("interference"), source),
            comm_slowdown=_interference_from(d.get("comm_slowdown"), source, "comm_slowdown"),
            times=_interference_from(d.get("times"), source, "times"),
            exact=d.get("exact", True) is not False, schedule=schedule)
        digest = d.get("digest")
        if digest is not None and digest != plan.digest():
            raise PlanError(f"{source}: digest: {digest!r} does not match the plan's groups and "
                            f"sizes ({plan.digest()!r}); was the file edited?")
        return plan

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


def _interference_from(raw: Any, source: str, key: str = "interference"
                       ) -> tuple[tuple[int, float], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PlanError(f"{source}: {key}: must be a list of [bytes, value]")
    try:
        return getattr(CostModel(0.0, 0.0, **{key: tuple(raw)}), key)
    except PlanError as exc:
        raise PlanError(f"{source}: {str(exc).split(': ', 1)[1]}") from None


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by `Plan.save` (or `mgcaffe plan --save-plan`)."""
    return Plan.from_dict(read_json(path), source=str(path))


def _check_groups(names: list[str], groups, source: str) -> None:
    """`names` input side first. Groups must be non-empty and, concatenated, list every layer
    once in backward order (so each group is a run of consecutive layers and the runs go
    output side first)."""
    names = list(names)
    known = set(names)
    flat = []
    for g, group in enumerate(groups):
        if not group:
            raise PlanError(f"{source}: groups[{g}]: empty group")
        for n in group:
            if not isinstance(n, str) or n not in known:
                raise PlanError(f"{source}: groups[{g}]: unknown layer {n!r}")
            flat.append(n)
    want = names[::-1]
    if flat == want:
        return
    seen = set()
    for n in flat:
        if n in seen:
            raise PlanError(f"{source}: groups: layer {n!r} appears in more than one place")
        seen.add(n)
    missing = [n for n in want if n not in seen]
    if missing:
        raise PlanError(f"{source}: groups: layer {missing[0]!r} is in no group "
                        f"({len(missing)} missing)")
    for i, (got, exp) in enumerate(zip(flat, want)):
        if got != exp:
            raise PlanError(f"{source}: groups: not consecutive layers in backward order: "
                            f"position {i} holds {got!r}, expected {exp!r}")


# ----------------------------------------------------------------------------- timeline
def _ready_times(profile: Profile) -> list[float]:
    """ready[l] for l = 1..L (index 0 unused): tau_b(L) = t_f, tau_b(l) = tau_b(l+1) +
    t_b(l+1), ready(l) = tau_b(l) + t_b(l)."""
    L = profile.num_layers
    ready = [0.0] * (L + 1)
    t = profile.forward_time
    for l in range(L, 0, -1):
        t = t + profile.layers[l - 1].backward_time
        ready[l] = t
    return ready


def timeline(profile: Profile, cost: CostModel, groups, *, scheme: str = "custom",
             nodes: int | None = None, bucket_bytes: int | None = None,
             exact: bool = True) -> Plan:
    """The predicted timeline of one iteration when `groups` (lists of layer names, output side
    first, each in backward order) are all-reduced one after another: the one implementation
    of the model's recurrences (docs/planner.md, "The model") that every scheme uses."""
    names = profile.names
    groups = tuple(tuple(g) for g in groups)
    _check_groups(names, groups, "groups" if scheme == "custom" else f"plan {scheme}")
    L = profile.num_layers
    ready = _ready_times(profile)
    # tau_b(l) = ready(l+1) (tau_b(L) = t_f), exactly as the recurrence adds them
    bstart = tuple([ready[l + 1] for l in range(1, L)] + [profile.forward_time])
    bend = tuple(ready[1:])
    index = {n: i + 1 for i, n in enumerate(names)}
    by_name = {layer.name: profile.layer_bytes(layer) for layer in profile.layers}
    interference = getattr(cost, "interference", ())
    if getattr(cost, "interferes", False):
        sizes, cstart, cend, slowed = _interfered_timeline(profile, cost, groups, index,
                                                           by_name)
        bstart = tuple([slowed[l + 1] for l in range(1, L)] + [profile.forward_time])
        bend = tuple(slowed[1:])
    else:
        sizes, cstart, cend = [], [], []
        free = 0.0  # F(L+1): the channel is free from the start
        for group in groups:
            size = sum(by_name[n] for n in group)
            start = max(free, ready[index[group[-1]]])
            free = start + cost.time(size)
            sizes.append(size)
            cstart.append(start)
            cend.append(free)
    t_iter = cend[-1]
    return Plan(
        scheme=scheme, model=profile.model, layers=tuple(names),
        layer_bytes=tuple(by_name[n] for n in names), groups=groups,
        group_sizes=tuple(sizes), forward_time=profile.forward_time,
        backward_start=bstart, backward_end=bend, comm_start=tuple(cstart),
        comm_end=tuple(cend), iteration_time=t_iter, ideal=ready[1], a=cost.a, b=cost.b,
        nodes=nodes if nodes is not None else getattr(cost, "nodes", None),
        bucket_bytes=bucket_bytes, interference=tuple(interference),
        comm_slowdown=tuple(getattr(cost, "comm_slowdown", ())),
        times=tuple(getattr(cost, "times", ())), exact=exact)


def scheduled_timeline(profile: Profile, cost: CostModel, groups, schedule: Schedule, *,
                       scheme: str = "custom", nodes: int | None = None,
                       exact: bool = True) -> Plan:
    """The steady state of `schedule` over `groups` (lists of layer names, output side first,
    each in backward order) as a Plan: `schedule.cycle`'s times (from the forward start; the
    iteration runs to the next forward start, updates included), comm_start/comm_end per
    message of schedule.order, ideal = t_f + t_b + the updates. A priority schedule is
    frozen into the sequence it is predicted to send (`schedule.freeze`): what ranks run."""
    names = profile.names
    groups = tuple(tuple(g) for g in groups)
    _check_groups(names, groups, "groups" if scheme == "custom" else f"plan {scheme}")
    index = {n: i + 1 for i, n in enumerate(names)}
    by_name = {layer.name: profile.layer_bytes(layer) for layer in profile.layers}
    sizes = [sum(by_name[n] for n in g) for g in groups]
    schedule.check([size // schedule.dtype_bytes for size in sizes],
                   "schedule" if scheme == "custom" else f"plan {scheme}: schedule")
    layers = [[index[n] for n in g] for g in groups]
    schedule = freeze(profile, cost, layers, schedule)
    c = cycle(profile, cost, layers, schedule)
    return Plan(
        scheme=scheme, model=profile.model, layers=tuple(names),
        layer_bytes=tuple(by_name[n] for n in names), groups=groups,
        group_sizes=tuple(sizes), forward_time=profile.forward_time,
        backward_start=c.backward_start, backward_end=c.backward_end,
        comm_start=c.comm_start, comm_end=c.comm_end, iteration_time=c.iteration_time,
        ideal=profile.ideal_time + profile.update_time, a=cost.a, b=cost.b,
        nodes=nodes if nodes is not None else getattr(cost, "nodes", None),
        interference=tuple(getattr(cost, "interference", ())),
        comm_slowdown=tuple(getattr(cost, "comm_slowdown", ())),
        times=tuple(getattr(cost, "times", ())), exact=exact, schedule=schedule)


def _message(ws: float, T: float, slow: float, sigma: float, total: float
             ) -> tuple[float, float]:
    """One message of the extended model, started when backward has done `ws` of its `total`
    seconds of work: it needs T seconds at full speed, progresses at 1/sigma while backward
    still runs, and backward runs at 1/slow (slow = 1 + rho) while it is in flight. Returns
    (its duration, backward's work at its end). The timeline and the optimal programme both
    use this one function, so they agree to the last bit."""
    if ws >= total:
        return T, total
    left = (total - ws) * slow  # seconds until backward ends, with the message in flight
    if sigma == 1.0 or T * sigma <= left:
        d = T * sigma
        return d, min(total, ws + d / slow)
    return left + (T - left / sigma), total  # backward ends first: the rest at full speed


def _interfered_timeline(profile: Profile, cost: CostModel, groups, index, by_name):
    """The timeline of the extended model (docs/planner.md): backward runs at 1/(1 + rho(M))
    of its speed while a message of M bytes is in flight, a message at 1/sigma(M) of its speed
    while backward runs. Messages go one at a time, so the state after each is (F, w): the
    time the channel is free and the backward work done by then; each message's end follows
    from `_message`, each layer's ready time from an event walk of backward's speed through
    the messages' intervals. Returns (sizes, comm starts, comm ends, ready[0..L])."""
    L = profile.num_layers
    ready = [0.0] * (L + 1)
    busy: list[tuple[float, float, float]] = []  # (start, end, speed) of each message so far
    t, work, nxt = profile.forward_time, 0.0, 0  # backward's clock, work done, next interval

    def advance(target: float) -> float:
        """Run backward from (t, work) until `target` seconds of work are done."""
        nonlocal t, work, nxt
        while work < target:
            while nxt < len(busy) and busy[nxt][1] <= t:
                nxt += 1
            if nxt < len(busy) and busy[nxt][0] <= t:  # inside a message: slowed
                end, speed = busy[nxt][1], busy[nxt][2]
                if work + (end - t) * speed >= target:
                    t += (target - work) / speed
                    work = target
                else:
                    work += (end - t) * speed
                    t = end
            else:  # the channel is idle (until the next message, if any)
                gap = busy[nxt][0] - t if nxt < len(busy) else math.inf
                if work + gap >= target:
                    t += target - work
                    work = target
                else:
                    work += gap
                    t = busy[nxt][0]
        return t

    done = [0.0] * (L + 2)  # done[l]: work at which layer l's gradient is ready
    for l in range(L, 0, -1):
        done[l] = done[l + 1] + profile.layers[l - 1].backward_time
    total = done[1]
    sizes, cstart, cend = [], [], []
    F, w = profile.forward_time, 0.0  # the state before the first message
    for group in groups:
        for n in group:
            ready[index[n]] = advance(done[index[n]])
        size = sum(by_name[n] for n in group)
        need = done[index[group[-1]]]
        s, ws = (F, w) if w >= need else (F + need - w, need)
        slow = 1.0 + cost.slowdown(size)
        d, w = _message(ws, cost.time(size), slow, cost.sigma(size), total)
        F = s + d
        busy.append((s, F, 1.0 / slow))
        sizes.append(size)
        cstart.append(s)
        cend.append(F)
    return sizes, cstart, cend, ready


# ----------------------------------------------------------------------------- schemes
def _groups_from_runs(profile: Profile, runs: list[tuple[int, int]]) -> list[list[str]]:
    """(high, low) 1-based layer runs, output side first -> lists of names in backward order."""
    names = profile.names
    return [[names[l - 1] for l in range(hi, lo - 1, -1)] for hi, lo in runs]


def _wfbp_runs(L: int) -> list[tuple[int, int]]:
    return [(l, l) for l in range(L, 0, -1)]


def _algorithm1_runs(profile: Profile, cost: CostModel) -> list[tuple[int, int]]:
    """Algorithm 1 of the paper, as docs/planner.md ("The model") states it. Its rule keeps
    the paper's form with the model's `a`: for a measured T_ar that is the start-up of the
    line fitted to the same points (the paper's a); t_c and the start times use T_ar itself."""
    L = profile.num_layers
    nb = profile.dtype_bytes
    a = cost.a
    ready = _ready_times(profile)
    p = [0] + [layer.params for layer in profile.layers]  # p[l], l = 1..L; merges move p down
    tc = [0.0] + [cost.time(nb * p[l]) for l in range(1, L + 1)]
    tau_c = [0.0] * (L + 2)

    def recompute(top: int) -> None:
        # tau_c(L) = ready(L); tau_c(l) = max(tau_c(l+1) + t_c(l+1), ready(l)). After merging l
        # into l-1 only t_c(l) and t_c(l-1) changed, so tau_c(l..L) are unchanged and
        # recomputing from `top` = l-1 down gives exactly the full recomputation's values.
        if top == L:
            tau_c[L] = ready[L]
            top -= 1
        for m in range(top, 0, -1):
            tau_c[m] = max(tau_c[m + 1] + tc[m + 1], ready[m])

    recompute(L)
    merged = [False] * (L + 1)
    for l in range(L, 1, -1):
        r = ready[l - 1]
        # Theorem 1: C.1 r < tau_c(l): merge; C.2 tau_c(l) <= r < tau_c(l) + t_c(l): merge iff
        # r - tau_c(l) < a; C.3 r >= tau_c(l) + t_c(l): keep. Together (t_c(l) >= a):
        if r < tau_c[l] + a:
            merged[l] = True
            p[l - 1] += p[l]
            p[l] = 0
            tc[l] = 0.0
            tc[l - 1] = cost.time(nb * p[l - 1])
            recompute(l - 1)
    runs, hi = [], L
    for l in range(L, 0, -1):
        if l == 1 or not merged[l]:
            runs.append((hi, l))
            hi = l - 1
    return runs


def _optimal_runs(profile: Profile, cost: CostModel) -> list[tuple[int, int]]:
    """Exact optimum over groupings of consecutive layers (the dynamic programme of
    docs/planner.md, "The model"), for any T_ar that never decreases with the size (a line
    or a measured curve; no linearity or subadditivity is needed).

    F(j) = min over k >= j of max(F(k+1), ready(j)) + T_ar(bytes of j..k), F(L+1) = 0. The
    right side never decreases in F(k+1), so the earliest end of each suffix is the one to
    extend. F(k+1) <= F(k) (dropping layer k from the optimum of L..k leaves messages no
    larger that start no later, as ready(k+1) <= ready(k) and T never decreases), so once
    F(k+1) <= ready(j) every larger k gives ready(j) + T(more bytes): the inner loop stops
    there (exact; O(L^2) in the worst case, far less on real profiles)."""
    L = profile.num_layers
    nb = profile.dtype_bytes
    ready = _ready_times(profile)
    p = [0] + [layer.params for layer in profile.layers]
    F = [0.0] * (L + 2)
    choice = [0] * (L + 2)
    time = cost.time
    for j in range(L, 0, -1):
        rj = ready[j]
        best, best_k, params = math.inf, j, 0
        for k in range(j, L + 1):
            params += p[k]
            f = F[k + 1]
            v = (f if f > rj else rj) + time(nb * params)
            if v < best:
                best, best_k = v, k
            if f <= rj:
                break
        F[j] = best
        choice[j] = best_k
    runs = []
    j = 1
    while j <= L:
        k = choice[j]
        runs.append((k, j))
        j = k + 1
    runs.reverse()
    return runs


def _optimal_interfered_runs(profile: Profile, cost: CostModel, *, strict: bool = True,
                             upper: float = math.inf, budget: int | None = None,
                             terms: dict | None = None
                             ) -> tuple[list[tuple[int, int]], bool]:
    """Exact optimum over groupings of consecutive layers under the extended model.

    Messages go in backward order, so after the groups holding layers L..k+1 the future
    depends only on the state (F, w): the time F the channel becomes free and the backward
    work w done by then (backward runs at full speed while the channel is idle). The next
    group j..k starts at s = F if w >= W(j) (the work after which layer j is ready), else at
    s = F + W(j) - w, with ws = max(w, W(j)) done; `_message` gives its duration and the work
    at its end. Dominance (docs/planner.md proves both):

    - `strict` (exact for every sigma >= 1): A dominates B when F_A <= F_B and w_A >= w_B. The
      start is then no later, the work at the start no smaller, so the duration no longer and
      the work at the end no smaller: A's next state dominates B's, and A ends no later.
    - otherwise (exact only when sigma = 1 for every size): also when F_A <= F_B and
      w_A + F_B - F_A >= w_B (A, had it idled until F_B, would have done w_B). With sigma > 1
      it fails: a message started earlier overlaps more backward, so it can end later.

    `upper`: the iteration time of a known grouping; a state whose lower bound (`_lower`)
    exceeds it cannot lead to anything better and is dropped (branch and bound, still exact:
    the states of an optimal grouping never exceed its time).

    `budget`: about this many state transitions in all. Before expanding front k it is cut
    to its share of what is left (those of least lower bound are kept, at least one); the
    result is then no longer proven optimal. `terms`: a dict of (T, 1 + rho, sigma) per
    message size, shared by searches of the same profile and cost. Returns (runs, exact):
    exact is False when a front was cut; runs is [] when every state was dropped (`upper`
    below what is reachable).

    A front is expanded as arrays (`_expand`): every state against a block of group sizes at
    once, with the same floating-point operations in the same order as `_message` and
    `_lower`, so the states, the transitions counted and the plan are those of the scalar
    recurrences."""
    L = profile.num_layers
    W = [0.0] * (L + 2)
    for l in range(L, 0, -1):
        W[l] = W[l + 1] + profile.layers[l - 1].backward_time
    need = _least_channel(profile, cost)  # need[k]: least channel time of layers 1..k
    search = _Expansion(profile, cost, W, need, upper, {} if terms is None else terms)
    exact, spent, per_state = True, 0, float(L)
    # pending[k]: chunks of states after sending layers L..k+1, in the order they were made:
    # ((F, w, parent state index) x n, parent k, j)
    pending: list[list[tuple]] = [[] for _ in range(L + 1)]
    pending[L] = [(np.array([[profile.forward_time], [0.0], [0.0]]), -1, -1)]
    fronts: list[tuple | None] = [None] * (L + 1)  # (F, w, parent si, parent k, j) arrays
    for k in range(L, -1, -1):
        chunks, pending[k] = pending[k], []
        if not chunks:
            continue
        if k == 0:  # every end state, in the order made (the first least is taken)
            fronts[0] = _concat(chunks)
            break
        front = _pareto_arrays(chunks, strict)
        if budget is not None:
            # this front's share of what is left (fronts k..1 try about k(k+1)/2 groups per
            # state), in states at the transitions per state seen on the previous front
            cap = max(1, int(2 * (budget - spent) / (k + 1) / max(1.0, per_state)))
            if len(front[0]) > cap:
                bound = search.lower(np.full(len(front[0]), k), front[0], front[1])
                keep = np.argsort(bound, kind="stable")[:cap]
                front = tuple(x[keep] for x in front)
                exact = False
        fronts[k] = front
        used = search.expand(k, front[0], front[1], pending)
        spent += used
        per_state = used / len(front[0])
    if fronts[0] is None:
        return [], exact
    at, state = int(np.argmin(fronts[0][0])), fronts[0]  # the first of the least
    runs = []
    while state[3][at] >= 0:
        k, at, j = int(state[3][at]), int(state[2][at]), int(state[4][at])
        runs.append((k, j))
        state = fronts[k]
    runs.reverse()
    return runs, exact


def _concat(chunks: list[tuple]) -> tuple:
    """The states of `chunks` (see _optimal_interfered_runs) as (F, w, parent si, parent k,
    j) arrays, in the order made."""
    made = np.concatenate([c[0] for c in chunks], axis=1)
    sizes = [c[0].shape[1] for c in chunks]
    return (made[0], made[1], made[2].astype(np.int64),
            np.repeat(np.array([c[1] for c in chunks], np.int64), sizes),
            np.repeat(np.array([c[2] for c in chunks], np.int64), sizes))


def _pareto_arrays(chunks: list[tuple], strict: bool) -> tuple:
    """The states of `chunks` (arrays, see _optimal_interfered_runs) not dominated by another:
    sorted by F (ties: most work first, then in the order made), each kept when its w
    (strict) or w - F exceeds every earlier one's. Returns (F, w, parent si, parent k, j)
    arrays."""
    F, w, si, pk, pj = _concat(chunks)
    order = np.lexsort((-w, F))  # stable: equal states stay in the order made
    F, w = F[order], w[order]
    v = w if strict else w - F
    before = np.empty_like(v)
    before[0] = -math.inf
    np.maximum.accumulate(v[:-1], out=before[1:])
    keep = v > before
    order = order[keep]
    return F[keep], w[keep], si[order], pk[order], pj[order]


class _Expansion:
    """The transitions of `_optimal_interfered_runs` as array operations: `expand(k, F, w,
    pending)` sends every group j..k (j = k..1) from each state of front k, appending the
    states that survive the bound to pending[j - 1]; `lower` is `_lower`. Each
    element goes through the operations of `_message` and `_lower` in their order (IEEE
    arithmetic is the same in numpy), so the results equal the scalar ones bit for bit."""

    BLOCK = 64  # group sizes tried per array operation (a state stops at its first break)

    def __init__(self, profile: Profile, cost: CostModel, W: list[float], need: list[float],
                 upper: float, terms: dict[int, tuple[float, float, float]]):
        self.nb = profile.dtype_bytes
        self.cum = [0, *itertools.accumulate(layer.params for layer in profile.layers)]
        self.W = np.array(W)
        self.need = np.array(need)
        self.total = W[1]
        self.cost = cost
        self.prune = math.isfinite(upper)
        self.limit = upper * (1 + 1e-9)  # a margin for rounding: pruning less stays exact
        self.lower = _lower(profile, cost, self.total, need)
        # per message size: its full-speed time, 1 + rho and sigma (sizes repeat; shared by
        # the searches of one profile and cost)
        self.terms = terms

    def _terms(self, k: int, js: range) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cost, terms, cum, nb, top = self.cost, self.terms, self.cum, self.nb, self.cum[k]
        out = []
        for j in js:
            size = nb * (top - cum[j - 1])
            term = terms.get(size)
            if term is None:
                term = terms[size] = (cost.time(size), 1.0 + cost.slowdown(size),
                                      cost.sigma(size))
            out.append(term)
        T, slow, sigma = np.array(out).T
        return T, slow, sigma

    def expand(self, k: int, F: np.ndarray, w: np.ndarray, pending: list[list[tuple]]) -> int:
        """Every group j..k from each state (F[i], w[i]) of front k; returns the transitions
        counted as the scalar loop counts them (a break counts the group that breaks)."""
        W, total, limit, prune = self.W, self.total, self.limit, self.prune
        n = len(F)
        alive = np.ones(n, bool)
        spent = 0
        si = np.arange(n)
        Fc, wc = F[:, None], w[:, None]
        need_k = self.need[k]
        for hi in range(k, 0, -self.BLOCK):
            if not alive.any():
                break
            lo = max(1, hi - self.BLOCK + 1)
            js = np.arange(hi, lo - 1, -1)
            T, slow, sigma = self._terms(k, range(hi, lo - 1, -1))
            Wj = W[js][None, :]
            idle = wc < Wj  # the group waits for layer j: it starts at F + W(j) - w
            s = np.where(idle, Fc + Wj - wc, Fc)
            ws = np.where(idle, Wj, wc)
            width = len(js)
            if prune:
                broke = idle & (s + need_k > limit)
                first_break = np.where(broke.any(axis=1), broke.argmax(axis=1), width)
                cols = np.arange(width)[None, :]
                valid = alive[:, None] & (cols < first_break[:, None])
                spent += int(np.minimum(first_break + 1, width)[alive].sum())
                alive &= first_break == width
            else:
                valid = np.broadcast_to(alive[:, None], s.shape)
                spent += int(alive.sum()) * width
            # `_message`, elementwise
            left = (total - ws) * slow
            d_in = T * sigma
            fits = (sigma == 1.0) | (d_in <= left)
            d = np.where(fits, d_in, left + (T - left / sigma))
            w2 = np.where(fits, np.minimum(total, ws + d_in / slow), total)
            done = ws >= total
            d = np.where(done, T, d)
            w2 = np.where(done, total, w2)
            F2 = s + d
            if prune:
                valid = valid & ~(self.lower((js - 1)[None, :], F2, w2) > limit)
            # column-major: for each j, the surviving states in front order
            vt = valid.T
            counts = vt.sum(axis=1)
            if not counts.any():
                continue
            # one (3, n) array of F, w and the parent's index (exact in float64)
            made = np.stack([F2.T[vt], w2.T[vt],
                             np.broadcast_to(si[None, :], vt.shape)[vt]])
            ends = np.cumsum(counts).tolist()
            counts, jl = counts.tolist(), js.tolist()
            for c, m in enumerate(counts):
                if m:
                    j = jl[c]
                    pending[j - 1].append((made[:, ends[c] - m:ends[c]], k, j))
        return spent


def _least_channel(profile: Profile, cost: CostModel) -> list[float]:
    """need[k], k = 0..L: the least full-speed channel time that layers 1..k can take, over
    every grouping of them into consecutive messages. For the paper's line (a, b >= 0) one
    message is the cheapest, T(their bytes); a measured T need not be subadditive (over TCP a
    large message can cost more than two halves), so in general it is the programme
    need[k] = min over j <= k of need[j-1] + T(bytes of j..k). Exact for any T."""
    L = profile.num_layers
    nb = profile.dtype_bytes
    cum = [0, *itertools.accumulate(layer.params for layer in profile.layers)]
    if not getattr(cost, "times", ()):
        return [0.0] + [cost.time(nb * c) for c in cum[1:]]
    time = cost.time
    need = [0.0] * (L + 1)
    for k in range(1, L + 1):
        need[k] = min(need[j - 1] + time(nb * (cum[k] - cum[j - 1])) for j in range(1, k + 1))
    return need


def _lower(profile: Profile, cost: CostModel, total: float, need: list[float] | None = None):
    """lower(k, F, w), elementwise over arrays (of one shape, or broadcast): a lower bound on
    the iteration time from the state (F, w) with layers 1..k still to send. Let R = total - w
    and x the time a message is in flight between F and the end E of backward. Backward runs
    at most at 1/(1 + rho_min) while one is, so E - F >= R + x q (q = rho_min / (1 +
    rho_min)), and at least at 1/(1 + rho_max), so
    x <= R (1 + rho_max); the channel does at most x / sigma_min of full-speed work before
    E; layers 1..k need at least C = need[k] of it (`_least_channel`), and the group holding
    layer 1 starts after E and lasts at least T1 = T(layer 1's bytes) (T never decreases with
    the size). So the time is at least F + R + x q + max(T1, C - x / sigma_min), minimised
    over x in [0, R (1 + rho_max)]."""
    need = np.array(_least_channel(profile, cost) if need is None else need)
    first = cost.time(profile.dtype_bytes * profile.layers[0].params)
    sigma_min = min([s for _, s in cost.comm_slowdown] or [1.0])
    rho_min = min([r for _, r in cost.interference] or [0.0])
    rho_max = max([r for _, r in cost.interference] or [0.0])
    q = rho_min / (1.0 + rho_min)

    def lower(k: np.ndarray, F: np.ndarray, w: np.ndarray) -> np.ndarray:
        rest = total - w
        c = need[k]
        closed = F + rest + np.maximum(first, c)  # x = 0 is the least
        if not (q * sigma_min >= 1.0):
            x = np.minimum((c - first) * sigma_min, rest * (1.0 + rho_max))
            inner = F + rest + x * q + np.maximum(first, c - x / sigma_min)
            closed = np.where(c <= first, closed, inner)
        return np.where(k == 0, F, np.where(rest <= 0, F + c, closed))

    return lower


# State transitions of `mgwfbp` under the extended model. The fronts are expanded as arrays
# (_Expansion), so a million transitions take well under a second; what a 500-layer profile
# costs beyond them (group sizes, candidates, fronts) keeps it at 2-3 s on an idle 2-core
# machine. GoogleNet and ResNet-50 (K80 profiles) plan exactly under measured-like rho/sigma.
FRONT_BUDGET = 1_000_000


def grouping_lower_bound(profile: Profile, cost: CostModel) -> float:
    """A lower bound on the iteration of any grouping of consecutive layers sent in backward
    order under `cost` (the extended model where it interferes): `_lower` from the start
    state, what a plan whose search was cut is measured against."""
    total = sum(layer.backward_time for layer in profile.layers)
    bound = _lower(profile, cost, total)(np.array(profile.num_layers),
                                         np.array(profile.forward_time), np.array(0.0))
    return float(bound)


def _optimal_extended_runs(profile: Profile, cost: CostModel
                           ) -> tuple[list[tuple[int, int]], bool]:
    """`mgwfbp` under the extended model: (runs, proven optimal). The state programme
    (strict dominance when some sigma > 1, else the idling one), bounded by the best of a few
    groupings so that only states that could still beat it are kept; past FRONT_BUDGET
    transitions fronts are cut (then not proven, and never worse than the best of those
    groupings)."""
    L = profile.num_layers
    strict = any(sigma > 1 for _, sigma in cost.comm_slowdown)
    candidates = [_wfbp_runs(L), [(L, 1)], _algorithm1_runs(profile, cost),
                  _optimal_runs(profile, cost)]

    def time_of(runs):
        return timeline(profile, cost, _groups_from_runs(profile, runs)).iteration_time

    best = min(candidates, key=time_of)
    terms: dict[int, tuple[float, float, float]] = {}
    if strict:  # the idling dominance is inexact here but a good bound
        guess, _ = _optimal_interfered_runs(profile, cost, strict=False, upper=time_of(best),
                                            budget=FRONT_BUDGET // 4, terms=terms)
        if guess and time_of(guess) < time_of(best):
            best = guess
    runs, exact = _optimal_interfered_runs(profile, cost, strict=strict,
                                           upper=time_of(best), budget=FRONT_BUDGET,
                                           terms=terms)
    if not runs or time_of(best) < time_of(runs):
        # only when a capped front lost the bound's states (exactly, best is optimal)
        runs = best
    return runs, exact


def _threshold_runs(profile: Profile, bucket_bytes: int) -> list[tuple[int, int]]:
    L = profile.num_layers
    runs, hi, acc = [], L, 0
    for l in range(L, 0, -1):
        acc += profile.layer_bytes(profile.layers[l - 1])
        if acc >= bucket_bytes or l == 1:
            runs.append((hi, l))
            hi, acc = l - 1, 0
    return runs


def _optimum(profile: Profile, cost: CostModel, bucket_bytes: int | None
             ) -> tuple[list[tuple[int, int]], bool]:
    if not getattr(cost, "interferes", False):
        return _optimal_runs(profile, cost), True
    return _optimal_extended_runs(profile, cost)


def _overlap(profile: Profile, cost: CostModel, bucket_bytes: int | None):
    """`overlap`: groups, parts and order chosen together (comm/model/scheduler.py), starting
    from this module's groupings and beating every other scheme's schedule."""
    L = profile.num_layers
    optimum = _optimal_runs(profile, cost)
    ddp = _threshold_runs(profile, DEFAULT_BUCKET_BYTES)
    groupings = {"mgwfbp": optimum, "wfbp": _wfbp_runs(L), "synceasgd": [(L, 1)],
                 "threshold": ddp, "mgwfbp-paper": _algorithm1_runs(profile, cost)}
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
           lambda p, c, b: (_wfbp_runs(p.num_layers), True), baseline=True,
           aliases=("layerwise",)),
    Scheme("synceasgd", "one all-reduce of every gradient after backward",
           lambda p, c, b: ([(p.num_layers, 1)], True), baseline=True,
           aliases=("sync_easgd", "single")),
    Scheme("mgwfbp", "merged groups: the exact optimum of the paper's cost model", _optimum,
           aliases=("mg_wfbp", "optimal", "exact", "dp")),
    Scheme("mgwfbp-paper", "merged groups by the paper's Algorithm 1 (greedy)",
           lambda p, c, b: (_algorithm1_runs(p, c), True),
           aliases=("paper", "infocom", "greedy", "algorithm1")),
    Scheme("threshold", "buckets of at least --bucket-mb, filled in backward order",
           lambda p, c, b: (_threshold_runs(p, DEFAULT_BUCKET_BYTES if b is None else b),
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
        plan = scheduled_timeline(profile, cost, _groups_from_runs(profile, runs), schedule,
                                  scheme=chosen.name, nodes=nodes, exact=exact)
        return plan if bucket is None else replace(plan, bucket_bytes=bucket)
    runs, exact = chosen.runs(profile, cost, bucket)
    return timeline(profile, cost, _groups_from_runs(profile, runs), scheme=chosen.name,
                    nodes=nodes, bucket_bytes=bucket, exact=exact)


def make_plans(profile: Profile, cost: CostModel, schemes=SCHEMES,
               bucket_bytes: int | None = None, *, nodes: int | None = None) -> dict[str, Plan]:
    """make_plan for several schemes: {scheme: Plan}, in the order given."""
    out: dict[str, Plan] = {}
    for s in schemes:
        plan = make_plan(profile, cost, s, bucket_bytes, nodes=nodes)
        out[plan.scheme] = plan
    return out

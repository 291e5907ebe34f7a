"""A `Plan`: which layers share each message, its predicted timeline, and its file format.

A `Plan` is data: groups (in the order they are communicated, output side first; each group
a list of layer names in backward order), their sizes, how they are sent (`schedule`: parts,
order, update; comm/model/schedule.py; None: each group whole, in order, one update after the
last), and the predicted iteration of timeline.py, whatever the scheme: the times of every
message in the order sent (`messages`), the iteration time and its non-overlapped
communication. It serialises to JSON (`save`,
`load_plan`) and has a `digest()` that ranks compare before training together. Plans written
before the schemes were renamed (format `mgcaffe-plan/1`, where `mgwfbp` meant Algorithm 1
and `optimal` the optimum) load under the new names.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ...errors import PlanError
from .cost import WIRE_BYTES, WIRE_FORMATS, CostModel
from .profile import as_float, as_int, read_json, require, require_mapping
from .schedule import Schedule

__all__ = ["PLAN_FORMAT", "SCHEDULED_FORMAT", "Plan", "check_groups", "load_plan"]

PLAN_FORMAT = "mgcaffe-plan/2"
# a plan with a schedule (parts, order, per-layer updates: comm/model/schedule.py)
SCHEDULED_FORMAT = "mgcaffe-plan/3"
# format 1 named Algorithm 1 `mgwfbp` and the optimum `optimal`
_FORMAT_1 = "mgcaffe-plan/1"
_FORMAT_1_NAMES = {"mgwfbp": "mgwfbp-paper", "optimal": "mgwfbp"}


@dataclass(frozen=True)
class Plan:
    """A grouping of the learnable layers into messages, with its predicted timeline
    (timeline.py).

    layers / layer_bytes / backward_start / backward_end: per layer, input side first (layer
    1 .. L), as in the profile. groups / group_sizes: per group, in the order they are sent
    (output side first); each group lists layer names in backward order. comm_start /
    comm_end: per message of `messages`, in the order sent (with no schedule, one message per
    group). iteration_time: from a forward start to the next, the updates the profile gives
    included (none in a profile without update times: then from the forward start to the end
    of the last message). Times are seconds from the start of the forward pass."""

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
    # whole, in order, one update after the last
    schedule: Schedule | None = None
    # per group, the format its messages travel in (cost.WIRE_FORMATS; () = every message
    # float32), and the cost model's offer and cast costs that chose them
    formats: tuple[str, ...] = ()
    wires: tuple[str, ...] = ()
    cast: tuple[tuple[str, float], ...] = ()

    # -- derived
    def wire(self, g: int) -> str:
        """The format group g's messages travel in."""
        return self.formats[g] if self.formats else "float32"

    @property
    def compressed(self) -> bool:
        """Whether any message travels in less than float32."""
        return any(f != "float32" for f in self.formats)

    @property
    def wire_bytes(self) -> int:
        """The bytes one rank's messages put on the wire per iteration (float32: the
        gradient's own)."""
        return sum(size * WIRE_BYTES[self.wire(g)] // 4
                   for g, size in enumerate(self.group_sizes))

    @property
    def non_overlapped_comm(self) -> float:
        """Communication not hidden behind backward: t_iter - (t_f + t_b), >= 0."""
        return max(0.0, self.iteration_time - self.ideal)

    @property
    def messages(self) -> tuple[tuple[int, int, str], ...]:
        """Every message in the order sent, as (group, part, kind) (schedule.py): the
        schedule's order, or each group whole, all-reduced in order."""
        if self.schedule is None:
            return tuple((g, 0, "ar") for g in range(len(self.groups)))
        return self.schedule.order

    @property
    def num_messages(self) -> int:
        return len(self.groups) if self.schedule is None else self.schedule.num_messages

    def group_spans(self) -> list[tuple[float, float]]:
        """Per group: (the start of its first message, the end of its last), seconds from
        the forward start."""
        spans: dict[int, tuple[float, float]] = {}
        for (g, _, _), s, e in zip(self.messages, self.comm_start, self.comm_end):
            lo, hi = spans.get(g, (s, e))
            spans[g] = (min(lo, s), max(hi, e))
        return [spans[g] for g in range(len(self.groups))]

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
                         self.comm_slowdown, self.times, wires=self.wires, cast=self.cast)

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
        if self.compressed:  # (a plan all float32 keeps the digest it always had)
            canon["formats"] = list(self.formats)
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
            **({"formats": list(self.formats)} if self.compressed else {}),
            **({"wires": list(self.wires)} if self.wires else {}),
            **({"cast": {w: c for w, c in self.cast}} if self.cast else {}),
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
        check_groups(names, groups, source)
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
                raise PlanError(f"{source}: {key}: must list one time per message "
                                f"({messages})")
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
            exact=d.get("exact", True) is not False, schedule=schedule,
            **_wire_fields(d, len(groups), source))
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


def _wire_fields(d: dict, groups: int, source: str) -> dict:
    """`formats` (one per group), `wires` and `cast` of a plan file, checked."""
    formats = d.get("formats", [])
    if not isinstance(formats, list) or (formats and len(formats) != groups) or any(
            f not in WIRE_FORMATS for f in formats):
        raise PlanError(f"{source}: formats: must list one of {', '.join(WIRE_FORMATS)} per "
                        f"group ({groups})")
    wires = d.get("wires", [])
    cast = d.get("cast", {})
    if not isinstance(wires, list) or not isinstance(cast, dict):
        raise PlanError(f"{source}: wires/cast: a list of formats and a mapping format -> "
                        f"seconds per byte")
    try:
        checked = CostModel(0.0, 0.0, wires=tuple(wires), cast=tuple(cast.items()))
    except PlanError as exc:
        raise PlanError(f"{source}: {str(exc).split(': ', 1)[1]}") from None
    if all(f == "float32" for f in formats):
        formats = []
    return {"formats": tuple(formats), "wires": checked.wires, "cast": checked.cast}


def load_plan(path: str | Path) -> Plan:
    """Read a plan written by `Plan.save` (or `mgcaffe plan --save-plan`)."""
    return Plan.from_dict(read_json(path), source=str(path))


def check_groups(names: list[str], groups, source: str) -> None:
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

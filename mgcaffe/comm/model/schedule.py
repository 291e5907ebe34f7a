"""Schedules: what a plan decides beyond its groups, and the messages it sends.

The merge planner decides which consecutive layers share a message and sends the messages in
backward order; the update waits for the last one. A `Schedule` adds to a plan's groups
(consecutive layers, output side first, each in backward order) what else a schedule decides:

- `parts[g]` >= 1: group g's gradient, its layers' elements laid out in backward order (as the
  flat gradient buffer holds them), is cut into parts[g] consecutive pieces of
  ceil(n / parts[g]) elements (the last one shorter, `part_bounds`). Each piece is a message of
  its own, ready as soon as every layer it holds is.
- `ops[g]`: "allreduce", or "rs-ag": a reduce-scatter of each part once it is ready and an
  all-gather of it later (DeAR). Each half costs T(M)/2: a ring all-reduce is exactly a
  reduce-scatter followed by an all-gather, and T(M) is all the cost model says.
- `order`: every message as (group, part, kind), kind "ar", "rs" or "ag" (an "rs" before its
  "ag"). With `policy` "sequence" it is the send order: each message starts when the previous
  one has ended and its data is ready; `batches` (sizes of consecutive runs of the order,
  default one each) sends a run of all-reduce parts as one collective over their
  concatenation, costing T of their sum. With "priority" it is a priority: whenever the
  channel is free, the first ready message in this order goes (a message is never
  interrupted: a long one delays a more urgent one released meanwhile; parts bound that), and
  up to `credit` bytes of ready all-reduce parts, in priority order, go with it.
  Every rank must send the same messages in the same order, and what is ready when depends on
  each rank's timing, so a plan to train is always a sequence: `freeze` turns a priority
  schedule into the sequence (and batches) the model predicts it sends, with the same
  predicted times.
- `update`: "barrier" (every message done, then the whole update, then the next forward: the
  paper's iteration) or "per-layer" (layer l's parameters are updated as soon as every message
  holding its gradient is done, right before its forward: the next forward waits per layer,
  and communication still under way overlaps it).

What a schedule predicts (its steady-state iteration) is timeline.py's: one predictor for
every plan, the merge planner's the barrier case of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import PlanError
from .profile import Profile

__all__ = ["KINDS", "OPS", "POLICIES", "UPDATES", "Message", "Schedule", "barrier_schedule",
           "edf_order", "message_layers", "messages", "part_bounds", "part_layers"]

OPS = ("allreduce", "rs-ag")
POLICIES = ("sequence", "priority")
UPDATES = ("barrier", "per-layer")
KINDS = ("ar", "rs", "ag")


def part_bounds(elements: int, parts: int) -> list[tuple[int, ...]]:
    """The [start, stop) element ranges of a group of `elements` cut into `parts` pieces as
    equal as whole elements allow (piece p starts at floor(p * elements / parts); none is
    empty while parts <= elements); the executor cuts its buffer by the same rule."""
    if parts <= 1 or elements <= 0:
        return [(0, max(0, elements))]
    cuts = [p * elements // parts for p in range(parts + 1)]
    return list(zip(cuts, cuts[1:]))


def _part_of(offset: int, elements: int, parts: int) -> int:
    """The part of `part_bounds(elements, parts)` that holds element `offset` (the last part
    for an offset at the very end)."""
    if parts <= 1 or elements <= 0:
        return 0
    return min(parts - 1, ((offset + 1) * parts - 1) // elements)


@dataclass(frozen=True)
class Schedule:
    """What a plan decides beyond its groups (module docstring). `bound`: the lower bound on
    the iteration the optimiser computed (informational, not part of the digest)."""

    parts: tuple[int, ...]
    ops: tuple[str, ...]
    order: tuple[tuple[int, int, str], ...]
    policy: str = "sequence"
    credit: int = 0
    update: str = "barrier"
    bound: float | None = None
    dtype_bytes: int = 4  # the element size the parts were cut by
    batches: tuple[int, ...] = ()  # "sequence": runs of the order sent as one collective

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(int(p) for p in self.parts))
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "order", tuple((int(g), int(p), str(k))
                                                for g, p, k in self.order))
        object.__setattr__(self, "batches", tuple(int(b) for b in self.batches))

    def runs(self) -> list[tuple[int, int]]:
        """The sequence's collectives as [start, stop) positions of the order."""
        sizes = self.batches or (1,) * len(self.order)
        out, i = [], 0
        for b in sizes:
            out.append((i, i + b))
            i += b
        return out

    @property
    def num_messages(self) -> int:
        return len(self.order)

    @property
    def whole_groups_in_order(self) -> bool:
        """Whether this is the merge planner's schedule (`barrier_schedule`): each group
        whole, all-reduced one after another in order, one update after the last: the
        paper's iteration."""
        return (self.update == "barrier" and self.policy == "sequence"
                and all(p == 1 for p in self.parts)
                and all(op == "allreduce" for op in self.ops)
                and all(b == 1 for b in self.batches)
                and self.order == tuple((g, 0, "ar") for g in range(len(self.parts))))

    def check(self, group_elements: list[int], source: str = "schedule") -> None:
        """Every field valid for groups of these sizes (elements), and `order` naming each
        message the parts and ops call for exactly once, each "rs" before its "ag"; a
        PlanError naming the field otherwise."""
        G = len(group_elements)
        if len(self.parts) != G or len(self.ops) != G:
            raise PlanError(f"{source}: parts and ops: need one entry per group ({G}), got "
                            f"{len(self.parts)} and {len(self.ops)}")
        for g, (k, n) in enumerate(zip(self.parts, group_elements)):
            if k < 1 or k > max(1, n):
                raise PlanError(f"{source}: parts[{g}]: must be 1..{max(1, n)} (the group's "
                                f"elements), got {k}")
        for g, op in enumerate(self.ops):
            if op not in OPS:
                raise PlanError(f"{source}: ops[{g}]: expected one of {', '.join(OPS)}, got "
                                f"{op!r}")
        if self.policy not in POLICIES:
            raise PlanError(f"{source}: policy: expected one of {', '.join(POLICIES)}, got "
                            f"{self.policy!r}")
        if self.update not in UPDATES:
            raise PlanError(f"{source}: update: expected one of {', '.join(UPDATES)}, got "
                            f"{self.update!r}")
        if self.dtype_bytes < 1:
            raise PlanError(f"{source}: dtype_bytes: must be >= 1, got {self.dtype_bytes}")
        if self.credit < 0:
            raise PlanError(f"{source}: credit: must be >= 0 bytes, got {self.credit}")
        if self.batches:
            if self.policy != "sequence" or any(b < 1 for b in self.batches) or \
                    sum(self.batches) != len(self.order):
                raise PlanError(f"{source}: batches: with policy sequence, sizes >= 1 that "
                                f"add up to the {len(self.order)} messages of the order")
            for s, e in self.runs():
                if e - s > 1 and any(k != "ar" for _, _, k in self.order[s:e]):
                    raise PlanError(f"{source}: batches: only all-reduce parts go together "
                                    f"(order[{s}:{e}])")
        want = {(g, p, k) for g in range(G) for p in range(self.parts[g])
                for k in (("ar",) if self.ops[g] == "allreduce" else ("rs", "ag"))}
        seen: set[tuple[int, int, str]] = set()
        for i, msg in enumerate(self.order):
            if msg not in want:
                raise PlanError(f"{source}: order[{i}]: {list(msg)} is not a message of this "
                                f"plan (group, part, kind)")
            if msg in seen:
                raise PlanError(f"{source}: order[{i}]: {list(msg)} appears twice")
            if msg[2] == "ag" and (msg[0], msg[1], "rs") not in seen:
                raise PlanError(f"{source}: order[{i}]: the all-gather of group {msg[0]} part "
                                f"{msg[1]} comes before its reduce-scatter")
            seen.add(msg)
        if len(seen) != len(want):
            g, p, k = min(want - seen)
            raise PlanError(f"{source}: order: message [{g}, {p}, {k!r}] is missing "
                            f"({len(want) - len(seen)} missing)")

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"parts": list(self.parts), "ops": list(self.ops),
                             "order": [list(m) for m in self.order], "policy": self.policy,
                             "credit": self.credit, "update": self.update,
                             "dtype_bytes": self.dtype_bytes}
        if self.batches and any(b > 1 for b in self.batches):
            d["batches"] = list(self.batches)
        if self.bound is not None:
            d["bound"] = self.bound
        return d

    def canon(self) -> dict:
        """What ranks must agree on (the digest's part of it): everything but `bound`."""
        d = self.to_dict()
        d.pop("bound", None)
        return d

    @classmethod
    def from_dict(cls, d: Any, source: str = "schedule") -> Schedule:
        if not isinstance(d, dict):
            raise PlanError(f"{source}: must be a JSON object")
        try:
            order = [tuple(m) for m in d.get("order", [])]
            if any(len(m) != 3 for m in order):
                raise ValueError
            bound = d.get("bound")
            return cls(tuple(d["parts"]), tuple(d["ops"]), tuple(order),
                       d.get("policy", "sequence"), int(d.get("credit", 0)),
                       d.get("update", "barrier"), None if bound is None else float(bound),
                       int(d.get("dtype_bytes", 4)), tuple(d.get("batches", ())))
        except KeyError as exc:
            raise PlanError(f"{source}: {exc.args[0]}: missing") from None
        except (TypeError, ValueError):
            raise PlanError(f"{source}: parts, ops and order must be lists (order of "
                            f"[group, part, kind])") from None


def barrier_schedule(num_groups: int, dtype_bytes: int = 4) -> Schedule:
    """The merge planner's schedule: each group whole, all-reduced in order, one update after
    the last."""
    return Schedule((1,) * num_groups, ("allreduce",) * num_groups,
                    tuple((g, 0, "ar") for g in range(num_groups)), dtype_bytes=dtype_bytes)


def edf_order(group_layers: list[list[int]], parts: list[int], ops: list[str]
              ) -> tuple[tuple[int, int, str], ...]:
    """Earliest due first: messages sorted by the input-most layer they hold (its forward
    needs it first), input-side pieces of a group first; a reduce-scatter before the
    all-gathers. `group_layers`: 1-based layer indices per group, backward order."""
    keyed = []
    for g, layers in enumerate(group_layers):
        lo = min(layers)
        for p in range(parts[g]):
            kinds = ("ar",) if ops[g] == "allreduce" else ("rs", "ag")
            for k in kinds:
                keyed.append(((k == "ag", lo, -p, g), (g, p, k)))
    keyed.sort()
    return tuple(m for _, m in keyed)


# ----------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class Message:
    """One message of a schedule, as the predictor sees it: its bytes, the input-most layer
    it holds (it is ready when that layer's gradient is), the layers it holds, its kind
    ("ar", "rs" or "ag"), for an "ag" the position of its "rs" in the order (else -1), its
    group and that group's bytes."""

    nbytes: int
    layer: int  # input-most layer it holds: the message is ready when that one is
    layers: tuple[int, ...]
    kind: str
    after: int  # for "ag": the position of its "rs" in the order; else -1
    group: int = 0
    whole: int = 0  # its group's bytes: a part costs at least its share (`part_time`)


def part_layers(sizes: list[int], parts: int) -> list[tuple[int, ...]]:
    """For one group whose layers (in backward order) hold `sizes` elements: per part, the
    positions (into `sizes`) of the layers it holds. A layer without parameters goes with the
    part where its place in the buffer falls (the last part at the very end)."""
    n = sum(sizes)
    k = len(part_bounds(n, parts))
    out: list[list[int]] = [[] for _ in range(k)]
    offset = 0
    for i, size in enumerate(sizes):
        first = _part_of(offset, n, k)
        last = _part_of(offset + size - 1, n, k) if size else first
        for p in range(first, last + 1):
            out[p].append(i)
        offset += size
    return [tuple(x) for x in out]


def message_layers(group_layers: list[list[int]], layer_elements: dict[int, int],
                   parts: list[int]) -> list[list[tuple[int, ...]]]:
    """Per group and part, the layers (1-based) whose elements the part holds
    (`part_layers`)."""
    out = []
    for g, layers in enumerate(group_layers):
        spans = part_layers([layer_elements[l] for l in layers], parts[g])
        out.append([tuple(layers[i] for i in span) for span in spans])
    return out


def messages(profile: Profile, group_layers: list[list[int]], schedule: Schedule
             ) -> list[Message]:
    """The schedule's messages in its order (`Message`), for groups `group_layers` (1-based
    layers, each group in backward order)."""
    elements = {i + 1: layer.params for i, layer in enumerate(profile.layers)}
    spans = message_layers(group_layers, elements, list(schedule.parts))
    bounds = [part_bounds(sum(elements[l] for l in layers), schedule.parts[g])
              for g, layers in enumerate(group_layers)]
    position = {m: i for i, m in enumerate(schedule.order)}
    msgs = []
    for g, p, k in schedule.order:
        s, e = bounds[g][p]
        layers = spans[g][p] or (min(group_layers[g]),)
        msgs.append(Message((e - s) * profile.dtype_bytes, min(layers), layers, k,
                         position[(g, p, "rs")] if k == "ag" else -1, g,
                         bounds[g][-1][-1] * profile.dtype_bytes))
    return msgs

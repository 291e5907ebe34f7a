"""Schedules that also overlap the next forward pass, and the steady state they predict.

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

`cycle(profile, cost, groups, schedule)` predicts one steady-state iteration. Every message of
an iteration is done before the next backward starts (each layer's forward waits for its
messages, and every layer runs forward before backward), so each backward starts with the
channel idle and the iteration repeats: its time is from one backward start to the next, the
same as from one forward start to the next. The compute thread runs backward L..1, then the
next forward: the part before learnable layer 1 (it needs no parameters), then for l = 1..L
the wait for layer l (per-layer) or for everything (barrier), its update and its forward
(`Profile.forward_segments`, `LayerProfile.update_time`). Under interference (docs/planner.md)
the compute thread, forward and updates as well as backward, runs at 1/(1 + rho(M)) while a
message of M bytes is in flight, and a message progresses at 1/sigma(M) while the compute
thread runs (not while it waits); for parts, M is their group's bytes (parts sent back to
back load the machine as the whole message does). With a barrier and no update time this is
exactly the merge planner's timeline.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Any

from ...errors import PlanError
from .cost import CostModel
from .profile import Profile

__all__ = ["KINDS", "OPS", "POLICIES", "UPDATES", "Cycle", "Schedule", "barrier_schedule",
           "cycle", "edf_order", "freeze", "message_layers", "part_bounds", "part_layers"]

OPS = ("allreduce", "rs-ag")
POLICIES = ("sequence", "priority")
UPDATES = ("barrier", "per-layer")
KINDS = ("ar", "rs", "ag")
_HALF = {"ar": 1.0, "rs": 0.5, "ag": 0.5}  # a reduce-scatter and an all-gather: T(M)/2 each


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
class _Msg:
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


def _messages(profile: Profile, group_layers: list[list[int]], schedule: Schedule
              ) -> list[_Msg]:
    elements = {i + 1: layer.params for i, layer in enumerate(profile.layers)}
    spans = message_layers(group_layers, elements, list(schedule.parts))
    bounds = [part_bounds(sum(elements[l] for l in layers), schedule.parts[g])
              for g, layers in enumerate(group_layers)]
    position = {m: i for i, m in enumerate(schedule.order)}
    msgs = []
    for g, p, k in schedule.order:
        s, e = bounds[g][p]
        layers = spans[g][p] or (min(group_layers[g]),)
        msgs.append(_Msg((e - s) * profile.dtype_bytes, min(layers), layers, k,
                         position[(g, p, "rs")] if k == "ag" else -1, g,
                         bounds[g][-1][-1] * profile.dtype_bytes))
    return msgs


def _batch_time(cost: CostModel, msgs: list[_Msg], batch) -> float:
    """Channel seconds of one collective over the messages `batch` (indices): T of their
    bytes, as parts of their groups (`CostModel.part_time`), halved for "rs"/"ag"."""
    nbytes = sum(msgs[i].nbytes for i in batch)
    part_time = getattr(cost, "part_time", None)
    t = part_time(nbytes, _group_bytes(msgs, batch)) if part_time is not None else \
        cost.time(nbytes)
    return t * _HALF[msgs[batch[0]].kind]


def _group_bytes(msgs: list[_Msg], batch) -> int:
    """The bytes of the groups the messages `batch` (indices) are parts of, each group once."""
    return sum({msgs[i].group: msgs[i].whole for i in batch}.values())


def _interfering_bytes(msgs: list[_Msg], batch) -> int:
    """The size rho and sigma are read at for one collective: its bytes, or, for parts,
    their groups' bytes. rho(M) and sigma(M) are measured on whole messages, and what they
    measure (the bytes per second the network stack moves beside backward) does not drop
    when a group is cut into parts sent back to back: reading them at a part's size let
    the search cut 100 MB into 1,581 parts of 64 KB to get the small-message rho (0.74
    against 4.6-6.4 at 1-16 MB), predicting 1,625 ms for what then measured 2,320."""
    return max(sum(msgs[i].nbytes for i in batch), _group_bytes(msgs, batch))


# ----------------------------------------------------------------------------- the cycle
@dataclass(frozen=True)
class Cycle:
    """One steady-state iteration. Times are seconds from the start of its forward pass (the
    previous iteration's messages still under way then are the same as this one's, one
    `iteration_time` earlier). Per layer, input side first: backward_start/_end (this
    iteration's), forward_start/_end (the next iteration's, each after its wait and update;
    iteration_time later than this iteration's), update_start/_end. Per message, in the
    schedule's order: comm_start, comm_end. `next_forward_start`: when the next iteration's
    forward starts (= iteration_time)."""

    iteration_time: float
    backward_start: tuple[float, ...]
    backward_end: tuple[float, ...]
    forward_start: tuple[float, ...]
    forward_end: tuple[float, ...]
    update_start: tuple[float, ...]
    update_end: tuple[float, ...]
    comm_start: tuple[float, ...]
    comm_end: tuple[float, ...]
    message_bytes: tuple[int, ...]
    message_kinds: tuple[str, ...]
    prefix: tuple[float, float]  # the next forward's part before learnable layer 1
    batch_of: tuple[int, ...] = ()  # per message: its collective's place in the send order

    @property
    def next_forward_start(self) -> float:
        return self.iteration_time

    @property
    def hidden_in_forward(self) -> float:
        """Communication time that runs after backward ends, beside the next forward."""
        end = max(self.backward_end)
        return math.fsum(max(0.0, e - max(s, end)) for s, e in zip(self.comm_start,
                                                                    self.comm_end))


def cycle(profile: Profile, cost: CostModel, group_layers: list[list[int]],
          schedule: Schedule) -> Cycle:
    """The steady-state iteration of `schedule` over `group_layers` (per group, its 1-based
    layers in backward order, output-side groups first); see the module docstring."""
    msgs = _messages(profile, group_layers, schedule)
    if getattr(cost, "interferes", False):
        return _Events(profile, cost, msgs, schedule).run()
    return _plain(profile, cost, msgs, schedule)


def freeze(profile: Profile, cost: CostModel, group_layers: list[list[int]],
           schedule: Schedule) -> Schedule:
    """A priority schedule as the sequence (and batches) the model predicts it sends: the
    same predicted times, and the same collectives in the same order on every rank whatever
    each one's timing. A sequence is returned unchanged."""
    if schedule.policy == "sequence":
        return schedule
    c = cycle(profile, cost, group_layers, schedule)
    keyed = sorted(range(len(schedule.order)), key=lambda i: (c.batch_of[i], i))
    order = tuple(schedule.order[i] for i in keyed)
    batches: list[int] = []
    previous = None
    for i in keyed:
        if c.batch_of[i] == previous:
            batches[-1] += 1
        else:
            batches.append(1)
            previous = c.batch_of[i]
    return replace(schedule, order=order, policy="sequence",
                   batches=tuple(batches) if any(b > 1 for b in batches) else ())


def _work(profile: Profile) -> list[float]:
    """W[l]: backward work done when layer l's gradient is ready (l = 1..L; W[L+1] = 0)."""
    L = profile.num_layers
    W = [0.0] * (L + 2)
    for l in range(L, 0, -1):
        W[l] = W[l + 1] + profile.layers[l - 1].backward_time
    return W


def _pick(ready: list, msgs: list[_Msg], credit: int) -> list[int]:
    """The next batch from the heap of ready messages (priority order)."""
    i = heapq.heappop(ready)
    batch, size = [i], msgs[i].nbytes
    if credit and msgs[i].kind == "ar":
        while ready and msgs[ready[0]].kind == "ar" and size + msgs[ready[0]].nbytes <= credit:
            j = heapq.heappop(ready)
            batch.append(j)
            size += msgs[j].nbytes
    return batch


def _plain(profile: Profile, cost: CostModel, msgs: list[_Msg], schedule: Schedule) -> Cycle:
    """The cycle without interference: backward at full speed, messages at T(M) (a part
    at `CostModel.part_time`)."""
    L = profile.num_layers
    W = _work(profile)
    n = len(msgs)
    start, end, batch_of = [0.0] * n, [0.0] * n, [0] * n
    if schedule.policy == "sequence":
        t = 0.0
        for b, (lo, hi) in enumerate(schedule.runs()):
            r = 0.0
            for i in range(lo, hi):
                m = msgs[i]
                ri = end[m.after] if m.kind == "ag" else W[m.layer]
                if ri > r:
                    r = ri
            s = t if t > r else r
            t = s + _batch_time(cost, msgs, range(lo, hi))
            for i in range(lo, hi):
                start[i], end[i], batch_of[i] = s, t, b
    else:
        ag_of = {m.after: i for i, m in enumerate(msgs) if m.kind == "ag"}
        pending = sorted((W[m.layer], i) for i, m in enumerate(msgs) if m.kind != "ag")
        pending.reverse()  # popped from the end: earliest first
        later: list[tuple[float, int]] = []  # all-gathers, ready when their half is done
        ready: list[int] = []
        t, done, b = 0.0, 0, 0
        while done < n:
            while pending and pending[-1][0] <= t:
                heapq.heappush(ready, pending.pop()[1])
            while later and later[0][0] <= t:
                heapq.heappush(ready, heapq.heappop(later)[1])
            if not ready:
                nxt = min(pending[-1][0] if pending else math.inf,
                          later[0][0] if later else math.inf)
                t = nxt
                continue
            batch = _pick(ready, msgs, schedule.credit)
            e = t + _batch_time(cost, msgs, batch)
            for j in batch:
                start[j], end[j], batch_of[j] = t, e, b
                if msgs[j].kind == "rs":
                    heapq.heappush(later, (e, ag_of[j]))
            t = e
            b += 1
            done += len(batch)
    done_at = _layer_done(msgs, end, L)
    backward_end = [W[l] for l in range(1, L + 1)]
    backward_start = [W[l + 1] for l in range(1, L + 1)]
    prefix, f = profile.forward_segments()
    u = [layer.update_time for layer in profile.layers]
    E = W[1]
    fs, fe, us, ue = [0.0] * L, [0.0] * L, [0.0] * L, [0.0] * L
    if schedule.update == "barrier":
        t = max(E, max(end) if end else 0.0)
        for l in range(L):
            us[l] = t
            t += u[l]
            ue[l] = t
        p0 = t
        t += prefix
        for l in range(L):
            fs[l] = t
            t += f[l]
            fe[l] = t
    else:
        p0 = E
        t = E + prefix
        for l in range(L):
            d = done_at[l + 1]
            if d > t:
                t = d
            us[l] = t
            t += u[l]
            ue[l] = t
            fs[l] = t
            t += f[l]
            fe[l] = t
    return _shifted(t, p0, backward_start, backward_end, fs, fe, us, ue, start, end, msgs,
                    prefix, batch_of)


def _layer_done(msgs: list[_Msg], end: list[float], L: int) -> list[float]:
    """done[l]: when every all-reduce or all-gather holding layer l's gradient has ended."""
    done = [0.0] * (L + 1)
    for m, e in zip(msgs, end):
        if m.kind != "rs":
            for l in m.layers:
                if e > done[l]:
                    done[l] = e
    return done


def _shifted(period, p0, bs, be, fs, fe, us, ue, cs, ce, msgs, prefix, batch_of) -> Cycle:
    """Times from backward start -> times from this iteration's forward start, which is one
    period before the next one's (p0)."""
    s = period - p0

    def sh(xs):
        return tuple(x + s for x in xs)

    return Cycle(period, sh(bs), sh(be), sh(fs), sh(fe), sh(us), sh(ue), sh(cs), sh(ce),
                 tuple(m.nbytes for m in msgs), tuple(m.kind for m in msgs),
                 (p0 + s, p0 + s + prefix), tuple(batch_of))


class _Events:
    """The cycle under interference: an event simulation of the compute thread and the
    channel, each progressing at a rate set by what the other is doing (module docstring)."""

    def __init__(self, profile: Profile, cost: CostModel, msgs: list[_Msg], schedule: Schedule):
        self.profile, self.cost, self.msgs, self.schedule = profile, cost, msgs, schedule
        self.L = profile.num_layers

    def _tasks(self) -> list[tuple[str, int, float]]:
        """The compute thread's work in order: (what, layer, seconds at full speed); a "wait"
        task (no work) blocks until layer `layer` (0: every layer) is reduced."""
        p = self.profile
        L = self.L
        tasks = [("backward", l, p.layers[l - 1].backward_time) for l in range(L, 0, -1)]
        prefix, f = p.forward_segments()
        if self.schedule.update == "barrier":
            tasks.append(("wait", 0, 0.0))
            tasks += [("update", l, p.layers[l - 1].update_time) for l in range(1, L + 1)]
            tasks.append(("prefix", 0, prefix))
            tasks += [("forward", l, f[l - 1]) for l in range(1, L + 1)]
        else:
            tasks.append(("prefix", 0, prefix))
            for l in range(1, L + 1):
                tasks += [("wait", l, 0.0), ("update", l, p.layers[l - 1].update_time),
                          ("forward", l, f[l - 1])]
        return tasks

    def run(self) -> Cycle:
        msgs, sched, cost = self.msgs, self.schedule, self.cost
        L, n = self.L, len(msgs)
        tasks = self._tasks()
        holders: dict[int, list[int]] = {}  # layer -> messages whose end it waits for
        for i, m in enumerate(msgs):
            if m.kind != "rs":
                for l in m.layers:
                    holders.setdefault(l, []).append(i)
        by_layer: dict[int, list[int]] = {}  # layer -> messages it makes ready
        for i, m in enumerate(msgs):
            if m.kind != "ag":
                by_layer.setdefault(m.layer, []).append(i)
        ag_of = {m.after: i for i, m in enumerate(msgs) if m.kind == "ag"}
        start, end = [math.nan] * n, [math.nan] * n
        done_msgs = 0
        ready: list[int] = []  # heap (priority) or the sequence's positions made ready
        is_ready = [False] * n
        nxt = 0  # the sequence's next collective
        runs = sched.runs()
        batch_of = [0] * n
        sent = 0  # collectives started
        t = 0.0
        ti, left = 0, tasks[0][2]  # current compute task and its work left
        tstart = {}  # (what, layer) -> start time
        tend = {}
        batch: list[int] = []
        chan_left = 0.0
        slow = sigma = 1.0
        done_layers = [False] * (L + 1)
        reduced = 0  # layers whose every message has ended
        pending = [len(holders.get(l, ())) for l in range(L + 1)]

        def compute_blocked() -> bool:
            what, layer, _ = tasks[ti]
            if what != "wait":
                return False
            return (reduced < L) if layer == 0 else not done_layers[layer]

        while ti < len(tasks) or done_msgs < n:
            # skip finished waits and empty tasks
            while ti < len(tasks) and not compute_blocked() and (
                    tasks[ti][0] == "wait" or left <= 0.0):
                what, layer, _ = tasks[ti]
                tstart.setdefault((what, layer), t)
                tend[(what, layer)] = t
                if what == "backward":
                    for i in by_layer.get(layer, ()):
                        is_ready[i] = True
                        if sched.policy == "priority":
                            heapq.heappush(ready, i)
                ti += 1
                if ti < len(tasks):
                    left = tasks[ti][2]
            if ti == len(tasks) and done_msgs == n:
                break
            if not batch:
                batch = self._next_batch(ready, is_ready, runs[nxt] if nxt < len(runs) else None)
                if batch:
                    if sched.policy == "sequence":
                        nxt += 1
                    for j in batch:
                        batch_of[j] = sent
                    sent += 1
                    flowing = _interfering_bytes(msgs, batch)
                    chan_left = _batch_time(cost, msgs, batch)
                    slow = 1.0 + cost.slowdown(flowing)
                    sigma = cost.sigma(flowing)
                    for j in batch:
                        start[j] = t
            running = ti < len(tasks) and not compute_blocked()
            if running:
                tstart.setdefault((tasks[ti][0], tasks[ti][1]), t)
            rc = (1.0 / slow if batch else 1.0) if running else 0.0
            rm = (1.0 / sigma if running else 1.0) if batch else 0.0
            dt = math.inf
            if rc > 0.0:
                dt = left / rc
            if rm > 0.0:
                dt = min(dt, chan_left / rm)
            if not math.isfinite(dt):
                raise PlanError("schedule: nothing can run (a wait for a message that is "
                                "never sent)")
            t += dt
            if rc > 0.0:
                left = max(0.0, left - dt * rc)
            if rm > 0.0:
                chan_left = max(0.0, chan_left - dt * rm)
                if chan_left <= 1e-15 * max(1.0, t):
                    for j in batch:
                        end[j] = t
                        done_msgs += 1
                        if msgs[j].kind == "rs":
                            is_ready[ag_of[j]] = True
                            if sched.policy == "priority":
                                heapq.heappush(ready, ag_of[j])
                        else:
                            for l in msgs[j].layers:
                                pending[l] -= 1
                                if pending[l] == 0:
                                    done_layers[l] = True
                                    reduced += 1
                    batch = []
                    slow = sigma = 1.0
            if running and left <= 1e-15 * max(1.0, t):
                left = 0.0
        return self._result(t, tasks, tstart, tend, start, end, batch_of)

    def _next_batch(self, ready: list, is_ready: list, run) -> list[int]:
        if self.schedule.policy == "sequence":
            if run is not None and all(is_ready[i] for i in range(*run)):
                return list(range(*run))
            return []
        if not ready:
            return []
        return _pick(ready, self.msgs, self.schedule.credit)

    def _result(self, t, tasks, tstart, tend, start, end, batch_of) -> Cycle:
        L = self.L
        bs = [tstart[("backward", l)] for l in range(1, L + 1)]
        be = [tend[("backward", l)] for l in range(1, L + 1)]
        fs = [tstart[("forward", l)] for l in range(1, L + 1)]
        fe = [tend[("forward", l)] for l in range(1, L + 1)]
        us = [tstart[("update", l)] for l in range(1, L + 1)]
        ue = [tend[("update", l)] for l in range(1, L + 1)]
        p0 = tstart[("prefix", 0)]
        prefix = tend[("prefix", 0)] - tstart[("prefix", 0)]
        return _shifted(t, p0, bs, be, fs, fe, us, ue, start, end, self.msgs, prefix, batch_of)

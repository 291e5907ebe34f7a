"""The one predictor of an iteration: `cycle`, and the Plan it gives a grouping (`timeline`).

Every scheme's prediction comes from `cycle(profile, cost, groups, schedule)`: `plan`,
`simulate`, the trainer's closing line and its re-plan. It predicts one steady-state
iteration, from a forward start to the next. Every message of an iteration is done before
the next backward starts (each layer's forward waits for its messages, and every layer runs
forward before backward), so each backward starts with the channel idle and the iteration
repeats. The compute thread runs backward L..1, then the next forward: the part before
learnable layer 1 (it needs no parameters), then for l = 1..L the wait for layer l (a
per-layer update) or for everything (the barrier), its update and its forward
(`Profile.forward_segments`, `LayerProfile.update_time`).

- **The barrier case** (no schedule, or `barrier_schedule`: each group whole, in order, one
  update after the last) is the paper's recurrences (docs/planner.md, "The model"): backward
  of layer l runs [tau_b(l), ready(l)) with tau_b(L) = t_f; a group starts at max(end of the
  previous message, ready of its input-most layer) and lasts T_ar(its bytes); the gradients
  are reduced when the last message ends, and the next forward starts after the updates
  (none in a profile without update times: then the iteration is t_iter = the last
  message's end, the paper's). Under interference (rho/sigma, docs/planner.md) backward and
  the messages slow each other, one message at a time (`interfered_message`, the same
  arithmetic as the exact search of interference_search.py).
- **A schedule** (parts, order, reduce-scatter/all-gather halves, per-layer updates;
  schedule.py) goes through the same iteration message by message; under interference the
  compute thread, forward and updates as well as backward, runs at 1/(1 + rho(M)) while a
  message of M bytes is in flight, and a message progresses at 1/sigma(M) while the compute
  thread runs (not while it waits); for parts, M is their group's bytes (parts sent back to
  back load the machine as the whole message does). Run on the barrier case, this event
  walk gives the recurrences' times up to rounding (1e-12 relative); the barrier case is
  computed by the recurrences themselves, so that the paper's numbers, and the exact
  search's, hold to the last bit.

Times are seconds from the start of this iteration's forward pass.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

from ...errors import PlanError
from .cost import CostModel
from .plan import Plan, check_groups
from .profile import Profile
from .schedule import Message, Schedule, messages

__all__ = ["Cycle", "cycle", "freeze", "interfered_message", "ready_times", "timeline"]

_HALF = {"ar": 1.0, "rs": 0.5, "ag": 0.5}  # a reduce-scatter and an all-gather: T(M)/2 each


def ready_times(profile: Profile) -> list[float]:
    """ready[l] for l = 1..L (index 0 unused): tau_b(L) = t_f, tau_b(l) = tau_b(l+1) +
    t_b(l+1), ready(l) = tau_b(l) + t_b(l)."""
    L = profile.num_layers
    ready = [0.0] * (L + 1)
    t = profile.forward_time
    for l in range(L, 0, -1):
        t = t + profile.layers[l - 1].backward_time
        ready[l] = t
    return ready


@dataclass(frozen=True)
class Cycle:
    """One steady-state iteration (`cycle`). Times are seconds from the start of its forward
    pass (the
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
    ideal: float  # t_f + t_b + the updates: the iteration with every message hidden
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
          schedule: Schedule | None = None) -> Cycle:
    """The steady-state iteration of `group_layers` (per group, its 1-based layers in
    backward order, output-side groups first) sent as `schedule` says (None: each group
    whole, in order, one update after the last); see the module docstring."""
    if schedule is None or schedule.whole_groups_in_order:
        return _barrier(profile, cost, group_layers)
    msgs = messages(profile, group_layers, schedule)
    if getattr(cost, "interferes", False):
        return _Events(profile, cost, msgs, schedule).run()
    return _plain(profile, cost, msgs, schedule)


def timeline(profile: Profile, cost: CostModel, groups, schedule: Schedule | None = None, *,
             scheme: str = "custom", nodes: int | None = None,
             bucket_bytes: int | None = None, exact: bool = True) -> Plan:
    """The Plan of `groups` (lists of layer names, output side first, each in backward
    order) sent as `schedule` says (None: each group whole, in order, one update after the
    last), with `cycle`'s times. A priority schedule is frozen into the sequence it is
    predicted to send (`freeze`): what ranks run."""
    names = profile.names
    groups = tuple(tuple(g) for g in groups)
    source = "groups" if scheme == "custom" else f"plan {scheme}"
    check_groups(names, groups, source)
    index = {n: i + 1 for i, n in enumerate(names)}
    by_name = {layer.name: profile.layer_bytes(layer) for layer in profile.layers}
    sizes = tuple(sum(by_name[n] for n in g) for g in groups)
    layers = [[index[n] for n in g] for g in groups]
    if schedule is not None:
        schedule.check([size // schedule.dtype_bytes for size in sizes],
                       "schedule" if scheme == "custom" else f"plan {scheme}: schedule")
        schedule = freeze(profile, cost, layers, schedule)
    c = cycle(profile, cost, layers, schedule)
    return Plan(
        scheme=scheme, model=profile.model, layers=tuple(names),
        layer_bytes=tuple(by_name[n] for n in names), groups=groups, group_sizes=sizes,
        forward_time=profile.forward_time, backward_start=c.backward_start,
        backward_end=c.backward_end, comm_start=c.comm_start, comm_end=c.comm_end,
        iteration_time=c.iteration_time, ideal=c.ideal, a=cost.a, b=cost.b,
        nodes=nodes if nodes is not None else getattr(cost, "nodes", None),
        bucket_bytes=bucket_bytes, interference=tuple(getattr(cost, "interference", ())),
        comm_slowdown=tuple(getattr(cost, "comm_slowdown", ())),
        times=tuple(getattr(cost, "times", ())), exact=exact, schedule=schedule,
        **wire_choice(cost, sizes))


def wire_choice(cost: CostModel, sizes) -> dict:
    """The Plan's wire fields: each group's format, the cheapest for its bytes (the same
    minimum T(M) the grouping and the times were priced with), and the offer behind it."""
    wires = tuple(getattr(cost, "wires", ()))
    if not wires:
        return {}
    formats = tuple(cost.wire_for(size) for size in sizes)
    return {"formats": formats if any(f != "float32" for f in formats) else (),
            "wires": wires, "cast": tuple(getattr(cost, "cast", ()))}


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


# ----------------------------------------------------------------------------- the barrier
def _barrier(profile: Profile, cost: CostModel, group_layers: list[list[int]]) -> Cycle:
    """The paper's iteration (module docstring): its recurrences exactly, or under rho/sigma
    `_interfered`; then the updates and the next forward."""
    prefix, f = profile.forward_segments()
    if all(layer.forward_time is not None for layer in profile.layers) and \
            math.fsum(f) > profile.forward_time:  # the layers' own forwards take longer
        profile = replace(profile, forward_time=math.fsum(f))
    L = profile.num_layers
    ready = ready_times(profile)
    sizes = [sum(profile.layer_bytes(profile.layers[l - 1]) for l in g) for g in group_layers]
    if getattr(cost, "interferes", False):
        cstart, cend, slowed = _interfered(profile, cost, group_layers, sizes)
    else:
        slowed, cstart, cend = ready, [], []
        free = 0.0  # F(L+1): the channel is free from the start
        for g, size in zip(group_layers, sizes):
            start = max(free, ready[g[-1]])
            free = start + cost.time(size)
            cstart.append(start)
            cend.append(free)
    # tau_b(l) = ready(l+1) (tau_b(L) = t_f), exactly as the recurrence adds them
    bstart = tuple([slowed[l + 1] for l in range(1, L)] + [profile.forward_time])
    t = cend[-1] if cend else profile.forward_time
    us, ue = [0.0] * L, [0.0] * L
    for l in range(L):  # the barrier: every message done, then every update
        us[l] = t
        t += profile.layers[l].update_time
        ue[l] = t
    period = t
    t += prefix
    fs, fe = [0.0] * L, [0.0] * L
    for l in range(L):
        fs[l] = t
        t += f[l]
        fe[l] = t
    update = math.fsum(layer.update_time for layer in profile.layers)
    return Cycle(period, bstart, tuple(slowed[1:]), tuple(fs), tuple(fe), tuple(us),
                 tuple(ue), tuple(cstart), tuple(cend), tuple(sizes),
                 ("ar",) * len(sizes), (period, period + prefix),
                 ready[1] + update if L else profile.forward_time + update,
                 tuple(range(len(sizes))))


def interfered_message(ws: float, T: float, slow: float, sigma: float, total: float
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


def _interfered(profile: Profile, cost: CostModel, group_layers: list[list[int]],
                sizes: list[int]) -> tuple[list[float], list[float], list[float]]:
    """The barrier case under the extended model (docs/planner.md): backward runs at
    1/(1 + rho(M)) of its speed while a message of M bytes is in flight, a message at
    1/sigma(M) of its speed while backward runs. Messages go one at a time, so the state
    after each is (F, w): the time the channel is free and the backward work done by then;
    each message's end follows from `interfered_message`, each layer's ready time from an
    event walk of backward's speed through the messages' intervals. Returns (comm starts,
    comm ends, ready[0..L])."""
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

    done = _work(profile)  # done[l]: work at which layer l's gradient is ready
    total = done[1]
    cstart, cend = [], []
    F, w = profile.forward_time, 0.0  # the state before the first message
    for group, size in zip(group_layers, sizes):
        for l in group:
            ready[l] = advance(done[l])
        need = done[group[-1]]
        s, ws = (F, w) if w >= need else (F + need - w, need)
        slow = 1.0 + cost.slowdown(size)
        d, w = interfered_message(ws, cost.time(size), slow, cost.sigma(size), total)
        F = s + d
        busy.append((s, F, 1.0 / slow))
        cstart.append(s)
        cend.append(F)
    return cstart, cend, ready


# ----------------------------------------------------------------------------- schedules
def _batch_time(cost: CostModel, msgs: list[Message], batch) -> float:
    """Channel seconds of one collective over the messages `batch` (indices): T of their
    bytes, as parts of their groups (`CostModel.part_time`), halved for "rs"/"ag"."""
    nbytes = sum(msgs[i].nbytes for i in batch)
    part_time = getattr(cost, "part_time", None)
    t = part_time(nbytes, _group_bytes(msgs, batch)) if part_time is not None else \
        cost.time(nbytes)
    return t * _HALF[msgs[batch[0]].kind]


def _group_bytes(msgs: list[Message], batch) -> int:
    """The bytes of the groups the messages `batch` (indices) are parts of, each group once."""
    return sum({msgs[i].group: msgs[i].whole for i in batch}.values())


def _interfering_bytes(msgs: list[Message], batch) -> int:
    """The size rho and sigma are read at for one collective: its bytes, or, for parts,
    their groups' bytes. rho(M) and sigma(M) are measured on whole messages, and what they
    measure (the bytes per second the network stack moves beside backward) does not drop
    when a group is cut into parts sent back to back: reading them at a part's size let
    the search cut 100 MB into 1,581 parts of 64 KB to get the small-message rho (0.74
    against 4.6-6.4 at 1-16 MB), predicting 1,625 ms for what then measured 2,320."""
    return max(sum(msgs[i].nbytes for i in batch), _group_bytes(msgs, batch))


def _work(profile: Profile) -> list[float]:
    """W[l]: backward work done when layer l's gradient is ready (l = 1..L; W[L+1] = 0)."""
    L = profile.num_layers
    W = [0.0] * (L + 2)
    for l in range(L, 0, -1):
        W[l] = W[l + 1] + profile.layers[l - 1].backward_time
    return W


def _pick(ready: list, msgs: list[Message], credit: int) -> list[int]:
    """The next batch from the heap of ready messages (priority order)."""
    i = heapq.heappop(ready)
    batch, size = [i], msgs[i].nbytes
    if credit and msgs[i].kind == "ar":
        while ready and msgs[ready[0]].kind == "ar" and size + msgs[ready[0]].nbytes <= credit:
            j = heapq.heappop(ready)
            batch.append(j)
            size += msgs[j].nbytes
    return batch


def _plain(profile: Profile, cost: CostModel, msgs: list[Message], schedule: Schedule) -> Cycle:
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
    return _shifted(profile, t, p0, backward_start, backward_end, fs, fe, us, ue, start, end,
                    msgs, prefix, batch_of)


def _layer_done(msgs: list[Message], end: list[float], L: int) -> list[float]:
    """done[l]: when every all-reduce or all-gather holding layer l's gradient has ended."""
    done = [0.0] * (L + 1)
    for m, e in zip(msgs, end):
        if m.kind != "rs":
            for l in m.layers:
                if e > done[l]:
                    done[l] = e
    return done


def _shifted(profile, period, p0, bs, be, fs, fe, us, ue, cs, ce, msgs, prefix,
             batch_of) -> Cycle:
    """Times from backward start -> times from this iteration's forward start, which is one
    period before the next one's (p0)."""
    s = period - p0

    def sh(xs):
        return tuple(x + s for x in xs)

    return Cycle(period, sh(bs), sh(be), sh(fs), sh(fe), sh(us), sh(ue), sh(cs), sh(ce),
                 tuple(m.nbytes for m in msgs), tuple(m.kind for m in msgs),
                 (p0 + s, p0 + s + prefix), profile.ideal_time + profile.update_time,
                 tuple(batch_of))


class _Events:
    """The cycle under interference: an event simulation of the compute thread and the
    channel, each progressing at a rate set by what the other is doing (module docstring)."""

    def __init__(self, profile: Profile, cost: CostModel, msgs: list[Message], schedule: Schedule):
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
        return _shifted(self.profile, t, p0, bs, be, fs, fe, us, ue, start, end, self.msgs,
                        prefix, batch_of)

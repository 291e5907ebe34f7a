"""The predicted timeline of one iteration: the model's recurrences, which every scheme's
groups go through (docs/planner.md, "The model").

Backward of layer l runs [tau_b(l), ready(l)) with tau_b(L) = t_f; messages go one at a time
in backward order, a group starting at max(end of the previous message, ready of its
input-most layer) and lasting T_ar(its bytes); t_iter = end of the last message (times from
the start of the forward pass). Under interference (rho/sigma) backward and the messages slow
each other (`interfered_message`). A schedule's steady state (parts, order, per-layer
updates) is `schedule.cycle`'s, returned as a Plan by `scheduled_timeline`.
"""

from __future__ import annotations

import math

from .cost import CostModel
from .plan import Plan, check_groups
from .profile import Profile
from .schedule import Schedule, cycle, freeze

__all__ = ["interfered_message", "ready_times", "scheduled_timeline", "timeline"]


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


def timeline(profile: Profile, cost: CostModel, groups, *, scheme: str = "custom",
             nodes: int | None = None, bucket_bytes: int | None = None,
             exact: bool = True) -> Plan:
    """The predicted timeline of one iteration when `groups` (lists of layer names, output side
    first, each in backward order) are all-reduced one after another: the one implementation
    of the model's recurrences (docs/planner.md, "The model") that every scheme uses."""
    names = profile.names
    groups = tuple(tuple(g) for g in groups)
    check_groups(names, groups, "groups" if scheme == "custom" else f"plan {scheme}")
    L = profile.num_layers
    ready = ready_times(profile)
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
    check_groups(names, groups, "groups" if scheme == "custom" else f"plan {scheme}")
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


def _interfered_timeline(profile: Profile, cost: CostModel, groups, index, by_name):
    """The timeline of the extended model (docs/planner.md): backward runs at 1/(1 + rho(M))
    of its speed while a message of M bytes is in flight, a message at 1/sigma(M) of its speed
    while backward runs. Messages go one at a time, so the state after each is (F, w): the
    time the channel is free and the backward work done by then; each message's end follows
    from `interfered_message`, each layer's ready time from an event walk of backward's speed
    through the messages' intervals. Returns (sizes, comm starts, comm ends, ready[0..L])."""
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
        d, w = interfered_message(ws, cost.time(size), slow, cost.sigma(size), total)
        F = s + d
        busy.append((s, F, 1.0 / slow))
        sizes.append(size)
        cstart.append(s)
        cend.append(F)
    return sizes, cstart, cend, ready

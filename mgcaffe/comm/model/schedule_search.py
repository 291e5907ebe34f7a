"""The scheduler that also overlaps the next forward pass: groups, parts and order chosen
together, a lower bound on the steady-state iteration, and other systems' schedules.

Pure functions of a `Profile` and a `CostModel` (only `time(M)`, `slowdown(M)`, `sigma(M)` and
`interferes`); schedules as `schedule.Schedule`, predicted by `timeline.cycle`.

**The lower bound** (`lower_bound`). The compute thread does backward, the update and the
forward one after another: t_iter >= t_b + U + t_f. And for each layer l: the gradients of
layers 1..l are ready no earlier than W(l) (layer l's, backward runs L..1), all of them must be
reduced before layer l's forward (every earlier forward waited for its own), and after that
layer l's update and forward and every later layer's still run: t_iter >= W(l) + S(bytes of
layers 1..l) + sum over m >= l of (u(m) + f(m)), where S(X) is the least channel time that
sends X bytes. When merged messages cost no more than their pieces sent apart (the paper's
Eq. 10, checked on a grid of sizes), S = T; otherwise S(X) = X times the least cost per byte
T(g) / g' over grid sizes g, g' = the next grid size (valid for any non-decreasing T). A
reduce-scatter and all-gather pair costs T too. Interference only slows both threads, so the
bound (computed without it) holds under it as well.

**The optimiser** (`overlap_schedule`). Decisions: which consecutive layers share a group,
how many parts each group is cut into, the send order and the update. Fixed: the update is
per layer, and the order is earliest-due-first among ready messages (`schedule.edf_order`:
the input-most layer first, since the next forward needs it first; never interrupting a
message). That order is proven optimal where messages can be cut anywhere for free
(preemptive earliest-due-date minimises the maximum lateness with release times, Horn 1974;
here the lateness of layer l's last message is measured against its deadline t_iter -
sum_{m >= l} (u(m) + f(m)), and every layer's window [release, deadline] nests inside the
next one's). Groups and parts are searched: from the merge planner's groupings and from
minimum-size merges, each cut into parts of a common maximum size, then a local search (merge
or split neighbouring groups, move a boundary by one layer, change a group's parts) until no
move improves or the search's budget of work (counted in simulated messages, not seconds:
the same inputs always give the same plan) is spent. Every other schedule passed in (the
other systems',
the merge planner's with its barrier) is a candidate too, so the result is never predicted
slower than any of them. The result is exact (proven optimal) when it meets the lower bound;
otherwise its gap to the bound is what the plan reports.

**Other systems' schedules**, in the same format: `bytescheduler_schedule` (every layer its
own group, parts of at most 1M parameters, up to 4M parameters in flight, priority to the
input side, per-layer updates: ByteScheduler's defaults) and `dear_schedule` (groups of at
least 25 MB in backward order; a reduce-scatter of each during backward and its all-gather
before its layers' next forward, in forward order; per-layer updates: DeAR). PyTorch DDP's
25 MB buckets in reverse order with one update after all is the merge planner's `threshold`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .cost import CostModel
from .profile import Profile
from .schedule import Schedule, _part_of, barrier_schedule, edf_order
from .timeline import cycle

__all__ = ["BYTESCHEDULER_CREDIT_PARAMS", "BYTESCHEDULER_PART_PARAMS", "DEAR_GROUP_BYTES",
           "Bound", "Choice", "bucket_runs", "bytescheduler_schedule", "dear_schedule",
           "lower_bound", "overlap_schedule", "runs_layers"]

BYTESCHEDULER_PART_PARAMS = 1 << 20  # ByteScheduler's default partition: 1M parameters
BYTESCHEDULER_CREDIT_PARAMS = 4 << 20  # and its credit: 4M parameters in flight
DEAR_GROUP_BYTES = 25 * 1024 * 1024  # DeAR's default fusion threshold, 25 MB
# The search's work, in simulated messages (each evaluation counts its messages and layers;
# four times that under interference, whose simulation is slower): 1-3 s on a 2-core machine.
SEARCH_BUDGET = 300_000

Runs = list[tuple[int, int]]  # (high, low) 1-based layer runs, output side first


def runs_layers(runs: Runs) -> list[list[int]]:
    """Each run's layers in backward order (high .. low)."""
    return [list(range(hi, lo - 1, -1)) for hi, lo in runs]


def bucket_runs(profile: Profile, nbytes: int) -> Runs:
    """Consecutive layers in backward order, a run closed once it holds >= nbytes (the last
    one may hold less): DDP's and DeAR's buckets."""
    L = profile.num_layers
    runs, hi, acc = [], L, 0
    for l in range(L, 0, -1):
        acc += profile.layer_bytes(profile.layers[l - 1])
        if acc >= nbytes or l == 1:
            runs.append((hi, l))
            hi, acc = l - 1, 0
    return runs


# ----------------------------------------------------------------------------- the bound
@dataclass(frozen=True)
class Bound:
    """A lower bound on the steady-state iteration: `value` seconds; `layer` is the layer
    whose wait binds (0: the compute thread's own work binds); `subadditive`: whether merged
    messages were found to cost no more than their pieces (the bound then uses T itself)."""

    value: float
    layer: int
    subadditive: bool

    def describe(self, names: Sequence[str]) -> str:
        if self.layer == 0:
            return f"{self.value * 1e3:.3f} ms (t_f + t_b + updates)"
        return (f"{self.value * 1e3:.3f} ms (layer {names[self.layer - 1]!r}'s forward waits "
                f"for the gradients of layers 1..{self.layer})")


def _grid(top: float) -> list[float]:
    """Sizes 1, sqrt(2), 2, ... bytes up to twice `top`."""
    out, x = [], 1.0
    while x <= 2 * max(top, 1.0):
        out.append(x)
        x *= math.sqrt(2.0)
    return out


def _send_bound(cost: CostModel, total: int):
    """(S, subadditive): S(X) a lower bound on the channel time that sends X bytes in any
    messages (module docstring)."""
    grid = _grid(total)
    T = [cost.time(x) for x in grid]
    subadditive = all(T[i] + T[j] >= cost.time(grid[i] + grid[j]) * (1 - 1e-12)
                      for i in range(len(grid)) for j in range(i, len(grid))
                      if grid[i] + grid[j] <= 2 * max(total, 1))
    if subadditive:
        return cost.time, True
    rates = [T[i] / grid[i + 1] for i in range(len(grid) - 1)]
    prefix_min = []
    m = math.inf
    for r in rates:
        m = min(m, r)
        prefix_min.append(m)

    def S(X: float) -> float:
        if X <= 0:
            return 0.0
        i = min(len(prefix_min) - 1, max(0, int(math.log(max(X, 1.0), math.sqrt(2.0))) + 1))
        return X * prefix_min[i]

    return S, False


def lower_bound(profile: Profile, cost: CostModel) -> Bound:
    """The larger of t_f + t_b + U and, over layers l, W(l) + S(bytes of 1..l) + the update
    and forward from layer l on (module docstring)."""
    L = profile.num_layers
    prefix, f = profile.forward_segments()
    u = [layer.update_time for layer in profile.layers]
    W = [0.0] * (L + 2)
    for l in range(L, 0, -1):
        W[l] = W[l + 1] + profile.layers[l - 1].backward_time
    Q = [0.0] * (L + 2)
    for l in range(L, 0, -1):
        Q[l] = Q[l + 1] + u[l - 1] + f[l - 1]
    total = sum(profile.layer_bytes(x) for x in profile.layers)
    S, sub = _send_bound(cost, total)
    best, which = W[1] + prefix + Q[1], 0
    cum = 0
    for l in range(1, L + 1):
        cum += profile.layer_bytes(profile.layers[l - 1])
        v = W[l] + S(cum) + Q[l]
        if v > best:
            best, which = v, l
    return Bound(best, which, sub)


# ----------------------------------------------------------------------------- others
def bytescheduler_schedule(profile: Profile, part_params: int = BYTESCHEDULER_PART_PARAMS,
                           credit_params: int = BYTESCHEDULER_CREDIT_PARAMS
                           ) -> tuple[Runs, Schedule]:
    """ByteScheduler's defaults: no merging, each layer cut into parts of at most
    `part_params` parameters, priority to the input side, up to `credit_params` parameters
    in flight, per-layer updates."""
    L = profile.num_layers
    runs = [(l, l) for l in range(L, 0, -1)]
    parts = [max(1, -(-profile.layers[l - 1].params // part_params)) for l, _ in runs]
    ops = ["allreduce"] * L
    order = edf_order(runs_layers(runs), parts, ops)
    return runs, Schedule(parts, ops, order, "priority", credit_params * profile.dtype_bytes,
                          "per-layer", dtype_bytes=profile.dtype_bytes)


def dear_schedule(profile: Profile, group_bytes: int = DEAR_GROUP_BYTES
                  ) -> tuple[Runs, Schedule]:
    """DeAR's defaults: buckets of >= `group_bytes` in backward order, each reduce-scattered
    once ready and all-gathered before its layers' next forward (forward order), per-layer
    updates."""
    runs = bucket_runs(profile, group_bytes)
    G = len(runs)
    order = [(g, 0, "rs") for g in range(G)] + [(g, 0, "ag") for g in range(G - 1, -1, -1)]
    return runs, Schedule((1,) * G, ("rs-ag",) * G, tuple(order), "sequence", 0, "per-layer",
                          dtype_bytes=profile.dtype_bytes)


# ----------------------------------------------------------------------------- the search
class _Fast:
    """The iteration of an all-reduce schedule with earliest-due-first priority, one message
    at a time and per-layer updates, without interference: the same arithmetic as
    `timeline.cycle`, without building its objects (the search calls it thousands of times)."""

    def __init__(self, profile: Profile, cost: CostModel):
        L = self.L = profile.num_layers
        self.p = [0] + [x.params for x in profile.layers]
        self.nb = profile.dtype_bytes
        W = self.W = [0.0] * (L + 2)
        for l in range(L, 0, -1):
            W[l] = W[l + 1] + profile.layers[l - 1].backward_time
        prefix, f = profile.forward_segments()
        self.prefix = prefix
        self.uf = [0.0] + [x.update_time for x in profile.layers]
        self.f = [0.0] + f
        part_time = getattr(cost, "part_time", None)
        self._time = part_time if part_time is not None else (lambda n, whole: cost.time(n))
        self._memo: dict[tuple[int, int], float] = {}

    def time(self, nbytes: int, whole: int) -> float:
        """A message's channel seconds, a part of `whole` bytes (`CostModel.part_time`)."""
        key = (nbytes, whole)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self._time(nbytes, whole)
        return t

    def messages(self, runs: Runs, parts: Sequence[int]) -> list[tuple]:
        """(release, priority, bytes, low layer, high layer, group bytes) per message;
        priority an integer, smaller first: the input-most layer held, then the input-side
        part."""
        p, W = self.p, self.W
        out = []
        span = 1 + max(parts, default=1)
        for (hi, lo), k in zip(runs, parts):
            n = sum(p[lo:hi + 1])
            k = max(1, min(k, n)) if n else 1
            lows = [0] * k
            highs = [0] * k
            offset = 0
            for l in range(hi, lo - 1, -1):
                size = p[l]
                first = _part_of(offset, n, k)
                last = _part_of(offset + size - 1, n, k) if size else first
                for q in range(first, last + 1):
                    if not highs[q]:
                        highs[q] = l
                    lows[q] = l
                offset += size
            cuts = [q * n // k for q in range(k + 1)] if n else [0, 0]
            nb = self.nb
            for q in range(k):
                lo_q = lows[q] or lo
                out.append((W[lo_q], lo_q * span - q, (cuts[q + 1] - cuts[q]) * nb, lo_q,
                            highs[q] or lo_q, n * nb))
        return out

    def period(self, runs: Runs, parts: Sequence[int]) -> float:
        msgs = self.messages(runs, parts)
        msgs.sort()
        L = self.L
        done = [0.0] * (L + 1)
        ready: list = []
        t, i, n = 0.0, 0, len(msgs)
        time = self.time
        push, pop = heapq.heappush, heapq.heappop
        while i < n or ready:
            while i < n and msgs[i][0] <= t:
                push(ready, (msgs[i][1], i))
                i += 1
            if not ready:
                t = msgs[i][0]
                continue
            _, j = pop(ready)
            _, _, nbytes, lo, hi, whole = msgs[j]
            t += time(nbytes, whole)
            for l in range(lo, hi + 1):
                if t > done[l]:
                    done[l] = t
        t = self.W[1] + self.prefix
        uf, f = self.uf, self.f
        for l in range(1, L + 1):
            if done[l] > t:
                t = done[l]
            t += uf[l] + f[l]
        return t


def _parts_for(p: list[int], runs: Runs, max_bytes: int | None, nb: int) -> list[int]:
    """Parts per run so that none holds more than max_bytes (None: 1 each)."""
    if max_bytes is None:
        return [1] * len(runs)
    out = []
    for hi, lo in runs:
        n = sum(p[lo:hi + 1])
        out.append(max(1, min(n, -(-n * nb // max_bytes))) if n else 1)
    return out


def _merge_runs(p: list[int], L: int, min_bytes: int, nb: int) -> Runs:
    """Consecutive layers in backward order, a run closed once it holds >= min_bytes."""
    runs, hi, acc = [], L, 0
    for l in range(L, 0, -1):
        acc += p[l] * nb
        if acc >= min_bytes or l == 1:
            runs.append((hi, l))
            hi, acc = l - 1, 0
    return runs


@dataclass(frozen=True)
class Choice:
    """The optimiser's answer: the groups (runs), the schedule, its predicted iteration, the
    lower bound, whether it is proven optimal, and where it came from (`origin`: "search",
    or the name of the candidate passed in that won)."""

    runs: Runs
    schedule: Schedule
    iteration_time: float
    bound: Bound
    exact: bool
    origin: str

    @property
    def gap(self) -> float:
        """How far above the lower bound, relative (0: proven optimal)."""
        return max(0.0, self.iteration_time / self.bound.value - 1) if self.bound.value else 0.0


def _edf(runs: Runs, parts: Sequence[int], dtype_bytes: int = 4) -> Schedule:
    """All-reduces, earliest due first, one at a time, per-layer updates."""
    ops = ["allreduce"] * len(runs)
    return Schedule(tuple(parts), tuple(ops), edf_order(runs_layers(runs), list(parts), ops),
                    "priority", 0, "per-layer", dtype_bytes=dtype_bytes)


def overlap_schedule(profile: Profile, cost: CostModel, starts: Sequence[Runs] = (),
                     candidates: dict[str, tuple[Runs, Schedule]] | None = None, *,
                     budget: int = SEARCH_BUDGET) -> Choice:
    """Choose groups, parts and order (module docstring). `starts`: groupings to begin the
    search from (the merge planner's); `candidates`: named schedules to beat (the other
    systems', the merge planner's with its barrier). The search stops once it has simulated
    `budget` messages (the first grouping's families are always tried, the candidates
    always compared): a pure function of its inputs."""
    bound = lower_bound(profile, cost)
    interferes = getattr(cost, "interferes", False)
    fast = _Fast(profile, cost)
    L, p, nb = fast.L, fast.p, fast.nb
    spent = [0]
    weight = 4 if interferes else 1

    def exhausted() -> bool:
        return spent[0] >= budget

    def exact_time(runs: Runs, sched: Schedule) -> float:
        return cycle(profile, cost, runs_layers(runs), sched).iteration_time

    if interferes:  # the search ranks by the full model (slower: fewer moves in the budget)
        def period(runs, parts):
            return exact_time(runs, _edf(runs, parts, nb))
    else:
        period = fast.period

    total = sum(p) * nb
    sizes = [None] + [1 << e for e in range(30, 13, -1) if (1 << e) < 2 * total]
    best_t, best = math.inf, None

    def consider(runs: Runs, parts: list[int]) -> bool:
        nonlocal best_t, best
        spent[0] += weight * (L + sum(parts))
        t = period(runs, parts)
        if t < best_t * (1 - 1e-12):
            best_t, best = t, (list(runs), list(parts))
            return True
        return False

    # families: the given groupings and minimum-size merges, each with a common part size
    groupings = [list(r) for r in starts] + [[(l, l) for l in range(L, 0, -1)]]
    for e in range(12, 31, 2):
        m = _merge_runs(p, L, 1 << e, nb)
        if m not in groupings:
            groupings.append(m)
        if len(m) == 1:
            break
    for i, runs in enumerate(groupings):
        for s in sizes:
            if i and exhausted():  # the first grouping is always tried whole
                break
            consider(runs, _parts_for(p, runs, s, nb))
    if best is not None:
        _local_search(consider, lambda: best, p, exhausted)
    runs, parts = best
    sched = _edf(runs, parts, nb)
    chosen_t, origin = exact_time(runs, sched), "search"
    chosen = (runs, sched)
    for name, (c_runs, c_sched) in (candidates or {}).items():
        t = exact_time(c_runs, c_sched)
        if t < chosen_t * (1 - 1e-12):
            chosen_t, chosen, origin = t, (list(c_runs), c_sched), name
    runs, sched = chosen
    exact = chosen_t <= bound.value * (1 + 1e-9)
    sched = replace(sched, bound=bound.value, dtype_bytes=nb)
    return Choice(runs, sched, chosen_t, bound, exact, origin)


def _local_search(consider, current, p, exhausted) -> None:
    """First-improvement moves on (runs, parts) until none improves or the budget is spent."""
    improved = True
    while improved and not exhausted():
        improved = False
        g = 0
        while not exhausted():
            runs, parts = current()
            if g >= len(runs):
                break
            for runs2, parts2 in _moves(runs, parts, g, p):
                if consider(runs2, parts2):
                    improved = True
                    break
                if exhausted():
                    return
            g += 1


def _moves(runs: Runs, parts: list[int], g: int, p: list[int]):
    """Neighbours of (runs, parts) around group g."""
    hi, lo = runs[g]
    k = parts[g]
    n = sum(p[lo:hi + 1])
    for k2 in (k * 2, k + 1, k - 1, k // 2):
        if 1 <= k2 <= max(1, n) and k2 != k:
            yield runs, parts[:g] + [k2] + parts[g + 1:]
    if g + 1 < len(runs):  # merge with the next (input-side) group
        hi2, lo2 = runs[g + 1]
        yield (runs[:g] + [(hi, lo2)] + runs[g + 2:],
               parts[:g] + [max(1, parts[g] + parts[g + 1] - 1)] + parts[g + 2:])
        yield (runs[:g] + [(hi, lo2)] + runs[g + 2:],
               parts[:g] + [parts[g] + parts[g + 1]] + parts[g + 2:])
        # move the boundary by one layer either way
        if lo < hi:
            yield runs[:g] + [(hi, lo + 1), (lo, lo2)] + runs[g + 2:], parts
        if lo2 < hi2:
            yield runs[:g] + [(hi, hi2), (hi2 - 1, lo2)] + runs[g + 2:], parts
    if hi > lo:  # split in two at the layer nearest half the bytes
        acc, cut = 0, hi
        for l in range(hi, lo, -1):
            acc += p[l]
            cut = l
            if 2 * acc >= n:
                break
        k1 = max(1, k // 2)
        yield (runs[:g] + [(hi, cut), (cut - 1, lo)] + runs[g + 1:],
               parts[:g] + [k1, max(1, k - k1)] + parts[g + 1:])


def barrier_candidates(profile: Profile, groupings: dict[str, Runs]
                       ) -> dict[str, tuple[Runs, Schedule]]:
    """The merge planner's groupings as schedules: in order, one update after all."""
    return {name: (runs, barrier_schedule(len(runs), profile.dtype_bytes))
            for name, runs in groupings.items()}

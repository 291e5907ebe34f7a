"""`mgwfbp` under the extended model (rho/sigma: backward and the messages slow each other):
the exact search over groupings of consecutive layers, by fronts of non-dominated states.

docs/planner.md ("Interference") states the model and proves the dominance rules. The fronts
are expanded as numpy arrays (`_Expansion`) with the same floating-point operations as the
timeline's scalar recurrences (timeline.interfered_message), so the plan equals what the
scalar programme would choose. Past FRONT_BUDGET transitions fronts are cut, and the plan
says it is not proven optimal; `grouping_lower_bound` is what its gap is measured against.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .cost import CostModel
from .mgwfbp import algorithm1_runs, groups_from_runs, optimal_runs, wfbp_runs
from .profile import Profile
from .timeline import timeline

__all__ = ["FRONT_BUDGET", "grouping_lower_bound", "optimal_extended_runs"]


def _optimal_interfered_runs(profile: Profile, cost: CostModel, *, strict: bool = True,
                             upper: float = math.inf, budget: int | None = None,
                             terms: dict | None = None
                             ) -> tuple[list[tuple[int, int]], bool]:
    """Exact optimum over groupings of consecutive layers under the extended model.

    Messages go in backward order, so after the groups holding layers L..k+1 the future
    depends only on the state (F, w): the time F the channel becomes free and the backward
    work w done by then (backward runs at full speed while the channel is idle). The next
    group j..k starts at s = F if w >= W(j) (the work after which layer j is ready), else at
    s = F + W(j) - w, with ws = max(w, W(j)) done; `interfered_message` gives its duration and
    the work at its end. Dominance (docs/planner.md proves both):

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
    once, with the same floating-point operations in the same order as `interfered_message` and
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
    element goes through the operations of `interfered_message` and `_lower` in their order (IEEE
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
            # `interfered_message`, elementwise
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


def optimal_extended_runs(profile: Profile, cost: CostModel
                           ) -> tuple[list[tuple[int, int]], bool]:
    """`mgwfbp` under the extended model: (runs, proven optimal). The state programme
    (strict dominance when some sigma > 1, else the idling one), bounded by the best of a few
    groupings so that only states that could still beat it are kept; past FRONT_BUDGET
    transitions fronts are cut (then not proven, and never worse than the best of those
    groupings)."""
    L = profile.num_layers
    strict = any(sigma > 1 for _, sigma in cost.comm_slowdown)
    candidates = [wfbp_runs(L), [(L, 1)], algorithm1_runs(profile, cost),
                  optimal_runs(profile, cost)]

    def time_of(runs):
        return timeline(profile, cost, groups_from_runs(profile, runs)).iteration_time

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

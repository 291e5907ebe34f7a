"""MG-WFBP's merge: the paper's Algorithm 1, the exact optimum, and the groupings they are
compared with, as (high, low) runs of consecutive 1-based learnable layers, output side first.

Pure functions of a `Profile` (per-layer sizes and backward times) and a `CostModel` (T_ar(M):
the paper's a + b*M, or a measured curve); docs/planner.md states the model.

- `wfbp_runs`: every layer its own message (wait-free backpropagation).
- `optimal_runs` (`mgwfbp`, the default): the best grouping of consecutive layers under the
  paper's cost model, by the exact dynamic programme: F(L+1) = 0, F(j) = min_{k>=j}
  max(F(k+1), ready(j)) + T_ar(bytes j..k), t_iter = F(1); O(L^2) in the worst case. Under
  the extended model (rho/sigma) the search is interference_search.py's.
- `algorithm1_runs` (`mgwfbp-paper`): the paper's Algorithm 1 (INFOCOM 2019) exactly: walk
  l = L..2 and make l a merged-gradient layer (sent with l-1) iff ready(l-1) < tau_c(l) + a
  (Theorem 1), recomputing the communication start times after each merge; O(L^2). Greedy,
  so not always optimal. With a measured T_ar, `a` is the start-up of the line fitted to the
  same points.
- `threshold_runs`: buckets of at least B bytes filled in backward order (PyTorch DDP's 25 MB
  buckets, Horovod's fusion buffer); the last bucket may be smaller.
"""

from __future__ import annotations

import math

from .cost import CostModel
from .profile import Profile
from .timeline import ready_times

__all__ = ["algorithm1_runs", "groups_from_runs", "optimal_runs", "threshold_runs",
           "wfbp_runs"]


def groups_from_runs(profile: Profile, runs: list[tuple[int, int]]) -> list[list[str]]:
    """(high, low) 1-based layer runs, output side first -> lists of names in backward order."""
    names = profile.names
    return [[names[l - 1] for l in range(hi, lo - 1, -1)] for hi, lo in runs]


def wfbp_runs(L: int) -> list[tuple[int, int]]:
    return [(l, l) for l in range(L, 0, -1)]


def algorithm1_runs(profile: Profile, cost: CostModel) -> list[tuple[int, int]]:
    """Algorithm 1 of the paper, as docs/planner.md ("The model") states it. Its rule keeps
    the paper's form with the model's `a`: for a measured T_ar that is the start-up of the
    line fitted to the same points (the paper's a); t_c and the start times use T_ar itself."""
    L = profile.num_layers
    nb = profile.dtype_bytes
    a = cost.a
    ready = ready_times(profile)
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


def optimal_runs(profile: Profile, cost: CostModel) -> list[tuple[int, int]]:
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
    ready = ready_times(profile)
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



def threshold_runs(profile: Profile, bucket_bytes: int) -> list[tuple[int, int]]:
    L = profile.num_layers
    runs, hi, acc = [], L, 0
    for l in range(L, 0, -1):
        acc += profile.layer_bytes(profile.layers[l - 1])
        if acc >= bucket_bytes or l == 1:
            runs.append((hi, l))
            hi, acc = l - 1, 0
    return runs

"""Communication for distributed synchronous SGD with merged gradients (MG-WFBP).

profile.py (per-layer sizes and backward times), cost.py (all-reduce cost T_ar(M) = a + b*M),
planner.py (which consecutive layers share one all-reduce: WFBP, SyncEASGD, the paper's
Algorithm 1, the exact optimum, fixed-size buckets) and simulate.py (weak-scaling predictions)
are pure and need no engine; the executor and communicators build on their `Plan`.
"""

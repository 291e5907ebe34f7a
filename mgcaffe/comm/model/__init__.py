"""The pure model of communication: what an iteration costs and which messages to send.

profile.py (per-layer sizes and compute times), cost.py and cost_fit.py (the all-reduce cost
T(M), rho and sigma), mgwfbp.py (MG-WFBP's merge: the paper's Algorithm 1 and the exact
optimum), interference_search.py (the merge under rho/sigma), schedule.py and
schedule_search.py (schedules that also overlap the next forward pass), timeline.py (the one
predictor of an iteration, every scheme's: the paper's recurrences are its barrier case),
schemes.py (every `--comm` scheme; `make_plan`), plan.py (the Plan and its file),
simulate.py (weak-scaling predictions) and plots.py. Nothing here runs: no MPI, no threads,
no engine.
"""

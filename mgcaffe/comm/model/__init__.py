"""The pure model of communication: what an iteration costs and which messages to send.

profile.py (per-layer sizes and compute times), cost.py (the all-reduce cost T(M), rho and
sigma), planner.py (which consecutive layers share a message), simulate.py (weak-scaling
predictions) and plots.py. Nothing here runs: no MPI, no threads, no engine.
"""

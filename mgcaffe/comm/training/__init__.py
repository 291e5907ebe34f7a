"""Distributed training: the trainer that wires a solver to a communicator and a plan.

world.py (the process as a rank: MPI's start-up, its GPU, failing together), trainer.py (the
solver's gradient_sync and iteration hook: agreements, the executor, the closing summary),
gradient_comm.py (which communicator carries the gradients), cost_source.py (the run's T(M):
a file, an emulation, or benchmark.py and interference.py at start-up), replanner.py (the
plan's phases: start-up profile, warm-up, re-plan window with insitu.py, fixed),
startup.py, agreement.py, options.py (flags over comm_param), faults.py and liveness.py
(every rank ends together).
"""

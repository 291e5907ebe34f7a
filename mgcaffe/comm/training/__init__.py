"""Distributed training: the trainer that wires a solver to a communicator and a plan.

trainer.py (start-up, plan, re-plan, per-iteration agreements), startup.py, agreement.py,
options.py (flags over comm_param), faults.py and liveness.py (every rank ends together),
benchmark.py and interference.py (the cost measured at start-up), insitu.py (rho measured
while training).
"""

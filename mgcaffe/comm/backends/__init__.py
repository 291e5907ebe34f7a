"""Communicators: one small interface (communicator.py) and the backends behind it.

mpi.py (mpi4py), nccl.py (NCCL through CuPy), local.py (one rank, or N ranks on threads for
tests), emulate.py (a modelled network on top of another communicator), launcher.py (which
launcher started the process) and startup_deadline.py (a deadline on MPI's start-up).
"""

"""Helpers for tests of mgcaffe and of code built on it: numerical gradient checks
(gradient_check.py) and stand-ins for the communication runtime (comm.py).
"""

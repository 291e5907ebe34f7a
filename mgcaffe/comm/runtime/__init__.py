"""What runs every iteration: the one communication thread that runs any plan over any
communicator (executor.py, the solver's gradient sync; by role: layout.py, paths.py, loop.py,
staging.py), per-layer timing (timing.py) and timeline traces (trace.py, timeline_plot.py).
"""

"""What runs every iteration: the executor thread that all-reduces the planned groups
(executor.py), per-layer timing (timing.py) and timeline traces (trace.py, timeline_plot.py).
"""

"""CPU execution policy: how many threads (threads.py), the chunk runner that spreads memory-bound
work over them (parallel.py), the per-layer choice of all threads or one (layer_way.py), and a
net's own runner and way, passed in as one value (engine.py).
"""

"""The network: layers wired into a DAG from a NetParameter, run forward and backward.

net.py (the Net), builder.py (Caffe's rules for wiring layers), weights.py (.caffemodel and
HDF5 weights in and out), debug.py (`debug_info` lines), norm_chain.py (in-place BatchNorm,
Scale and ReLU chains run as one sweep), profiling.py (per-layer timing) and
synthetic_data.py (random inputs in place of data layers).
"""

from .net import Net

__all__ = ["Net"]

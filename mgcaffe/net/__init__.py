"""The network: layers wired into a DAG from a NetParameter, run forward and backward.

net.py (the engine, `NetEngine`: layers run by index, the learnable-layer hook, parameter
diffs), pycaffe.py (`Net`: pycaffe's name-keyed and batched API on the engine; what every
caller builds), builder.py (Caffe's rules for wiring layers), learnable.py (the learnable
layers' numbering), weights.py (.caffemodel and HDF5 weights in and out), param_diffs.py
(the parameter diffs' layout and clears), debug.py (`debug_info` lines), norm_chain.py
(in-place BatchNorm, Scale and ReLU chains run as one sweep), profiling.py (per-layer timing)
and synthetic_data.py (random inputs in place of data layers).
"""

from .net import NetEngine
from .pycaffe import Net

__all__ = ["Net", "NetEngine"]

"""mgcaffe: Caffe-style networks and solvers with MG-WFBP distributed training.

The pycaffe-style API (Net, TRAIN/TEST, set_mode_cpu, get_solver, ...) is exported here.
"""

from .layers.base import TEST, TRAIN
from .proto import caffe_pb2

__version__ = "0.1.0"
__all__ = ["TRAIN", "TEST", "caffe_pb2", "__version__"]

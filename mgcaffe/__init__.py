"""mgcaffe: Caffe-style networks and solvers with MG-WFBP distributed training.

The pycaffe-style API, with pycaffe's names:

    import mgcaffe
    mgcaffe.set_mode_cpu()                    # or set_mode_gpu(); set_device(i)
    net = mgcaffe.Net("deploy.prototxt", mgcaffe.TEST, weights="w.caffemodel")
    net.blobs["data"].reshape(1, 3, 224, 224)
    out = net.forward(data=image)             # {output name: array}
    solver = mgcaffe.get_solver("solver.prototxt")

The one piece of global state is pycaffe's: the default device that `set_mode_cpu`,
`set_mode_gpu` and `set_device` choose, used by `mgcaffe.Net` when no `device=` is given
(and available to other callers through `default_device()`). Everything below this API
(`mgcaffe.net.Net`, the solvers, the layers) takes its device explicitly.
"""

from __future__ import annotations

import os as _os

from . import _launch  # noqa: F401 - first: Ctrl-C while the program starts ends quietly

# OpenBLAS's idle threads spin for ~0.1 s after every matrix product, taking the core that
# mgcaffe's sample-chunk threads need for copies and pooling (kernels/parallel.py); parking
# them sooner measured GoogleNet b8 at ~690 instead of ~790 ms per iteration on 2 cores.
# Effective only when numpy has not loaded yet; a value the user set wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import importlib

from .backend import CPU, Device
from .layer_types.base import TEST, TRAIN
from .proto import caffe_pb2

__version__ = "0.1.0"

_SOLVER_NAMES = ("get_solver", "SGDSolver", "NesterovSolver", "AdaGradSolver",
                 "RMSPropSolver", "AdaDeltaSolver", "AdamSolver")

__all__ = ["TRAIN", "TEST", "Net", "caffe_pb2", "set_mode_cpu", "set_mode_gpu", "set_device",
           "default_device", "__version__", *_SOLVER_NAMES]

# pycaffe's model: one process-wide mode/device; see the module docstring.
_mode = "cpu"
_gpu_index = 0


def set_mode_cpu() -> None:
    """Build later `mgcaffe.Net`s (without device=) on the CPU."""
    global _mode
    _mode = "cpu"


def set_mode_gpu() -> None:
    """Build later `mgcaffe.Net`s (without device=) on the GPU chosen by set_device (0)."""
    global _mode
    _mode = "gpu"


def set_device(index: int) -> None:
    """Choose the GPU that GPU mode uses (pycaffe's caffe.set_device)."""
    global _gpu_index
    _gpu_index = int(index)


def default_device() -> Device:
    """The device chosen by set_mode_cpu / set_mode_gpu / set_device (CPU by default)."""
    return CPU if _mode == "cpu" else Device("gpu", _gpu_index)


def _make_net_class():
    from .net import Net as _Net  # noqa: PLC0415 - see __getattr__

    class Net(_Net):
        """pycaffe's Net: `Net(prototxt, mgcaffe.TEST, weights=path)` or the older
        `Net(prototxt, weights_path, mgcaffe.TEST)`; built on `default_device()` unless a
        device is given. Everything else is `mgcaffe.net.Net`."""

        def __init__(self, model, *args, device: Device | None = None, **kwargs):
            super().__init__(model, *args, device=device or default_device(), **kwargs)

    Net.__module__ = __name__
    return Net


def __getattr__(name: str):
    # Net and the solvers are imported on first use: they pull in every layer (and the
    # solvers are being written alongside), while `import mgcaffe` must stay light for
    # the planner and the CLI, and free of import cycles with the subpackages.
    if name == "Net":
        globals()["Net"] = cls = _make_net_class()
        return cls
    if name in _SOLVER_NAMES:
        solvers = importlib.import_module(f"{__name__}.solvers")
        return getattr(solvers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
(and available to other callers through `default_device()`), and by the solvers built from
Python (`mgcaffe.SGDSolver(path)`, `mgcaffe.get_solver(path)`) whatever the file's solver_mode
says, as in pycaffe; `set_random_seed` likewise seeds the nets and solvers built afterwards.
Everything below this API (`mgcaffe.net.Net`, `mgcaffe.solvers`, the layers, the `mgcaffe
train` command) takes its device explicitly.

The rest of pycaffe's names: `Layer` (base class of `type: "Python"` layers), `NetSpec`,
`layers` (L), `params` (P), `to_proto`, `io`, `Classifier`, `Detector`, `draw`, `coord_map`,
`layer_type_list`, `Timer`, `has_nccl`, `init_log`, `log`, `set_multiprocess`,
`solver_count`/`solver_rank` (and their setters). `mgcaffe.caffe_alias` makes `import caffe`
resolve to mgcaffe (see docs there).
"""

from __future__ import annotations

import os as _os

from . import _launch  # noqa: F401 - first: Ctrl-C while the program starts ends quietly

# OpenBLAS's idle threads spin for ~0.1 s after every matrix product, taking the core that
# mgcaffe's sample-chunk threads need for copies and pooling (cpu/parallel.py); parking
# them sooner measured GoogleNet b8 at ~690 instead of ~790 ms per iteration on 2 cores.
# Effective only when numpy has not loaded yet; a value the user set wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

# The helpers below are imported under private names: `mgcaffe.<name>` is pycaffe's namespace.
import importlib as _importlib
import time as _time

from . import solvers
from .backend import CPU, Device
from .backend import gpu_available as _gpu_available
from .layer_types.base import TEST, TRAIN
from .layer_types.registry import layer_types as _registered_layer_types
from .log import configure as _configure_log
from .net import Net as _Net
from .proto import caffe_pb2
from .solvers.params import load_solver_param as _load_solver_param

__version__ = "0.1.0"

_SOLVER_NAMES = ("get_solver", "SGDSolver", "NesterovSolver", "AdaGradSolver",
                 "RMSPropSolver", "AdaDeltaSolver", "AdamSolver")

# Lazily imported pycaffe names: attribute -> (module, name in it; None: the module itself).
_LAZY = {
    "Layer": ("layer_types.python_layer", "UserLayer"),
    "NetSpec": ("net_spec", "NetSpec"),
    "layers": ("net_spec", "layers"),
    "params": ("net_spec", "params"),
    "to_proto": ("net_spec", "to_proto"),
    "Classifier": ("classifier", "Classifier"),
    "Detector": ("detector", "Detector"),
    "io": ("io", None),
    "draw": ("draw", None),
    "coord_map": ("coord_map", None),
    "proto": ("proto", None),
    # pycaffe's caffe.log(message): the mgcaffe.log module is callable and logs at INFO.
    "log": ("log", None),
}

__all__ = ["TRAIN", "TEST", "Net", "caffe_pb2", "set_mode_cpu", "set_mode_gpu", "set_device",
           "default_device", "__version__", *_SOLVER_NAMES, *_LAZY, "layer_type_list",
           "Timer", "has_nccl", "set_random_seed", "set_multiprocess", "init_log", "log",
           "solver_count", "set_solver_count", "solver_rank", "set_solver_rank"]

# pycaffe's model: one process-wide mode/device; see the module docstring.
_mode = "cpu"
_gpu_index = 0
_random_seed: int | None = None
_solver_count = 1
_solver_rank = 0


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


def set_random_seed(seed: int) -> None:
    """Seed the fillers and random layers of nets (and solvers whose file gives no
    random_seed) built from now on (pycaffe's caffe.set_random_seed)."""
    global _random_seed
    _random_seed = int(seed)


def layer_type_list() -> list[str]:
    """Every layer type string this installation can build (read from the registry)."""

    return _registered_layer_types()


def has_nccl() -> bool:
    """True when NCCL can be used here (CuPy with NCCL and a CUDA GPU)."""

    if not _gpu_available():
        return False
    try:
        from cupy.cuda import nccl  # noqa: PLC0415 - optional, GPU installs only
    except ImportError:
        return False
    return bool(getattr(nccl, "available", True))


def set_multiprocess(value: bool) -> None:
    """Accepted for pycaffe code; mgcaffe always runs one process per rank (MPI), which is
    what Caffe's multiprocess mode means, so there is nothing to switch."""


def solver_count() -> int:
    """The number of solvers (ranks) pycaffe code declared with set_solver_count (1)."""
    return _solver_count


def set_solver_count(count: int) -> None:
    """Record the number of ranks for pycaffe code that asks solver_count(); distributed
    training with `mgcaffe train` tells Python layers their rank/world_size itself."""
    global _solver_count
    _solver_count = int(count)


def solver_rank() -> int:
    """The rank pycaffe code declared with set_solver_rank (0)."""
    return _solver_rank


def set_solver_rank(rank: int) -> None:
    """Record this process's rank for pycaffe code that asks solver_rank()."""
    global _solver_rank
    _solver_rank = int(rank)


_LOG_LEVELS = ("INFO", "WARNING", "ERROR", "CRITICAL")


def init_log(level: int = 0, stderr: bool = True) -> None:
    """Log mgcaffe's messages to stderr in glog format from glog level `level` up
    (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL), as pycaffe's caffe.init_log."""

    _configure_log(_LOG_LEVELS[min(max(int(level), 0), 3)])


class Timer:
    """pycaffe's Timer: start(), stop(), and `ms`, the milliseconds between them (or since
    start while running)."""

    def __init__(self):
        self._start: float | None = None
        self._elapsed = 0.0

    def start(self) -> None:

        self._start = _time.perf_counter()

    def stop(self) -> None:

        if self._start is not None:
            self._elapsed = _time.perf_counter() - self._start
            self._start = None

    @property
    def ms(self) -> float:

        if self._start is not None:
            return (_time.perf_counter() - self._start) * 1e3
        return self._elapsed * 1e3


def _make_net_class():

    class Net(_Net):
        """pycaffe's Net: `Net(prototxt, mgcaffe.TEST, weights=path)` or the older
        `Net(prototxt, weights_path, mgcaffe.TEST)`; built on `default_device()` unless a
        device is given, seeded by `set_random_seed` unless a seed is given. Everything
        else is `mgcaffe.net.Net`."""

        def __init__(self, model, *args, device: Device | None = None, **kwargs):
            if _random_seed is not None:
                kwargs.setdefault("seed", _random_seed)
            super().__init__(model, *args, device=device or default_device(), **kwargs)

    Net.__module__ = __name__
    return Net


def _python_solver_options(options: dict) -> dict:
    """pycaffe's rule for solvers built from Python: the mode functions decide the device."""
    options.setdefault("device", default_device())
    return options


def _make_solver(name: str):

    def seeded(source):
        param, path = _load_solver_param(source)
        if _random_seed is not None and not param.HasField("random_seed"):
            param.random_seed = _random_seed
        return param, path

    if name == "get_solver":
        def get_solver(source, **options):
            """The solver of the type the file names, on the device that set_mode_cpu /
            set_mode_gpu / set_device chose (pycaffe's caffe.get_solver)."""
            param, path = seeded(source)
            cls = solvers.SOLVER_CLASSES.get(param.type)
            if cls is None:  # the library's error names the types
                return solvers.get_solver(param, solver_path=path, **options)
            return __getattr__(cls.__name__)(param, solver_path=path, **options)

        return get_solver
    base = getattr(solvers, name)

    def __init__(self, source, **options):
        param, path = seeded(source)
        options.setdefault("solver_path", path)
        base.__init__(self, param, **_python_solver_options(options))

    cls = type(name, (base,), {"__init__": __init__, "__module__": __name__,
                               "__doc__": f"pycaffe's {name}: {base.__doc__ or ''}".strip()})
    return cls


def __getattr__(name: str):
    # Net and the solvers are imported on first use: they pull in every layer (and the
    # solvers are being written alongside), while `import mgcaffe` must stay light for
    # the planner and the CLI, and free of import cycles with the subpackages.
    if name == "Net":
        globals()["Net"] = cls = _make_net_class()
        return cls
    if name in _SOLVER_NAMES:
        globals()[name] = value = _make_solver(name)
        return value
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = _importlib.import_module(f"{__name__}.{module_name}")
        globals()[name] = value = module if attr is None else getattr(module, attr)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

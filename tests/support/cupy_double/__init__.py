"""A CuPy test double: the GPU engine run on the CPU, with CuPy's rules and counters.

    import cupy_double                # tests/support is on the path (pytest, PYTHONPATH)
    with cupy_double.installed(devices=2) as double:   # `import cupy` now gets the double
        net = Net(param, TRAIN, device=Device("gpu", 0))
        net.forward(); net.backward()
        double.counters.launches, double.counters.syncs, double.counters.sync_sites

`install()` puts modules named `cupy`, `cupy.cuda`, `cupy.cuda.runtime`, `cupy.cuda.nccl`,
`cupy.random`, `cupy.lib.stride_tricks` and `cupyx` into `sys.modules`, so the engine's own
`import cupy` (mgcaffe.backend) gets them without a change. They offer only names CuPy
really has (`names.py`; any other is an AttributeError, as in CuPy) and implement what the
engine uses, on numpy arrays, enforcing CuPy's host/device rules (arrays.py) and counting
launches, host syncs with their call sites and bytes copied each way (counters.py).
Devices, streams, events, pinned memory and NCCL are in cuda.py; `RawKernel` compiles the
CUDA source for the host (rawkernel.py).

What the double does not model: timing, asynchrony (every call completes at once) and
numerics beyond numpy's (cuBLAS may sum in another order).

`python -m cupy_double PROGRAM ARGS` (tests/support on PYTHONPATH) runs a Python program or
module (`-m mgcaffe train ...`) with the double installed: the way tests start `mgcaffe`
commands and MPI ranks on it.
"""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np

from .arrays import make_array_api
from .cuda import Device, State, make_cuda_module
from .names import cupy_names
from .rawkernel import make_raw_kernel

__all__ = ["CupyDouble", "install", "installed", "uninstall"]

_MODULES = ("cupy", "cupy.cuda", "cupy.cuda.runtime", "cupy.cuda.nccl", "cupy.random",
            "cupy.lib", "cupy.lib.stride_tricks", "cupyx")


class _Checked(types.ModuleType):
    """A module of the double: `namespace` first, then `fallback(name)`; a name CuPy does
    not have is an AttributeError."""

    def __init__(self, name, namespace, allowed, fallback=None):
        super().__init__(name)
        self.__dict__.update(namespace)
        self._allowed, self._fallback = allowed, fallback

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr not in self._allowed:
            raise AttributeError(f"module '{self.__name__}' has no attribute '{attr}'")
        if self._fallback is None:
            raise AttributeError(f"the CuPy double does not implement {self.__name__}."
                                 f"{attr} (CuPy has it)")
        value = self._fallback(attr)
        setattr(self, attr, value)
        return value


class CupyDouble:
    """One installed double: `cupy` (the module), `counters`, `state`."""

    def __init__(self, devices: int = 1):
        self.names = names = cupy_names()
        self.state = state = State(devices)
        self.counters = state.counters
        (ndarray, function, _ufunc, bind_device, unwrap, wrap, call,
         host_to_device) = make_array_api(state, names)
        self.ndarray = ndarray

        def checked(name, namespace, fallback=None):
            return _Checked(name, namespace, names.get(name, frozenset(namespace)), fallback)

        cuda = make_cuda_module(state, checked)
        bind_device(Device)

        def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
            if isinstance(a, ndarray):
                return a.get(stream=stream, order=order, out=out, blocking=blocking)
            return np.asarray(a, order=order)

        def get_array_module(*args):
            return cupy if any(isinstance(a, ndarray) for a in args) else np

        def empty_pinned(shape, dtype=float, order="C"):
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            memory = cuda.alloc_pinned_memory(nbytes)
            return np.frombuffer(memory.mem, dtype=np.uint8, count=nbytes).view(
                dtype).reshape(shape, order=order)

        def zeros_pinned(shape, dtype=float, order="C"):
            out = empty_pinned(shape, dtype, order)
            out[...] = 0
            return out

        def scatter_add(a, slices, value):
            a.scatter_add(slices, value)

        random = checked("cupy.random", {
            "default_rng": lambda seed=None: _Generator(np.random.default_rng(seed), call)},
            None)
        stride_tricks = checked("cupy.lib.stride_tricks", {
            "as_strided": lambda x, shape=None, strides=None: call(
                "as_strided", np.lib.stride_tricks.as_strided, (x,),
                {"shape": shape, "strides": strides}),
        })
        lib = types.ModuleType("cupy.lib")
        lib.stride_tricks = stride_tricks
        cupyx = checked("cupyx", {"scatter_add": scatter_add, "empty_pinned": empty_pinned,
                                  "zeros_pinned": zeros_pinned})
        self.cupy = cupy = checked("cupy", {
            "ndarray": ndarray, "ufunc": _ufunc, "cuda": cuda, "random": random, "lib": lib,
            "asnumpy": asnumpy, "get_array_module": get_array_module,
            "RawKernel": make_raw_kernel(state, unwrap), "__version__": "14.2.0 (double)",
            "is_available": lambda: state.visible() > 0,
        }, function)
        self.modules = {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": cuda.runtime,
                        "cupy.cuda.nccl": cuda.nccl, "cupy.random": random, "cupy.lib": lib,
                        "cupy.lib.stride_tricks": stride_tricks, "cupyx": cupyx}
        self.wrap, self.unwrap, self.host_to_device = wrap, unwrap, host_to_device

    @property
    def visible_devices(self) -> int:
        return self.state.visible()


class _Generator:
    """cupy.random.Generator over numpy's: draws on the host, copies to the device (the
    double does not reproduce cuRAND's streams; tests compare shapes and statistics)."""

    def __init__(self, rng, call):
        self._rng, self._call = rng, call

    def __getattr__(self, name):
        draw = getattr(self._rng, name)
        return lambda *args, **kwargs: self._call(f"random.{name}", draw, args, kwargs)


_installed: list[tuple[CupyDouble, dict]] = []


def install(devices: int = 1) -> CupyDouble:
    """Put a fresh double in sys.modules (`import cupy` returns it) and return it."""
    double = CupyDouble(devices)
    saved = {name: sys.modules.get(name) for name in _MODULES}
    sys.modules.update(double.modules)
    _installed.append((double, saved))
    return double


def uninstall() -> None:
    """Put back what sys.modules held before the last install()."""
    _double, saved = _installed.pop()
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


@contextlib.contextmanager
def installed(devices: int = 1):
    """The double installed for the duration of a `with` block."""
    double = install(devices)
    try:
        yield double
    finally:
        uninstall()

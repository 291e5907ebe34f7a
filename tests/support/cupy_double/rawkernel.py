"""`cupy.RawKernel` of the double: the CUDA C source compiled for the host and run there.

The kernels mgcaffe writes (mgcaffe/kernels/cuda/) are plain C apart from their launch
indices; with blockIdx = threadIdx = 0 and blockDim = gridDim = 1 their grid-stride loop
visits every index on one host thread. So the very source NVRTC would compile runs here on
the arrays behind the double's device arrays (a C++ compiler is needed: g++ or c++).
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = ["HOST_PRELUDE", "compile_for_host"]

HOST_PRELUDE = r"""
#include <algorithm>
#include <cmath>
using std::min;
using std::max;
using std::exp;
using std::log;
using std::sqrt;
#define __global__
#define __device__
// one thread per block: a block's shared memory is its one thread's, and a barrier is a no-op
#define __shared__ static
static inline void __syncthreads() {}
struct mgcaffe_dim3 { unsigned int x; };
static const mgcaffe_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""

_lock = threading.Lock()
_built: dict[str, ctypes.CDLL] = {}
_folder: Path | None = None


def compile_for_host(source: str, name: str):
    """The function `name` of CUDA C `source`, compiled as a host shared library (cached
    per source); a RuntimeError when no C++ compiler is installed."""
    global _folder
    key = hashlib.sha256((source + name).encode()).hexdigest()[:16]
    with _lock:
        if key not in _built:
            compiler = shutil.which("g++") or shutil.which("c++")
            if compiler is None:
                raise RuntimeError("the CuPy double runs RawKernels on the host and needs a "
                                   "C++ compiler (g++ or c++); none is installed")
            if _folder is None:
                _folder = Path(tempfile.mkdtemp(prefix="cupy-double-kernels-"))
            src = _folder / f"{key}.cpp"
            lib = _folder / f"{key}.so"
            src.write_text(HOST_PRELUDE + source)
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)],
                           check=True, capture_output=True)
            _built[key] = ctypes.CDLL(str(lib))
        return getattr(_built[key], name)


def c_argument(value, unwrap):
    """A kernel argument as ctypes: device arrays as pointers, numpy scalars by type."""
    if hasattr(value, "_a"):
        return ctypes.c_void_p(unwrap(value).ctypes.data)
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)} (a numpy array as a kernel argument)")
    table = {np.dtype(np.int32): ctypes.c_int, np.dtype(np.int64): ctypes.c_longlong,
             np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
             np.dtype(np.int8): ctypes.c_byte, np.dtype(np.int16): ctypes.c_short,
             np.dtype(np.uint32): ctypes.c_uint, np.dtype(np.uint64): ctypes.c_ulonglong}
    if isinstance(value, np.generic) and value.dtype in table:
        return table[value.dtype](value.item())
    raise TypeError(f"the CuPy double takes numpy scalars of a fixed size or device arrays as "
                    f"kernel arguments, got {type(value).__name__}")


def make_raw_kernel(state, unwrap):
    """The RawKernel class bound to a double's state."""

    class RawKernel:
        """cupy.RawKernel(code, name): call as kernel(grid, block, args)."""

        def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False,
                     enable_cooperative_groups=False, jitify=False):
            self.code, self.name, self.options = code, name, tuple(options)
            self._function = None

        def __call__(self, grid, block, args, *, shared_mem=0):
            if self._function is None:
                self._function = compile_for_host(self.code, self.name)
            c_args = [c_argument(a, lambda x: unwrap(x, self.name)) for a in args]
            state.launch(f"RawKernel {self.name}")
            self._function(*c_args)

    RawKernel.__module__ = "cupy"
    return RawKernel

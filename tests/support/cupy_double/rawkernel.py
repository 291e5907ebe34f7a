"""`cupy.RawKernel` of the double: the CUDA C source compiled for the host and run there.

The kernels mgcaffe writes (mgcaffe/kernels/cuda/) are plain C apart from their launch
indices; with blockIdx = threadIdx = 0 and blockDim = gridDim = 1 their grid-stride loop
visits every index on one host thread. So the very source NVRTC would compile runs here on
the arrays behind the double's device arrays (a C++ compiler is needed: g++ or c++).

Every launch is checked first, as a GPU would need it and the host does not: each argument
against the kernel's parameter list, as CuPy marshals it (signature.py), and the grid and
block against CUDA's limits. The host libraries are cached on disk by the hash of what they
are built from (CUPY_DOUBLE_CACHE, else a folder of this user's in the temporary folder),
so a process starting on the double does not compile them again.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from .signature import check_arguments, kernel_parameters

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
_FLAGS = ("-O2", "-shared", "-fPIC")
#: CUDA's launch limits (every GPU since compute capability 3.0).
_MAX_BLOCK_THREADS, _MAX_BLOCK = 1024, (1024, 1024, 64)
_MAX_GRID = (2**31 - 1, 65535, 65535)


def _cache_folder() -> Path:
    folder = os.environ.get("CUPY_DOUBLE_CACHE") or os.path.join(
        tempfile.gettempdir(), f"cupy-double-kernels-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return Path(folder)


def compile_for_host(source: str, name: str):
    """The function `name` of CUDA C `source`, compiled as a host shared library (cached
    per source, on disk too); a RuntimeError when no C++ compiler is installed."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("the CuPy double runs RawKernels on the host and needs a C++ "
                           "compiler (g++ or c++); none is installed")
    text = HOST_PRELUDE + source
    key = hashlib.sha256("\0".join((compiler, *_FLAGS, text)).encode()).hexdigest()[:24]
    with _lock:
        if key not in _built:
            folder = _cache_folder()
            lib = folder / f"{key}.so"
            if not lib.exists():
                # built under a name of this process's, then renamed: processes building
                # the same kernel at once each get a whole library
                part = folder / f"{key}.{os.getpid()}.{threading.get_ident()}"
                src = part.with_suffix(".cpp")
                src.write_text(text)
                try:
                    subprocess.run([compiler, *_FLAGS, "-o", str(part), str(src)], check=True,
                                   capture_output=True)
                    os.replace(part, lib)
                finally:
                    src.unlink(missing_ok=True)
                    part.unlink(missing_ok=True)
            _built[key] = ctypes.CDLL(str(lib))
        return getattr(_built[key], name)


_CTYPES = {np.dtype(np.bool_): ctypes.c_bool, np.dtype(np.int8): ctypes.c_int8,
           np.dtype(np.uint8): ctypes.c_uint8, np.dtype(np.int16): ctypes.c_int16,
           np.dtype(np.uint16): ctypes.c_uint16, np.dtype(np.int32): ctypes.c_int32,
           np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.int64): ctypes.c_int64,
           np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.float32): ctypes.c_float,
           np.dtype(np.float64): ctypes.c_double}


def c_argument(value, param, unwrap):
    """A checked kernel argument as ctypes, of its parameter's type: device arrays as
    pointers, scalars by value."""
    if param.pointer:
        return ctypes.c_void_p(None if value is None else unwrap(value).ctypes.data)
    return _CTYPES[param.dtype](np.asarray(value).item())


def _dims(what: str, value) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def check_launch(name: str, grid, block) -> None:
    """CUDA's limits on a launch's grid and block (cudaErrorInvalidConfiguration on a GPU)."""
    grid, block = _dims("grid", grid), _dims("block", block)
    threads = block[0] * block[1] * block[2]
    if (min(grid + block) < 1 or threads > _MAX_BLOCK_THREADS
            or any(b > m for b, m in zip(block, _MAX_BLOCK))
            or any(g > m for g, m in zip(grid, _MAX_GRID))):
        raise ValueError(f"RawKernel {name}: launch of grid {grid} and block {block} is "
                         f"outside CUDA's limits (cudaErrorInvalidConfiguration)")


def make_raw_kernel(state, unwrap):
    """The RawKernel class bound to a double's state."""

    class RawKernel:
        """cupy.RawKernel(code, name): call as kernel(grid, block, args); each launch's
        arguments are checked against the kernel's parameters first."""

        def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False,
                     enable_cooperative_groups=False, jitify=False):
            self.code, self.name, self.options = code, name, tuple(options)
            self._function = None
            self._parameters = None

        def __call__(self, grid, block, args, *, shared_mem=0):
            if self._parameters is None:
                self._parameters = kernel_parameters(self.code, self.name)
            args = tuple(args)
            check_launch(self.name, grid, block)
            check_arguments(self.name, self._parameters, args, lambda v: hasattr(v, "_a"))
            if self._function is None:
                self._function = compile_for_host(self.code, self.name)
            c_args = [c_argument(a, p, lambda x: unwrap(x, self.name))
                      for a, p in zip(args, self._parameters)]
            state.launch(f"RawKernel {self.name}")
            self._function(*c_args)

    RawKernel.__module__ = "cupy"
    return RawKernel

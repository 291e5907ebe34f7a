"""The CUDA kernels' registry and launch helpers.

Each module of kernels registers its CUDA C sources here by name (`register`), with the
threads per block its launches use. A source is written once with `REAL` for the element
type, and `INDEX` for the winner-tag type where it has one; `variants()` lists every
(kernel, dtype, winner-tag dtype) the launch helpers can compile, which is what the tests
compile with NVIDIA's compiler (tests/gpu/test_nvrtc.py) and what docs/gpu.md tabulates.

Kernels compile on their first launch (NVRTC, through `cupy.RawKernel`), once per element
type, and are cached here and in CuPy's on-disk kernel cache. Nothing here imports CuPy:
the arrays passed in bring their module. Launches go to the current CuPy stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...backend import get_array_module

__all__ = ["BLOCK_THREADS", "INDEX_TYPES", "REAL_TYPES", "Variant", "cupy_of", "kernel_source",
           "launch", "launch_blocks", "register", "use_cuda_kernels", "variants"]

#: Element types the kernels are compiled for (numpy dtype -> CUDA type).
REAL_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
#: Winner-tag types the pooling layer keeps (the smallest that holds kh*kw + 1).
INDEX_TYPES = {np.dtype(np.int8): "signed char", np.dtype(np.int16): "short",
               np.dtype(np.int32): "int"}
#: Threads per block of a grid-stride launch (`launch`).
BLOCK_THREADS = 256
#: A grid-stride loop covers any size; more blocks than this buys nothing on current GPUs.
MAX_BLOCKS = 65536

_SOURCES: dict[str, str] = {}
_THREADS: dict[str, int] = {}
#: Kernels by (RawKernel class, name, dtype, index dtype), compiled on their first launch.
_cache: dict[tuple, object] = {}


@dataclass(frozen=True)
class Variant:
    """One compilable kernel: its name, element dtype, winner-tag dtype (None where it has
    none) and the threads per block it is launched with."""

    name: str
    dtype: np.dtype
    index_dtype: np.dtype | None
    threads: int

    @property
    def source(self) -> str:
        return kernel_source(self.name, self.dtype, self.index_dtype)

    def __str__(self) -> str:
        tag = "" if self.index_dtype is None else f"/{self.index_dtype}"
        return f"{self.name}<{self.dtype}{tag}>"


def register(sources: dict[str, str], threads: int = BLOCK_THREADS) -> None:
    """Register kernels (name -> CUDA C source with REAL, and INDEX where it has winner tags)
    launched with `threads` per block."""
    clash = set(sources) & set(_SOURCES)
    if clash:
        raise ValueError(f"kernels already registered: {sorted(clash)}")
    _SOURCES.update(sources)
    _THREADS.update(dict.fromkeys(sources, int(threads)))


def kernel_source(name: str, dtype, index_dtype=None) -> str:
    """The CUDA C source of kernel `name` for element type `dtype` (and, for pooling, the
    winner-index type). Plain C apart from the launch indices, so tests can also compile it
    for the host (tests/gpu/test_cuda_kernels_cpu.py)."""
    if name not in _SOURCES:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(sorted(_SOURCES))}")
    real = REAL_TYPES.get(np.dtype(dtype))
    if real is None:
        raise ValueError(f"{name}: no CUDA kernel for dtype {np.dtype(dtype)} (supported: "
                         f"{', '.join(str(d) for d in REAL_TYPES)})")
    source = _SOURCES[name].replace("REAL", real, 1)
    if "INDEX" in source:
        index = INDEX_TYPES.get(np.dtype(index_dtype)) if index_dtype is not None else None
        if index is None:
            raise ValueError(f"{name}: winner tags must be int8, int16 or int32, got "
                             f"{None if index_dtype is None else np.dtype(index_dtype)}")
        source = source.replace("INDEX", index, 1)
    return source


def variants() -> list[Variant]:
    """Every registered kernel in every type it compiles for, in registration order."""
    out = []
    for name, source in _SOURCES.items():
        tags = list(INDEX_TYPES) if "INDEX" in source else [None]
        out.extend(Variant(name, dtype, tag, _THREADS[name])
                   for dtype in REAL_TYPES for tag in tags)
    return out


def use_cuda_kernels(xp, dtype=None) -> bool:
    """Whether the CUDA kernels apply: `xp` is CuPy and `dtype` (when given) one they
    support. A layer asks this once (in reshape) and calls either a kernel or array code."""
    if xp is np or getattr(xp, "__name__", "") != "cupy":
        return False
    return dtype is None or np.dtype(dtype) in REAL_TYPES


def cupy_of(array, what: str):
    """CuPy, the module of `array`; a TypeError naming `what` for any other array."""
    xp = get_array_module(array)
    if not use_cuda_kernels(xp):
        raise TypeError(f"{what}: the CUDA kernels take CuPy arrays, got "
                        f"{type(array).__module__}.{type(array).__name__}; use the generic "
                        f"function for numpy arrays")
    return xp


def _compiled(xp, name: str, dtype, index_dtype=None):
    # A RawKernel compiles for each device it is launched on, so one object serves all
    # devices of one CuPy module (tests install a fresh CuPy double now and then).
    key = (xp.RawKernel, name, np.dtype(dtype),
           None if index_dtype is None else np.dtype(index_dtype))
    kernel = _cache.get(key)
    if kernel is None:
        kernel = _cache[key] = xp.RawKernel(kernel_source(name, dtype, index_dtype), name)
    return kernel


def launch(xp, name: str, dtype, total: int, args, index_dtype=None) -> None:
    """Kernel `name` over `total` items: a grid-stride loop of the kernel's registered
    threads per block, at most MAX_BLOCKS blocks (nothing for 0 items)."""
    if total == 0:
        return
    threads = _THREADS[name]
    blocks = min((total + threads - 1) // threads, MAX_BLOCKS)
    _compiled(xp, name, dtype, index_dtype)((blocks,), (threads,), args)


def launch_blocks(xp, name: str, dtype, count: int, args) -> None:
    """Kernel `name` with one block of its registered threads per item (a grid-stride loop
    over blocks past MAX_BLOCKS; nothing for 0 items): the per-channel reductions."""
    if count:
        _compiled(xp, name, dtype)((min(count, MAX_BLOCKS),), (_THREADS[name],), args)

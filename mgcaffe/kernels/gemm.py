"""`c += a @ b` inside the GEMM (BLAS beta = 1) on the CPU, with numpy's own BLAS.
`GemmStack`: many such GEMMs on slices of the same three arrays, checked once.

Why: a weight gradient is added into the parameter diff (Caffe's layers accumulate). numpy's
matmul has no beta, so the layer wrote the product into a scratch and added it: for
AlexNet's fc6 at batch 8 (a 4096 x 9216 weight, 151 MB) that is a 151 MB write and a
three-array pass over 151 MB more, where the GEMM alone is memory-bound on its output. The
BLAS's gemm with beta = 1 reads and writes the diff once.

numpy bundles OpenBLAS and exports its CBLAS symbols (`scipy_cblas_sgemm64_` in numpy 2's
wheels, `cblas_sgemm` in older ones); threadpoolctl says which library numpy loaded, so the
call goes to that very library (its thread pool, its thread limit), not to a second BLAS.
Where it cannot be found (another BLAS, other dtypes, operands that are not row- or
column-major 2-D views) `gemm_accumulate` falls back to matmul into a scratch and an add.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
from threadpoolctl import threadpool_info

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_lock = threading.Lock()
_functions: dict | None = None


def _load() -> dict:
    """{dtype: cblas ?gemm function} of the OpenBLAS numpy loaded ({} when not found)."""
    global _functions
    with _lock:
        if _functions is not None:
            return _functions
        _functions = {}
        for info in threadpool_info():
            if info.get("internal_api") != "openblas" or not info.get("filepath"):
                continue
            path = info["filepath"]
            if "numpy" not in path:  # another library's OpenBLAS (scipy's own copy)
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            ilp64 = "64_" in path.rsplit("/", 1)[-1]
            found = {}
            for dtype, letter, real in ((np.float32, "s", ctypes.c_float),
                                        (np.float64, "d", ctypes.c_double)):
                names = ([f"scipy_cblas_{letter}gemm64_", f"cblas_{letter}gemm64_"] if ilp64
                         else [f"scipy_cblas_{letter}gemm", f"cblas_{letter}gemm"])
                fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
                if fn is None:
                    continue
                integer = ctypes.c_int64 if ilp64 else ctypes.c_int
                fn.restype = None
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer,
                               integer, real, ctypes.c_void_p, integer, ctypes.c_void_p,
                               integer, real, ctypes.c_void_p, integer]
                found[np.dtype(dtype)] = fn
            if found:
                _functions = found
                break
        return _functions


def _layout(array: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D view as a row-major BLAS operand."""
    item = array.itemsize
    s0, s1 = array.strides
    rows, cols = array.shape
    if (s1 == item or cols == 1) and s0 % item == 0 and s0 // item >= max(1, cols):
        return _NO_TRANS, max(1, s0 // item)
    if (s0 == item or rows == 1) and s1 % item == 0 and s1 // item >= max(1, rows):
        return _TRANS, max(1, s1 // item)
    return None


def available(dtype) -> bool:
    """Whether `gemm_accumulate` calls the BLAS directly for this dtype."""
    return np.dtype(dtype) in _load()


def gemm_accumulate(a: np.ndarray, b: np.ndarray, c: np.ndarray, scratch=None,
                    overwrite: bool = False) -> None:
    """c += a @ b for 2-D numpy arrays (c row-major); `scratch(shape)` gives the fallback's
    temporary (a new array when None). `overwrite`: c = a @ b instead (BLAS beta = 0: c's
    old values are neither read nor kept, a lazily cleared diff's first write)."""
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k or c.shape != (m, n):
        raise ValueError(f"gemm_accumulate: shapes {a.shape} @ {b.shape} into {c.shape}")
    fn = _load().get(c.dtype) if a.dtype == b.dtype == c.dtype else None
    la, lb, lc = _layout(a), _layout(b), _layout(c)
    if fn is None or la is None or lb is None or lc is None or lc[0] != _NO_TRANS or \
            min(m, n, k) == 0:
        if overwrite:
            np.matmul(a, b, out=c)
            return
        tmp = scratch((m, n)) if scratch is not None else np.empty((m, n), c.dtype)
        np.matmul(a, b, out=tmp)
        c += tmp
        return
    fn(_ROW_MAJOR, la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1],
       0.0 if overwrite else 1.0, c.ctypes.data, lc[1])


class GemmStack:
    """c[ic] (+)= a[ia] @ b[ib] for the 2-D slices of three stacks of operands: arrays (or
    views) a (..., m, k), b (..., k, n), c (..., m, n) whose leading axes index the slices.

    Why: loops that make hundreds of small GEMMs on slices of the same arrays (per sample,
    per Winograd tile position and group) paid gemm_accumulate's checks and three ctypes
    pointer look-ups on every call, about 14 us of Python holding the GIL (1132 calls a
    ResNet-50 pass at batch 4, 200 a CIFAR-10 quick pass). A stack checks the slices'
    layout once and adds each slice's offset to one pointer per stack; each call is the same
    BLAS call gemm_accumulate makes, so the same bits. Where gemm_accumulate would fall
    back (no direct BLAS, another dtype, slices no BLAS operand), every call falls back.
    """

    def __init__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray):
        lead = a.ndim - 2
        if lead < 0 or b.ndim - 2 < 0 or c.ndim - 2 < 0:
            raise ValueError(f"GemmStack: operands need 2 trailing axes, got shapes "
                             f"{a.shape}, {b.shape}, {c.shape}")
        (m, k), (k2, n), (m2, n2) = a.shape[-2:], b.shape[-2:], c.shape[-2:]
        if k2 != k or (m2, n2) != (m, n):
            raise ValueError(f"GemmStack: slices {a.shape[-2:]} @ {b.shape[-2:]} into "
                             f"{c.shape[-2:]}")
        self.a, self.b, self.c = a, b, c
        self.m, self.n, self.k = m, n, k
        fn = _load().get(c.dtype) if a.dtype == b.dtype == c.dtype else None
        first = [x[(0,) * (x.ndim - 2)] if x.size else None for x in (a, b, c)]
        layouts = [_layout(x) if x is not None else None for x in first]
        usable = (fn is not None and None not in layouts and layouts[2][0] == _NO_TRANS
                  and min(m, n, k) > 0)
        self._fn = fn if usable else None
        if usable:
            (self._ta, self._lda), (self._tb, self._ldb), (_, self._ldc) = layouts
            self._pointers = [x.ctypes.data for x in (a, b, c)]

    @staticmethod
    def _offset(index, array) -> int:
        """Bytes from the stack's first slice to slice `index` (checked: the pointer is
        handed to the BLAS). Plain loops: this runs once per GEMM."""
        shape, strides = array.shape, array.strides
        if type(index) is int:
            index = (index,)
        offset = 0
        if len(index) == len(shape) - 2:
            for axis, i in enumerate(index):
                if not 0 <= i < shape[axis]:
                    break
                offset += i * strides[axis]
            else:
                return offset
        raise IndexError(f"GemmStack: slice {index} of a stack of shape {shape}")

    def __call__(self, ia, ib, ic, overwrite: bool = False) -> None:
        """c[ic] (+)= a[ia] @ b[ib] (= with `overwrite`: BLAS beta = 0); each index an int
        or a tuple of leading indices."""
        if self._fn is None:
            gemm_accumulate(self.a[ia], self.b[ib], self.c[ic], None, overwrite)
            return
        pa, pb, pc = self._pointers
        self._fn(_ROW_MAJOR, self._ta, self._tb, self.m, self.n, self.k, 1.0,
                 pa + self._offset(ia, self.a), self._lda, pb + self._offset(ib, self.b),
                 self._ldb, 0.0 if overwrite else 1.0, pc + self._offset(ic, self.c),
                 self._ldc)

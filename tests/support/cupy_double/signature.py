"""Kernel signatures for the double's RawKernel: what a CUDA kernel takes, what CuPy passes.

`kernel_parameters(source, name)` reads the parameter list of `extern "C" __global__ void
name(...)` from the source (typedefs resolved), and `check_arguments` holds each launch
argument against it the way CuPy would marshal it (cupy/cuda/function.pyx `_pointer` and
cupy/_core/_scalar.pyx `CScalar`, CuPy 14.2.0): a device array becomes a pointer whatever
its dtype, `None` a null pointer, a numpy scalar (or a numpy array of one element) its own
bytes, a Python bool a `bool`, a Python int a 64-bit integer (unsigned from 2**63), a Python
float a double, a Python complex a complex128; a larger numpy array is refused.

On a GPU a mismatch is no error: cuLaunchKernel copies as many bytes as the kernel's
parameter has from wherever the argument lies, so an `np.int32` for a `long long` reads four
bytes of garbage and a float64 array read as `float*` is nonsense. On the host the C
calling convention often hides the same mistake. Here it fails the launch, naming the
kernel, the parameter and both types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Parameter", "check_arguments", "kernel_parameters"]

#: C spellings (qualifiers dropped, words sorted) -> numpy dtype; LP64, as CUDA on Linux.
_C_TYPES = {
    "bool": np.bool_, "char": np.int8, "char signed": np.int8, "char unsigned": np.uint8,
    "short": np.int16, "int short": np.int16, "short signed": np.int16,
    "int short signed": np.int16, "short unsigned": np.uint16,
    "int short unsigned": np.uint16,
    "int": np.int32, "signed": np.int32, "int signed": np.int32, "unsigned": np.uint32,
    "int unsigned": np.uint32,
    "long": np.int64, "int long": np.int64, "long signed": np.int64, "long unsigned": np.uint64,
    "long long": np.int64, "int long long": np.int64, "long long signed": np.int64,
    "long long unsigned": np.uint64, "int long long unsigned": np.uint64,
    "float": np.float32, "double": np.float64,
    "int8_t": np.int8, "int16_t": np.int16, "int32_t": np.int32, "int64_t": np.int64,
    "uint8_t": np.uint8, "uint16_t": np.uint16, "uint32_t": np.uint32,
    "uint64_t": np.uint64, "size_t": np.uint64, "ptrdiff_t": np.int64,
}
_QUALIFIERS = {"const", "volatile", "__restrict__", "restrict", "struct"}
_TYPEDEF = re.compile(r"\btypedef\s+([A-Za-z_][\w\s\*]*?)\s+([A-Za-z_]\w*)\s*;")


@dataclass(frozen=True)
class Parameter:
    """One kernel parameter: its name, C type as written, element dtype (None: `void*`,
    any) and whether it is a pointer."""

    name: str
    c_type: str
    dtype: np.dtype | None
    pointer: bool


def _signature_text(source: str, name: str) -> str:
    head = re.search(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                     r'void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?' + re.escape(name)
                     + r"\s*\(", source)
    if head is None:
        raise ValueError(f"RawKernel {name}: no `extern \"C\" __global__ void {name}(...)` "
                         f"in its source")
    depth, start = 1, head.end()
    for i in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        if depth == 0:
            return source[start:i]
    raise ValueError(f"RawKernel {name}: its parameter list is not closed")


def _resolve(words: list[str], typedefs: dict[str, str], kernel: str, text: str) -> np.dtype:
    for _ in range(8):  # typedefs of typedefs
        if len(words) == 1 and words[0] in typedefs:
            words = typedefs[words[0]].split()
        else:
            break
    key = " ".join(sorted(w for w in words if w not in _QUALIFIERS))
    if key not in _C_TYPES:
        raise ValueError(f"RawKernel {kernel}: parameter `{text}`: the double does not know "
                         f"the C type {' '.join(words)!r}")
    return np.dtype(_C_TYPES[key])


def kernel_parameters(source: str, name: str) -> list[Parameter]:
    """The parameters of kernel `name` in CUDA C `source`, in order."""
    typedefs = {alias: target.strip() for target, alias in _TYPEDEF.findall(source)}
    text = _signature_text(source, name).strip()
    if not text or text == "void":
        return []
    out = []
    for item in text.split(","):
        item = " ".join(item.split())
        stars = item.count("*") + item.count("&")
        words = item.replace("*", " ").replace("&", " ").split()
        if len(words) < 2 or "[" in item or "<" in item:
            raise ValueError(f"RawKernel {name}: cannot read parameter `{item}`")
        base = [w for w in words[:-1] if w not in _QUALIFIERS]
        if stars and base == ["void"]:
            dtype = None
        else:
            target = typedefs.get(base[0], "") if len(base) == 1 else ""
            stars += target.count("*")
            if target.count("*"):
                base = [w for w in target.replace("*", " ").split() if w not in _QUALIFIERS]
            dtype = _resolve(base, typedefs, name, item)
        out.append(Parameter(words[-1], " ".join(words[:-1]) + " *" * stars, dtype,
                             bool(stars)))
    return out


def _passed(value, is_device_array):
    """(pointer?, dtype or None, description) of what CuPy passes for `value`."""
    if value is None:
        return True, None, "None (a null pointer)"
    if is_device_array(value):
        return True, value.dtype, f"a {value.dtype} device array (a {value.dtype} pointer)"
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise TypeError(f"You are trying to pass a numpy.ndarray of shape {value.shape} as "
                            f"a kernel parameter. Only numpy.ndarrays of size one can be passed "
                            f"by value (CuPy's rule): copy it to the device first")
        return False, value.dtype, f"a one-element numpy array of {value.dtype}"
    kind = type(value)
    if kind is bool:
        return False, np.dtype(np.bool_), "a Python bool (CuPy passes bool)"
    if kind is int:
        dtype = np.dtype(np.uint64 if value >= 2**63 else np.int64)
        return False, dtype, f"a Python int (CuPy passes {dtype})"
    if kind is float:
        return False, np.dtype(np.float64), "a Python float (CuPy passes float64)"
    if kind is complex:
        return False, np.dtype(np.complex128), "a Python complex (CuPy passes complex128)"
    if isinstance(value, np.generic):
        return False, value.dtype, f"numpy.{value.dtype} (its own {value.dtype.itemsize} bytes)"
    raise TypeError(f"Unsupported type {kind} as a kernel argument")


def check_arguments(kernel: str, parameters: list[Parameter], args, is_device_array) -> None:
    """Raise TypeError unless each of `args` is what `parameters` take, as CuPy passes it."""
    if len(args) != len(parameters):
        raise TypeError(f"RawKernel {kernel}: {len(args)} arguments for {len(parameters)} "
                        f"parameters ({', '.join(p.name for p in parameters)})")
    for i, (value, param) in enumerate(zip(args, parameters)):
        pointer, dtype, what = _passed(value, is_device_array)
        wanted = f"parameter {i} `{param.c_type} {param.name}`"
        if pointer != param.pointer:
            raise TypeError(f"RawKernel {kernel}: {wanted} is "
                            f"{'a pointer' if param.pointer else 'a value'}, got {what}")
        if dtype is not None and param.dtype is not None and dtype != param.dtype:
            raise TypeError(f"RawKernel {kernel}: {wanted} takes "
                            f"{'a ' + str(param.dtype) + ' pointer' if pointer else param.dtype}"
                            f", got {what}")

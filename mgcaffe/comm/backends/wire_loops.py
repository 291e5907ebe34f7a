"""The wire's casts and host sum as compiled loops (numba), for the CPU.

Why: on a host the casts run on the communication thread, beside backward. numpy does the
float16 rounding in ten passes over the message (wire.f16_bits), and the host sum of the
payloads in a dozen more; on GoogleNet's 53.5 MB that is about 300 ms of CPU an iteration,
which on a host with one core is taken from backward. One loop per step does each in a
single pass, in a twentieth to a sixth of the time (the sum keeps a block of partial sums
in the L1 cache).

The results are the bits of wire.py's numpy functions (and of numpy's own casts): division
by the world size in float32, then rounding to nearest, ties to even; a finite value past
the format's range becomes inf, NaN stays a quiet NaN (float16 0x7E00, bfloat16 0x7FC0).
Sums widen each payload to float32 exactly, add in rank order and round once.

Payloads are uint16 bit patterns (a float16 array is viewed as uint16 by the caller).
`load()` imports numba on first use and returns the compiled functions, or None when numba
cannot be imported (wire.py then keeps its numpy functions).
"""

from __future__ import annotations

import types

import numpy as np

from ...cpu import compiled

#: Elements per block of a sum: a block's float32 partial sums stay in the L1 cache.
BLOCK = 2048

_U = np.uint32
F16, BF16 = 0, 1  # the `fmt` codes the loops take


def _as_f32(u):
    """The float32 whose bits are the uint32 `u` (a bit cast; compiled in `_compile`)."""
    return np.array([u], np.uint32).view(np.float32)[0]


def _as_u32(f):
    """The bits of the float32 `f` as a uint32 (a bit cast; compiled in `_compile`)."""
    return np.array([f], np.float32).view(np.uint32)[0]


def _f16(v):
    """float16 bits of the float32 `v`."""
    u = _as_u32(v)
    a = u & _U(0x7FFFFFFF)
    # rebias the exponent (127 -> 15, modulo 2**32) and round the 13 dropped bits
    normal = _U(a + _U(0xC8000FFF) + ((a >> _U(13)) & _U(1))) >> _U(13)
    # subnormal results: adding 0.5 rounds at float16's subnormal step (2**-24), leaving the
    # result in the low bits
    sub = _U(_as_u32(abs(v) + np.float32(0.5)) - _U(0x3F000000))
    past = _U(0x7E00) if a > _U(0x7F800000) else _U(0x7C00)  # NaN, else inf
    h = sub if a < _U(0x38800000) else (normal if a < _U(0x47800000) else past)
    return np.uint16(h | ((u >> _U(16)) & _U(0x8000)))


def _bf16(v):
    """bfloat16 bits of the float32 `v` (adding 0x7FFF plus the lowest kept bit rounds to
    nearest, ties to even, carrying into the exponent up to inf)."""
    u = _as_u32(v)
    rounded = np.uint16(_U(u + _U(0x7FFF) + ((u >> _U(16)) & _U(1))) >> _U(16))
    return np.uint16(0x7FC0) if (u & _U(0x7FFFFFFF)) > _U(0x7F800000) else rounded


def _f16_value(bits):
    """The float32 value of float16 bits (exact)."""
    h = _U(bits)
    o = (h & _U(0x7FFF)) << _U(13)
    e = o & _U(0x0F800000)
    sign = (h & _U(0x8000)) << _U(16)
    if e == _U(0):  # zero and subnormals: the mantissa times 2**-24, exact in float32
        small = np.float32(h & _U(0x3FF)) * np.float32(2.0 ** -24)
        return -small if sign else small
    # the exponent's bias, 15 -> 127; twice for inf and NaN (all-ones stays all-ones)
    return _as_f32((o + (_U(0x70000000) if e == _U(0x0F800000) else _U(0x38000000))) | sign)


def _bf16_value(bits):
    """The float32 value of bfloat16 bits (exact)."""
    return _as_f32(_U(bits) << _U(16))


def to_wire(src, divisor, fmt, out):
    """out = bits of format(src / divisor), src float32, out uint16 (both 1-D)."""
    if fmt == F16:
        for i in range(src.size):
            out[i] = _f16(src[i] / divisor)
    else:
        for i in range(src.size):
            out[i] = _bf16(src[i] / divisor)


def from_wire(src, fmt, out):
    """out (float32) = the values of the uint16 payload `src` (exact)."""
    if fmt == F16:
        for i in range(src.size):
            out[i] = _f16_value(src[i])
    else:
        for i in range(src.size):
            out[i] = _bf16_value(src[i])


def sum_wire(parts, fmt, out):
    """out = bits of format(parts[0] + parts[1] + ...), parts (ranks, n) uint16, summed in
    float32 in rank order and rounded once."""
    acc = np.empty(BLOCK, np.float32)
    for start in range(0, out.size, BLOCK):
        m = min(BLOCK, out.size - start)
        a = acc[:m]
        from_wire(parts[0, start:start + m], fmt, a)
        for r in range(1, parts.shape[0]):
            block = parts[r, start:start + m]
            if fmt == F16:
                for i in range(m):
                    a[i] += _f16_value(block[i])
            else:
                for i in range(m):
                    a[i] += _bf16_value(block[i])
        to_wire(a, np.float32(1), fmt, out[start:start + m])


def _bit_casts(numba):
    """(as_f32, as_u32): LLVM bit casts between float32 and uint32 (numba has no scalar
    view)."""
    from numba import types as nt  # noqa: PLC0415 - numba is optional at run time

    def cast(to, frm):
        def typer(typingctx, x):
            def codegen(context, builder, signature, args):
                return builder.bitcast(args[0], context.get_value_type(to))
            return to(frm), codegen
        return numba.extending.intrinsic(typer)

    return cast(nt.float32, nt.uint32), cast(nt.uint32, nt.float32)


def _compile(numba) -> types.SimpleNamespace:
    # Helpers first: the kernels call the compiled versions through the module globals.
    # error_model="numpy": the division needs no zero check (which would keep the loop from
    # being vectorised); the divisor is the world size.
    global _as_f32, _as_u32, _f16, _bf16, _f16_value, _bf16_value, to_wire, from_wire
    jit = lambda fn: compiled.jit(numba, fn, error_model="numpy")  # noqa: E731
    _as_f32, _as_u32 = _bit_casts(numba)
    _f16, _bf16, _f16_value, _bf16_value = map(jit, (_f16, _bf16, _f16_value, _bf16_value))
    to_wire, from_wire = jit(to_wire), jit(from_wire)
    return types.SimpleNamespace(to_wire=to_wire, from_wire=from_wire,
                                 sum_wire=jit(sum_wire))


load = compiled.loader(
    _compile, "The compiled loops (compiled on first call), or None without numba.")

"""Gradients on the wire in fewer bytes: float16 and bfloat16 payloads on host buffers.

A compressed message travels as 16-bit words (`wire_dtype`): float16 as numpy's float16,
bfloat16 as the upper half of a float32's bits in uint16 (numpy has no bfloat16). Casting
rounds to nearest, ties to even, in both formats; a value too large for the format becomes
inf (the data path then sends the message again in float32).

`to_wire(src, divisor, out)` divides by the world size while casting (the mean cannot
overflow where the sum of means does not); `from_wire(src, fmt, out)` casts back.
`sum_payloads(payloads, fmt)` is the reduction a host communicator does itself where MPI
has no datatype for the format: the payloads widened to float32, summed in rank order (every
rank gets the same bits), rounded once to the format. Summing two 16-bit values in float32
and rounding once gives the correctly rounded 16-bit sum (float32 has more than twice the
bits plus two), so two ranks get what an all-reduce in the format itself gives.

These three run as compiled loops (wire_loops.py) where numba imports, else as the numpy
functions below, with the same bits; `cast_path()` says which.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import wire_loops

__all__ = ["HOST_WIRES", "all_finite", "bf16_bits", "bf16_value", "cast_cost", "cast_path",
           "f16_bits", "f16_value", "from_wire", "sum_payloads", "to_wire", "wire_dtype"]

#: The wire formats a host (numpy) buffer can travel in.
HOST_WIRES = ("float32", "float16", "bfloat16")


def wire_dtype(fmt: str) -> np.dtype:
    """The numpy dtype a payload of format `fmt` is held in."""
    return np.dtype({"float16": np.float16, "bfloat16": np.uint16,
                     "float32": np.float32}[fmt])


def bf16_bits(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 `x` rounded to bfloat16 (nearest, ties to even), as uint16 bit patterns; NaN
    stays a (quiet) NaN, a finite value past bfloat16's largest becomes inf."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even, carrying into
    # the exponent where it must (up to inf)
    rounded = (u >> 16) & 1
    rounded += 0x7FFF
    rounded += u
    rounded >>= 16
    if out is None:
        out = np.empty(u.shape, np.uint16)
    np.copyto(out, rounded, casting="unsafe")
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_value(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """uint16 bfloat16 bit patterns as float32 values (exact)."""
    wide = bits.astype(np.uint32)
    wide <<= 16
    if out is None:
        return wide.view(np.float32)
    np.copyto(out, wide.view(np.float32))
    return out


def _ones_where(condition: np.ndarray) -> np.ndarray:
    """A uint32 mask: all ones where `condition` holds, else zero (chooses without a branch
    per element: a mixed mask costs what a uniform one does)."""
    mask = condition.view(np.uint8).astype(np.uint32)
    mask *= np.uint32(0xFFFFFFFF)
    return mask


def f16_bits(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to float16 (nearest, ties to even) into `out` (float16): the same
    bits as numpy's cast. numpy's cast takes a slow path for results below float16's
    smallest normal (2**-14), where a mean gradient's values mostly lie: 15-25 times slower
    than for normal values; here every value costs the same. Normal results rebias the
    exponent and round the 13 dropped bits; subnormal ones let a float32 add of 0.5 do the
    rounding; past the range, inf (NaN stays NaN)."""
    a = x.view(np.uint32) & np.uint32(0x7FFFFFFF)
    r = (a >> 13) & 1
    r += np.uint32(0xC8000FFF)  # ((15 - 127) << 23) + 0xFFF, modulo 2**32
    r += a
    r >>= 13
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN lanes: replaced below
        sub = np.abs(x) + np.float32(0.5)
    sub = sub.view(np.uint32)
    sub -= np.uint32(0x3F000000)
    sub ^= r
    sub &= _ones_where(a < np.uint32(0x38800000))
    r ^= sub
    big = a >= np.uint32(0x47800000)
    if big.any():
        r[big] = np.where(a[big] > np.uint32(0x7F800000), np.uint32(0x7E00), np.uint32(0x7C00))
    r |= (x.view(np.uint32) >> 16) & np.uint32(0x8000)
    np.copyto(out.view(np.uint16), r, casting="unsafe")
    return out


def f16_value(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 values as float32 (exact; numpy's cast is slow on subnormals, as above)."""
    h = bits.view(np.uint16).astype(np.uint32)
    o = h & np.uint32(0x7FFF)
    o <<= 13
    e = o & np.uint32(0x0F800000)
    o += np.uint32(0x38000000)  # the exponent's bias, 15 -> 127
    o += (e == np.uint32(0x0F800000)).view(np.uint8).astype(np.uint32) * np.uint32(0x38000000)
    # zero and subnormals: (1 + m/1024) * 2**-14 - 2**-14, exact in float32
    sub = (o + np.uint32(0x00800000)).view(np.float32) - np.float32(2.0 ** -14)
    sub = sub.view(np.uint32) ^ o
    sub &= _ones_where(e == 0)
    o ^= sub
    o |= (h & np.uint32(0x8000)) << 16
    if out is None:
        return o.view(np.float32)
    np.copyto(out, o.view(np.float32))
    return out


#: Elements cast per step: the float32 quotient of a step stays in the cache (dividing
#: straight into float16 goes through numpy's buffered cast: half again as slow).
CHUNK = 1 << 15


def cast_path() -> str:
    """Which functions cast and sum host payloads in this process, and why."""
    if wire_loops.load() is None:
        return "numpy (numba cannot be imported)"
    return "compiled loops (numba)"


def _code(fmt: str) -> int:
    return wire_loops.F16 if fmt == "float16" else wire_loops.BF16


def to_wire(src: np.ndarray, divisor: float, fmt: str, out: np.ndarray) -> None:
    """out = format(src / divisor): the float32 quotient, rounded once to `fmt`."""
    flat, dst = src.reshape(-1), out.reshape(-1)
    loops = wire_loops.load()
    if loops is not None:
        loops.to_wire(flat, np.float32(divisor), _code(fmt), dst.view(np.uint16))
        return
    quotient = np.empty(min(CHUNK, flat.size), np.float32)
    d = np.float32(divisor)
    with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN: caught after the sum
        for start in range(0, flat.size, CHUNK):
            stop = min(start + CHUNK, flat.size)
            q = quotient[:stop - start]
            np.divide(flat[start:stop], d, out=q)
            if fmt == "float16":
                f16_bits(q, dst[start:stop])
            else:
                bf16_bits(q, out=dst[start:stop])


def from_wire(src: np.ndarray, fmt: str, out: np.ndarray) -> None:
    """out (float32) = the payload's values (exact)."""
    if not out.flags.c_contiguous:  # reshape would copy, and the values would be lost
        raise ValueError("from_wire writes into a contiguous float32 buffer")
    flat, dst = src.reshape(-1), out.reshape(-1)
    loops = wire_loops.load()
    if loops is not None:
        loops.from_wire(flat.view(np.uint16), _code(fmt), dst)
        return
    for start in range(0, flat.size, CHUNK):
        stop = min(start + CHUNK, flat.size)
        if fmt == "float16":
            f16_value(flat[start:stop], out=dst[start:stop])
        else:
            bf16_value(flat[start:stop], out=dst[start:stop])


def all_finite(payload: np.ndarray, fmt: str) -> bool:
    """Whether every value of a payload is finite: no all-ones exponent (inf or NaN),
    tested on the 16-bit words (numpy's isfinite on float16 is ten times slower)."""
    mask = np.uint16(0x7C00 if fmt == "float16" else 0x7F80)
    words = payload.reshape(-1).view(np.uint16)
    return not bool(np.any((words & mask) == mask))


def _values(payload: np.ndarray, fmt: str) -> np.ndarray:
    return f16_value(payload) if fmt == "float16" else bf16_value(payload)


def sum_payloads(payloads: Any, fmt: str, out: np.ndarray | None = None) -> np.ndarray:
    """The payloads (a list, or the rows of a 2-D array; index = rank) summed in float32 in
    rank order and rounded to `fmt`, into `out` where given."""
    if out is None:
        out = np.empty(payloads[0].shape, wire_dtype(fmt))
    loops = wire_loops.load()
    if loops is not None:
        words = (payloads.view(np.uint16) if isinstance(payloads, np.ndarray)
                 else np.stack([p.reshape(-1).view(np.uint16) for p in payloads]))
        loops.sum_wire(words.reshape(len(payloads), -1), _code(fmt),
                       out.reshape(-1).view(np.uint16))
        return out
    total = _values(payloads[0], fmt).copy()
    for p in payloads[1:]:
        total += _values(p, fmt)
    if fmt == "float16":
        return f16_bits(total, out)
    return bf16_bits(total, out=out)


def cast_cost(formats, xp: Any = np, nbytes: int = 8 << 20, repeats: int = 5,
              sum_parts: int = 0) -> dict[str, float]:
    """Seconds per float32 byte to send a message through each compressed format's casts on
    this device, as the data paths do them: divide and cast in, the check of the reduced
    payload, cast back, and with `sum_parts` > 1 the host's sum of that many payloads of a
    block of the message (a rank's share of the reduction, where the communicator sums on
    the host). The fastest of `repeats` rounds over `nbytes`; CuPy: float16 only, the
    device synchronised after each round."""
    out = {}
    n = nbytes // 4
    x = xp.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    for fmt in formats:
        if fmt == "float32":
            continue
        best = float("inf")
        if xp is np:
            payload = np.empty(n, wire_dtype(fmt))
            back = np.empty(n, np.float32)
            block = n // max(sum_parts, 1)
            parts = payload[:block * sum_parts].reshape(sum_parts, block)
            summed = np.empty(block, payload.dtype)
            for _ in range(repeats):
                t0 = time.perf_counter()
                to_wire(x, 2, fmt, payload)
                if sum_parts > 1:
                    sum_payloads(parts, fmt, out=summed)
                all_finite(payload, fmt)
                from_wire(payload, fmt, back)
                best = min(best, time.perf_counter() - t0)
        else:
            payload = xp.empty(n, xp.float16)
            back = xp.empty(n, xp.float32)
            sync = xp.cuda.get_current_stream().synchronize
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                xp.divide(x, 2, out=payload)
                bool(xp.isfinite(payload).all())
                xp.copyto(back, payload)
                sync()
                best = min(best, time.perf_counter() - t0)
        out[fmt] = best / nbytes
    return out

"""Gradients on the wire in fewer bytes: float16 and bfloat16 payloads on host buffers.

A compressed message travels as 16-bit words (`wire_dtype`): float16 as numpy's float16,
bfloat16 as the upper half of a float32's bits in uint16 (numpy has no bfloat16). Casting
rounds to nearest, ties to even, in both formats; a value too large for the format becomes
inf (the data path then sends the message again in float32).

`to_wire(src, divisor, out)` divides by the world size while casting (the mean cannot
overflow where the sum of means does not); `from_wire(src, fmt, out)` casts back.
`sum_payloads(payloads, fmt)` is the reduction a host communicator does in numpy where MPI
has no datatype for the format: the payloads widened to float32, summed in rank order (every
rank gets the same bits), rounded once to the format. Summing two 16-bit values in float32
and rounding once gives the correctly rounded 16-bit sum (float32 has more than twice the
bits plus two), so two ranks get what an all-reduce in the format itself gives.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["HOST_WIRES", "all_finite", "bf16_bits", "bf16_value", "cast_cost", "from_wire",
           "sum_payloads", "to_wire", "wire_dtype"]

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


#: Elements cast per step: the float32 quotient of a step stays in the cache (dividing
#: straight into float16 goes through numpy's buffered cast: half again as slow).
CHUNK = 1 << 15


def to_wire(src: np.ndarray, divisor: float, fmt: str, out: np.ndarray) -> None:
    """out = format(src / divisor): the float32 quotient, rounded once to `fmt`."""
    flat, dst = src.reshape(-1), out.reshape(-1)
    quotient = np.empty(min(CHUNK, flat.size), np.float32)
    d = np.float32(divisor)
    with np.errstate(over="ignore"):  # past the format's range: inf, caught after the sum
        for start in range(0, flat.size, CHUNK):
            stop = min(start + CHUNK, flat.size)
            q = quotient[:stop - start]
            np.divide(flat[start:stop], d, out=q)
            if fmt == "float16":
                np.copyto(dst[start:stop], q, casting="same_kind")
            else:
                bf16_bits(q, out=dst[start:stop])


def from_wire(src: np.ndarray, fmt: str, out: np.ndarray) -> None:
    """out (float32) = the payload's values (exact)."""
    if fmt == "float16":
        np.copyto(out, src)
    else:
        bf16_value(src, out=out)


def all_finite(payload: np.ndarray, fmt: str) -> bool:
    """Whether every value of a payload is finite: no all-ones exponent (inf or NaN),
    tested on the 16-bit words (numpy's isfinite on float16 is ten times slower)."""
    mask = np.uint16(0x7C00 if fmt == "float16" else 0x7F80)
    words = payload.reshape(-1).view(np.uint16)
    return not bool(np.any((words & mask) == mask))


def _values(payload: np.ndarray, fmt: str) -> np.ndarray:
    return payload.astype(np.float32) if fmt == "float16" else bf16_value(payload)


def sum_payloads(payloads: list[Any], fmt: str) -> np.ndarray:
    """The payloads (index = rank) summed in float32 in rank order and rounded to `fmt`."""
    total = _values(payloads[0], fmt).copy()
    for p in payloads[1:]:
        total += _values(p, fmt)
    if fmt == "float16":
        with np.errstate(over="ignore"):
            return total.astype(np.float16)
    return bf16_bits(total)


def cast_cost(formats, xp: Any = np, nbytes: int = 8 << 20, repeats: int = 5
              ) -> dict[str, float]:
    """Seconds per float32 byte to send a message through each compressed format's casts on
    this device, as the data paths do them: divide and cast in, the check of the reduced
    payload, cast back (the fastest of `repeats` rounds over `nbytes`; CuPy: float16 only,
    the device synchronised after each round)."""
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
            for _ in range(repeats):
                t0 = time.perf_counter()
                to_wire(x, 2, fmt, payload)
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

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

from typing import Any

import numpy as np

__all__ = ["HOST_WIRES", "all_finite", "bf16_bits", "bf16_value", "from_wire",
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


def to_wire(src: np.ndarray, divisor: float, fmt: str, out: np.ndarray) -> None:
    """out = format(src / divisor): the float32 quotient, rounded once to `fmt`."""
    with np.errstate(over="ignore"):  # past the format's range: inf, caught after the sum
        if fmt == "float16":
            np.divide(src, np.float32(divisor), out=out, casting="same_kind")
            return
        bf16_bits(np.divide(src, np.float32(divisor), dtype=np.float32), out=out)


def from_wire(src: np.ndarray, fmt: str, out: np.ndarray) -> None:
    """out (float32) = the payload's values (exact)."""
    if fmt == "float16":
        np.copyto(out, src)
    else:
        bf16_value(src, out=out)


def all_finite(payload: np.ndarray, fmt: str) -> bool:
    """Whether every value of a payload is finite (no inf, no NaN)."""
    if fmt == "bfloat16":  # an all-ones exponent is inf or NaN
        return not bool(np.any((payload & 0x7F80) == 0x7F80))
    return bool(np.isfinite(payload).all())


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

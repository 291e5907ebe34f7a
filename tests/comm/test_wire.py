"""The casts and the host sum of the wire against numpy's own casts (float16) and an
independent rounding (bfloat16): the same bits for every 16-bit pattern, and for float32
inputs across the whole range, the subnormal results (where numpy's cast is slow and
gradients lie) included; both ways, the compiled loops and the numpy functions."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.comm.backends import wire, wire_loops
from mgcaffe.comm.backends.wire import (
    cast_cost,
    cast_path,
    from_wire,
    sum_payloads,
    to_wire,
    wire_dtype,
)


def numpy_half_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).view(np.uint16)


def same_half(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want.view(np.float16))
    assert np.isnan(got.view(np.float16)[nan]).all()
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]


def test_from_wire_refuses_a_buffer_it_cannot_write_in_place():
    with pytest.raises(ValueError, match="contiguous"):
        from_wire(np.zeros(8, np.float16), "float16", np.zeros(16, np.float32)[::2])


# -- the two ways the wire casts and sums: compiled loops (numba) and numpy, the same bits


@pytest.fixture(params=["loops", "numpy"])
def path(request, monkeypatch):
    """Which functions cast and sum: the compiled loops, or numpy's (numba absent)."""
    if request.param == "numpy":
        monkeypatch.setattr(wire_loops, "load", lambda: None)
    elif wire_loops.load() is None:
        pytest.skip("numba cannot be imported here: no compiled loops to check")
    return request.param


def test_cast_path_names_the_functions_in_use(path):
    assert cast_path().startswith({"loops": "compiled loops", "numpy": "numpy"}[path])
    if path == "numpy":
        assert "numba cannot be imported" in cast_path()


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits by frexp/rint (independent of the code's bit arithmetic): 8
    significant bits, ties to even, below float32's smallest normal a fixed step of
    2**-133; past the range inf; NaN a quiet NaN."""
    x64 = x.astype(np.float64)
    m, e = np.frexp(x64)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.ldexp(np.rint(m * 256.0) / 256.0, e)
        r = np.where(np.abs(x64) < 2.0 ** -126, np.rint(x64 * 2.0 ** 133) / 2.0 ** 133, r)
        r = r.astype(np.float32)
    bits = (r.view(np.uint32) >> 16).astype(np.uint16)
    bits[np.isnan(x)] = 0x7FC0
    return bits


@pytest.mark.parametrize("sign", [0, 0x80000000])
def test_to_wire_rounds_as_numpy_over_the_half_range(path, sign):
    # every 5th float32 pattern from below half's smallest subnormal to past its largest
    # value: subnormal results, the ties, the carry into the exponent, overflow to inf
    bits = np.arange(0x32000000, 0x47900000, 5, dtype=np.uint64).astype(np.uint32) | sign
    x = bits.view(np.float32)
    payload = np.empty(x.size, np.float16)
    to_wire(x, 1, "float16", payload)
    same_half(payload.view(np.uint16), numpy_half_bits(x))


def test_to_wire_rounds_random_patterns_and_the_edges_as_numpy(path):
    rng = np.random.default_rng(5)
    bits = np.concatenate([
        rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
        np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                  0x477FEFFF, 0x477FF000, 0x47800000, 0x38800000, 0x387FFFFF, 0x33000000,
                  0x33000001, 0x32FFFFFF, 0x00000001, 0x807FFFFF], np.uint32)])
    x = bits.view(np.float32)
    payload = np.empty(x.size, np.float16)
    to_wire(x, 1, "float16", payload)
    same_half(payload.view(np.uint16), numpy_half_bits(x))


def test_to_wire_divides_in_float32_before_rounding_once(path):
    rng = np.random.default_rng(7)
    edges = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                      0x477FEFFF, 0x47800000, 0x38800000, 0x387FFFFF, 0x33000001,
                      0x00000001, 0x7F7FFFFF], np.uint32).view(np.float32)
    x = np.concatenate([rng.standard_normal(300_001).astype(np.float32) * 1e-4,
                        rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32), edges])
    for divisor in (3, 8):
        with np.errstate(over="ignore", invalid="ignore"):
            q = x / np.float32(divisor)
        half = np.empty(x.size, np.float16)
        to_wire(x, divisor, "float16", half)
        same_half(half.view(np.uint16), numpy_half_bits(q))
        brain = np.empty(x.size, np.uint16)
        to_wire(x, divisor, "bfloat16", brain)
        want = bf16_reference(q)
        assert (brain == want).all(), np.flatnonzero(brain != want)[:5]


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_from_wire_is_exact_for_every_16_bit_pattern(path, fmt):
    words = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = np.empty(words.size, np.float32)
    from_wire(words.view(wire_dtype(fmt)), fmt, got)
    if fmt == "float16":
        want = words.view(np.float16).astype(np.float32)
    else:
        want = (words.astype(np.uint32) << 16).view(np.float32)
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_sum_payloads_widens_adds_in_rank_order_and_rounds_once(path, fmt, ranks):
    rng = np.random.default_rng(ranks)
    grads = [(rng.standard_normal(50_001) * s).astype(np.float32)
             for s in (1e-6, 1.0, 3e4)[:ranks]]
    payloads = []
    for g in grads:
        p = np.empty(g.size, wire_dtype(fmt))
        to_wire(g, ranks, fmt, p)
        payloads.append(p)
    # the reference: widened by numpy (float16) or a shift (bfloat16), float32 adds in rank
    # order, rounded by numpy's cast (float16) or frexp/rint (bfloat16)
    widen = ((lambda p: p.astype(np.float32)) if fmt == "float16"
             else (lambda p: (p.astype(np.uint32) << 16).view(np.float32)))
    total = widen(payloads[0])
    for p in payloads[1:]:
        total = total + widen(p)
    want = numpy_half_bits(total) if fmt == "float16" else bf16_reference(total)
    for given in (payloads, np.stack(payloads)):  # a list, or the rows of an array
        got = sum_payloads(given, fmt).view(np.uint16)
        same_half(got, want) if fmt == "float16" else np.testing.assert_array_equal(got, want)
    out = np.empty(grads[0].size, wire_dtype(fmt))
    assert sum_payloads(payloads, fmt, out=out) is out
    assert (out.view(np.uint16) == want).all()


def test_cast_cost_counts_the_host_sum_when_asked(path, monkeypatch):
    sums = []
    real = wire.sum_payloads
    monkeypatch.setattr(wire, "sum_payloads",
                        lambda parts, fmt, out=None: sums.append(parts.shape) or real(
                            parts, fmt, out=out))
    plain = cast_cost(("float16",), nbytes=1 << 20, repeats=2)
    assert sums == [] and plain["float16"] > 0
    summed = cast_cost(("float16", "bfloat16"), nbytes=1 << 20, repeats=2, sum_parts=2)
    # each round sums the 2 ranks' payloads of a block of the message, once per format
    assert sums == [(2, (1 << 18) // 2)] * 4 and set(summed) == {"float16", "bfloat16"}

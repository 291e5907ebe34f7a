"""The float16 casts of the wire (wire.f16_bits, wire.f16_value) against numpy's own casts:
the same bits for every float16 pattern, and for float32 inputs across the whole range,
the subnormal results (where numpy's cast is slow and gradients lie) included."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.comm.backends.wire import f16_bits, f16_value, from_wire, to_wire


def numpy_half_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).view(np.uint16)


def same_half(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want.view(np.float16))
    assert np.isnan(got.view(np.float16)[nan]).all()
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, [(hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]


@pytest.mark.parametrize("sign", [0, 0x80000000])
def test_f16_bits_rounds_as_numpy_over_the_half_range(sign):
    # every 5th float32 pattern from below half's smallest subnormal to past its largest
    # value: subnormal results, the ties, the carry into the exponent, overflow to inf
    bits = np.arange(0x32000000, 0x47900000, 5, dtype=np.uint64).astype(np.uint32) | sign
    x = bits.view(np.float32)
    same_half(f16_bits(x, np.empty(x.size, np.float16)).view(np.uint16), numpy_half_bits(x))


def test_f16_bits_on_random_patterns_and_the_edges():
    rng = np.random.default_rng(5)
    bits = np.concatenate([
        rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32),
        np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                  0x477FEFFF, 0x477FF000, 0x47800000, 0x38800000, 0x387FFFFF, 0x33000000,
                  0x33000001, 0x32FFFFFF, 0x00000001, 0x807FFFFF], np.uint32)])
    x = bits.view(np.float32)
    same_half(f16_bits(x, np.empty(x.size, np.float16)).view(np.uint16), numpy_half_bits(x))


def test_f16_value_is_numpy_for_every_half_pattern():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = h.view(np.float16).astype(np.float32)
    got = f16_value(h)
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_a_gradient_of_small_values_goes_through_the_wire_as_numpy_casts_it():
    g = (np.random.default_rng(1).standard_normal(100_003) * 1e-5).astype(np.float32)
    payload = np.empty(g.size, np.float16)
    to_wire(g, 2, "float16", payload)
    assert (payload.view(np.uint16) == numpy_half_bits(g / np.float32(2))).all()
    back = np.empty(g.size, np.float32)
    from_wire(payload, "float16", back)
    np.testing.assert_array_equal(back, payload.astype(np.float32))


def test_from_wire_refuses_a_buffer_it_cannot_write_in_place():
    with pytest.raises(ValueError, match="contiguous"):
        from_wire(np.zeros(8, np.float16), "float16", np.zeros(16, np.float32)[::2])

"""kernels.scale_loops: the Scale layer's rows, against numpy and sums written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mgcaffe.kernels.loops import scale as scale_loops

loops = scale_loops.load()
pytestmark = pytest.mark.skipif(loops is None, reason="numba is not importable")


def rows(seed, shape=(6, 37), dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_is_numpys_multiply_then_add_on_the_rows_asked(dtype, keep, bias):
    x = rows(1, dtype=dtype)
    s, b = rows(2, (6,), dtype), rows(3, (6,), dtype)
    y = np.full_like(x, 7.0)
    copy = np.full_like(x, 9.0)
    loops.forward(x, y, copy, s, b, keep, bias, 2, 5)
    expected = x * s[:, None]
    if bias:
        expected = expected + b[:, None]
    np.testing.assert_array_equal(y[2:5], expected[2:5])
    assert (y[:2] == 7).all() and (y[5:] == 7).all()
    if keep:
        np.testing.assert_array_equal(copy[2:5], x[2:5])
    assert (copy[:2] == 9).all() and (copy[5:] == 9).all() and (keep or (copy == 9).all())


def test_forward_in_place_keeps_the_input():
    x = rows(4)
    original = x.copy()
    s, b = rows(5, (6,)), rows(6, (6,))
    copy = np.empty_like(x)
    loops.forward(x, x, copy, s, b, True, True, 0, 6)
    np.testing.assert_array_equal(copy, original)
    np.testing.assert_array_equal(x, original * s[:, None] + b[:, None])


@pytest.mark.parametrize("inner", [1, 3, 37, 3136])
def test_backward_sums_in_float64_and_writes_the_bottom_diff_in_place(inner):
    dy, x = rows(7, (5, inner)), rows(8, (5, inner))
    dy *= 1e3  # large and small terms: float32 sums would lose digits
    dy[:, ::7] *= 1e-6
    s = rows(9, (5,))
    bias_sum, scale_sum = np.full(5, np.nan), np.full(5, np.nan)
    expected_bias = [math.fsum(float(v) for v in row) for row in dy[1:4]]
    expected_scale = [math.fsum(float(g) * float(v) for g, v in zip(gr, xr))
                      for gr, xr in zip(dy[1:4], x[1:4])]
    expected_dx = dy * s[:, None]
    original = dy.copy()
    loops.backward(dy, x, dy, s, bias_sum, scale_sum, True, True, True, 1, 4)
    np.testing.assert_allclose(bias_sum[1:4], expected_bias, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(scale_sum[1:4], expected_scale, rtol=1e-12, atol=1e-9)
    assert np.isnan(bias_sum[[0, 4]]).all() and np.isnan(scale_sum[[0, 4]]).all()
    np.testing.assert_array_equal(dy[1:4], expected_dx[1:4])  # dx was dy: read first
    np.testing.assert_array_equal(dy[[0, 4]], original[[0, 4]])


def test_backward_skips_what_is_not_wanted():
    dy, x, s = rows(10), rows(11), rows(12, (6,))
    dx = np.full_like(dy, 5.0)
    bias_sum, scale_sum = np.full(6, np.nan), np.full(6, np.nan)
    loops.backward(dy, x, dx, s, bias_sum, scale_sum, False, True, False, 0, 6)
    assert np.isnan(bias_sum).all() and (dx == 5).all()
    expected = [math.fsum(float(g) * float(v) for g, v in zip(gr, xr)) for gr, xr in zip(dy, x)]
    np.testing.assert_allclose(scale_sum, expected, rtol=1e-12, atol=1e-12)

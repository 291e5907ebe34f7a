"""kernels.gemm: c += a @ b inside the BLAS, against float64 products computed here."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.kernels import gemm


def reference(a, b, c):
    return c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
@pytest.mark.parametrize("a_t, b_t", [(False, False), (True, False), (False, True),
                                      (True, True)])
def test_accumulates_for_every_operand_layout(dtype, tol, a_t, b_t):
    rng = np.random.default_rng(1)
    m, k, n = 7, 13, 5
    a = rng.standard_normal((k, m) if a_t else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if b_t else (k, n)).astype(dtype)
    a, b = (a.T if a_t else a), (b.T if b_t else b)
    c = rng.standard_normal((m, n)).astype(dtype)
    expected = reference(a, b, c)
    gemm.gemm_accumulate(a, b, c)
    np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)


def test_the_blas_is_called_directly_where_numpy_bundles_openblas():
    from threadpoolctl import threadpool_info

    numpy_openblas = any(i.get("internal_api") == "openblas" and "numpy" in i["filepath"]
                         for i in threadpool_info())
    if not numpy_openblas:
        pytest.skip("this numpy does not bundle OpenBLAS: the fallback path is used")
    assert gemm.available(np.float32) and gemm.available(np.float64)


def test_views_strided_operands_and_other_dtypes_take_the_fallback():
    rng = np.random.default_rng(2)
    big = rng.standard_normal((10, 12)).astype(np.float32)
    a = big[::2, ::3]                       # neither row- nor column-major
    b = rng.standard_normal((4, 3)).astype(np.float32)
    c = np.ones((5, 3), np.float32)
    expected = reference(a, b, c)
    used = []
    gemm.gemm_accumulate(a, b, c, scratch=lambda shape: used.append(shape) or
                         np.empty(shape, np.float32))
    np.testing.assert_allclose(c, expected, rtol=1e-5)
    assert used == [(5, 3)]
    ci = np.zeros((2, 2), np.int64)
    gemm.gemm_accumulate(np.ones((2, 3), np.int64), np.ones((3, 2), np.int64), ci)
    assert (ci == 3).all()
    # a row slice of a bigger buffer is still a row-major operand (leading dim 12)
    c2 = np.zeros((3, 2), np.float32)
    gemm.gemm_accumulate(big[1:4, :4], b[:, :2], c2)
    np.testing.assert_allclose(c2, big[1:4, :4].astype(np.float64) @ b[:, :2], rtol=1e-5)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="gemm_accumulate: shapes"):
        gemm.gemm_accumulate(np.ones((2, 3)), np.ones((4, 2)), np.ones((2, 2)))


@pytest.mark.parametrize("strided", [False, True], ids=["blas", "fallback"])
def test_overwrite_ignores_the_old_values(strided):
    """overwrite=True (beta = 0): c = a @ b, whatever c held (NaN here), on both paths."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((12, 18)).astype(np.float32)
    a = big[::2, ::3] if strided else big[:6, :6].copy()
    b = rng.standard_normal((6, 4)).astype(np.float32)
    c = np.full((6, 4), np.nan, np.float32)
    used = []
    gemm.gemm_accumulate(a, b, c, scratch=lambda shape: used.append(shape) or
                         np.empty(shape, np.float32), overwrite=True)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5)
    assert used == []  # no scratch: the product goes straight into c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_stack_gives_each_slice_the_bits_of_gemm_accumulate(dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 2, 5, 6)).astype(dtype)
    b = rng.standard_normal((3, 2, 7, 6)).astype(dtype).transpose(0, 1, 3, 2)  # column-major
    c = rng.standard_normal((2, 3, 5, 7)).astype(dtype)
    before = c.copy()
    expected = c.copy()
    stack = gemm.GemmStack(a, b, c.transpose(1, 0, 2, 3))  # c's slices indexed the other way
    for i in range(3):
        for j in range(2):
            stack((i, j), (i, j), (i, j), overwrite=i == 1)
            gemm.gemm_accumulate(a[i, j], b[i, j], expected[j, i], None, i == 1)
    assert np.array_equal(c, expected)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for i, old in ((1, 0.0), (2, before[:, 2])):  # slice 1 overwritten, slice 2 accumulated
        want = old + np.einsum("jmk,jkn->jmn", a[i].astype(np.float64), b[i].astype(np.float64))
        np.testing.assert_allclose(c[:, i], want, rtol=tol, atol=tol)


def test_a_stack_checks_its_slices_and_falls_back_where_the_blas_cannot_run():
    a = np.ones((2, 3, 4), np.float32)
    stack = gemm.GemmStack(a, np.ones((2, 4, 5), np.float32), np.zeros((2, 3, 5), np.float32))
    with pytest.raises(IndexError, match=r"slice \(2,\)"):
        stack(2, 0, 0)
    with pytest.raises(IndexError, match="slice"):
        stack((0, 0), 0, 0)
    with pytest.raises(ValueError, match="slices"):
        gemm.GemmStack(a, np.ones((2, 5, 5), np.float32), np.zeros((2, 3, 5), np.float32))
    ci = np.zeros((2, 2, 2), np.int64)
    ints = gemm.GemmStack(np.ones((2, 2, 3), np.int64), np.ones((1, 3, 2), np.int64), ci)
    ints(1, 0, 1)
    assert (ci[1] == 3).all() and (ci[0] == 0).all()

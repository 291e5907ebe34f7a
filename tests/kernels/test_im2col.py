"""im2col / col2im against naive loops, over a grid of kernel, pad, stride and dilation."""

from __future__ import annotations

import numpy as np
import pytest
from im2col_reference import GEOMETRIES, naive_col2im, naive_im2col

from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.kernels.im2col import col2im, col2im_batch_last, im2col, im2col_batch_last, valid_range

#: Splits every minibatch into one-sample chunks run on three threads.
THREADED = ChunkRunner(3, chunk_elements=1, serial_below=0)

@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_im2col_matches_naive(geometry, dtype):
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 6)).astype(dtype)
    col = im2col(x, *geometry)
    assert col.dtype == dtype
    np.testing.assert_array_equal(col, naive_im2col(x, *geometry))


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_col2im_matches_naive(geometry):
    shape = (2, 3, 7, 6)
    expected_cols = naive_im2col(np.zeros(shape), *geometry).shape
    col = np.random.default_rng(1).standard_normal(expected_cols)
    np.testing.assert_allclose(col2im(col, shape, *geometry),
                               naive_col2im(col, shape, *geometry), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_reused_buffers_are_fully_rewritten(geometry):
    """Stale values in `out`/`padded` (another input's, or garbage) never leak through."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 7, 6))
    col = im2col(x, *geometry)
    out = rng.standard_normal(col.shape)
    (ph, pw) = geometry[1]
    padded = rng.standard_normal((2, 3, 7 + 2 * ph, 6 + 2 * pw))
    im2col(x, *geometry, out=out, padded=padded if (ph, pw) != (0, 0) else None)
    np.testing.assert_array_equal(out, col)
    image = rng.standard_normal(x.shape)
    col2im(col, x.shape, *geometry, out=image)
    np.testing.assert_allclose(image, col2im(col, x.shape, *geometry))


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_threaded_chunks_give_the_same_bits(geometry):
    """Samples split over threads: every column and image cell as in one call (same sums in
    the same order), reused buffers included."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 3, 7, 6)).astype(np.float32)
    (ph, pw) = geometry[1]
    padded = None if (ph, pw) == (0, 0) else np.full((5, 3, 7 + 2 * ph, 6 + 2 * pw), np.nan,
                                                     dtype=np.float32)
    expected = naive_im2col(x, *geometry)
    out = np.full(expected.shape, np.nan, dtype=np.float32)
    assert im2col(x, *geometry, out=out, padded=padded, runner=THREADED) is out
    np.testing.assert_array_equal(out, expected)
    col = rng.standard_normal(expected.shape).astype(np.float32)
    image = np.full(x.shape, np.nan, dtype=np.float32)
    col2im(col, x.shape, *geometry, out=image, runner=THREADED)
    np.testing.assert_array_equal(image, col2im(col, x.shape, *geometry,
                                                runner=ChunkRunner(1)))
    np.testing.assert_allclose(image, naive_col2im(col.astype(np.float64), x.shape, *geometry),
                               rtol=1e-5, atol=1e-5)


def batch_last_columns(col, n):
    """NCHW-ordered columns (rows, N*P) reordered to (rows, P*N)."""
    rows = col.shape[0]
    return np.ascontiguousarray(col.reshape(rows, n, -1).transpose(0, 2, 1)).reshape(rows, -1)


@pytest.mark.parametrize("runner", [None, THREADED])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_batch_last_layout_matches_naive(geometry, runner):
    """Batch-last columns hold the naive columns in (H_out, W_out, N) order; col2im from them
    gives col2im's bits (same sums, same order); stale scratch never leaks through."""
    rng = np.random.default_rng(5)
    shape = (3, 2, 7, 6)
    x = rng.standard_normal(shape).astype(np.float32)
    (ph, pw) = geometry[1]
    image = np.full((2, 7 + 2 * ph, 6 + 2 * pw, 3), np.nan, dtype=np.float32)
    expected = batch_last_columns(naive_im2col(x, *geometry), 3)
    out = np.full(expected.shape, np.nan, dtype=np.float32)
    assert im2col_batch_last(x, *geometry, out=out, image=image, runner=runner) is out
    np.testing.assert_array_equal(out, expected)
    col = rng.standard_normal(expected.shape).astype(np.float32)
    # The same columns in NCHW order: (rows, P, N) -> (rows, N, P).
    nchw_col = np.ascontiguousarray(col.reshape(col.shape[0], -1, 3).transpose(0, 2, 1))
    nchw_col = nchw_col.reshape(col.shape)
    back = np.full(shape, np.nan, dtype=np.float32)
    image[...] = np.nan
    col2im_batch_last(col, shape, *geometry, out=back, image=image, runner=runner)
    np.testing.assert_array_equal(back, col2im(nchw_col, shape, *geometry))
    np.testing.assert_allclose(back, naive_col2im(nchw_col.astype(np.float64), shape,
                                                  *geometry), rtol=1e-5, atol=1e-5)


def test_batch_last_shape_errors():
    x = np.zeros((2, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="im2col_batch_last: out has shape"):
        im2col_batch_last(x, (3, 3), out=np.zeros((9, 5), np.float32))
    with pytest.raises(ValueError, match="im2col_batch_last: image has shape"):
        im2col_batch_last(x, (3, 3), image=np.zeros((1, 4, 4, 1), np.float32))
    with pytest.raises(ValueError, match="col2im_batch_last: col has shape"):
        col2im_batch_last(np.zeros((9, 5), np.float32), x.shape, (3, 3))


def test_col2im_is_the_adjoint_of_im2col():
    rng = np.random.default_rng(3)
    geometry = ((3, 2), (1, 2), (2, 1), (2, 1))
    x = rng.standard_normal((3, 2, 9, 8))
    cols = im2col(x, *geometry)
    y = rng.standard_normal(cols.shape)
    assert np.isclose(np.sum(cols * y), np.sum(x * col2im(y, x.shape, *geometry)))


def test_kernel_larger_than_padded_reach_rows_read_nothing():
    # Offsets whose every window lands in the padding give zero rows.
    x = np.ones((1, 1, 2, 2))
    col = im2col(x, (5, 5), (2, 2), (3, 3), (1, 1))
    np.testing.assert_array_equal(col, naive_im2col(x, (5, 5), (2, 2), (3, 3), (1, 1)))


@pytest.mark.parametrize("size,out_size,pad,stride,offset", [
    (7, 4, 1, 2, 0), (7, 4, 1, 2, 3), (5, 3, 2, 3, 0), (2, 1, 2, 3, 4), (6, 6, 0, 1, 0)])
def test_valid_range(size, out_size, pad, stride, offset):
    o0, o1, first = valid_range(size, out_size, pad, stride, offset)
    valid = [o for o in range(out_size) if 0 <= o * stride - pad + offset < size]
    assert list(range(o0, max(o0, o1))) == valid
    if valid:
        assert first == valid[0] * stride - pad + offset


def test_shape_errors():
    with pytest.raises(ValueError, match="expected"):
        im2col(np.zeros((1, 1, 4, 4)), (3, 3), out=np.zeros((9, 5)))
    with pytest.raises(ValueError, match="expected"):
        col2im(np.zeros((9, 5)), (1, 1, 4, 4), (3, 3))

"""LRN's compiled loops (kernels/loops/lrn.py): against a float64 reference written here,
against the numpy path in float32, gradients, threads, and the fallback without numba."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.kernels.loops import lrn as lrn_loops
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

pytest.importorskip("numba", reason="the compiled LRN loops need numba")

# lrn_param text, bottom shape: local_size 5 with channels fewer than the window, one
# interior channel, many; local_size 3 and 7 (the generic window); a beta other than 0.75.
CASES = [
    ("local_size: 5 alpha: 1.5 beta: 0.75", (1, 2, 3, 4)),
    ("local_size: 5 alpha: 2 beta: 0.75 k: 2", (3, 5, 2, 3)),
    ("local_size: 5 alpha: 0.0001 beta: 0.75", (3, 11, 4, 5)),
    ("local_size: 3 alpha: 1 beta: 0.75", (1, 6, 3, 3)),
    ("local_size: 7 alpha: 3 beta: 0.6 k: 1.5", (3, 9, 2, 5)),
]


def reference(x, size, alpha, beta, k, dtop):
    """(top, bottom diff) in float64 by explicit channel windows: the forward from Caffe's
    formula, the backward by differentiating top[j] = x[j] * s[j]^-beta with
    ds[j]/dx[i] = 2 * alpha / size * x[i] for i in j's window."""
    x, dtop = x.astype(np.float64), dtop.astype(np.float64)
    c, half = x.shape[1], (size - 1) // 2
    scale = np.empty_like(x)
    for j in range(c):
        window = x[:, max(0, j - half):j + half + 1]
        scale[:, j] = k + alpha / size * (window ** 2).sum(axis=1)
    top = x * scale ** -beta
    diff = dtop * scale ** -beta
    for i in range(c):
        for j in range(max(0, i - half), min(c, i + half + 1)):
            diff[:, i] += (dtop[:, j] * x[:, j] * -beta * scale[:, j] ** (-beta - 1)
                           * 2 * alpha / size * x[:, i])
    return top, diff


def lrn(text, shape, dtype, compiled, threads=1):
    param = text_format.Parse(f'name: "norm" type: "LRN" lrn_param {{ {text} }}',
                              caffe_pb2.LayerParameter())
    runner = ChunkRunner(threads, chunk_elements=64, serial_below=0, adaptive=False)
    rules = changed(lrn={"compiled": compiled})
    layer = create_layer(param, LayerContext(dtype=dtype, seed=0, chunk_runner=runner,
                                             rules=rules))
    bottom, top = Blob(shape, dtype=dtype, name="x"), Blob((), dtype=dtype, name="y")
    return layer, bottom, top


def run(text, x, dtop, compiled, threads=1):
    layer, bottom, top = lrn(text, x.shape, x.dtype, compiled, threads)
    bottom.data[...] = x
    layer.setup([bottom], [top])
    assert (layer._loops is not None) == compiled
    layer.forward([bottom], [top])
    top.diff[...] = dtop
    bottom.diff[...] = np.nan  # stale: must be overwritten everywhere
    layer.backward([top], [True], [bottom])
    return top.data.copy(), bottom.diff.copy()


def inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)


def params(text):
    p = text_format.Parse(text, caffe_pb2.LRNParameter())
    return p.local_size, p.alpha, p.beta, p.k


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("text,shape", CASES)
def test_compiled_matches_float64_reference(text, shape, dtype, rtol):
    x, dtop = inputs(shape, dtype)
    for threads in (1, 2):
        top, diff = run(text, x, dtop, True, threads)
        want_top, want_diff = reference(x, *params(text), dtop)
        np.testing.assert_allclose(top, want_top, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(diff, want_diff, rtol=rtol * 10,
                                   atol=rtol * 10 * np.abs(want_diff).max())


@pytest.mark.parametrize("text,shape", CASES)
def test_compiled_matches_numpy_in_float32(text, shape):
    x, dtop = inputs(shape, np.float32, seed=2)
    (top_a, diff_a), (top_b, diff_b) = (run(text, x, dtop, c, 2) for c in (False, True))
    if "beta: 0.75" in text:
        # scale^-0.75 by square roots: within 4 ulps of pow (the sums and scales are equal)
        np.testing.assert_allclose(top_b, top_a, rtol=4 * 2.0 ** -23, atol=0)
        np.testing.assert_allclose(diff_b, diff_a, rtol=1e-6,
                                   atol=1e-6 * np.abs(diff_a).max())
    else:  # pow in both: the same operations in the same order
        np.testing.assert_array_equal(top_b, top_a)
        np.testing.assert_array_equal(diff_b, diff_a)


@pytest.mark.parametrize("text,shape", [CASES[0], CASES[2], CASES[4]])
def test_compiled_gradients(text, shape):
    layer, bottom, top = lrn(text, shape, np.float64, True)
    bottom.data[...] = np.random.default_rng(4).standard_normal(shape)
    layer.setup([bottom], [top])
    assert layer._loops is not None
    check_layer_gradients(layer, [bottom], [top], max_checks=60)


def test_within_channel_keeps_the_numpy_path():
    layer, bottom, top = lrn("local_size: 3 norm_region: WITHIN_CHANNEL", (1, 2, 3, 3),
                             np.float32, True)
    layer.setup([bottom], [top])
    assert layer._loops is None


def test_without_numba_the_numpy_path_runs(monkeypatch, untried):
    """numba missing: `load` gives None and the layer keeps its numpy passes."""
    untried(lrn_loops)  # load() tries the import anew
    monkeypatch.setitem(sys.modules, "numba", None)    # `import numba` raises ImportError
    assert lrn_loops.load() is None
    text = CASES[2][0]
    x, dtop = inputs((2, 7, 3, 3), np.float64, seed=5)
    layer, bottom, top = lrn(text, x.shape, np.float64, True)
    bottom.data[...] = x
    layer.setup([bottom], [top])
    assert layer._loops is None and layer.rules.compiled
    assert layer.choice.path == "passes" and "no compiled loops" in layer.choice.reason
    layer.forward([bottom], [top])
    np.testing.assert_allclose(top.data, reference(x, *params(text), dtop)[0], rtol=1e-13)

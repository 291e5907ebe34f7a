"""LRN: both regions against naive loops (Caffe's formulas), gradients, errors; every test on
the compiled loops (ACROSS_CHANNELS, where numba imports) and on the numpy passes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients
from gradient_check import make_layer as _make_layer
from layer_rules import changed

from mgcaffe.errors import LayerError
from mgcaffe.kernels.loops import lrn as lrn_loops
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.proto import caffe_pb2


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def lrn_path(request):
    """Every test runs on the compiled loops and on the numpy passes."""
    if request.param == "compiled" and lrn_loops.load() is None:
        pytest.skip("the compiled LRN loops need numba")
    _RULES[0] = changed(lrn={"compiled": request.param == "compiled"})
    yield request.param
    _RULES[0] = LayerRules()


#: The rules this test's layers are built with (set by the `lrn_path` fixture).
_RULES = [LayerRules()]


def make_layer(*args, **kwargs):
    """gradient_check.make_layer under this test's rules."""
    return _make_layer(*args, rules=_RULES[0], **kwargs)


def lrn_param(body: str, name: str = "norm") -> caffe_pb2.LayerParameter:
    text = f'name: "{name}" type: "LRN" lrn_param {{ {body} }}'
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def naive_across(x, size, alpha, beta, k):
    n, c, h, w = x.shape
    half = (size - 1) // 2
    top = np.zeros_like(x)
    for ni, ci, y, z in itertools.product(range(n), range(c), range(h), range(w)):
        total = sum(x[ni, cc, y, z] ** 2 for cc in range(max(0, ci - half),
                                                        min(c, ci + half + 1)))
        top[ni, ci, y, z] = x[ni, ci, y, z] * (k + alpha / size * total) ** -beta
    return top


def naive_within(x, size, alpha, beta):
    """Caffe's composition: AVE pooling of x^2 (pad (size-1)/2, padding counted), power."""
    n, c, h, w = x.shape
    half = (size - 1) // 2
    top = np.zeros_like(x)
    for ni, ci, y, z in itertools.product(range(n), range(c), range(h), range(w)):
        total = 0.0
        for yy, zz in itertools.product(range(y - half, y + half + 1),
                                        range(z - half, z + half + 1)):
            if 0 <= yy < h and 0 <= zz < w:
                total += x[ni, ci, yy, zz] ** 2
        top[ni, ci, y, z] = x[ni, ci, y, z] * (1 + alpha * total / size ** 2) ** -beta
    return top


CASES = [
    # body, bottom shape
    ("local_size: 5 alpha: 0.0001 beta: 0.75", (2, 7, 3, 3)),  # AlexNet-like, tiny alpha
    ("local_size: 3 alpha: 1.5 beta: 0.6 k: 2", (2, 4, 2, 3)),
    ("local_size: 5 alpha: 2 beta: 0.75 k: 1.5", (1, 3, 3, 2)),  # window wider than C
    ("local_size: 1 alpha: 0.5 beta: 1.2", (1, 3, 2, 2)),
    ("local_size: 3 alpha: 1.2 beta: 0.75 k: 7 norm_region: WITHIN_CHANNEL", (2, 2, 4, 5)),
    ("local_size: 5 alpha: 3 beta: 0.5 norm_region: WITHIN_CHANNEL", (1, 2, 3, 6)),
]


def expected_top(layer, x):
    if layer.region == caffe_pb2.LRNParameter.ACROSS_CHANNELS:
        return naive_across(x, layer.size, layer.alpha, layer.beta, layer.k)
    return naive_within(x, layer.size, layer.alpha, layer.beta)


@pytest.mark.parametrize("body,shape", CASES)
def test_forward_matches_naive(body, shape, lrn_path):
    layer, bottom, top = make_layer(lrn_param(body), [shape])
    across = layer.region == caffe_pb2.LRNParameter.ACROSS_CHANNELS
    assert (layer._loops is not None) == (lrn_path == "compiled" and across)
    layer.forward(bottom, top)
    assert top[0].shape == shape
    np.testing.assert_allclose(top[0].data, expected_top(layer, bottom[0].data), rtol=1e-12)


def test_within_channel_ignores_k():
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4))
    tops = []
    for k in (1, 9):
        layer, bottom, top = make_layer(
            lrn_param(f"local_size: 3 alpha: 2 beta: 0.75 k: {k} norm_region: WITHIN_CHANNEL"),
            [x])
        layer.forward(bottom, top)
        tops.append(top[0].data.copy())
    np.testing.assert_array_equal(tops[0], tops[1])


@pytest.mark.parametrize("body,shape", CASES)
def test_gradients(body, shape):
    # Values of order 1 with a large alpha make the normalisation (not only x) matter.
    layer, bottom, top = make_layer(lrn_param(body), [shape], seed=4)
    check_layer_gradients(layer, bottom, top, max_checks=80)


def test_float32_matches_float64():
    x = np.random.default_rng(1).standard_normal((2, 6, 5, 5))
    body = "local_size: 5 alpha: 0.5 beta: 0.75"
    layer, bottom, top = make_layer(lrn_param(body), [x.astype(np.float32)], dtype=np.float32)
    layer.forward(bottom, top)
    assert top[0].data.dtype == np.float32
    np.testing.assert_allclose(top[0].data, naive_across(x, 5, 0.5, 0.75, 1.0), rtol=1e-5)


def test_bottom_diff_overwritten_and_propagate_down_respected():
    layer, bottom, top = make_layer(lrn_param("local_size: 3 alpha: 1 beta: 0.75"),
                                    [(1, 4, 3, 3)])
    layer.forward(bottom, top)
    top[0].diff[...] = 1.0
    bottom[0].diff[...] = 4.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(bottom[0].diff, 4.0)
    layer.backward(top, [True], bottom)
    first = bottom[0].diff.copy()
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(bottom[0].diff, first)


@pytest.mark.parametrize("body,shape,message", [
    ("local_size: 4", (1, 3, 2, 2), "odd values for local_size"),
    ("local_size: 3", (2, 3, 4), "must have 4 axes"),
])
def test_errors_name_the_layer(body, shape, message):
    with pytest.raises(LayerError, match=f"'bad_lrn'.*{message}"):
        make_layer(lrn_param(body, name="bad_lrn"), [shape])

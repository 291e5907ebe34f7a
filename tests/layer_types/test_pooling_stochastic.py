"""STOCHASTIC pooling: TRAIN picks against a naive sampler fed the same uniforms, TEST
weighting, gradients, and the pick frequencies following the values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.layer_types import TEST, TRAIN
from mgcaffe.proto import caffe_pb2


def param(body):
    text = f'name: "sp" type: "Pooling" pooling_param {{ pool: STOCHASTIC {body} }}'
    return text_format.Parse(text, caffe_pb2.LayerParameter())


def windows(x, k, s, out):
    """Caffe's stochastic windows: start at p*stride, clipped, no padding."""
    _, _, h, w = x.shape
    for ph, pw in itertools.product(range(out[0]), range(out[1])):
        yield ph, pw, [(r, c) for r in range(ph * s[0], min(ph * s[0] + k[0], h))
                       for c in range(pw * s[1], min(pw * s[1] + k[1], w))]


CASES = [("kernel_size: 2 stride: 2", (2, 3, 4, 4), (2, 2), (2, 2)),
         ("kernel_size: 3 stride: 2", (1, 2, 5, 6), (3, 3), (2, 2)),
         ("kernel_size: 3 stride: 2 pad: 1", (1, 2, 5, 5), (3, 3), (2, 2))]


@pytest.mark.parametrize("body,shape,k,s", CASES)
def test_train_picks_like_a_naive_sampler(body, shape, k, s):
    x = np.random.default_rng(1).uniform(0, 1, size=shape)
    layer, bottom, top = make_layer(param(body), [x], phase=TRAIN)
    layer._rng = np.random.default_rng(42)
    layer.forward(bottom, top)
    u = np.random.default_rng(42).random(top[0].shape)
    want = np.zeros(top[0].shape)
    want_diff = np.zeros(shape)
    top[0].diff[...] = np.random.default_rng(2).standard_normal(top[0].shape)
    for n, c in itertools.product(range(shape[0]), range(shape[1])):
        for ph, pw, cells in windows(x, k, s, top[0].shape[2:]):
            total = sum(x[n, c, r, q] for r, q in cells)
            running = 0.0
            for r, q in cells:
                running += x[n, c, r, q]
                if running >= u[n, c, ph, pw] * total:
                    want[n, c, ph, pw] = x[n, c, r, q]
                    want_diff[n, c, r, q] += top[0].diff[n, c, ph, pw]
                    break
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12)
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(bottom[0].diff, want_diff, rtol=1e-12)


@pytest.mark.parametrize("body,shape,k,s", CASES)
def test_test_phase_weights_by_probability(body, shape, k, s):
    x = np.random.default_rng(3).uniform(0.1, 1, size=shape)
    layer, bottom, top = make_layer(param(body), [x], phase=TEST)
    layer.forward(bottom, top)
    want = np.zeros(top[0].shape)
    for n, c in itertools.product(range(shape[0]), range(shape[1])):
        for ph, pw, cells in windows(x, k, s, top[0].shape[2:]):
            v = np.array([x[n, c, r, q] for r, q in cells])
            want[n, c, ph, pw] = (v * v).sum() / v.sum()
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12)
    check_layer_gradients(layer, bottom, top)


def test_pick_frequency_follows_the_values():
    x = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 2, 2)
    layer, bottom, top = make_layer(param("kernel_size: 2"), [x], phase=TRAIN)
    picks = []
    for _ in range(2000):
        layer.forward(bottom, top)
        picks.append(float(top[0].data[0, 0, 0, 0]))
    freq = np.array([picks.count(v) for v in (1.0, 2.0, 3.0, 4.0)]) / len(picks)
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.04)

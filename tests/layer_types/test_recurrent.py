"""LSTM, RNN, LSTMUnit: forward against naive per-step code, state carry, gradients."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients, make_layer

from mgcaffe.errors import LayerError
from mgcaffe.proto import caffe_pb2


def layer_param(kind, hidden=3, expose=False, tops=1, bottoms=2):
    text = (f'name: "{kind.lower()}" type: "{kind}" recurrent_param {{ num_output: {hidden} '
            f'weight_filler {{ type: "uniform" min: -0.5 max: 0.5 }} '
            f'bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} '
            f'expose_hidden: {"true" if expose else "false"} }}')
    p = text_format.Parse(text, caffe_pb2.LayerParameter())
    p.bottom.extend(f"b{i}" for i in range(bottoms))
    p.top.extend(f"t{i}" for i in range(tops))
    return p


def sig(x):
    return 1 / (1 + np.exp(-x))


def naive_lstm(x, cont, params, static=None, h0=None, c0=None):
    """Per step, per stream, with Caffe's gate order i, f, o, g."""
    t_len, n = cont.shape
    if static is None:
        w_x, b, w_h = params
    else:
        w_x, b, w_s, w_h = params
    hidden = w_h.shape[1]
    h = np.zeros((n, hidden)) if h0 is None else h0.copy()
    c = np.zeros((n, hidden)) if c0 is None else c0.copy()
    out = np.zeros((t_len, n, hidden))
    for t in range(t_len):
        for s in range(n):
            a = w_x @ x[t, s].ravel() + b + w_h @ (cont[t, s] * h[s])
            if static is not None:
                a = a + w_s @ static[s].ravel()
            i, f, o = (sig(a[k * hidden:(k + 1) * hidden]) for k in range(3))
            g = np.tanh(a[3 * hidden:])
            c[s] = cont[t, s] * f * c[s] + i * g
            h[s] = o * np.tanh(c[s])
        out[t] = h
    return out, h, c


def naive_rnn(x, cont, params, static=None, h0=None):
    t_len, n = cont.shape
    if static is None:
        w_x, b, w_h, w_o, b_o = params
    else:
        w_x, b, w_s, w_h, w_o, b_o = params
    hidden = w_h.shape[1]
    h = np.zeros((n, hidden)) if h0 is None else h0.copy()
    out = np.zeros((t_len, n, hidden))
    for t in range(t_len):
        for s in range(n):
            a = w_x @ x[t, s].ravel() + b + w_h @ (cont[t, s] * h[s])
            if static is not None:
                a = a + w_s @ static[s].ravel()
            h[s] = np.tanh(a)
            out[t, s] = np.tanh(w_o @ h[s] + b_o)
    return out, h


CONT = np.array([[0, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]], dtype=float)  # T=4, N=3


@pytest.mark.parametrize("static", [False, True])
def test_lstm_forward_and_parameter_layout(static):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 2, 2))  # K = 4
    bottoms = [x, CONT] + ([rng.standard_normal((3, 5))] if static else [])
    layer, bottom, top = make_layer(layer_param("LSTM", bottoms=len(bottoms)), bottoms)
    shapes = [b.shape for b in layer.blobs]
    assert shapes == [(12, 4), (12,)] + ([(12, 5)] if static else []) + [(12, 3)]
    layer.forward(bottom, top)
    params = [b.data for b in layer.blobs]
    want, _, _ = naive_lstm(x, CONT, params, bottoms[2] if static else None)
    assert top[0].shape == (4, 3, 3)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12, atol=1e-14)


def test_lstm_carries_state_between_forwards():
    """Without expose_hidden the final state seeds the next call (Caffe copies h_T to h_0)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3, 2))
    cont = np.ones((4, 3))
    layer, bottom, top = make_layer(layer_param("LSTM"), [x, cont])
    params = [b.data for b in layer.blobs]
    layer.forward(bottom, top)
    first, h, c = naive_lstm(x, cont, params)
    np.testing.assert_allclose(top[0].data, first, rtol=1e-12)
    layer.forward(bottom, top)
    second, _, _ = naive_lstm(x, cont, params, h0=h, c0=c)
    np.testing.assert_allclose(top[0].data, second, rtol=1e-12)
    assert not np.allclose(first, second)
    layer.reset()
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, first, rtol=1e-12)


def test_lstm_expose_hidden_forward():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 2))
    h0, c0 = rng.standard_normal((1, 3, 3)), rng.standard_normal((1, 3, 3))
    cont = np.ones((4, 3))
    layer, bottom, top = make_layer(layer_param("LSTM", expose=True, bottoms=4, tops=3),
                                    [x, cont, h0, c0])
    layer.forward(bottom, top)
    want, h, c = naive_lstm(x, cont, [b.data for b in layer.blobs], h0=h0[0], c0=c0[0])
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12)
    np.testing.assert_allclose(top[1].data[0], h, rtol=1e-12)
    np.testing.assert_allclose(top[2].data[0], c, rtol=1e-12)


@pytest.mark.parametrize("static", [False, True])
def test_rnn_forward_and_parameter_layout(static):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3, 2))
    bottoms = [x, CONT] + ([rng.standard_normal((3, 2, 2))] if static else [])
    layer, bottom, top = make_layer(layer_param("RNN", bottoms=len(bottoms)), bottoms)
    shapes = [b.shape for b in layer.blobs]
    assert shapes == [(3, 2), (3,)] + ([(3, 4)] if static else []) + [(3, 3), (3, 3), (3,)]
    layer.forward(bottom, top)
    want, _ = naive_rnn(x, CONT, [b.data for b in layer.blobs],
                        bottoms[2] if static else None)
    np.testing.assert_allclose(top[0].data, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
def test_recurrent_gradients(kind, static):
    rng = np.random.default_rng(7)
    bottoms = [rng.standard_normal((4, 3, 2)), CONT]
    if static:
        bottoms.append(rng.standard_normal((3, 3)))
    layer, bottom, top = make_layer(layer_param(kind, bottoms=len(bottoms)), bottoms)
    check = [0, 2] if static else [0]
    check_layer_gradients(layer, bottom, top, check_bottom=check, eps=1e-6, rtol=1e-5,
                          atol=1e-8)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_gradients_through_exposed_state(kind):
    rng = np.random.default_rng(8)
    n_state = 2 if kind == "LSTM" else 1
    cont = np.array([[1, 0], [1, 1], [0, 1]], dtype=float)
    bottoms = [rng.standard_normal((3, 2, 2)), cont]
    bottoms += [rng.standard_normal((1, 2, 3)) for _ in range(n_state)]
    layer, bottom, top = make_layer(layer_param(kind, expose=True, bottoms=len(bottoms),
                                                tops=1 + n_state), bottoms)
    check_layer_gradients(layer, bottom, top, check_bottom=[0] + list(range(2, len(bottoms))),
                          eps=1e-6, rtol=1e-5, atol=1e-8)


def test_lstm_unit_forward_and_gradients():
    rng = np.random.default_rng(9)
    c_prev = rng.standard_normal((1, 4, 3))
    gates = rng.standard_normal((1, 4, 12))
    cont = np.array([[1.0, 0.0, 1.0, 1.0]])
    p = text_format.Parse('name: "u" type: "LSTMUnit" top: "c" top: "h"',
                          caffe_pb2.LayerParameter())
    layer, bottom, top = make_layer(p, [c_prev, gates, cont])
    layer.forward(bottom, top)
    g = gates[0]
    i, f, o = sig(g[:, :3]), sig(g[:, 3:6]) * cont[0][:, None], sig(g[:, 6:9])
    c = f * c_prev[0] + i * np.tanh(g[:, 9:])
    np.testing.assert_allclose(top[0].data[0], c, rtol=1e-12)
    np.testing.assert_allclose(top[1].data[0], o * np.tanh(c), rtol=1e-12)
    check_layer_gradients(layer, bottom, top, check_bottom=[0, 1], eps=1e-6, rtol=1e-5,
                          atol=1e-8)
    with pytest.raises(LayerError, match="sequence markers"):
        layer.backward(top, [True, True, True], bottom)


def test_recurrent_rejects_bad_inputs():
    x = np.zeros((4, 3, 2))
    with pytest.raises(LayerError, match="cont"):
        make_layer(layer_param("LSTM"), [x, np.zeros((4, 2))])
    layer, bottom, top = make_layer(layer_param("RNN"), [x, np.ones((4, 3))])
    bottom[0].reshape((5, 3, 2))
    bottom[1].reshape((5, 3))
    with pytest.raises(LayerError, match="timesteps changed"):
        layer.reshape(bottom, top)
    with pytest.raises(LayerError, match="num_output"):
        make_layer(layer_param("RNN", hidden=0), [x, np.ones((4, 3))])
    with pytest.raises(LayerError, match="sequence markers"):
        layer2, b2, t2 = make_layer(layer_param("LSTM"), [x, np.ones((4, 3))])
        layer2.forward(b2, t2)
        layer2.backward(t2, [True, True], b2)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_one_step_at_a_time_equals_the_whole_sequence(kind):
    """Caffe's own check: T steps in one call equal T calls of one step (the carried state),
    and with every cont 0 the later steps differ."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 2, 4))
    cont = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    whole, bottom, top = make_layer(layer_param(kind), [x, cont])
    whole.forward(bottom, top)
    expected = top[0].data.copy()
    for reset_cont in (False, True):
        step, b1, t1 = make_layer(layer_param(kind), [x[:1], cont[:1]])
        for blob, loaded in zip(step.blobs, whole.blobs):
            blob.data[...] = loaded.data
        for t in range(3):
            b1[0].data[...] = x[t:t + 1]
            b1[1].data[...] = 0 if reset_cont else cont[t:t + 1]
            step.forward(b1, t1)
            if reset_cont and t > 0:
                assert not np.allclose(t1[0].data[0], expected[t])
            else:
                np.testing.assert_allclose(t1[0].data[0], expected[t], rtol=1e-12)


def test_debug_info_logs_the_layer_blobs(caplog):
    p = layer_param("RNN")
    p.recurrent_param.debug_info = True
    layer, bottom, top = make_layer(p, [np.ones((2, 1, 2)), np.ones((2, 1))])
    with caplog.at_level("INFO", logger="mgcaffe.layer_types.recurrent"):
        layer.forward(bottom, top)
        layer.backward(top, [True, False], bottom)
    text = caplog.text
    assert "[Forward] Layer rnn, top blob 0 data" in text
    assert "[Backward] Layer rnn, param blob 4 diff" in text

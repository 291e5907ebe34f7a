"""An s2vt/LRCN-style captioning net (Embed -> LSTM with a static "image" input ->
InnerProduct -> SoftmaxWithLoss over time-major T x N words) built from a prototxt and trained
by the solver on a synthetic task until it learns it; recurrent parameters are ordinary
learnable params and can be shared between layers by name."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

T, N, V, CLASSES, FEATURE = 5, 16, 8, 4, 6

NET = f"""
name: "caption"
layer {{ name: "input" type: "Input" top: "input_sentence" top: "cont" top: "image"
         top: "target"
         input_param {{ shape {{ dim: {T} dim: {N} }} shape {{ dim: {T} dim: {N} }}
                       shape {{ dim: {N} dim: {FEATURE} }} shape {{ dim: {T} dim: {N} }} }} }}
layer {{ name: "embed" type: "Embed" bottom: "input_sentence" top: "embedded"
         embed_param {{ input_dim: {V} num_output: 12
                       weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "lstm" type: "LSTM" bottom: "embedded" bottom: "cont" bottom: "image"
         top: "lstm"
         recurrent_param {{ num_output: 24
                           weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }}
                           bias_filler {{ type: "constant" value: 0 }} }} }}
layer {{ name: "predict" type: "InnerProduct" bottom: "lstm" top: "predict"
         inner_product_param {{ num_output: {V} axis: 2
                               weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "predict" bottom: "target"
         top: "loss" softmax_param {{ axis: 2 }} }}
"""


def batch(rng):
    """Each item: a class shown as a noisy one-hot "image" feature, and that class's fixed
    word sequence (words 1..V-1; 0 begins a sentence). The first word depends only on the
    image, so the static input must carry information through the LSTM."""
    classes = rng.integers(0, CLASSES, size=N)
    image = np.zeros((N, FEATURE))
    image[np.arange(N), classes] = 1
    image += 0.1 * rng.standard_normal(image.shape)
    words = np.array([[(k * 3 + t * (k + 1)) % (V - 1) + 1 for k in classes]
                      for t in range(T)])
    sentence = np.vstack([np.zeros((1, N)), words[:-1]])
    cont = np.ones((T, N))
    cont[0] = 0
    return sentence, cont, image, words


def set_inputs(net, arrays):
    for name, value in zip(("input_sentence", "cont", "image", "target"), arrays):
        net.blobs[name].data[...] = value


def test_recurrent_params_are_ordinary_learnable_params():
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), seed=1)
    shapes = [tuple(b.shape) for b in net.params["lstm"]]
    assert shapes == [(96, 12), (96,), (96, FEATURE), (96, 24)]
    learnable = [id(b) for b in net.learnable_params]
    assert all(id(b) in learnable for b in net.params["lstm"])
    assert learnable.index(id(net.params["embed"][0])) < learnable.index(
        id(net.params["lstm"][0])) < learnable.index(id(net.params["predict"][0]))
    layers = {ll.name: ll for ll in net.learnable_layers}
    assert [ll.name for ll in net.learnable_layers] == ["embed", "lstm", "predict"]
    assert layers["lstm"].count == sum(b.count for b in net.params["lstm"])


def test_two_lstm_layers_share_weights_by_param_name():
    text = """
    layer { name: "in" type: "Input" top: "x" top: "cont"
             input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }
    layer { name: "a" type: "LSTM" bottom: "x" bottom: "cont" top: "ha"
             param { name: "wx" } param { name: "b" } param { name: "wh" }
             recurrent_param { num_output: 5 weight_filler { type: "gaussian" } } }
    layer { name: "b" type: "LSTM" bottom: "x" bottom: "cont" top: "hb"
             param { name: "wx" } param { name: "b" } param { name: "wh" }
             recurrent_param { num_output: 5 weight_filler { type: "gaussian" } } }
    """
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), seed=2)
    assert len(net.learnable_params) == 3
    net.blobs["x"].data[...] = np.random.default_rng(0).standard_normal((3, 2, 4))
    net.forward()
    np.testing.assert_allclose(net.blobs["ha"].data, net.blobs["hb"].data)


def test_captioning_net_learns_the_synthetic_task():
    solver_param = caffe_pb2.SolverParameter(base_lr=0.02, lr_policy="fixed", max_iter=1000,
                                             type="Adam", momentum=0.9, momentum2=0.999,
                                             random_seed=5, display=0)
    solver_param.net_param.CopyFrom(text_format.Parse(NET, caffe_pb2.NetParameter()))
    solver = get_solver(solver_param, dtype=np.float32)
    net = solver.net
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(300):
        set_inputs(net, batch(rng))
        solver.step(1)
        losses.append(float(net.blobs["loss"].data))
    assert np.mean(losses[:10]) > 1.5  # about log(V) at the start
    assert np.mean(losses[-10:]) < 0.05
    test_batch = batch(np.random.default_rng(99))
    set_inputs(net, test_batch)
    net.forward()
    predicted = net.blobs["predict"].data.argmax(axis=2)
    np.testing.assert_array_equal(predicted, test_batch[3])


TV, TW = 3, 4  # encoder (video frame) steps, then decoder (word) steps

S2VT = f"""
name: "s2vt_like"
layer {{ name: "input" type: "Input" top: "frames" top: "cont" top: "input_sentence"
         top: "target"
         input_param {{ shape {{ dim: {TV + TW} dim: {N} dim: {FEATURE} }}
                       shape {{ dim: {TV + TW} dim: {N} }} shape {{ dim: {TV + TW} dim: {N} }}
                       shape {{ dim: {TV + TW} dim: {N} }} }} }}
layer {{ name: "lstm1" type: "LSTM" bottom: "frames" bottom: "cont" top: "lstm1"
         recurrent_param {{ num_output: 16
                           weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "embed" type: "Embed" bottom: "input_sentence" top: "embedded"
         embed_param {{ input_dim: {V} num_output: 8 bias_term: false
                       weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "lstm2_input" type: "Concat" bottom: "lstm1" bottom: "embedded"
         top: "lstm2_input" concat_param {{ axis: 2 }} }}
layer {{ name: "lstm2" type: "LSTM" bottom: "lstm2_input" bottom: "cont" top: "lstm2"
         recurrent_param {{ num_output: 16
                           weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "predict" type: "InnerProduct" bottom: "lstm2" top: "predict"
         inner_product_param {{ num_output: {V} axis: 2
                               weight_filler {{ type: "uniform" min: -0.1 max: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "predict" bottom: "target" top: "loss"
         softmax_param {{ axis: 2 }} loss_param {{ ignore_label: -1 }} }}
layer {{ name: "accuracy" type: "Accuracy" bottom: "predict" bottom: "target"
         top: "accuracy" accuracy_param {{ axis: 2 ignore_label: -1 }} }}
"""


def s2vt_batch(rng):
    """S2VT's layout on one time axis: TV steps of frame features (the words padded with 0,
    the targets ignored), then TW steps of words (the frames zero)."""
    classes = rng.integers(0, CLASSES, size=N)
    frames = np.zeros((TV + TW, N, FEATURE))
    frames[:TV, np.arange(N), classes] = 1
    frames[:TV] += 0.1 * rng.standard_normal((TV, N, FEATURE))
    words = np.array([[(k * 3 + t * (k + 1)) % (V - 1) + 1 for k in classes]
                      for t in range(TW)])
    sentence = np.zeros((TV + TW, N))
    sentence[TV + 1:] = words[:-1]
    target = np.full((TV + TW, N), -1.0)
    target[TV:] = words
    cont = np.ones((TV + TW, N))
    cont[0] = 0
    return {"frames": frames, "cont": cont, "input_sentence": sentence, "target": target}


@pytest.mark.slow
def test_s2vt_style_stacked_encoder_decoder_learns():
    solver_param = caffe_pb2.SolverParameter(base_lr=0.02, lr_policy="fixed", max_iter=1000,
                                             type="Adam", momentum=0.9, momentum2=0.999,
                                             random_seed=6, display=0)
    solver_param.net_param.CopyFrom(text_format.Parse(S2VT, caffe_pb2.NetParameter()))
    solver = get_solver(solver_param, dtype=np.float32)
    net = solver.net
    rng = np.random.default_rng(1)
    for _ in range(250):
        for name, value in s2vt_batch(rng).items():
            net.blobs[name].data[...] = value
        solver.step(1)
    for name, value in s2vt_batch(np.random.default_rng(98)).items():
        net.blobs[name].data[...] = value
    net.forward()
    assert float(net.blobs["accuracy"].data) == 1.0
    assert float(net.blobs["loss"].data) < 0.1

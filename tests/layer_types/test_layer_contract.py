"""Contract test over every registered layer type from the element-wise, normalisation,
shape, softmax, loss, accuracy, input, recurrent and sequence modules (and MVN, SPP, Im2col,
BatchReindex, Filter, InfogainLoss): setup, reshape, forward and backward on a
small float32 input run, and the tops have the declared shapes and dtype."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.blob import Blob
from mgcaffe.layer_types import TRAIN, LayerContext, create_layer, layer_class, layer_types
from mgcaffe.proto import caffe_pb2

#: The modules whose layers this table must cover.
MODULES = {f"mgcaffe.layer_types.{m}" for m in (
    "neuron", "power_exp_log", "prelu", "dropout", "batch_norm", "scale_bias", "eltwise",
    "concat", "slice", "shape", "crop", "tile", "reduction", "softmax", "loss", "loss_extra",
    "accuracy", "input", "recurrent", "lstm_unit", "embed", "mvn", "batch_reindex", "filter",
    "infogain_loss", "spp", "im2col_layer")}

X = (2, 3, 4, 5)
LABELS = np.array([0.0, 2.0])

# type: (parameter text, bottoms (shapes or arrays), number of tops, expected top shapes)
CASES = {
    "ReLU": ("", [X], 1, [X]),
    "PReLU": ("", [X], 1, [X]),
    "ELU": ("", [X], 1, [X]),
    "Sigmoid": ("", [X], 1, [X]),
    "TanH": ("", [X], 1, [X]),
    "AbsVal": ("", [X], 1, [X]),
    "Power": ("power_param { power: 2 }", [X], 1, [X]),
    "Exp": ("", [X], 1, [X]),
    "Log": ("log_param { shift: 10 }", [X], 1, [X]),
    "BNLL": ("", [X], 1, [X]),
    "Threshold": ("", [X], 1, [X]),
    "Clip": ("clip_param { min: -1 max: 1 }", [X], 1, [X]),
    "Swish": ("", [X], 1, [X]),
    "Dropout": ("", [X], 1, [X]),
    "BatchNorm": ("", [X], 1, [X]),
    "Scale": ("scale_param { bias_term: true }", [X], 1, [X]),
    "Bias": ("", [X, (3,)], 1, [X]),
    "Eltwise": ("", [X, X, X], 1, [X]),
    "Concat": ("", [X, (2, 1, 4, 5)], 1, [(2, 4, 4, 5)]),
    "Slice": ("slice_param { slice_point: 1 }", [X], 2, [(2, 1, 4, 5), (2, 2, 4, 5)]),
    "Split": ("", [X], 3, [X, X, X]),
    "Flatten": ("", [X], 1, [(2, 60)]),
    "Reshape": ("reshape_param { shape { dim: 0 dim: -1 dim: 5 } }", [X], 1, [(2, 12, 5)]),
    "Silence": ("", [X, (2,)], 0, []),
    "Crop": ("", [X, (2, 3, 2, 2)], 1, [(2, 3, 2, 2)]),
    "Tile": ("tile_param { tiles: 2 }", [X], 1, [(2, 6, 4, 5)]),
    "Reduction": ("reduction_param { axis: 1 }", [X], 1, [(2,)]),
    "Softmax": ("", [X], 1, [X]),
    "SoftmaxWithLoss": ("", [(2, 3), LABELS], 2, [(), (2, 3)]),
    "EuclideanLoss": ("", [(2, 3), (2, 3)], 1, [()]),
    "SigmoidCrossEntropyLoss": ("", [(2, 3), (2, 3)], 1, [()]),
    "MultinomialLogisticLoss": ("", [np.full((2, 3), 1 / 3), LABELS], 1, [()]),
    "HingeLoss": ("", [(2, 3), LABELS], 1, [()]),
    "ContrastiveLoss": ("", [(2, 3), (2, 3), np.array([1.0, 0.0])], 1, [()]),
    "Accuracy": ("", [(2, 3), LABELS], 2, [(), (3,)]),
    "ArgMax": ("", [(2, 3)], 1, [(2, 1, 1)]),
    "Input": ("input_param { shape { dim: 2 dim: 3 } }", [], 2, [(2, 3), (2, 3)]),
    "DummyData": ('dummy_data_param { shape { dim: 2 } data_filler { type: "gaussian" } }',
                  [], 1, [(2,)]),
    "Parameter": ("parameter_param { shape { dim: 4 } }", [], 1, [(4,)]),
    "LSTM": ('recurrent_param { num_output: 4 weight_filler { type: "gaussian" } }',
             [(3, 2, 5), np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])], 1, [(3, 2, 4)]),
    "RNN": ('recurrent_param { num_output: 4 expose_hidden: true weight_filler { type: '
            '"gaussian" } }', [(3, 2, 5), np.ones((3, 2)), (2, 6), (1, 2, 4)], 2,
            [(3, 2, 4), (1, 2, 4)]),
    "LSTMUnit": ("", [(1, 2, 3), (1, 2, 12), np.array([[1.0, 0.0]])], 2,
                 [(1, 2, 3), (1, 2, 3)]),
    "Embed": ("embed_param { num_output: 4 input_dim: 3 }", [np.array([[0.0, 2.0]])], 1,
              [(1, 2, 4)]),
    "MVN": ("", [X], 1, [X]),
    "BatchReindex": ("", [X, np.array([1.0, 1.0, 0.0])], 1, [(3, 3, 4, 5)]),
    "Filter": ("", [X, np.array([[0.0], [1.0]])], 1, [(1, 3, 4, 5)]),
    "InfogainLoss": ("", [(2, 3), LABELS, np.eye(3)], 2, [(), (2, 3)]),
    "SPP": ("spp_param { pyramid_height: 2 }", [X], 1, [(2, 15)]),
    "Im2col": ("convolution_param { kernel_size: 2 }", [X], 1, [(2, 12, 3, 4)]),
}


def owned_types():
    return [t for t in layer_types() if layer_class(t).__module__ in MODULES]


def test_every_owned_type_has_a_case():
    missing = sorted(set(owned_types()) - set(CASES))
    assert not missing, f"add contract cases for {missing}"


@pytest.mark.parametrize("type_", sorted(CASES))
def test_layer_contract(type_):
    text, bottoms, n_top, shapes = CASES[type_]
    lp = text_format.Parse(f'name: "c_{type_}" type: "{type_}" {text}',
                           caffe_pb2.LayerParameter())
    layer = create_layer(lp, LayerContext(phase=TRAIN, dtype=np.float32, seed=1))
    assert layer.type == type_
    rng = np.random.default_rng(0)
    bottom = []
    for i, item in enumerate(bottoms):
        array = item if isinstance(item, np.ndarray) else rng.standard_normal(item)
        blob = Blob(array.shape, dtype=np.float32, name=f"b{i}")
        blob.data[...] = array
        bottom.append(blob)
    top = [Blob((), dtype=np.float32, name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    assert [t.shape for t in top] == shapes
    for t in top:
        assert t.data.dtype == np.float32 and t.diff.dtype == np.float32
        assert np.all(np.isfinite(t.data))
    for b in layer.blobs:
        assert b.dtype == np.float32
    down = [layer.allow_force_backward(i) for i in range(len(bottom))]
    for t in top:
        t.diff[...] = 1.0
    layer.backward(top, down, bottom)
    for b, d in zip(bottom, down):
        if d:
            assert np.all(np.isfinite(b.diff))


NET_TEXT = """
name: "chain" force_backward: true
layer { name: "in" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 dim: 3 dim: 3 } shape { dim: 4 } } }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn" }
layer { name: "sc" type: "Scale" bottom: "bn" top: "bn"
        scale_param { bias_term: true filler { type: "gaussian" }
                      bias_filler { type: "gaussian" } } }
layer { name: "relu" type: "ReLU" bottom: "bn" top: "bn" relu_param { negative_slope: 0.1 } }
layer { name: "pr" type: "PReLU" bottom: "data" top: "pr" }
layer { name: "sum" type: "Eltwise" bottom: "bn" bottom: "pr" top: "sum" }
layer { name: "sig" type: "Sigmoid" bottom: "sum" top: "sum" }
layer { name: "cat" type: "Concat" bottom: "sum" bottom: "data" top: "cat" }
layer { name: "fl" type: "Flatten" bottom: "cat" top: "fl" }
layer { name: "sl" type: "Slice" bottom: "fl" top: "a" top: "b" slice_param { slice_point: 7 } }
layer { name: "sil" type: "Silence" bottom: "a" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "b" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "b" bottom: "label" top: "acc" }
"""


def test_in_place_chain_through_a_net():
    """BatchNorm -> Scale -> ReLU in place, automatic splits, Concat/Flatten/Slice/Silence
    and SoftmaxWithLoss inside a Net: the input and parameter gradients match central
    differences of the net's loss."""
    from mgcaffe.net import Net  # noqa: PLC0415 - the Net is only needed here

    net = Net(text_format.Parse(NET_TEXT, caffe_pb2.NetParameter()), TRAIN, seed=3,
              dtype=np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 3, 3))
    labels = np.array([0.0, 5.0, 30.0, 3.0])

    def loss():
        net.blobs["data"].data[...] = x
        net.blobs["label"].data[...] = labels
        net.forward()
        return float(net.blobs["loss"].data)

    loss()
    net.clear_param_diffs()
    net.backward()
    targets = [("data", x, net.blobs["data"].diff.copy())]
    targets += [(f"{name}[{i}]", b.data, b.diff.copy())
                for name in ("sc", "pr") for i, b in enumerate(net.params[name])]
    for name, values, grad in targets:
        flat, g = values.reshape(-1), grad.reshape(-1)
        for k in rng.choice(flat.size, min(flat.size, 12), replace=False):
            saved = flat[k]
            flat[k] = saved + 1e-5
            plus = loss()
            flat[k] = saved - 1e-5
            minus = loss()
            flat[k] = saved
            numeric = (plus - minus) / 2e-5
            assert abs(numeric - g[k]) <= 1e-6 + 1e-4 * abs(numeric), (name, k, numeric, g[k])

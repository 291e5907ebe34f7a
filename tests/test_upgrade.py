"""Upgrades of deprecated definitions: V1 `layers`, net-level inputs, BatchNorm params,
solver_type."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgcaffe.errors import ParseError
from mgcaffe.formats import protoio, upgrade
from mgcaffe.proto import caffe_pb2

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "prototxt"
V1 = caffe_pb2.V1LayerParameter

# The current type string of every V1 enum value, written out independently of the code.
EXPECTED_V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DATA": "Data", "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU",
    "SIGMOID": "Sigmoid", "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence", "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH", "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}


def test_every_v1_enum_value_is_mapped():
    enum_names = {value.name for value in V1.LayerType.DESCRIPTOR.values} - {"NONE"}
    assert enum_names == set(EXPECTED_V1_TYPES)
    net = caffe_pb2.NetParameter(name="all")
    for enum_name in sorted(enum_names):
        net.layers.add(name=enum_name.lower(), type=V1.LayerType.Value(enum_name))
    upgraded = protoio.read_net_param(net)
    assert not upgraded.layers
    assert {layer.name: layer.type for layer in upgraded.layer} == {
        name.lower(): type_name for name, type_name in EXPECTED_V1_TYPES.items()}


def without_names(net: caffe_pb2.NetParameter) -> list[caffe_pb2.LayerParameter]:
    layers = []
    for layer in net.layer:
        copy = caffe_pb2.LayerParameter()
        copy.CopyFrom(layer)
        copy.ClearField("name")
        layers.append(copy)
    return layers


def test_v1_lenet_upgrades_to_the_bundled_lenet():
    v1 = protoio.read_net_param(FIXTURES / "lenet_v1.prototxt")
    current = protoio.read_net_param(ROOT / "models" / "lenet" / "lenet.prototxt")
    assert v1.layer[0].name == "input" and current.layer[0].name == "data"
    assert without_names(v1) == without_names(current)
    assert [layer.name for layer in v1.layer][1:] == [layer.name for layer in current.layer][1:]


def test_v1_fields_are_carried_over():
    net = protoio.read_net_param(FIXTURES / "v1_features.prototxt")
    layers = {layer.name: layer for layer in net.layer}
    data = layers["mnist"]
    assert data.type == "Data"
    assert data.include[0].phase == caffe_pb2.TRAIN
    transform = data.transform_param
    assert (transform.scale, transform.mean_file, transform.crop_size, transform.mirror) == (
        pytest.approx(1 / 256), "mean.binaryproto", 24, True)
    for field in ("scale", "mean_file", "crop_size", "mirror"):
        assert not data.data_param.HasField(field), field
    assert data.data_param.source == "examples/mnist/mnist_train_lmdb"
    assert data.data_param.batch_size == 64

    conv = layers["conv1"]
    assert [(p.name, p.share_mode, p.lr_mult, p.decay_mult) for p in conv.param] == [
        ("conv_w", caffe_pb2.ParamSpec.STRICT, 1, 1),
        ("conv_b", caffe_pb2.ParamSpec.PERMISSIVE, 2, 0)]
    twin = layers["conv1_twin"]
    assert [p.name for p in twin.param] == ["conv_w", "conv_b"]
    assert not twin.param[0].HasField("lr_mult")
    assert layers["deconv"].type == "Deconvolution"
    assert layers["deconv"].convolution_param.bias_term is False
    assert [p.lr_mult for p in layers["deconv"].param] == [0.5]
    assert list(layers["loss"].loss_weight) == [3]
    assert (layers["silence"].type, list(layers["silence"].bottom)) == (
        "Silence", ["conv1_twin", "label"])


def test_v1_blobs_are_kept():
    net = caffe_pb2.NetParameter()
    v1 = net.layers.add(name="ip", type=V1.INNER_PRODUCT)
    v1.blobs.add().data.extend([1.5, 2.5])
    upgraded = protoio.read_net_param(net)
    assert list(upgraded.layer[0].blobs[0].data) == [1.5, 2.5]


def test_both_layer_and_layers_is_an_error():
    with pytest.raises(ParseError, match="bad_both_layer_layers.prototxt: the net has both "
                                         "`layer` and legacy `layers`"):
        protoio.read_net_param(FIXTURES / "bad_both_layer_layers.prototxt")


def test_current_field_in_a_v1_block_is_a_parse_error_with_a_hint():
    path = FIXTURES / "bad_v1_field.prototxt"
    with pytest.raises(ParseError) as info:
        protoio.read_net_param(path)
    assert str(info.value).startswith(f"{path}:13:")
    assert "legacy V1 `layers {}` block" in str(info.value)


def test_no_v1_hint_outside_v1_blocks():
    with pytest.raises(ParseError) as info:
        protoio.parse_net_text('layer { name: "a" param { lr_mult: x } }')
    assert "V1" not in str(info.value)


def test_v1_layer_without_a_type_is_an_error():
    with pytest.raises(ParseError, match="V1 layer #0 'typeless': V1 layer type NONE"):
        protoio.read_net_param(FIXTURES / "bad_v1_type.prototxt")


def test_a_v1_field_the_upgrade_does_not_know_is_an_error(monkeypatch):
    # Pretend loss_weight had no current equivalent: the upgrade must refuse, not drop it.
    fields = tuple(f for f in upgrade._SAME_NAME_FIELDS if f != "loss_weight")
    monkeypatch.setattr(upgrade, "_SAME_NAME_FIELDS", fields)
    with pytest.raises(ParseError, match="V1 layer #4 'loss': V1 field `loss_weight` has no"):
        protoio.read_net_param(FIXTURES / "v1_features.prototxt")


# ---------------------------------------------------------------------------------------------
# Net-level inputs


def test_input_dim_becomes_an_input_layer_first():
    net = protoio.read_net_param(FIXTURES / "lenet_v1.prototxt")
    first = net.layer[0]
    assert (first.name, first.type, list(first.top)) == ("input", "Input", ["data"])
    assert [list(s.dim) for s in first.input_param.shape] == [[64, 1, 28, 28]]
    assert not net.input and not net.input_dim
    assert sum(layer.type == "Input" for layer in net.layer) == 1


def test_input_shape_with_two_inputs():
    net = protoio.read_net_param(FIXTURES / "input_shape.prototxt")
    assert [layer.name for layer in net.layer] == ["input", "relu"]
    assert list(net.layer[0].top) == ["data", "label"]
    assert [list(s.dim) for s in net.layer[0].input_param.shape] == [[2, 3, 5, 5], [2]]
    assert not net.input and not net.input_shape


def test_input_without_shape_is_dropped():
    # Old .caffemodel files name their inputs without shapes; Caffe just drops them.
    net = protoio.read_net_param(caffe_pb2.NetParameter(input=["data"]))
    assert not net.input and not net.layer


@pytest.mark.parametrize("text, message", [
    ('input: "a" input: "b" input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8',
     r"2 net input\(s\) but 4 input_dim values; expected 4 per input \(8\)"),
    ('input: "a" input: "b" input_shape { dim: 1 }',
     r"2 net input\(s\) but 1 input_shape entries"),
    ('input: "a" input_shape { dim: 1 } input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1',
     "net inputs give both input_shape and input_dim"),
])
def test_inconsistent_net_inputs(text, message):
    with pytest.raises(ParseError, match="^inputs.prototxt: " + message):
        protoio.parse_net_text(text, source="inputs.prototxt")


def test_bad_input_dim_fixture():
    with pytest.raises(ParseError, match="6 input_dim values"):
        protoio.read_net_param(FIXTURES / "bad_input_dim.prototxt")


# ---------------------------------------------------------------------------------------------
# BatchNorm, idempotence, solvers


def test_old_batch_norm_param_specs_are_pinned_to_zero():
    net = protoio.parse_net_text("""
        layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x"
                param { lr_mult: 1 name: "m" } param { lr_mult: 1 } param { lr_mult: 1 } }
        layer { name: "scale" type: "Scale" bottom: "x" top: "x"
                param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } }
    """)
    bn, scale = net.layer
    assert [(p.lr_mult, p.decay_mult) for p in bn.param] == [(0, 0)] * 3
    assert bn.param[0].name == "m"
    assert [p.lr_mult for p in scale.param] == [1, 1, 1]


def test_upgrading_a_current_net_changes_nothing():
    net = protoio.read_net_param(FIXTURES / "features.prototxt")
    again = caffe_pb2.NetParameter()
    again.CopyFrom(net)
    upgrade.upgrade_net(again)
    assert again == net


@pytest.mark.parametrize("enum_name, type_name", [
    ("SGD", "SGD"), ("NESTEROV", "Nesterov"), ("ADAGRAD", "AdaGrad"),
    ("RMSPROP", "RMSProp"), ("ADADELTA", "AdaDelta"), ("ADAM", "Adam")])
def test_every_solver_type_enum(enum_name, type_name):
    solver = caffe_pb2.SolverParameter(
        solver_type=caffe_pb2.SolverParameter.SolverType.Value(enum_name))
    upgrade.upgrade_solver(solver)
    assert solver.type == type_name and not solver.HasField("solver_type")


def test_solver_without_solver_type_is_unchanged():
    solver = caffe_pb2.SolverParameter(type="Adam", base_lr=0.1)
    upgrade.upgrade_solver(solver)
    assert solver == caffe_pb2.SolverParameter(type="Adam", base_lr=0.1)

"""Settings refused at start: non-finite numbers anywhere in a net or solver file, values out
of the ranges Caffe's own checks allow, and net inputs declared without a shape.

Each case goes through the real entry points (a solver file, a net file, the CLI) and checks
the one line the user sees: the file, the layer, the field, and what Caffe would have done.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mgcaffe.errors import NetError, SolverError
from mgcaffe.formats import settings_check
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

NET = """
name: "n"
layer {{ name: "data" type: "Input" top: "data" top: "label"
  input_param {{ shape {{ dim: 2 dim: 3 }} shape {{ dim: 2 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  param {{ lr_mult: {lr_mult} decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
  inner_product_param {{ num_output: 2
    weight_filler {{ {weight_filler} }}
    bias_filler {{ type: "constant" value: {bias_value} }} }} }}
{extra}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
  loss_weight: {loss_weight} }}
"""

GOOD = dict(lr_mult=1, weight_filler='type: "gaussian" std: 0.1', bias_value=0, extra="",
            loss_weight=1)


def net_file(tmp_path, **fields) -> str:
    path = tmp_path / "net.prototxt"
    path.write_text(NET.format(**{**GOOD, **fields}))
    return str(path)


def solver_file(tmp_path, fields: str, **net_fields) -> str:
    net = net_file(tmp_path, **net_fields)
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net: "{net}"\nbase_lr: 0.1\nmax_iter: 1\nlr_policy: "fixed"\n'
                    f'snapshot_after_train: false\nsnapshot_prefix: "{tmp_path}/s"\n{fields}\n')
    return str(path)


def replace_in(path: str, old: str, new: str) -> None:
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def test_a_good_net_and_solver_pass(tmp_path):
    solver = get_solver(solver_file(tmp_path, "momentum: 0.9\nweight_decay: 0.0005"))
    assert solver.net.params["ip"][0].data.shape == (2, 3)


# ------------------------------------------------------------------------- the solver
@pytest.mark.parametrize("field", ["base_lr", "momentum", "weight_decay", "gamma", "power",
                                   "clip_gradients", "delta", "momentum2", "rms_decay"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_every_non_finite_solver_float_is_refused_naming_file_and_field(tmp_path, field,
                                                                         value):
    path = solver_file(tmp_path, "" if field == "base_lr" else f"{field}: {value}")
    if field == "base_lr":
        replace_in(path, "base_lr: 0.1", f"base_lr: {value}")
    with pytest.raises(SolverError) as info:
        get_solver(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {field}: ")
    assert "expected" in message and value.lstrip("-") in message
    assert "Caffe" in message and "\n" not in message


def test_base_lr_nan_no_longer_trains_to_a_nan_loss(tmp_path):
    # The case: it used to stop at iteration 1 naming layer 'ip', not the setting.
    path = solver_file(tmp_path, "")
    replace_in(path, "base_lr: 0.1", "base_lr: nan")
    with pytest.raises(SolverError, match=re.escape(
            f"{path}: base_lr: expected a finite number, found nan (Caffe would have "
            "accepted it: every update")):
        get_solver(path)


@pytest.mark.parametrize("fields, words", [
    # Caffe aborts on these too
    ('type: "RMSProp"\nrms_decay: 1', "rms_decay: expected a value in [0, 1), found 1 "
     "(Caffe aborts on it too: CHECK_GE(rms_decay, 0) and CHECK_LT(rms_decay, 1)"),
    ('type: "AdaGrad"\nmomentum: 0.9', "momentum: expected 0 (AdaGrad and RMSProp have no "
     "momentum), found 0.9 (Caffe aborts on it too"),
    # Caffe accepts these; the message says what it would have done
    ('base_lr: -0.1', "base_lr: expected >= 0, found -0.1 (Caffe would have accepted it: "
     "with a negative rate every update climbs the loss"),
    ('weight_decay: -1', "weight_decay: expected >= 0, found -1 (Caffe would have accepted"),
    ('type: "Adam"\nmomentum: 1', "momentum: expected a value in [0, 1) (Adam's beta1), "
     "found 1 (Caffe would have accepted it"),
    ('type: "Adam"\nmomentum2: 1', "momentum2: expected a value in [0, 1) (Adam's beta2), "
     "found 1 (Caffe would have accepted it: with beta2 = 1"),
    ('type: "AdaDelta"\nmomentum: 1.5', "(AdaDelta's decay), found 1.5 (Caffe would"),
    ('type: "AdaGrad"\ndelta: 0', "delta: expected > 0, found 0 (Caffe would have accepted"),
])
def test_solver_ranges(tmp_path, fields, words):
    if fields.startswith("base_lr"):
        path = solver_file(tmp_path, "")
        replace_in(path, "base_lr: 0.1", fields)
    else:
        path = solver_file(tmp_path, fields)
    with pytest.raises(SolverError) as info:
        get_solver(path)
    assert str(info.value).startswith(f"{path}: ")
    assert words in str(info.value)


def test_a_net_inside_the_solver_is_named_by_the_solver_file_and_field(tmp_path):
    net_text = NET.format(**{**GOOD, "lr_mult": "nan"})
    path = tmp_path / "solver.prototxt"
    path.write_text(f'net_param {{ {net_text} }}\nbase_lr: 0.1\nlr_policy: "fixed"\n'
                    f'snapshot_prefix: "{tmp_path}/s"\n')
    with pytest.raises(NetError, match=re.escape(
            f"{path}: net_param: layer 'ip' (InnerProduct): param[0].lr_mult: expected a "
            "finite number, found nan (Caffe would have accepted it")):
        get_solver(str(path))


# ------------------------------------------------------------------------------ the net
@pytest.mark.parametrize("fields, where", [
    (dict(lr_mult="nan"), "layer 'ip' (InnerProduct): param[0].lr_mult"),
    (dict(loss_weight="inf"), "layer 'loss' (SoftmaxWithLoss): loss_weight[0]"),
    (dict(bias_value="-inf"), "layer 'ip' (InnerProduct): inner_product_param.bias_filler."
     "value"),
    (dict(weight_filler='type: "gaussian" std: inf'), "layer 'ip' (InnerProduct): "
     "inner_product_param.weight_filler.std"),
    (dict(weight_filler='type: "uniform" min: nan max: 1'),
     "inner_product_param.weight_filler.min"),
    (dict(extra='layer { name: "d" type: "Dropout" bottom: "ip" top: "ip" '
                'dropout_param { dropout_ratio: nan } }'),
     "layer 'd' (Dropout): dropout_param.dropout_ratio"),
    (dict(extra='layer { name: "bn" type: "BatchNorm" bottom: "ip" top: "ip" '
                'batch_norm_param { eps: inf } }'), "layer 'bn' (BatchNorm): "
     "batch_norm_param.eps"),
    (dict(extra='layer { name: "p" type: "Power" bottom: "ip" top: "ip" '
                'power_param { power: 2 scale: nan shift: 1 } }'),
     "layer 'p' (Power): power_param.scale"),
    (dict(extra='layer { name: "l" type: "LRN" bottom: "ip" top: "ip" '
                'lrn_param { beta: -inf } }'), "layer 'l' (LRN): lrn_param.beta"),
    (dict(extra='layer { name: "r" type: "ReLU" bottom: "ip" top: "ip" '
                'relu_param { negative_slope: nan } }'), "relu_param.negative_slope"),
])
def test_non_finite_net_values_are_refused_naming_file_layer_and_field(tmp_path, fields,
                                                                       where):
    path = net_file(tmp_path, **fields)
    with pytest.raises(NetError) as info:
        Net(path, caffe_pb2.TRAIN)
    message = str(info.value)
    assert message.startswith(f"{path}: layer ") and f"{where}: expected" in message
    assert "Caffe" in message and "\n" not in message


@pytest.mark.parametrize("fields, words", [
    (dict(weight_filler='type: "gaussian" std: 0'), "weight_filler.std: expected > 0 for a "
     "gaussian filler, found 0 (Caffe aborts on it too: CHECK_GT(sigma, 0)"),
    (dict(weight_filler='type: "gaussian" std: nan'), "weight_filler.std: expected > 0 for a "
     "gaussian filler, found nan (Caffe aborts on it too"),  # CHECK_GT fails for NaN too
    (dict(weight_filler='type: "uniform" min: 1 max: -1'), "weight_filler.max: expected >= "
     "min (1) for a uniform filler, found -1 (Caffe aborts on it too: CHECK_LE(min, max)"),
    (dict(weight_filler='type: "xavier" sparse: 3'), "weight_filler.sparse: expected -1 "
     "(only gaussian fillers are sparse), found 3 (Caffe aborts on it too"),
    (dict(extra='layer { name: "d" type: "Dropout" bottom: "ip" top: "ip" '
                'dropout_param { dropout_ratio: 1 } }'), "dropout_param.dropout_ratio: "
     "expected a value in [0, 1), found 1 (Caffe would have accepted it: a ratio of 1 drops "
     "every value"),
    (dict(extra='layer { name: "e" type: "Exp" bottom: "ip" top: "ip" '
                'exp_param { base: -2 } }'), "exp_param.base: expected > 0, or -1 for e, "
     "found -2 (Caffe aborts on it too: CHECK_GT(base, 0)"),
])
def test_net_ranges(tmp_path, fields, words):
    path = net_file(tmp_path, **fields)
    with pytest.raises(NetError) as info:
        Net(path, caffe_pb2.TEST)
    assert str(info.value).startswith(f"{path}: layer ")
    assert words in str(info.value)


def test_weights_inside_a_net_are_data_not_settings():
    # blobs { data: nan } in a layer is a weight, not a setting: not this check's business
    param = caffe_pb2.NetParameter()
    layer = param.layer.add(name="c", type="Input")
    layer.blobs.add().data.append(float("nan"))
    settings_check.check_net_settings(param, "x")


def test_the_table_names_only_real_fields():
    for rule in settings_check.RULES:
        descriptor = getattr(caffe_pb2, rule.message).DESCRIPTOR
        assert rule.field in descriptor.fields_by_name, rule
        assert bool(rule.caffe) != bool(rule.check), rule  # one of the two notes


# --------------------------------------------------------------------- inputs, the CLI
def test_a_legacy_input_without_a_shape_says_so(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text('input: "data"\nlayer { name: "conv1" type: "Convolution" bottom: "data" '
                    'top: "c" convolution_param { num_output: 2 kernel_size: 1 } }\n')
    with pytest.raises(NetError) as info:
        Net(str(path), caffe_pb2.TEST)
    message = str(info.value)
    assert message.startswith(f"{path}: layer 'conv1': net input 'data' (declared with "
                              "`input: \"data\"`) has no shape")
    assert "input_shape" in message and "input_dim" in message and "Input layer" in message


def test_an_unused_input_without_a_shape_is_dropped_as_caffe_does(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text('input: "unused"\nlayer { name: "d" type: "Input" top: "x" '
                    'input_param { shape { dim: 1 } } }\n')
    assert list(Net(str(path), caffe_pb2.TEST).blobs) == ["x"]


def test_the_cli_prints_one_line_and_exits_non_zero(tmp_path):
    path = solver_file(tmp_path, "momentum: nan")
    proc = subprocess.run([sys.executable, "-m", "mgcaffe", "train", "--solver", path],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"{path}: momentum: expected a finite number, found nan" in proc.stderr


def _float_paths(descriptor, prefix=(), depth=0):
    """Every path (field names) from `descriptor` to a float field, weights excepted."""
    from google.protobuf.descriptor import FieldDescriptor as F

    for fd in descriptor.fields:
        if fd.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            yield (*prefix, fd.name)
        elif fd.type == F.TYPE_MESSAGE and depth < 2 and fd.message_type.name != "BlobProto":
            yield from _float_paths(fd.message_type, (*prefix, fd.name), depth + 1)


def _set_nan(message, path):
    for name in path[:-1]:
        field = getattr(message, name)
        message = field.add() if hasattr(field, "add") else field
    target = getattr(message, path[-1])
    if hasattr(target, "append"):
        target.append(float("nan"))
    else:
        setattr(message, path[-1], float("nan"))


@pytest.mark.parametrize("path", sorted(set(_float_paths(caffe_pb2.LayerParameter.DESCRIPTOR))),
                         ids=".".join)
def test_every_float_of_a_layer_is_checked(path):
    net = caffe_pb2.NetParameter()
    _set_nan(net.layer.add(name="l", type="X"), path)
    with pytest.raises(NetError) as info:
        settings_check.check_net_settings(net, "f.prototxt")
    shown = re.sub(r"\[\d+\]", "", str(info.value).split(": ")[2])
    assert shown == ".".join(path), str(info.value)
    assert "found nan (Caffe" in str(info.value)


@pytest.mark.parametrize("path", sorted(p for p in _float_paths(
    caffe_pb2.SolverParameter.DESCRIPTOR) if p[0] not in ("net_param", "train_net_param",
                                                          "test_net_param")), ids=".".join)
def test_every_float_of_a_solver_is_checked(path):
    solver = caffe_pb2.SolverParameter(type="SGD")
    _set_nan(solver, path)
    with pytest.raises(SolverError, match=re.escape(f"s.prototxt: {'.'.join(path)}")):
        settings_check.check_solver_settings(solver, "s.prototxt")

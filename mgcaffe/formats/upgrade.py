"""Upgrade deprecated Caffe definitions to the current format, as Caffe does when it loads them.

Nets: V0 `layers { layer { type: "conv" ... } }` become V1 first (see `upgrade_v0`); legacy
V1 `layers { type: CONVOLUTION ... }` become `layer { type: "Convolution" ... }` (with the V1
data-transformation fields moved to `transform_param` first), net-level
`input`/`input_shape`/`input_dim` become one Input layer named "input", and the old
three-ParamSpec BatchNorm form gets lr_mult/decay_mult 0. Solvers: the `solver_type` enum
becomes the `type` string. Every function edits its message in place and names `source`
(the file) in its errors.
"""

from __future__ import annotations

from ..errors import ParseError
from ..proto import caffe_pb2
from .upgrade_v0 import is_v0_net, upgrade_v0_net

V1 = caffe_pb2.V1LayerParameter

#: V1 layer type enum name -> current type string (BVLC's mapping, one entry per enum value).
V1_TYPE_NAMES: dict[str, str] = {
    "ABSVAL": "AbsVal",
    "ACCURACY": "Accuracy",
    "ARGMAX": "ArgMax",
    "BNLL": "BNLL",
    "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss",
    "CONVOLUTION": "Convolution",
    "DATA": "Data",
    "DECONVOLUTION": "Deconvolution",
    "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise",
    "EXP": "Exp",
    "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data",
    "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss",
    "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct",
    "LRN": "LRN",
    "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN",
    "POOLING": "Pooling",
    "POWER": "Power",
    "RELU": "ReLU",
    "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence",
    "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss",
    "SPLIT": "Split",
    "SLICE": "Slice",
    "TANH": "TanH",
    "WINDOW_DATA": "WindowData",
    "THRESHOLD": "Threshold",
}

#: Deprecated solver_type enum name -> `type` string.
SOLVER_TYPE_NAMES: dict[str, str] = {
    "SGD": "SGD",
    "NESTEROV": "Nesterov",
    "ADAGRAD": "AdaGrad",
    "RMSPROP": "RMSProp",
    "ADADELTA": "AdaDelta",
    "ADAM": "Adam",
}

# V1 fields copied one-to-one into the LayerParameter field of the same name.
_SAME_NAME_FIELDS = ("bottom", "top", "name", "include", "exclude", "blobs", "loss_weight")
# V1 fields that become ParamSpec entries (V1 name -> ParamSpec field).
_PARAM_SPEC_FIELDS = {"param": "name", "blob_share_mode": "share_mode",
                      "blobs_lr": "lr_mult", "weight_decay": "decay_mult"}
# V1 data layers whose own parameter message once held the transformation fields.
_V1_DATA_PARAM = {"DATA": "data_param", "IMAGE_DATA": "image_data_param",
                  "WINDOW_DATA": "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def upgrade_net(net: caffe_pb2.NetParameter, source: str = "<net>") -> caffe_pb2.NetParameter:
    """Bring `net` to the current format in place (see the module docstring); returns it."""
    if is_v0_net(net):
        upgrade_v0_net(net, source)
    if net.layers and net.layer:
        raise ParseError(f"{source}: the net has both `layer` and legacy `layers` entries; "
                         "use only `layer { type: \"...\" }` (the current format)")
    if net.layers:
        _upgrade_v1_layers(net, source)
    _upgrade_net_inputs(net, source)
    _upgrade_batch_norm(net)
    return net


def upgrade_solver(solver: caffe_pb2.SolverParameter,
                   source: str = "<solver>") -> caffe_pb2.SolverParameter:
    """Turn the deprecated `solver_type` enum into the `type` string, in place; returns it.

    Both given and naming different solvers is an error; both given and agreeing is accepted.
    """
    if not solver.HasField("solver_type"):
        return solver
    enum_name = caffe_pb2.SolverParameter.SolverType.Name(solver.solver_type)
    type_name = SOLVER_TYPE_NAMES[enum_name]
    if solver.HasField("type") and solver.type != type_name:
        raise ParseError(f"{source}: solver_type: {enum_name} (= \"{type_name}\") contradicts "
                         f"type: \"{solver.type}\"; give only `type`")
    solver.type = type_name
    solver.ClearField("solver_type")
    return solver


def _upgrade_v1_layers(net: caffe_pb2.NetParameter, source: str) -> None:
    upgraded = []
    for index, v1 in enumerate(net.layers):
        _move_v1_transform_fields(v1)
        upgraded.append(_upgrade_v1_layer(v1, f"{source}: V1 layer #{index} '{v1.name}'"))
    net.ClearField("layers")
    net.layer.extend(upgraded)


def _move_v1_transform_fields(v1: caffe_pb2.V1LayerParameter) -> None:
    # Before TransformationParameter existed, data layers carried scale/mean/crop/mirror in
    # their own parameter message; those fields are ignored there now.
    param_field = _V1_DATA_PARAM.get(V1.LayerType.Name(v1.type)) if v1.HasField("type") else None
    if param_field is None or not v1.HasField(param_field):
        return
    data_param = getattr(v1, param_field)
    for name in _TRANSFORM_FIELDS:
        if data_param.HasField(name):
            setattr(v1.transform_param, name, getattr(data_param, name))
            data_param.ClearField(name)


def _upgrade_v1_layer(v1: caffe_pb2.V1LayerParameter, where: str) -> caffe_pb2.LayerParameter:
    layer = caffe_pb2.LayerParameter()
    for field, value in v1.ListFields():
        name = field.name
        if name in _SAME_NAME_FIELDS:
            target = getattr(layer, name)
            if field.is_repeated:
                target.extend(value)
            else:
                setattr(layer, name, value)
        elif name == "type":
            layer.type = _v1_type(v1, where)
        elif name in _PARAM_SPEC_FIELDS:
            spec_field = _PARAM_SPEC_FIELDS[name]
            for i, item in enumerate(value):
                while len(layer.param) <= i:
                    layer.param.add()
                setattr(layer.param[i], spec_field, item)
        elif name.endswith("_param") and name in caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name:
            getattr(layer, name).CopyFrom(value)
        else:
            raise ParseError(f"{where}: V1 field `{name}` has no equivalent in the current "
                             "format; remove it or rewrite the layer as `layer {}`")
    if not v1.HasField("type"):
        _v1_type(v1, where)
    return layer


def _v1_type(v1: caffe_pb2.V1LayerParameter, where: str) -> str:
    enum_name = V1.LayerType.Name(v1.type) if v1.HasField("type") else "NONE"
    try:
        return V1_TYPE_NAMES[enum_name]
    except KeyError:
        raise ParseError(f"{where}: V1 layer type {enum_name} has no current layer type; "
                         "expected one of " + ", ".join(sorted(V1_TYPE_NAMES))) from None


def _upgrade_net_inputs(net: caffe_pb2.NetParameter, source: str) -> None:
    n_inputs = len(net.input)
    has_shape, has_dim = len(net.input_shape) > 0, len(net.input_dim) > 0
    if has_shape and has_dim:
        raise ParseError(f"{source}: net inputs give both input_shape and input_dim; "
                         "give one of them")
    if has_shape and len(net.input_shape) != n_inputs:
        raise ParseError(f"{source}: {n_inputs} net input(s) but {len(net.input_shape)} "
                         "input_shape entries; expected one input_shape per input")
    if has_dim and len(net.input_dim) != 4 * n_inputs:
        raise ParseError(f"{source}: {n_inputs} net input(s) but {len(net.input_dim)} "
                         f"input_dim values; expected 4 per input ({4 * n_inputs})")
    # Caffe's rule: inputs without any shape (old .caffemodel files) are simply dropped.
    if has_shape or has_dim:
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        for i, top in enumerate(net.input):
            layer.top.append(top)
            shape = layer.input_param.shape.add()
            if has_shape:
                shape.CopyFrom(net.input_shape[i])
            else:
                shape.dim.extend(net.input_dim[4 * i: 4 * i + 4])
        layers = [layer, *net.layer]
        net.ClearField("layer")
        net.layer.extend(layers)
    for name in ("input", "input_shape", "input_dim"):
        net.ClearField(name)


def _upgrade_batch_norm(net: caffe_pb2.NetParameter) -> None:
    # Old BatchNorm definitions declared its three statistics blobs as parameters; they are
    # not gradients, so their multipliers are pinned to 0 (names kept for sharing).
    for layer in net.layer:
        if layer.type == "BatchNorm" and len(layer.param) == 3:
            for spec in layer.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0

"""Upgrade V0 nets (2013-2014: `layers { layer { type: "conv" ... } }`) to V1, as Caffe does.

Two steps, Caffe's rules:
1. Padding layers go away: a `padding` layer feeding a conv or pool layer gives that layer its
   `pad`, and the layer takes the padding layer's input instead (a padding layer feeding any
   other layer type, or with other than one input and one output, is an error).
2. Each V0 layer becomes a V1 layer: the lower-case type string becomes the V1 enum, and each
   flat V0 field moves into the parameter message of the layer type it applies to (conv
   `kernelsize` -> `convolution_param.kernel_size`, data `batchsize` ->
   `data_param.batch_size`, `cropsize`/`mirror`/`scale`/`meanfile` -> `transform_param`, ...).
   A field that does not apply to the layer's type is dropped with a warning, as Caffe does.
The V1 result is then upgraded to the current format by `upgrade.upgrade_net`.
"""

from __future__ import annotations

import logging

from ..errors import ParseError
from ..proto import caffe_pb2

log = logging.getLogger(__name__)

#: V0 type string -> V1 LayerType enum name.
V0_TYPE_NAMES: dict[str, str] = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION",
    "data": "DATA", "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN", "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL", "images": "IMAGE_DATA", "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING",
    "relu": "RELU", "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS",
    "split": "SPLIT", "tanh": "TANH", "window_data": "WINDOW_DATA",
}

_ANY = "*"  # a field that applies to every layer type
_DATA_TYPES = {"data": "data_param", "hdf5_data": "hdf5_data_param",
               "images": "image_data_param", "window_data": "window_data_param"}
_CONV_IP = {"conv": "convolution_param", "innerproduct": "inner_product_param"}
_CONV_POOL = {"conv": "convolution_param", "pool": "pooling_param"}
_LRN = {"lrn": "lrn_param"}
_WINDOW = {"window_data": "window_data_param"}

#: V0 field -> (V0 layer type -> V1 parameter message, the field's name there). Fields
#: copied as they are (name, type, blobs, blobs_lr, weight_decay) are not listed.
_FIELD_MAP: dict[str, tuple[dict[str, str], str]] = {
    "num_output": (_CONV_IP, "num_output"),
    "biasterm": (_CONV_IP, "bias_term"),
    "weight_filler": (_CONV_IP, "weight_filler"),
    "bias_filler": (_CONV_IP, "bias_filler"),
    "pad": (_CONV_POOL, "pad"),
    "kernelsize": (_CONV_POOL, "kernel_size"),
    "group": ({"conv": "convolution_param"}, "group"),
    "stride": (_CONV_POOL, "stride"),
    "pool": ({"pool": "pooling_param"}, "pool"),
    "dropout_ratio": ({"dropout": "dropout_param"}, "dropout_ratio"),
    "local_size": (_LRN, "local_size"),
    "alpha": (_LRN, "alpha"),
    "beta": (_LRN, "beta"),
    "k": (_LRN, "k"),
    "source": ({**_DATA_TYPES, "infogain_loss": "infogain_loss_param"}, "source"),
    "scale": ({_ANY: "transform_param"}, "scale"),
    "meanfile": ({_ANY: "transform_param"}, "mean_file"),
    "batchsize": (_DATA_TYPES, "batch_size"),
    "cropsize": ({_ANY: "transform_param"}, "crop_size"),
    "mirror": ({_ANY: "transform_param"}, "mirror"),
    "rand_skip": ({"data": "data_param", "images": "image_data_param"}, "rand_skip"),
    "shuffle_images": ({"images": "image_data_param"}, "shuffle"),
    "new_height": ({"images": "image_data_param"}, "new_height"),
    "new_width": ({"images": "image_data_param"}, "new_width"),
    "concat_dim": ({"concat": "concat_param"}, "concat_dim"),
    "det_fg_threshold": (_WINDOW, "fg_threshold"),
    "det_bg_threshold": (_WINDOW, "bg_threshold"),
    "det_fg_fraction": (_WINDOW, "fg_fraction"),
    "det_context_pad": (_WINDOW, "context_pad"),
    "det_crop_mode": (_WINDOW, "crop_mode"),
    "hdf5_output_param": ({"hdf5_output": "hdf5_output_param"}, None),
}
_DIRECT = ("name", "blobs", "blobs_lr", "weight_decay")


def is_v0_net(net: caffe_pb2.NetParameter) -> bool:
    """Caffe's NetNeedsV0ToV1Upgrade: some `layers` entry holds a V0 `layer`."""
    return any(entry.HasField("layer") for entry in net.layers)


def upgrade_v0_net(net: caffe_pb2.NetParameter, source: str = "<net>") -> None:
    """Turn the V0 `layers` of `net` into V1 `layers`, in place (see the module docstring)."""
    log.info("Upgrading V0 net definition: %s", source)
    folded = _fold_padding_layers(net, source)
    upgraded = [_upgrade_v0_layer(entry, source, i) for i, entry in enumerate(folded)]
    net.ClearField("layers")
    net.layers.extend(upgraded)


def _v0_name(entry: caffe_pb2.V1LayerParameter, index: int) -> str:
    return entry.layer.name or entry.name or f"#{index}"


def _fold_padding_layers(net, source: str) -> list[caffe_pb2.V1LayerParameter]:
    kept: list[caffe_pb2.V1LayerParameter] = []
    # blob name -> index (into net.layers) of the layer that last wrote it; -1 = net input
    producer: dict[str, int] = {name: -1 for name in net.input}
    for i, entry in enumerate(net.layers):
        v0 = entry.layer
        where = f"{source}: V0 layer '{_v0_name(entry, i)}'"
        if v0.type != "padding":
            copy = caffe_pb2.V1LayerParameter()
            copy.CopyFrom(entry)
            kept.append(copy)
        for j, blob in enumerate(entry.bottom):
            if blob not in producer:
                raise ParseError(f"{where}: unknown bottom blob {blob!r}; no earlier layer "
                                 "or net input produces it")
            src = producer[blob]
            if src < 0 or net.layers[src].layer.type != "padding":
                continue
            pad_layer = net.layers[src]
            if v0.type not in ("conv", "pool"):
                raise ParseError(f"{where}: a padding layer feeds this {v0.type!r} layer; "
                                 "V0 padding layers may only feed conv or pool layers")
            if len(entry.bottom) != 1 or len(pad_layer.bottom) != 1 or len(pad_layer.top) != 1:
                raise ParseError(f"{where}: padding is folded only between single-input "
                                 "layers (the padding layer needs one bottom and one top, "
                                 "the padded layer one bottom)")
            kept[-1].layer.pad = pad_layer.layer.pad
            kept[-1].bottom[j] = pad_layer.bottom[0]
        for blob in entry.top:
            producer[blob] = i
    return kept


def _upgrade_v0_layer(entry: caffe_pb2.V1LayerParameter, source: str,
                      index: int) -> caffe_pb2.V1LayerParameter:
    v1 = caffe_pb2.V1LayerParameter()
    v1.bottom.extend(entry.bottom)
    v1.top.extend(entry.top)
    if not entry.HasField("layer"):
        return v1
    v0 = entry.layer
    where = f"{source}: V0 layer '{_v0_name(entry, index)}'"
    kind = v0.type
    if v0.HasField("type"):
        if kind not in V0_TYPE_NAMES:
            raise ParseError(f"{where}: unknown V0 layer type {kind!r}; expected one of "
                             + ", ".join(sorted([*V0_TYPE_NAMES, "padding"])))
        v1.type = caffe_pb2.V1LayerParameter.LayerType.Value(V0_TYPE_NAMES[kind])
    for field, value in v0.ListFields():
        name = field.name
        if name == "type":
            continue
        if name in _DIRECT:
            if field.is_repeated:
                getattr(v1, name).extend(value)
            else:
                setattr(v1, name, value)
            continue
        targets, target_field = _FIELD_MAP.get(name, ({}, None))
        param_name = targets.get(kind) or targets.get(_ANY)
        if param_name is None:
            log.warning("%s: V0 field %s does not apply to layer type %r; dropped",
                        where, name, kind)
            continue
        message = getattr(v1, param_name)
        if target_field is None:
            message.CopyFrom(value)
            continue
        target = getattr(message, target_field)
        descriptor = message.DESCRIPTOR.fields_by_name[target_field]
        if descriptor.message_type is not None:
            target.CopyFrom(value)
        elif descriptor.is_repeated:
            target.append(value)
        else:
            setattr(message, target_field, value)
    return v1

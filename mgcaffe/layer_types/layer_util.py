"""Small helpers shared by the layer modules: axis arithmetic, parameter blobs, in-place checks."""

from __future__ import annotations

from math import prod

from ..fillers import fill_blob, filler_rng
from ..proto import caffe_pb2


def canonical_axis(layer, axis: int, num_axes: int, what: str = "axis") -> int:
    """`axis` counted from the end when negative; a LayerError naming `layer` if out of range."""
    if not -num_axes <= axis < num_axes:
        raise layer.error(f"{what} {axis} is out of range for a {num_axes}-D input "
                          f"(expected {-num_axes} <= {what} < {num_axes})")
    return axis + num_axes if axis < 0 else axis


def count(shape, start: int = 0, end: int | None = None) -> int:
    """Product of shape[start:end] (Caffe's Blob::count(start, end)); 1 for an empty range."""
    return int(prod(shape[start:end]))


def in_place(bottom, top, i: int = 0) -> bool:
    """Whether top[i] is computed in place over bottom[i] (the Net passes the same Blob)."""
    return top[i] is bottom[i] or top[i].data is bottom[i].data


def filler_param(message, present: bool, default_type: str = "constant",
                 default_value: float = 0.0) -> caffe_pb2.FillerParameter:
    """`message` when the prototxt set it, else a filler of `default_type`/`default_value`."""
    if present:
        return message
    param = caffe_pb2.FillerParameter(type=default_type)
    if default_type == "constant":
        param.value = default_value
    return param


def ensure_param_blob(layer, index: int, shape, filler: caffe_pb2.FillerParameter,
                      what: str) -> None:
    """Create layer.blobs[index] of `shape` filled by `filler`, or check a loaded one's shape.

    Blobs already present (weights loaded before setup) are kept when their shape matches.
    """
    shape = tuple(int(d) for d in shape)
    if index < len(layer.blobs):
        found = layer.blobs[index].shape
        if found != shape:
            raise layer.error(f"{what} blob (blobs[{index}]) has shape {found}, expected {shape}")
        return
    if index != len(layer.blobs):
        raise layer.error(f"cannot create blobs[{index}] before blobs[{len(layer.blobs)}]")
    blob = layer.new_blob(shape, name=f"{layer.name}/{what}")
    fill_blob(blob, filler, filler_rng(layer.ctx.seed, f"{layer.name}#{index}"))
    layer.blobs.append(blob)

"""Replace data layers that read files by random inputs of the declared shape.

Used by `mgcaffe time --synthetic-data` (and anything else that must run a train_val net
without its LMDB/images). The replacement happens on the NetParameter, before the Net is
built: each Data, ImageData, HDF5Data, MemoryData or WindowData layer becomes a DummyData
layer with the same name, tops and include/exclude rules.

Shapes. A Data layer's image shape comes from its records, so it is not in the prototxt;
the rule is:
- an explicit override `shapes[name] = (N, C, H, W, ...)`, `name` being a top blob or the
  layer (for its first top), always wins;
- MemoryData: (batch_size, channels, height, width) from memory_data_param;
- Data, ImageData, WindowData: (batch_size, 3, S, S) where S is the crop_size (from
  transform_param, or the layer's own legacy crop_size) when one is set; ImageData without
  a crop uses new_height x new_width when both are set, and 1 channel when is_color is
  false; otherwise S = 224 (ImageNet). MNIST-like 1x28x28 sources cannot be guessed: pass
  an override (`--synthetic-shape data=64,1,28,28`);
- HDF5Data declares no shape: every top needs an override.
The second top of Data, ImageData, MemoryData and WindowData is the label: shape (N,), N
the first top's batch, random integers in [0, num_classes) written once after the net is
built (see `fill_labels`). `batch_size`, when given, replaces the first dimension of every
synthetic top and of every Input layer's shapes.
"""

from __future__ import annotations

import numpy as np

from ..errors import NetError
from ..proto import caffe_pb2

FILE_DATA_TYPES = ("Data", "ImageData", "HDF5Data", "MemoryData", "WindowData")
_PARAM_FIELD = {"Data": "data_param", "ImageData": "image_data_param",
                "HDF5Data": "hdf5_data_param", "MemoryData": "memory_data_param",
                "WindowData": "window_data_param"}
DEFAULT_SIZE = 224


def parse_shape_override(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=N,C,H,W` -> (NAME, (N, C, H, W)); a one-line NetError otherwise."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",")) if sep else ()
    except ValueError:
        shape = ()
    if not name or not shape or any(d <= 0 for d in shape):
        raise NetError(f"--synthetic-shape {text!r}: expected NAME=N,C,H,W with positive "
                       f"integers, e.g. data=64,1,28,28")
    return name, shape


def _image_shape(layer: caffe_pb2.LayerParameter, batch: int) -> tuple[int, ...]:
    specific = getattr(layer, _PARAM_FIELD[layer.type])
    if layer.type == "MemoryData":
        return (batch, specific.channels, specific.height, specific.width)
    crop = layer.transform_param.crop_size or getattr(specific, "crop_size", 0)
    channels = 1 if layer.type == "ImageData" and not specific.is_color else 3
    if crop:
        return (batch, channels, crop, crop)
    if layer.type == "ImageData" and specific.new_height and specific.new_width:
        return (batch, channels, specific.new_height, specific.new_width)
    return (batch, channels, DEFAULT_SIZE, DEFAULT_SIZE)


def _top_shapes(layer, shapes, batch_size) -> list[tuple[int, ...]]:
    specific = getattr(layer, _PARAM_FIELD[layer.type])
    batch = batch_size or specific.batch_size or 1
    out = []
    for j, top in enumerate(layer.top):
        if top in shapes or (j == 0 and layer.name in shapes):
            shape = shapes.get(top) or shapes[layer.name]
            shape = (batch_size, *shape[1:]) if batch_size else shape
        elif layer.type == "HDF5Data":
            raise NetError(f"layer {layer.name!r} (HDF5Data): top {top!r} has no shape in the "
                           f"prototxt; give one with --synthetic-shape {top}=N,C,...")
        elif j == 0:
            shape = _image_shape(layer, batch)
        elif j == 1:
            shape = (out[0][0],)  # the label follows the data's batch (overridden or not)
        else:
            raise NetError(f"layer {layer.name!r} ({layer.type}): cannot guess the shape of "
                           f"top {top!r}; give one with --synthetic-shape {top}=N,...")
        out.append(tuple(int(d) for d in shape))
    return out


def synthesize_data_layers(netparam: caffe_pb2.NetParameter, shapes: dict | None = None,
                           batch_size: int | None = None, *, replace_data: bool = True
                           ) -> tuple[caffe_pb2.NetParameter, list[str]]:
    """A copy of `netparam` with file-reading data layers replaced by DummyData (only
    when `replace_data`) and Input layers given the `shapes`/`batch_size` asked for.

    Returns (the new NetParameter, names of the label tops to fill with `fill_labels`).
    """
    shapes = dict(shapes or {})
    out = caffe_pb2.NetParameter()
    out.CopyFrom(netparam)
    labels = []
    for layer in out.layer:
        if layer.type == "Input":
            for j, top in enumerate(layer.top):
                if j < len(layer.input_param.shape) and (
                        top in shapes or (j == 0 and layer.name in shapes)):
                    dims = shapes.get(top) or shapes[layer.name]
                    layer.input_param.shape[j].ClearField("dim")
                    layer.input_param.shape[j].dim.extend(dims)
                if batch_size and j < len(layer.input_param.shape):
                    layer.input_param.shape[j].dim[0] = batch_size
            continue
        if not replace_data or layer.type not in FILE_DATA_TYPES:
            continue
        top_shapes = _top_shapes(layer, shapes, batch_size)
        keep = caffe_pb2.LayerParameter(name=layer.name, type="DummyData", top=layer.top,
                                        include=layer.include, exclude=layer.exclude)
        if layer.HasField("phase"):
            keep.phase = layer.phase
        for j, shape in enumerate(top_shapes):
            keep.dummy_data_param.shape.add().dim.extend(shape)
            filler = keep.dummy_data_param.data_filler.add()
            if j == 1 and layer.type != "HDF5Data":
                # Constant: filled once, so the labels written by fill_labels stay.
                filler.type, filler.value = "constant", 0
                labels.append(layer.top[j])
            else:
                filler.type, filler.std = "gaussian", 1.0
        layer.CopyFrom(keep)
    return out, labels


def fill_labels(net, label_tops, num_classes: int = 10, seed: int | None = None) -> None:
    """Write random integer labels in [0, num_classes) into the given blobs of `net`."""
    rng = np.random.default_rng(seed)
    for name in label_tops:
        if name in net.blobs:
            blob = net.blobs[name]
            blob.data[...] = net.xp.asarray(rng.integers(0, num_classes, size=blob.shape),
                                            dtype=blob.dtype)

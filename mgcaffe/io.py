"""pycaffe's caffe.io: blob/datum <-> array conversion, image loading and resizing, Transformer.

Semantics follow pycaffe: `blobproto_to_array` returns float64 and uses the legacy
(num, channels, height, width) shape when any of those fields is set, else `shape.dim`
(a blob without a shape holding several values is a ValueError); `array_to_datum` stores
uint8 arrays as bytes and anything else as float_data, and leaves the label unset when it
is None. Images are H x W x K float32 arrays in [0, 1] (RGB); `Transformer.preprocess`
turns one into the K x H x W array a net input takes.

Resizing is done here with numpy (no scikit-image or SciPy needed): interp_order 0 is
nearest neighbour, 1 (the default) bilinear with pixel centres aligned (what
scikit-image's `resize(order=1)` computes, without its anti-aliasing blur).
"""

from __future__ import annotations

import numpy as np

from .data.db import iter_records
from .proto import caffe_pb2

_LEGACY = ("num", "channels", "height", "width")


# ----------------------------------------------------------------------------- protos
def blobproto_to_array(blob, return_diff: bool = False) -> np.ndarray:
    """A BlobProto's data (or diff) as a float64 array of the blob's shape."""
    if return_diff:
        values = blob.diff if len(blob.diff) else blob.double_diff
    else:
        values = blob.data if len(blob.data) else blob.double_data
    data = np.array(values, dtype=np.float64)
    if any(blob.HasField(f) for f in _LEGACY):
        return data.reshape(blob.num, blob.channels, blob.height, blob.width)
    return data.reshape(tuple(blob.shape.dim))


def array_to_blobproto(arr, diff=None) -> caffe_pb2.BlobProto:
    """A BlobProto holding `arr` (and `diff`, of the same shape) as float values."""
    arr = np.asarray(arr)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(arr.shape)
    blob.data.extend(arr.astype(float).flat)
    if diff is not None:
        blob.diff.extend(np.asarray(diff).astype(float).flat)
    return blob


def arraylist_to_blobprotovector_str(arraylist) -> bytes:
    """A serialized BlobProtoVector of the arrays."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(arr) for arr in arraylist)
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(data: bytes) -> list[np.ndarray]:
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr, label=None) -> caffe_pb2.Datum:
    """A Datum of a C x H x W array: bytes for uint8, float_data otherwise."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError("Incorrect array shape.")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = arr.shape
    if arr.dtype == np.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = label
    return datum


def datum_to_array(datum) -> np.ndarray:
    """A Datum's values as a C x H x W array (uint8 for byte data, float64 otherwise)."""
    shape = (datum.channels, datum.height, datum.width)
    if len(datum.data):
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    return np.array(datum.float_data, dtype=float).reshape(shape)


def db_datums(path, backend=None):
    """(key, Datum) of every record of a Datum LMDB or LevelDB, in key order (`backend`:
    caffe_pb2.DataParameter.LMDB or LEVELDB; None: whichever the files are). Not in
    pycaffe, whose users open the database with the lmdb or leveldb module; with
    `datum_to_array` it reads what convert_imageset and extract_features write."""
    for key, value in iter_records(path, backend):
        datum = caffe_pb2.Datum()
        datum.ParseFromString(value)
        yield key, datum


# ----------------------------------------------------------------------------- images
def load_image(filename, color: bool = True) -> np.ndarray:
    """An image file as float32 in [0, 1]: H x W x 3 (RGB) when color, else H x W x 1
    (grey images stay grey without color; an alpha channel is dropped)."""
    from PIL import Image  # noqa: PLC0415 - imaging only where images are read

    with Image.open(filename) as im:
        if not color:
            im = im.convert("L")
        elif im.mode not in ("RGB", "L", "RGBA"):
            im = im.convert("RGBA" if "A" in im.mode else "RGB")
        raw = np.asarray(im)
    scale = 65535.0 if raw.dtype == np.uint16 else 255.0
    img = (raw.astype(np.float32) / np.float32(scale)) if raw.dtype != np.float32 else raw
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
        if color:
            img = np.tile(img, (1, 1, 3))
    elif img.shape[2] == 4:
        img = img[:, :, :3]
    return img


def _axis_weights(n_in: int, n_out: int, order: int):
    """Source indices and weights along one axis, for pixel-centre-aligned resampling."""
    centres = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    if order == 0:
        index = np.clip(np.floor(centres + 0.5).astype(int), 0, n_in - 1)
        return index, index, np.zeros(n_out)
    centres = np.clip(centres, 0, n_in - 1)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, n_in - 1)
    return low, high, centres - low


def resize_image(im, new_dims, interp_order: int = 1) -> np.ndarray:
    """Resize an H x W x K array to new_dims (height, width); float32 result."""
    im = np.asarray(im)
    if interp_order not in (0, 1):
        raise ValueError(f"resize_image: interp_order {interp_order} is not supported "
                         "(0: nearest, 1: bilinear)")
    h, w = int(new_dims[0]), int(new_dims[1])
    if im.size and im.min() == im.max():
        return np.full((h, w) + im.shape[2:], im.min(), dtype=np.float32)
    data = im.astype(np.float64)
    r0, r1, rw = _axis_weights(im.shape[0], h, interp_order)
    c0, c1, cw = _axis_weights(im.shape[1], w, interp_order)
    rw = rw.reshape((-1, 1) + (1,) * (im.ndim - 2))
    cw = cw.reshape((1, -1) + (1,) * (im.ndim - 2))
    rows = data[r0] * (1 - rw) + data[r1] * rw
    out = rows[:, c0] * (1 - cw) + rows[:, c1] * cw
    return out.astype(np.float32)


def oversample(images, crop_dims) -> np.ndarray:
    """Ten crops per H x W x K image: four corners and the centre, then their mirrors
    (left-right), as N*10 x crop_h x crop_w x K float32."""
    crop_h, crop_w = int(crop_dims[0]), int(crop_dims[1])
    im_h, im_w, channels = images[0].shape
    top_lefts = [(0, 0), (0, im_w - crop_w), (im_h - crop_h, 0), (im_h - crop_h, im_w - crop_w),
                 (int(im_h / 2.0 - crop_h / 2.0), int(im_w / 2.0 - crop_w / 2.0))]
    crops = np.empty((10 * len(images), crop_h, crop_w, channels), dtype=np.float32)
    k = 0
    for im in images:
        five = [im[y:y + crop_h, x:x + crop_w, :] for y, x in top_lefts]
        for crop in five:
            crops[k] = crop
            k += 1
        for crop in five:
            crops[k] = crop[:, ::-1, :]
            k += 1
    return crops


# ----------------------------------------------------------------------------- Transformer
class Transformer:
    """Prepare images for a net's inputs (and undo it): resize, transpose, channel swap,
    raw scale, mean subtraction, input scale, in that order (pycaffe's Transformer).

    `inputs`: {input name: its shape (N, K, H, W)}, e.g. {"data": net.blobs["data"].shape}.
    """

    def __init__(self, inputs):
        self.inputs = {name: tuple(shape) for name, shape in inputs.items()}
        self.transpose: dict = {}
        self.channel_swap: dict = {}
        self.raw_scale: dict = {}
        self.mean: dict = {}
        self.input_scale: dict = {}

    def _check_input(self, in_):
        if in_ not in self.inputs:
            raise Exception(f"{in_} is not one of the net inputs: {self.inputs}")

    def preprocess(self, in_, data) -> np.ndarray:
        """An H' x W' x K image as the K x H x W float32 array input `in_` takes."""
        self._check_input(in_)
        caffe_in = np.asarray(data).astype(np.float32, copy=False)
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        if in_ in self.transpose:
            caffe_in = caffe_in.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            caffe_in = caffe_in[list(self.channel_swap[in_]), :, :]
        if self.raw_scale.get(in_) is not None:
            caffe_in = caffe_in * self.raw_scale[in_]
        if self.mean.get(in_) is not None:
            caffe_in = caffe_in - self.mean[in_]
        if self.input_scale.get(in_) is not None:
            caffe_in = caffe_in * self.input_scale[in_]
        return caffe_in.astype(np.float32, copy=False)

    def deprocess(self, in_, data) -> np.ndarray:
        """Undo preprocess (except resizing): a K x H x W array back to H x W x K."""
        self._check_input(in_)
        out = np.array(data, copy=True).squeeze()
        if self.input_scale.get(in_) is not None:
            out = out / self.input_scale[in_]
        if self.mean.get(in_) is not None:
            out = out + self.mean[in_]
        if self.raw_scale.get(in_) is not None:
            out = out / self.raw_scale[in_]
        if in_ in self.channel_swap:
            out = out[np.argsort(self.channel_swap[in_]), :, :]
        if in_ in self.transpose:
            out = out.transpose(np.argsort(self.transpose[in_]))
        return out

    def set_transpose(self, in_, order) -> None:
        """Dimension order, e.g. (2, 0, 1) turns H x W x K into K x H x W."""
        self._check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise Exception("Transpose order needs to have the same number of dimensions "
                            "as the input.")
        self.transpose[in_] = order

    def set_channel_swap(self, in_, order) -> None:
        """Channel order after transposing, e.g. (2, 1, 0) for RGB -> BGR."""
        self._check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise Exception("Channel swap needs to have the same number of dimensions as "
                            "the input channels.")
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_, scale) -> None:
        """Multiply the [0, 1] image by `scale` first (255 for the ImageNet models)."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean) -> None:
        """Subtract `mean`: one value per channel (K,), or K x H x W (resized when its
        H x W differ from the input's)."""
        self._check_input(in_)
        mean = np.asarray(mean)
        if mean.ndim == 1:
            if mean.shape[0] != self.inputs[in_][1]:
                raise ValueError("Mean channels incompatible with input.")
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            shape = mean.shape if mean.ndim != 2 else (1,) + mean.shape
            if len(shape) != 3:
                raise ValueError("Mean shape invalid")
            mean = mean.reshape(shape)
            if shape != self.inputs[in_][1:]:
                if shape[0] != self.inputs[in_][1]:
                    raise ValueError("Mean shape incompatible with input shape.")
                resized = resize_image(mean.transpose(1, 2, 0), self.inputs[in_][2:])
                mean = resized.reshape(tuple(self.inputs[in_][2:]) + (shape[0],))
                mean = mean.transpose(2, 0, 1)
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale) -> None:
        """Multiply by `scale` last (after mean subtraction)."""
        self._check_input(in_)
        self.input_scale[in_] = scale

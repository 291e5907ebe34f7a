"""Caffe's DataTransformer: crop, mirror, mean subtraction and scaling of one CHW image.

Order of operations and arithmetic as in Caffe's DataTransformer::Transform:
    out[c, h, w'] = (x[c, h_off + h, w_off + w] - mean[c, h_off + h, w_off + w]) * scale
with w' = crop_w - 1 - w when mirrored. The mean_file must have the image's full (uncropped)
size and is cropped at the same offsets as the image; mean_value is per channel (one value
applies to every channel). Crop offsets are random in TRAIN, centred in TEST; the mirror coin
is random in either phase when `mirror` is set (Caffe draws it first, then h_off, w_off).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DataError, ParseError
from ..formats.protoio import read_binaryproto
from ..proto import caffe_pb2


def read_mean_file(path: str) -> np.ndarray:
    """A .binaryproto mean image as a float32 (C, H, W) array (a leading num of 1 is dropped)."""
    try:
        mean = read_binaryproto(path, np.float32)
    except ParseError as exc:
        raise DataError(f"mean_file: {exc}") from None
    if mean.ndim == 4 and mean.shape[0] == 1:
        mean = mean[0]
    if mean.ndim != 3:
        raise DataError(f"mean_file {path!r} has shape {mean.shape}, expected 1xCxHxW")
    return mean


class DataTransformer:
    """Applies one layer's TransformationParameter to CHW images on the host.

    rng: numpy Generator for the crop offsets and mirror coin (seeded by the layer, so
    runs reproduce). dtype: output dtype (the net's float type).
    """

    def __init__(self, param: caffe_pb2.TransformationParameter, phase: int,
                 rng: np.random.Generator | None = None, dtype=np.float32, name: str = ""):
        self.name = name
        self.phase = phase
        self.rng = rng if rng is not None else np.random.default_rng()
        self.dtype = np.dtype(dtype)
        self.scale = float(param.scale)
        self.mirror = bool(param.mirror)
        self.crop_size = int(param.crop_size)
        if param.force_color and param.force_gray:
            raise DataError(f"{name}: force_color and force_gray cannot both be set")
        #: How encoded images are decoded: True colour, False grey, None as stored.
        self.color = True if param.force_color else (False if param.force_gray else None)
        if param.mean_file and len(param.mean_value):
            raise DataError(f"{name}: cannot specify mean_file and mean_value at the same time")
        self.mean_file = param.mean_file or None
        self.mean = read_mean_file(os.fspath(param.mean_file)) if param.mean_file else None
        self.mean_values = np.asarray(param.mean_value, dtype=self.dtype)

    def output_shape(self, shape, what: str = "image") -> tuple[int, int, int]:
        """The transformed (C, H, W) of an input of `shape`; errors if it cannot be cropped."""
        c, h, w = (int(d) for d in shape)
        if self.crop_size:
            if h < self.crop_size or w < self.crop_size:
                raise DataError(f"{what}: image is {c}x{h}x{w}, smaller than crop_size "
                                f"{self.crop_size}")
            return c, self.crop_size, self.crop_size
        return c, h, w

    def _mean_for(self, c: int, h: int, w: int, what: str):
        if self.mean is not None:
            if self.mean.shape != (c, h, w):
                m = self.mean.shape
                raise DataError(f"{what}: image is {c}x{h}x{w} but mean_file "
                                f"{self.mean_file!r} is {m[0]}x{m[1]}x{m[2]}; they must match")
            return self.mean.astype(self.dtype, copy=False)
        if self.mean_values.size:
            if self.mean_values.size == 1:
                return self.mean_values.reshape(1, 1, 1)
            if self.mean_values.size != c:
                raise DataError(f"{what}: {self.mean_values.size} mean_value entries for an "
                                f"image of {c} channels; give one or one per channel")
            return self.mean_values.reshape(c, 1, 1)
        return None

    def transform(self, image: np.ndarray, out: np.ndarray | None = None,
                  what: str = "image") -> np.ndarray:
        """Transform one CHW image (uint8 or float) into `out` (allocated when None)."""
        c, h, w = image.shape
        _, out_h, out_w = self.output_shape(image.shape, what)
        do_mirror = self.mirror and bool(self.rng.integers(2))
        h_off = w_off = 0
        if self.crop_size:
            if self.phase == caffe_pb2.TRAIN:
                h_off = int(self.rng.integers(h - out_h + 1))
                w_off = int(self.rng.integers(w - out_w + 1))
            else:
                h_off, w_off = (h - out_h) // 2, (w - out_w) // 2
        rows, cols = slice(h_off, h_off + out_h), slice(w_off, w_off + out_w)
        x = image[:, rows, cols].astype(self.dtype)
        mean = self._mean_for(c, h, w, what)
        if mean is not None:
            x -= mean[:, rows, cols] if mean.shape[1:] == (h, w) else mean
        if self.scale != 1:
            x *= self.dtype.type(self.scale)
        if do_mirror:
            x = x[:, :, ::-1]
        if out is None:
            return np.ascontiguousarray(x)
        out[...] = x
        return out

"""Caffe `Datum` records <-> numpy arrays (channels first).

A Datum holds one image and its label in one of three forms: raw uint8 bytes in `data`
(CHW order), 32-bit floats in `float_data`, or an encoded JPEG/PNG file in `data` with
`encoded` set (decoded here with Pillow into BGR, as Caffe's OpenCV decode gives).
"""

from __future__ import annotations

import numpy as np
from google.protobuf.message import DecodeError

from ..errors import DataError
from ..proto import caffe_pb2
from .image import decode_image


def parse_datum(value: bytes, what: str = "record") -> caffe_pb2.Datum:
    """Deserialize a Datum; `what` (e.g. "LMDB 'x' key '0001'") names it in errors."""
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as exc:
        raise DataError(f"{what}: not a Caffe Datum ({exc})") from None
    return datum


def datum_to_array(datum: caffe_pb2.Datum, color: bool | None = None,
                   what: str = "record") -> np.ndarray:
    """The Datum's image as a CHW array: uint8 for raw and encoded data, float32 for float_data.

    `color` applies to encoded images only (True: 3 channels, False: 1, None: as stored).
    """
    if datum.encoded:
        return decode_image(bytes(datum.data), color=color, what=what)
    shape = (datum.channels, datum.height, datum.width)
    expected = shape[0] * shape[1] * shape[2]
    # Caffe's rule: uint8 `data` when it is non-empty, else `float_data`.
    if datum.data:
        if len(datum.data) != expected:
            raise DataError(f"{what}: Datum has {len(datum.data)} bytes of data, expected "
                            f"{shape[0]}x{shape[1]}x{shape[2]} = {expected}")
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    if len(datum.float_data) != expected or expected == 0:
        raise DataError(f"{what}: Datum has {len(datum.float_data)} float_data values and no "
                        f"data, expected {shape[0]}x{shape[1]}x{shape[2]} = {expected}")
    return np.asarray(datum.float_data, dtype=np.float32).reshape(shape)


def array_to_datum(array: np.ndarray, label: int = 0) -> caffe_pb2.Datum:
    """A Datum from a CHW array: uint8 goes to `data`, any other dtype to `float_data`."""
    array = np.asarray(array)
    if array.ndim != 3:
        raise DataError(f"array_to_datum needs a 3-d CHW array, got shape {array.shape}")
    datum = caffe_pb2.Datum(channels=array.shape[0], height=array.shape[1],
                            width=array.shape[2], label=int(label))
    if array.dtype == np.uint8:
        datum.data = np.ascontiguousarray(array).tobytes()
    else:
        datum.float_data.extend(array.astype(np.float32).ravel().tolist())
    return datum


def encoded_datum(data: bytes, label: int = 0) -> caffe_pb2.Datum:
    """A Datum holding an encoded image file's bytes (Caffe leaves the sizes unset)."""
    return caffe_pb2.Datum(data=bytes(data), label=int(label), encoded=True)

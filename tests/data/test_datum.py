"""Datum <-> numpy: raw uint8, float_data and encoded PNG/JPEG records."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from mgcaffe.data.datum import array_to_datum, datum_to_array, encoded_datum, parse_datum
from mgcaffe.data.image import encode_image
from mgcaffe.errors import DataError
from mgcaffe.proto import caffe_pb2


def roundtrip(datum):
    return parse_datum(datum.SerializeToString(), "test")


def png_bytes(array, fmt="PNG", **kw):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_raw_uint8_roundtrip():
    x = np.random.default_rng(0).integers(0, 256, size=(3, 4, 5), dtype=np.uint8)
    d = roundtrip(array_to_datum(x, label=7))
    assert (d.channels, d.height, d.width, d.label) == (3, 4, 5, 7)
    assert d.data == x.tobytes() and not d.float_data
    y = datum_to_array(d)
    assert y.dtype == np.uint8 and np.array_equal(y, x)


def test_float_data_roundtrip():
    x = np.random.default_rng(1).standard_normal((2, 3, 3)).astype(np.float32)
    d = roundtrip(array_to_datum(x, label=3))
    assert not d.data and len(d.float_data) == 18
    y = datum_to_array(d)
    assert y.dtype == np.float32 and np.array_equal(y, x)


def test_encoded_png_color_is_bgr_chw():
    rgb = np.random.default_rng(2).integers(0, 256, size=(4, 6, 3), dtype=np.uint8)
    d = roundtrip(encoded_datum(png_bytes(rgb), label=1))
    y = datum_to_array(d)
    assert y.shape == (3, 4, 6)
    for c, source_channel in enumerate((2, 1, 0)):  # B, G, R
        assert np.array_equal(y[c], rgb[:, :, source_channel])


def test_encoded_png_gray_native_and_forced():
    gray = np.arange(20, dtype=np.uint8).reshape(4, 5) * 12
    d = encoded_datum(png_bytes(gray))
    assert np.array_equal(datum_to_array(d), gray[None])
    forced = datum_to_array(d, color=True)
    assert forced.shape == (3, 4, 5) and all(np.array_equal(forced[c], gray) for c in range(3))


def test_encoded_color_forced_gray_uses_luma():
    rgb = np.random.default_rng(3).integers(0, 256, size=(3, 3, 3), dtype=np.uint8)
    y = datum_to_array(encoded_datum(png_bytes(rgb)), color=False)
    r, g, b = (rgb[..., i].astype(float) for i in range(3))
    luma = (r * 299 + g * 587 + b * 114) / 1000
    assert y.shape == (1, 3, 3)
    assert np.abs(y[0].astype(float) - luma).max() <= 1


def test_encoded_jpeg_close_to_source():
    ramp = np.linspace(0, 255, 16 * 16).reshape(16, 16)
    rgb = np.stack([ramp, ramp.T, 255 - ramp], axis=-1).astype(np.uint8)
    y = datum_to_array(encoded_datum(png_bytes(rgb, "JPEG", quality=95)))
    expected = rgb[:, :, ::-1].transpose(2, 0, 1).astype(float)
    assert y.shape == (3, 16, 16)
    assert np.abs(y - expected).mean() < 4


def test_encode_image_roundtrip():
    bgr = np.random.default_rng(4).integers(0, 256, size=(3, 5, 4), dtype=np.uint8)
    assert np.array_equal(datum_to_array(encoded_datum(encode_image(bgr, "PNG"))), bgr)


def test_wrong_data_size_names_record():
    d = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"\x00" * 3)
    with pytest.raises(DataError, match="rec7.*3 bytes.*1x2x2 = 4"):
        datum_to_array(d, what="rec7")


def test_missing_data_and_garbage_inputs():
    with pytest.raises(DataError, match="float_data"):
        datum_to_array(caffe_pb2.Datum(channels=1, height=1, width=2))
    with pytest.raises(DataError, match="cannot decode"):
        datum_to_array(encoded_datum(b"not an image"), what="k")
    with pytest.raises(DataError, match="not a Caffe Datum"):
        parse_datum(b"\xff\xff\xff", "k")
    with pytest.raises(DataError, match="3-d"):
        array_to_datum(np.zeros((2, 2), np.uint8))

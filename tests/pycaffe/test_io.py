"""mgcaffe.io: conversions (dtypes, legacy shapes, errors), images, Transformer by hand."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mgcaffe
from mgcaffe import io as cio
from mgcaffe.proto import caffe_pb2


# ----------------------------------------------------------------------------- protos
def test_blobproto_shapes_dtypes_and_errors():
    legacy = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3, data=range(6))
    arr = cio.blobproto_to_array(legacy)
    assert arr.shape == (1, 2, 1, 3) and arr.dtype == np.float64
    assert arr[0, 1, 0, 2] == 5.0
    shaped = caffe_pb2.BlobProto(data=[1.5, 2.5], diff=[3, 4])
    shaped.shape.dim.extend([2])
    np.testing.assert_array_equal(cio.blobproto_to_array(shaped), [1.5, 2.5])
    np.testing.assert_array_equal(cio.blobproto_to_array(shaped, return_diff=True), [3, 4])
    with pytest.raises(ValueError):
        cio.blobproto_to_array(caffe_pb2.BlobProto(data=[1, 2, 3]))  # no shape, 3 values
    scalar = cio.blobproto_to_array(caffe_pb2.BlobProto(data=[123]))
    assert scalar.shape == () and scalar == 123


def test_array_blobproto_vector_round_trips():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[[0.25]]])
    blob = cio.array_to_blobproto(a, diff=a * 2)
    assert list(blob.shape.dim) == [2, 3] and list(blob.diff) == [0, 2, 4, 6, 8, 10]
    back = cio.blobprotovector_str_to_arraylist(cio.arraylist_to_blobprotovector_str([a, b]))
    assert [x.shape for x in back] == [(2, 3), (1, 1, 1)]
    np.testing.assert_array_equal(back[0], a)
    assert back[1].dtype == np.float64 and back[1].item() == 0.25


def test_datum_round_trips_and_label():
    pixels = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    datum = cio.array_to_datum(pixels, label=3)
    assert datum.data == bytes(range(24)) and not datum.float_data and datum.label == 3
    np.testing.assert_array_equal(cio.datum_to_array(datum), pixels)
    floats = cio.array_to_datum(pixels.astype(np.float32) / 2)
    assert not floats.HasField("label") and len(floats.float_data) == 24 and not floats.data
    back = cio.datum_to_array(floats)
    assert back.dtype == np.float64 and back[1, 2, 3] == 11.5
    assert len(cio.array_to_datum(pixels, 1).SerializeToString()) > \
        len(cio.array_to_datum(pixels).SerializeToString())
    with pytest.raises(ValueError, match="Incorrect array shape"):
        cio.array_to_datum(np.zeros((2, 2)))


# ----------------------------------------------------------------------------- images
def test_load_image_color_grey_and_alpha(tmp_path):
    rgba = np.zeros((2, 3, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 255, 10
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    img = cio.load_image(str(tmp_path / "a.png"))
    assert img.shape == (2, 3, 3) and img.dtype == np.float32
    np.testing.assert_array_equal(img[0, 0], [1, 0, 0])
    grey = np.array([[0, 51], [102, 255]], np.uint8)
    Image.fromarray(grey, "L").save(tmp_path / "g.png")
    as_color = cio.load_image(str(tmp_path / "g.png"))
    assert as_color.shape == (2, 2, 3)
    np.testing.assert_allclose(as_color[0, 1], [0.2, 0.2, 0.2], rtol=1e-6)
    as_grey = cio.load_image(str(tmp_path / "g.png"), color=False)
    assert as_grey.shape == (2, 2, 1) and as_grey[1, 1, 0] == 1.0


def test_resize_image_bilinear_by_hand():
    im = np.array([[0.0, 1.0], [2.0, 3.0]]).reshape(2, 2, 1)
    out = cio.resize_image(im, (4, 4))
    assert out.shape == (4, 4, 1) and out.dtype == np.float32
    # Output pixel centres map to input coordinates -0.25, 0.25, 0.75, 1.25 (clamped to
    # 0..1): along each axis the weights are 0, 0.25, 0.75, 1.
    w = np.array([0.0, 0.25, 0.75, 1.0])
    expected = 2 * w[:, None] + 1 * w[None, :]
    np.testing.assert_allclose(out[..., 0], expected, rtol=1e-6)
    np.testing.assert_array_equal(cio.resize_image(im, (2, 2)), im)
    nearest = cio.resize_image(im, (4, 4), interp_order=0)[..., 0]
    np.testing.assert_array_equal(nearest[0], [0, 0, 1, 1])
    flat = cio.resize_image(np.full((3, 3, 3), 0.5), (2, 5))
    assert flat.shape == (2, 5, 3) and (flat == 0.5).all()
    with pytest.raises(ValueError, match="interp_order 3"):
        cio.resize_image(im, (3, 3), interp_order=3)


def test_oversample_ten_crops_in_order():
    im = np.arange(4 * 5, dtype=np.float32).reshape(4, 5, 1)
    crops = cio.oversample([im], (2, 2))
    assert crops.shape == (10, 2, 2, 1)
    corners = [im[0:2, 0:2], im[0:2, 3:5], im[2:4, 0:2], im[2:4, 3:5], im[1:3, 1:3]]
    for k, crop in enumerate(corners):
        np.testing.assert_array_equal(crops[k], crop)
        np.testing.assert_array_equal(crops[5 + k], crop[:, ::-1])


# ----------------------------------------------------------------------------- Transformer
def test_transformer_by_hand():
    t = cio.Transformer({"data": (1, 3, 2, 2)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    image = np.zeros((2, 2, 3), np.float32)
    image[..., 0], image[..., 1], image[..., 2] = 0.1, 0.2, 0.4  # R, G, B
    out = t.preprocess("data", image)
    assert out.shape == (3, 2, 2) and out.dtype == np.float32
    # BGR order, * 255, minus the per-channel mean (in net order), * 0.5.
    expected = [(0.4 * 255 - 10) * 0.5, (0.2 * 255 - 20) * 0.5, (0.1 * 255 - 30) * 0.5]
    np.testing.assert_allclose(out[:, 0, 0], expected, rtol=1e-5)
    np.testing.assert_allclose(t.deprocess("data", out), image, rtol=1e-5, atol=1e-6)
    # Images of another size are resized first.
    assert t.preprocess("data", np.zeros((5, 7, 3))).shape == (3, 2, 2)


def test_transformer_checks():
    t = cio.Transformer({"data": (1, 3, 4, 4)})
    with pytest.raises(Exception, match="is not one of the net inputs"):
        t.set_raw_scale("image", 1)
    with pytest.raises(Exception, match="Transpose order"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(Exception, match="Channel swap"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="Mean channels"):
        t.set_mean("data", np.zeros(2))
    with pytest.raises(ValueError, match="Mean shape invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 4)))
    t.set_mean("data", np.ones((3, 8, 8)))  # resized to the input's 4 x 4
    assert t.mean["data"].shape == (3, 4, 4)


def test_io_is_the_pycaffe_name():
    assert mgcaffe.io is cio and mgcaffe.io.Transformer is cio.Transformer

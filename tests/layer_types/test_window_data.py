"""WindowData: window file parsing, fg/bg batch composition, crops, context padding."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

from mgcaffe.blob import Blob
from mgcaffe.errors import DataError, LayerError
from mgcaffe.layer_types import TRAIN, LayerContext, create_layer
from mgcaffe.proto import caffe_pb2


def write_image(path, rng, h=8, w=8):
    rgb = rng.integers(1, 255, size=(h, w, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return rgb[:, :, ::-1].transpose(2, 0, 1).astype(float)  # CHW BGR, as the layer reads


def make(tmp_path, windows_text, body, batch=4):
    (tmp_path / "windows.txt").write_text(windows_text)
    text = (f'name: "w" type: "WindowData" top: "data" top: "label" window_data_param {{ '
            f'source: "{tmp_path / "windows.txt"}" root_folder: "{tmp_path}/" '
            f'batch_size: {batch} {body} }}')
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(param, LayerContext(phase=TRAIN, dtype=np.float64, seed=3))
    top = [Blob((), dtype=np.float64), Blob((), dtype=np.float64)]
    return layer, top


def test_batches_hold_background_then_foreground_crops(tmp_path):
    image = write_image(tmp_path / "a.png", np.random.default_rng(0))
    text = "# 0\na.png\n3 8 8\n3\n2 0.9 2 1 5 4\n1 0.2 0 0 3 3\n3 0.4 1 1 4 4\n"
    layer, top = make(tmp_path, text, "fg_threshold: 0.5 bg_threshold: 0.3 fg_fraction: 0.5 "
                      "scale: 0.5 crop_size: 4", batch=4)  # the legacy crop_size field
    layer.setup([], top)
    try:
        assert top[0].shape == (4, 3, 4, 4) and top[1].shape == (4,)
        layer.forward([], top)
        # Crop size equals the window size (warp mode, no resize): exact copies.
        np.testing.assert_array_equal(top[1].data, [0, 0, 2, 2])
        for i in (0, 1):
            np.testing.assert_allclose(top[0].data[i], image[:, 0:4, 0:4] * 0.5)
        for i in (2, 3):
            np.testing.assert_allclose(top[0].data[i], image[:, 1:5, 2:6] * 0.5)
    finally:
        layer.close()


def test_mirror_and_mean_value(tmp_path):
    image = write_image(tmp_path / "a.png", np.random.default_rng(1))
    text = "# 0\na.png\n3 8 8\n2\n1 0.9 2 1 5 4\n1 0.1 0 0 3 3\n"
    layer, top = make(tmp_path, text, "fg_fraction: 0.5", batch=8)
    layer.param.transform_param.mirror = True
    layer.param.transform_param.crop_size = 4
    layer.param.transform_param.mean_value.append(10)
    layer.setup([], top)
    try:
        seen = set()
        region = image[:, 1:5, 2:6] - 10
        for _ in range(3):
            layer.forward([], top)
            for i in range(4, 8):
                same = np.allclose(top[0].data[i], region)
                flipped = np.allclose(top[0].data[i], region[:, :, ::-1])
                assert same or flipped
                seen.add(flipped)
        assert seen == {True, False}
    finally:
        layer.close()


def test_context_pad_places_the_warped_window_with_a_border(tmp_path):
    write_image(tmp_path / "a.png", np.random.default_rng(2))
    text = "# 0\na.png\n3 8 8\n2\n1 0.9 0 0 7 7\n1 0.1 0 0 3 3\n"
    layer, top = make(tmp_path, text, "fg_fraction: 1 context_pad: 1", batch=1)
    layer.param.transform_param.crop_size = 10
    layer.setup([], top)
    try:
        layer.forward([], top)
        data = top[0].data[0]
        # By hand: scale 10/8 around the centre gives x, y in [-1, 9], clipped to [0, 7];
        # the 8 clipped pixels warp to round(8 * 10/11) = 7, placed at offset round(10/11) = 1.
        assert (data[:, 0, :] == 0).all() and (data[:, :, 0] == 0).all()
        assert (data[:, 8:, :] == 0).all() and (data[:, :, 8:] == 0).all()
        assert (data[:, 1:8, 1:8] > 0).all()
    finally:
        layer.close()


def test_bad_window_files(tmp_path):
    write_image(tmp_path / "a.png", np.random.default_rng(3))
    layer, top = make(tmp_path, "", "")
    layer.param.transform_param.crop_size = 4
    with pytest.raises(DataError, match="empty"):
        layer.setup([], top)
    layer, top = make(tmp_path, "# 0\na.png\n3 8 8\n1\n0 0.9 0 0 3 3\n", "")
    layer.param.transform_param.crop_size = 4
    with pytest.raises(DataError, match="class 0"):
        layer.setup([], top)
    layer, top = make(tmp_path, "# 0\na.png\n3 8 8\n1\n1 0.9 0 0 3 3\n", "")
    with pytest.raises(LayerError, match="crop_size"):
        layer.setup([], top)

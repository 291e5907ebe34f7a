"""Caffe's DataTransformer: crop, mirror, mean_file, mean_value, scale, against hand values."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.data.transformer import DataTransformer
from mgcaffe.errors import DataError
from mgcaffe.formats.protoio import write_binaryproto
from mgcaffe.proto import caffe_pb2

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST
IMAGE = (np.arange(3 * 5 * 6) * 7 % 251).astype(np.uint8).reshape(3, 5, 6)


def make(phase=TEST, seed=0, dtype=np.float64, **fields):
    param = caffe_pb2.TransformationParameter()
    for name, value in fields.items():
        if name == "mean_value":
            param.mean_value.extend(value)
        else:
            setattr(param, name, value)
    return DataTransformer(param, phase, rng=np.random.default_rng(seed), dtype=dtype)


def by_hand(image, h_off, w_off, size_h, size_w, mean=None, scale=1.0, mirror=False):
    """Caffe's loop, element by element."""
    c_n = image.shape[0]
    out = np.zeros((c_n, size_h, size_w))
    for c in range(c_n):
        for h in range(size_h):
            for w in range(size_w):
                value = float(image[c, h_off + h, w_off + w])
                if mean is not None:
                    value -= float(mean[c, h_off + h, w_off + w])
                out[c, h, size_w - 1 - w if mirror else w] = value * scale
    return out


def test_scale_only():
    out = make(scale=0.25).transform(IMAGE)
    assert out.dtype == np.float64 and out.shape == IMAGE.shape
    assert np.array_equal(out, IMAGE * 0.25)


def test_output_dtype_float32_by_default():
    out = make(dtype=np.float32, scale=0.00390625).transform(IMAGE)
    assert out.dtype == np.float32
    assert np.array_equal(out, IMAGE.astype(np.float32) * np.float32(0.00390625))


def test_mean_value_single_and_per_channel():
    one = make(mean_value=[10.0], scale=0.5).transform(IMAGE)
    assert np.allclose(one, (IMAGE.astype(float) - 10) * 0.5)
    per = make(mean_value=[1.0, 2.0, 3.0]).transform(IMAGE)
    for c in range(3):
        assert np.allclose(per[c], IMAGE[c].astype(float) - (c + 1))
    with pytest.raises(DataError, match="2 mean_value entries for an image of 3 channels"):
        make(mean_value=[1.0, 2.0]).transform(IMAGE)


def test_mean_file_with_centre_crop_in_test(tmp_path):
    mean = np.random.default_rng(5).uniform(0, 100, size=(1, 3, 5, 6)).astype(np.float32)
    write_binaryproto(mean, tmp_path / "mean.binaryproto")
    t = make(TEST, mean_file=str(tmp_path / "mean.binaryproto"), crop_size=3, scale=0.1)
    out = t.transform(IMAGE)
    # Centre offsets: (5-3)//2 = 1 and (6-3)//2 = 1; mean cropped at the same place, then
    # (x - mean) * scale, not x * scale - mean.
    assert np.allclose(out, by_hand(IMAGE, 1, 1, 3, 3, mean[0], 0.1))


def test_random_crop_in_train_covers_every_offset():
    t = make(TRAIN, seed=3, crop_size=3)
    seen = set()
    for _ in range(300):
        out = t.transform(IMAGE)
        matches = [(h, w) for h in range(3) for w in range(4)
                   if np.array_equal(out, by_hand(IMAGE, h, w, 3, 3))]
        assert len(matches) == 1
        seen.add(matches[0])
    assert seen == {(h, w) for h in range(3) for w in range(4)}


def test_mirror_mirrors_after_mean_subtraction(tmp_path):
    mean = np.random.default_rng(6).uniform(0, 50, size=(1, 3, 5, 6)).astype(np.float32)
    write_binaryproto(mean, tmp_path / "m.binaryproto")
    t = make(TEST, seed=1, mirror=True, mean_file=str(tmp_path / "m.binaryproto"), scale=2.0)
    plain = by_hand(IMAGE, 0, 0, 5, 6, mean[0], 2.0)
    flipped = by_hand(IMAGE, 0, 0, 5, 6, mean[0], 2.0, mirror=True)
    kinds = []
    for _ in range(40):
        out = t.transform(IMAGE)
        is_plain, is_flipped = np.allclose(out, plain), np.allclose(out, flipped)
        assert is_plain != is_flipped
        kinds.append(is_flipped)
    assert any(kinds) and not all(kinds)


def test_same_seed_same_augmentation():
    a = make(TRAIN, seed=9, crop_size=2, mirror=True)
    b = make(TRAIN, seed=9, crop_size=2, mirror=True)
    for _ in range(20):
        assert np.array_equal(a.transform(IMAGE), b.transform(IMAGE))


def test_transform_into_out_buffer():
    out = np.zeros((3, 3, 3), dtype=np.float32)
    t = make(TEST, dtype=np.float32, crop_size=3)
    assert t.transform(IMAGE, out=out) is out
    assert np.array_equal(out, by_hand(IMAGE, 1, 1, 3, 3))


def test_errors(tmp_path):
    with pytest.raises(DataError, match="rec.*3x5x6, smaller than crop_size 6"):
        make(crop_size=6).transform(IMAGE, what="rec")
    write_binaryproto(np.zeros((1, 3, 4, 4), np.float32), tmp_path / "m.binaryproto")
    with pytest.raises(DataError, match="3x5x6 but mean_file .* 3x4x4"):
        make(mean_file=str(tmp_path / "m.binaryproto")).transform(IMAGE)
    with pytest.raises(DataError, match="mean_file and mean_value"):
        make(mean_file=str(tmp_path / "m.binaryproto"), mean_value=[1.0])
    with pytest.raises(DataError, match="missing.binaryproto"):
        make(mean_file=str(tmp_path / "missing.binaryproto"))

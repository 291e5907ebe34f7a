"""tools/convert_imageset.py: list file -> Datum LMDB (raw, grey+resize, encoded, skips)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mgcaffe.data.datum import datum_to_array, parse_datum
from mgcaffe.data.db import LMDBReader

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("convert_imageset",
                                                  REPO / "tools" / "convert_imageset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    rgbs = [rng.integers(0, 256, (4, 6, 3), dtype=np.uint8) for _ in range(3)]
    for i, rgb in enumerate(rgbs):
        Image.fromarray(rgb).save(tmp_path / f"im{i}.png")
    (tmp_path / "list.txt").write_text("im0.png 3\nim1.png 1\nim2.png 2\n")
    return rgbs


def records(path):
    reader = LMDBReader(path)
    out = [reader.next() for _ in range(len(reader))]
    reader.close()
    return out


def test_raw_conversion_keys_and_pixels(tool, tmp_path, images):
    assert tool.main([f"{tmp_path}/", str(tmp_path / "list.txt"), str(tmp_path / "db")]) == 0
    recs = records(tmp_path / "db")
    assert [k for k, _ in recs] == [b"00000000_im0.png", b"00000001_im1.png",
                                    b"00000002_im2.png"]
    datum = parse_datum(recs[1][1])
    assert datum.label == 1 and not datum.encoded
    assert np.array_equal(datum_to_array(datum), images[1][:, :, ::-1].transpose(2, 0, 1))


def test_gray_resize_with_caffe_single_dash_flags(tool, tmp_path, images):
    argv = ["-gray", "-resize_height", "2", "-resize_width", "3", f"{tmp_path}/",
            str(tmp_path / "list.txt"), str(tmp_path / "db")]
    assert tool.main(argv) == 0
    array = datum_to_array(parse_datum(records(tmp_path / "db")[0][1]))
    expected = Image.open(tmp_path / "im0.png").convert("L").resize((3, 2), Image.BILINEAR)
    assert np.array_equal(array[0], np.asarray(expected))


def test_encoded_keeps_the_file_bytes(tool, tmp_path, images):
    argv = ["--encoded", f"{tmp_path}/", str(tmp_path / "list.txt"), str(tmp_path / "db")]
    assert tool.main(argv) == 0
    datum = parse_datum(records(tmp_path / "db")[2][1])
    assert datum.encoded and datum.data == (tmp_path / "im2.png").read_bytes()
    assert np.array_equal(datum_to_array(datum), images[2][:, :, ::-1].transpose(2, 0, 1))


def test_unreadable_images_are_skipped_and_shuffle_is_seeded(tool, tmp_path, images, capsys):
    (tmp_path / "list.txt").write_text("im0.png 0\nmissing.png 9\nim1.png 1\nim2.png 2\n")
    argv = ["--shuffle", "--seed", "3", f"{tmp_path}/", str(tmp_path / "list.txt")]
    assert tool.main([*argv, str(tmp_path / "a")]) == 0
    assert "missing.png" in capsys.readouterr().err
    assert tool.main([*argv, str(tmp_path / "b")]) == 0
    a, b = records(tmp_path / "a"), records(tmp_path / "b")
    assert a == b and len(a) == 3
    assert sorted(parse_datum(v).label for _, v in a) == [0, 1, 2]


def test_check_size_rejects_mixed_sizes(tool, tmp_path, images, capsys):
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(tmp_path / "big.png")
    (tmp_path / "list.txt").write_text("im0.png 0\nbig.png 1\n")
    argv = ["--check_size", f"{tmp_path}/", str(tmp_path / "list.txt"), str(tmp_path / "db")]
    assert tool.main(argv) == 1
    assert "big.png" in capsys.readouterr().err
    assert not (tmp_path / "db").exists()

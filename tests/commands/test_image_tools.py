"""convert_imageset -> compute_image_mean -> extract_features end to end on a few tiny
images, read back with the plain lmdb library and caffe_pb2 (Caffe's own reading)."""

from __future__ import annotations

import io

import lmdb
import numpy as np
import pytest
from PIL import Image

from mgcaffe.formats.protoio import parse_net_text
from mgcaffe.layer_types.base import TEST
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2


def read_lmdb(path) -> list[tuple[bytes, caffe_pb2.Datum]]:
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        out = [(bytes(k), caffe_pb2.Datum.FromString(bytes(v))) for k, v in txn.cursor()]
    env.close()
    return out


def chw_bgr(rgb: np.ndarray) -> np.ndarray:
    return rgb[:, :, ::-1].transpose(2, 0, 1)


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    rgbs = [rng.integers(0, 256, (4, 5, 3), dtype=np.uint8) for _ in range(4)]
    (tmp_path / "img").mkdir()
    for i, rgb in enumerate(rgbs):
        Image.fromarray(rgb).save(tmp_path / "img" / f"a{i}.png")
    (tmp_path / "list.txt").write_text("".join(f"a{i}.png {i % 2}\n" for i in range(4)))
    return rgbs


def test_convert_imageset_writes_caffe_keys_and_datums(tmp_path, images, cli):
    rc, err = cli("convert_imageset", "-backend", "lmdb", "--noshuffle", f"{tmp_path}/img/",
                  tmp_path / "list.txt", tmp_path / "db")
    assert rc == 0, err
    assert "A total of 4 images." in err and "Processed 4 files." in err
    records = read_lmdb(tmp_path / "db")
    assert [k for k, _ in records] == [f"{i:08d}_a{i}.png".encode() for i in range(4)]
    for i, (_, datum) in enumerate(records):
        assert (datum.channels, datum.height, datum.width, datum.label) == (3, 4, 5, i % 2)
        assert not datum.encoded and not datum.float_data
        np.testing.assert_array_equal(
            np.frombuffer(datum.data, np.uint8).reshape(3, 4, 5), chw_bgr(images[i]))


def test_convert_imageset_encode_type_and_shuffle(tmp_path, images, cli):
    argv = ["convert_imageset", "-shuffle=true", "-seed=1", "-encoded", "-encode_type=png",
            "-resize_height=2", "-resize_width=3", f"{tmp_path}/img/", tmp_path / "list.txt"]
    assert cli(*argv, tmp_path / "a")[0] == 0
    assert cli(*argv, tmp_path / "b")[0] == 0
    a, b = read_lmdb(tmp_path / "a"), read_lmdb(tmp_path / "b")
    assert [k for k, _ in a] == [k for k, _ in b]
    names = sorted(k.decode()[9:] for k, _ in a)
    assert names == [f"a{i}.png" for i in range(4)]
    assert [k.decode()[:8] for k, _ in a] == [f"{i:08d}" for i in range(4)]
    for _, datum in a:
        assert datum.encoded and datum.data[:8] == b"\x89PNG\r\n\x1a\n"
        assert Image.open(io.BytesIO(datum.data)).size == (3, 2)


def test_convert_imageset_refuses_an_existing_db_and_other_backends(tmp_path, images, cli):
    args = [f"{tmp_path}/img/", tmp_path / "list.txt", tmp_path / "db"]
    assert cli("convert_imageset", *args)[0] == 0
    rc, err = cli("convert_imageset", *args)
    assert rc == 1 and "already exists" in err
    rc, err = cli("convert_imageset", "-backend", "rocksdb", *args[:2], tmp_path / "x")
    assert rc == 1 and "-backend rocksdb: expected lmdb or leveldb" in err
    assert not (tmp_path / "x").exists()


def test_leveldb_written_by_convert_imageset_is_read_by_the_tools(tmp_path, images, cli):
    # convert_imageset -backend leveldb -> the same records as its LMDB, which
    # compute_image_mean reads (told the backend, or not) and a Data layer trains on.
    plyvel = pytest.importorskip("plyvel", reason="LevelDB needs plyvel (a runtime dependency)")
    args = [f"{tmp_path}/img/", tmp_path / "list.txt"]
    assert cli("convert_imageset", *args, tmp_path / "db")[0] == 0
    assert cli("convert_imageset", "-backend=leveldb", *args, tmp_path / "ldb")[0] == 0
    db = plyvel.DB(str(tmp_path / "ldb"))
    ldb = [(k, caffe_pb2.Datum.FromString(v)) for k, v in db]
    db.close()
    assert ldb == read_lmdb(tmp_path / "db")
    expected = np.mean([chw_bgr(im).astype(np.float64) for im in images], axis=0)
    for flags in ([], ["-backend", "leveldb"]):
        rc, err = cli("compute_image_mean", *flags, tmp_path / "ldb", tmp_path / "m.bp")
        assert rc == 0, err
        blob = caffe_pb2.BlobProto.FromString((tmp_path / "m.bp").read_bytes())
        np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 4, 5), expected, rtol=1e-6)
    rc, err = cli("compute_image_mean", "-backend", "lmdb", tmp_path / "ldb")
    assert rc == 1 and "is a LEVELDB database, but backend LMDB was asked for" in err


def test_compute_image_mean_writes_a_legacy_blobproto(tmp_path, images, cli):
    assert cli("convert_imageset", f"{tmp_path}/img/", tmp_path / "list.txt",
               tmp_path / "db")[0] == 0
    rc, err = cli("compute_image_mean", "-backend=lmdb", tmp_path / "db",
                  tmp_path / "mean.binaryproto")
    assert rc == 0, err
    expected = np.mean([chw_bgr(im).astype(np.float64) for im in images], axis=0)
    blob = caffe_pb2.BlobProto.FromString((tmp_path / "mean.binaryproto").read_bytes())
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 3, 4, 5)
    assert not blob.HasField("shape")
    np.testing.assert_allclose(np.asarray(blob.data).reshape(3, 4, 5), expected, rtol=1e-6)
    for c in range(3):
        assert f"mean_value channel [{c}]: {expected[c].mean():g}" in err
    # Without OUTPUT_FILE only the channel means are logged.
    rc, err = cli("compute_image_mean", tmp_path / "db")
    assert rc == 0 and "Number of channels: 3" in err


FEATURE_NET = """
name: "features"
layer { name: "data" type: "Data" top: "data" top: "label"
        data_param { source: "%s" batch_size: 3 backend: LMDB } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "pool" type: "Pooling" bottom: "data" top: "pool"
        pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
"""


def test_extract_features_writes_float_datums_keyed_by_item(tmp_path, images, cli):
    assert cli("convert_imageset", f"{tmp_path}/img/", tmp_path / "list.txt",
               tmp_path / "db")[0] == 0
    (tmp_path / "net.prototxt").write_text(FEATURE_NET % (tmp_path / "db"))
    net = Net(parse_net_text(FEATURE_NET % (tmp_path / "db")), TEST, seed=4)
    weight = net.params["ip"][0].data.astype(np.float64)
    bias = np.linspace(-1, 1, 2)
    net.params["ip"][1].data[...] = bias
    net.save(str(tmp_path / "w.caffemodel"))
    rc, err = cli("extract_features", tmp_path / "w.caffemodel", tmp_path / "net.prototxt",
                  "ip,pool", f"{tmp_path}/f_ip,{tmp_path}/f_pool", "2", "lmdb")
    assert rc == 0, err
    assert "Successfully extracted the features!" in err
    ip, pool = read_lmdb(tmp_path / "f_ip"), read_lmdb(tmp_path / "f_pool")
    assert [k for k, _ in ip] == [f"{i:010d}".encode() for i in range(6)]
    # 2 batches of 3 wrap around the 4 images: items 0..5 are images 0,1,2,3,0,1.
    for i, (_, datum) in enumerate(ip):
        x = chw_bgr(images[i % 4]).astype(np.float64).ravel()
        assert (datum.channels, datum.height, datum.width) == (2, 1, 1)
        assert not datum.HasField("label") and not datum.data
        np.testing.assert_allclose(datum.float_data, weight @ x + bias, rtol=1e-5)
    for i, (_, datum) in enumerate(pool):
        assert (datum.channels, datum.height, datum.width) == (3, 2, 3)
        np.testing.assert_allclose(np.asarray(datum.float_data).reshape(3, 2, 3),
                                   _ave_pool(chw_bgr(images[i % 4]).astype(np.float64)),
                                   rtol=1e-5)


def _ave_pool(x: np.ndarray) -> np.ndarray:
    """2x2 stride-2 AVE pooling as Caffe does it: 4x5 -> 2x3 (the output size rounds up);
    the last column's window holds only image column 4, and averages over that."""
    out = np.zeros((3, 2, 3))
    for r in range(2):
        for c in range(3):
            out[:, r, c] = x[:, 2 * r:2 * r + 2, 2 * c:2 * c + 2].mean(axis=(1, 2))
    return out


def test_extract_features_bad_input(tmp_path, images, cli):
    assert cli("convert_imageset", f"{tmp_path}/img/", tmp_path / "list.txt",
               tmp_path / "db")[0] == 0
    (tmp_path / "net.prototxt").write_text(FEATURE_NET % (tmp_path / "db"))
    Net(str(tmp_path / "net.prototxt"), TEST).save(str(tmp_path / "w.caffemodel"))
    base = ["extract_features", tmp_path / "w.caffemodel", tmp_path / "net.prototxt"]
    rc, err = cli(*base, "nope", tmp_path / "f", "1", "lmdb")
    assert rc == 1 and "Unknown feature blob name nope in the network" in err
    rc, err = cli(*base, "ip,pool", tmp_path / "f", "1", "lmdb")
    assert rc == 1 and "2 blob name(s) but 1 database name(s)" in err
    assert not (tmp_path / "f").exists()


def test_compute_image_mean_reads_databases_written_as_caffe_writes_them(tmp_path, images, cli):
    # Written with the lmdb library directly: encoded PNG Datums (sizes unset, as Caffe's
    # -encoded leaves them) in one database, float_data Datums in another.
    encoded, floats = tmp_path / "enc", tmp_path / "flt"
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((2, 3, 2)).astype(np.float32) for _ in range(3)]
    for path, datums in (
        (encoded, [caffe_pb2.Datum(data=(tmp_path / "img" / f"a{i}.png").read_bytes(),
                                   encoded=True, label=i) for i in range(4)]),
        (floats, [caffe_pb2.Datum(channels=2, height=3, width=2, float_data=a.ravel())
                  for a in arrays])):
        env = lmdb.open(str(path), map_size=1 << 24)
        with env.begin(write=True) as txn:
            for i, datum in enumerate(datums):
                txn.put(f"{i:08d}".encode(), datum.SerializeToString())
        env.close()
    for path, expected in (
            (encoded, np.mean([chw_bgr(im).astype(np.float64) for im in images], axis=0)),
            (floats, np.mean(arrays, axis=0, dtype=np.float64))):
        assert cli("compute_image_mean", path, tmp_path / "m.binaryproto")[0] == 0
        blob = caffe_pb2.BlobProto.FromString((tmp_path / "m.binaryproto").read_bytes())
        np.testing.assert_allclose(np.asarray(blob.data).reshape(expected.shape), expected,
                                   rtol=1e-6)

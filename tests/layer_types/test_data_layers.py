"""Data layers: Data (LMDB), ImageData, HDF5Data, MemoryData; shapes, values, sharding, errors."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from google.protobuf import text_format
from PIL import Image

import mgcaffe.layer_types  # noqa: F401 - registers the layers
from mgcaffe.blob import Blob
from mgcaffe.data.convert import write_lmdb
from mgcaffe.data.datum import array_to_datum, encoded_datum
from mgcaffe.data.image import encode_image
from mgcaffe.errors import DataError, LayerError
from mgcaffe.layer_types.base import TEST, TRAIN, LayerContext
from mgcaffe.layer_types.registry import create_layer
from mgcaffe.proto import caffe_pb2


def build(text, n_top=2, phase=TEST, rank=0, world_size=1, seed=0):
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    ctx = LayerContext(phase=phase, dtype=np.float32, seed=seed, rank=rank,
                       world_size=world_size)
    layer = create_layer(param, ctx)
    top = [Blob((), name=f"top{i}") for i in range(n_top)]
    layer.setup([], top)
    return layer, top


def forward(layer, top):
    layer.forward([], top)
    return [t.data.copy() for t in top]


@pytest.fixture
def closing():
    layers = []
    yield layers.append
    for layer in layers:
        layer.close()


def images(n, shape=(1, 3, 4)):
    return [np.full(shape, 10 * i, np.uint8) + np.arange(np.prod(shape), dtype=np.uint8)
            .reshape(shape) for i in range(n)]


def data_layer(source, batch, extra="", data_extra="", **kw):
    return build(f'name: "d" type: "Data" top: "data" top: "label" data_param {{ '
                 f'source: "{source}" batch_size: {batch} backend: LMDB {data_extra} }} '
                 + extra, **kw)


# -- Data --------------------------------------------------------------------------------


def test_data_reads_records_in_order_and_wraps(tmp_path, closing):
    xs = images(5)
    write_lmdb(tmp_path / "db", (array_to_datum(x, 100 + i) for i, x in enumerate(xs)))
    layer, top = data_layer(tmp_path / "db", 2, "transform_param { scale: 0.5 }")
    closing(layer)
    assert [t.shape for t in top] == [(2, 1, 3, 4), (2,)]
    order = [0, 1, 2, 3, 4, 0, 1, 2]
    for step in range(4):
        data, label = forward(layer, top)
        picked = order[2 * step: 2 * step + 2]
        assert np.array_equal(label, [100 + i for i in picked])
        assert np.array_equal(data, np.stack([xs[i] * 0.5 for i in picked]))


def test_data_label_top_is_optional_and_crop_shapes_top(tmp_path, closing):
    write_lmdb(tmp_path / "db", (array_to_datum(x) for x in images(3)))
    layer, top = data_layer(tmp_path / "db", 3, "transform_param { crop_size: 2 }", n_top=1)
    closing(layer)
    assert top[0].shape == (3, 1, 2, 2)
    (data,) = forward(layer, top)
    assert np.array_equal(data[2], images(3)[2][:, 0:2, 1:3])  # centre crop in TEST


def test_data_decodes_encoded_records(tmp_path, closing):
    bgr = np.random.default_rng(0).integers(0, 256, (3, 4, 5), dtype=np.uint8)
    write_lmdb(tmp_path / "db", [encoded_datum(encode_image(bgr, "PNG"), 4)])
    layer, top = data_layer(tmp_path / "db", 1)
    closing(layer)
    data, label = forward(layer, top)
    assert np.array_equal(data[0], bgr) and label[0] == 4


@pytest.mark.parametrize("world_size", [2, 3])
def test_data_ranks_together_read_the_single_process_batch(tmp_path, closing, world_size):
    xs = images(7)
    write_lmdb(tmp_path / "db", (array_to_datum(x, i) for i, x in enumerate(xs)))
    single, single_top = data_layer(tmp_path / "db", 2 * world_size, phase=TRAIN)
    closing(single)
    ranks = [data_layer(tmp_path / "db", 2, rank=r, world_size=world_size, phase=TRAIN)
             for r in range(world_size)]
    for layer, _ in ranks:
        closing(layer)
    for _ in range(4):
        _, big = forward(single, single_top)
        parts = [forward(layer, top)[1] for layer, top in ranks]
        assert np.array_equal(big, [parts[r][i] for i in range(2) for r in range(world_size)])


def test_data_rand_skip_is_seeded_and_keeps_order(tmp_path, closing):
    write_lmdb(tmp_path / "db", (array_to_datum(x, i) for i, x in enumerate(images(10))))
    starts = []
    for seed in [*range(12), 0]:
        layer, top = data_layer(tmp_path / "db", 3, data_extra="rand_skip: 10", seed=seed)
        closing(layer)
        labels = forward(layer, top)[1]
        assert np.array_equal(labels, (labels[0] + np.arange(3)) % 10)
        starts.append(labels[0])
    assert starts[0] == starts[-1] and len(set(starts)) > 1


def test_test_phase_is_not_sharded(tmp_path, closing):
    # Caffe 1.0: test nets run on rank 0 only and read every record.
    write_lmdb(tmp_path / "db", (array_to_datum(x, i) for i, x in enumerate(images(4))))
    layer, top = data_layer(tmp_path / "db", 4, rank=0, world_size=2, phase=TEST)
    closing(layer)
    assert np.array_equal(forward(layer, top)[1], [0, 1, 2, 3])


def test_image_data_ranks_split_a_shuffled_epoch(tmp_path, closing):
    write_images(tmp_path / "imgs", 4)
    lines = [f"im{i}.png {i}" for i in range(4)]
    # Unseeded: the ranks must still agree on the shuffle, or they would overlap.
    ranks = [image_layer(tmp_path, lines, "batch_size: 2 shuffle: true }", phase=TRAIN,
                         rank=r, world_size=2, seed=None) for r in range(2)]
    for layer, _ in ranks:
        closing(layer)
    for _ in range(3):
        parts = [forward(layer, top)[1] for layer, top in ranks]
        assert sorted(np.concatenate(parts).tolist()) == [0, 1, 2, 3]


def test_data_wrong_record_size_names_db_and_key(tmp_path, closing):
    datums = [array_to_datum(x) for x in images(2)] + [array_to_datum(np.zeros((1, 2, 2),
                                                                                np.uint8))]
    write_lmdb(tmp_path / "db", datums)
    layer, top = data_layer(tmp_path / "db", 3)
    closing(layer)
    with pytest.raises(DataError, match="db'? record '00000002' is 1x2x2, expected 1x3x4"):
        layer.forward([], top)


def test_data_crop_larger_than_record_and_missing_db(tmp_path):
    write_lmdb(tmp_path / "db", [array_to_datum(images(1)[0])])
    with pytest.raises(DataError, match="record '00000000'.*smaller than crop_size 5"):
        data_layer(tmp_path / "db", 1, "transform_param { crop_size: 5 }")
    with pytest.raises(DataError, match="absent_lmdb.*not found"):
        data_layer(tmp_path / "absent_lmdb", 1)


def test_data_close_stops_prefetch_thread(tmp_path):
    write_lmdb(tmp_path / "db", (array_to_datum(x) for x in images(2)))
    layer, top = data_layer(tmp_path / "db", 1)
    layer.forward([], top)
    thread = layer._prefetcher._thread
    layer.close()
    assert not thread.is_alive()
    with pytest.raises(LayerError, match="closed"):
        layer.forward([], top)


# -- ImageData ---------------------------------------------------------------------------


def write_images(folder, n, size=(4, 6)):
    """n RGB PNGs with distinct content; returns their BGR CHW arrays."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    arrays = []
    for i in range(n):
        rgb = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(folder / f"im{i}.png")
        arrays.append(rgb[:, :, ::-1].transpose(2, 0, 1))
    return arrays


def image_layer(tmp_path, lines, extra="", **kw):
    (tmp_path / "list.txt").write_text("".join(f"{line}\n" for line in lines))
    return build(f'name: "img" type: "ImageData" top: "data" top: "label" image_data_param '
                 f'{{ source: "{tmp_path / "list.txt"}" root_folder: "{tmp_path}/imgs/" '
                 + extra, **kw)


def test_image_data_reads_list_in_order(tmp_path, closing):
    arrays = write_images(tmp_path / "imgs", 3)
    layer, top = image_layer(tmp_path, [f"im{i}.png {i + 5}" for i in range(3)],
                             "batch_size: 2 } transform_param { scale: 0.5 }")
    closing(layer)
    assert [t.shape for t in top] == [(2, 3, 4, 6), (2,)]
    data, label = forward(layer, top)
    assert np.array_equal(label, [5, 6]) and np.array_equal(data[1], arrays[1] * 0.5)
    data, label = forward(layer, top)
    assert np.array_equal(label, [7, 5]) and np.array_equal(data[0], arrays[2] * 0.5)


def test_image_data_resize_and_gray(tmp_path, closing):
    write_images(tmp_path / "imgs", 1)
    layer, top = image_layer(tmp_path, ["im0.png 0"],
                             "batch_size: 1 new_height: 3 new_width: 2 is_color: false }")
    closing(layer)
    assert top[0].shape == (1, 1, 3, 2)
    expected = Image.open(tmp_path / "imgs/im0.png").convert("L").resize((2, 3),
                                                                         Image.BILINEAR)
    assert np.array_equal(forward(layer, top)[0][0, 0], np.asarray(expected))


def test_image_data_shuffle_is_seeded_and_reshuffled_each_epoch(tmp_path, closing):
    write_images(tmp_path / "imgs", 6)
    lines = [f"im{i}.png {i}" for i in range(6)]
    epochs = []
    for _ in range(2):
        layer, top = image_layer(tmp_path, lines, "batch_size: 6 shuffle: true }", seed=4)
        closing(layer)
        epochs.append([list(forward(layer, top)[1]) for _ in range(3)])
    assert epochs[0] == epochs[1]
    for labels in epochs[0]:
        assert sorted(labels) == list(range(6))
    assert len({tuple(labels) for labels in epochs[0]}) > 1


def test_image_data_unreadable_image_names_file_and_line(tmp_path, closing):
    write_images(tmp_path / "imgs", 1)
    (tmp_path / "imgs/bad.png").write_bytes(b"this is not a png")
    layer, top = image_layer(tmp_path, ["im0.png 0", "", "bad.png 1"], "batch_size: 2 }")
    closing(layer)
    with pytest.raises(DataError, match="bad.png.*list.txt' line 3.*cannot decode"):
        layer.forward([], top)


def test_image_data_missing_list_and_bad_line(tmp_path):
    with pytest.raises(DataError, match="list file .*nolist.txt' not found"):
        build('name: "i" type: "ImageData" top: "d" top: "l" '
              f'image_data_param {{ source: "{tmp_path}/nolist.txt" }}')
    with pytest.raises(DataError, match="line 1: expected 'path label'"):
        image_layer(tmp_path, ["im0.png"], "}")


# -- HDF5Data ----------------------------------------------------------------------------


def write_h5(path, data, label):
    with h5py.File(path, "w") as f:
        f["data"] = data
        f["label"] = label


def hdf5_layer(tmp_path, files, extra="", **kw):
    (tmp_path / "h5list.txt").write_text("".join(f"{tmp_path / name}\n" for name in files))
    return build(f'name: "h" type: "HDF5Data" top: "data" top: "label" hdf5_data_param '
                 f'{{ source: "{tmp_path / "h5list.txt"}" ' + extra, **kw)


def test_hdf5_batches_cross_file_boundaries(tmp_path, closing):
    all_data = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    all_label = np.arange(5, dtype=np.float32).reshape(5, 1) + 10
    write_h5(tmp_path / "a.h5", all_data[:3], all_label[:3])
    write_h5(tmp_path / "b.h5", all_data[3:], all_label[3:])
    layer, top = hdf5_layer(tmp_path, ["a.h5", "b.h5"], "batch_size: 4 }")
    closing(layer)
    assert [t.shape for t in top] == [(4, 2, 3), (4, 1)]
    order = [0, 1, 2, 3, 4, 0, 1, 2]
    for step in range(2):
        data, label = forward(layer, top)
        rows = order[4 * step: 4 * step + 4]
        assert np.array_equal(data, all_data[rows]) and np.array_equal(label, all_label[rows])


def test_hdf5_shuffle_each_pass_is_a_permutation(tmp_path, closing):
    write_h5(tmp_path / "a.h5", np.zeros((4, 1)), np.arange(4.0))
    write_h5(tmp_path / "b.h5", np.zeros((2, 1)), np.arange(4.0, 6.0))
    layer, top = hdf5_layer(tmp_path, ["a.h5", "b.h5"], "batch_size: 6 shuffle: true }")
    closing(layer)
    passes = [tuple(forward(layer, top)[1]) for _ in range(4)]
    assert all(sorted(p) == list(range(6)) for p in passes)
    assert len(set(passes)) > 1


def test_hdf5_sharding_matches_single_process(tmp_path, closing):
    write_h5(tmp_path / "a.h5", np.zeros((5, 1)), np.arange(5.0))
    single, single_top = hdf5_layer(tmp_path, ["a.h5"], "batch_size: 4 }", phase=TRAIN)
    closing(single)
    ranks = [hdf5_layer(tmp_path, ["a.h5"], "batch_size: 2 }", rank=r, world_size=2,
                        phase=TRAIN) for r in range(2)]
    for layer, _ in ranks:
        closing(layer)
    for _ in range(3):
        big = forward(single, single_top)[1]
        parts = [forward(layer, top)[1] for layer, top in ranks]
        assert np.array_equal(big, [parts[r][i] for i in range(2) for r in range(2)])


def test_hdf5_errors(tmp_path):
    write_h5(tmp_path / "a.h5", np.zeros((2, 1)), np.zeros(2))
    (tmp_path / "l.txt").write_text(f"{tmp_path}/a.h5\n")
    with pytest.raises(DataError, match="a.h5' has no dataset 'other'"):
        build(f'name: "h" type: "HDF5Data" top: "data" top: "other" hdf5_data_param '
              f'{{ source: "{tmp_path / "l.txt"}" batch_size: 1 }}')
    with pytest.raises(DataError, match="HDF5 list file .*none.txt' not found"):
        build(f'name: "h" type: "HDF5Data" top: "data" hdf5_data_param '
              f'{{ source: "{tmp_path}/none.txt" batch_size: 1 }}', n_top=1)
    with pytest.raises(LayerError, match="does not transform"):
        hdf5_layer(tmp_path, ["a.h5"], "batch_size: 1 } transform_param { scale: 2 }")


# -- MemoryData --------------------------------------------------------------------------

MEMORY = ('name: "m" type: "MemoryData" top: "data" top: "label" memory_data_param '
          '{ batch_size: 2 channels: 1 height: 2 width: 3 }')


def test_memory_data_serves_batches_and_wraps():
    layer, top = build(MEMORY)
    assert [t.shape for t in top] == [(2, 1, 2, 3), (2,)]
    data = np.arange(4 * 6, dtype=np.float32).reshape(4, 1, 2, 3)
    layer.set_input_arrays(data, np.array([1, 2, 3, 4]))
    for rows in ([0, 1], [2, 3], [0, 1]):
        got, label = forward(layer, top)
        assert np.array_equal(got, data[rows]) and np.array_equal(label, np.add(rows, 1))
    layer.set_input_arrays(data[::-1], np.zeros((4, 1, 1, 1)))  # resets to the start
    assert np.array_equal(forward(layer, top)[0], data[[3, 2]])


def test_memory_data_errors():
    layer, top = build(MEMORY)
    with pytest.raises(LayerError, match="set_input_arrays"):
        layer.forward([], top)
    with pytest.raises(LayerError, match=r"number of items \(3\).*batch_size \(2\)"):
        layer.set_input_arrays(np.zeros((3, 1, 2, 3)), np.zeros(3))
    with pytest.raises(LayerError, match="same first dimension"):
        layer.set_input_arrays(np.zeros((4, 1, 2, 3)), np.zeros(2))
    with pytest.raises(LayerError, match=r"expected \(N, 1, 2, 3\)"):
        layer.set_input_arrays(np.zeros((4, 2, 2, 3)), np.zeros(4))
    with pytest.raises(LayerError, match="must be specified"):
        build('name: "m" type: "MemoryData" top: "d" top: "l" memory_data_param '
              '{ batch_size: 2 }')


def test_train_phase_crop_stays_inside_record(tmp_path, closing):
    xs = images(1, shape=(1, 5, 5))
    write_lmdb(tmp_path / "db", [array_to_datum(xs[0])])
    layer, top = data_layer(tmp_path / "db", 8, "transform_param { crop_size: 3 mirror: true }",
                            phase=TRAIN)
    closing(layer)
    data = forward(layer, top)[0]
    crops = [xs[0][:, h:h + 3, w:w + 3] for h in range(3) for w in range(3)]
    candidates = crops + [c[:, :, ::-1] for c in crops]
    assert all(any(np.array_equal(d, c) for c in candidates) for d in data)


@pytest.mark.timeout(20)
def test_a_fifo_as_list_file_is_refused_not_waited_on(tmp_path):
    """A FIFO with no writer would block open() forever: ImageData and HDF5Data refuse it."""
    import os  # noqa: PLC0415

    fifo = tmp_path / "list.fifo"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="list.fifo: not a regular file"):
        build('name: "i" type: "ImageData" top: "d" top: "l" '
              f'image_data_param {{ source: "{fifo}" }}')
    with pytest.raises(DataError, match="list.fifo: not a regular file"):
        build(f'name: "h" type: "HDF5Data" top: "data" hdf5_data_param '
              f'{{ source: "{fifo}" batch_size: 1 }}', n_top=1)

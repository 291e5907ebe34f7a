"""tools/convert_digits.py: counts, class balance, fixed split, record contents, idempotence."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import mgcaffe.layer_types  # noqa: F401 - registers the layers
from mgcaffe.blob import Blob
from mgcaffe.data.datum import datum_to_array, parse_datum
from mgcaffe.data.db import LMDBReader
from mgcaffe.formats.protoio import read_binaryproto, read_net_param, read_solver_param
from mgcaffe.layer_types.base import TEST, TRAIN, LayerContext
from mgcaffe.layer_types.registry import create_layer

sklearn_datasets = pytest.importorskip("sklearn.datasets")


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("convert_digits",
                                                  REPO / "tools" / "convert_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def converted(tool, tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    assert tool.convert(out) == (1437, 360)
    return out


def read_all(path):
    reader = LMDBReader(path)
    records = [reader.next() for _ in range(len(reader))]
    reader.close()
    return records


def test_counts_balance_and_contents(tool, converted):
    digits = sklearn_datasets.load_digits()
    train, test = read_all(converted / tool.TRAIN_DB), read_all(converted / tool.TEST_DB)
    assert (len(train), len(test)) == (1437, 360)
    assert [k for k, _ in train] == [f"{i:08d}".encode() for i in range(1437)]
    test_labels = [parse_datum(v).label for _, v in test]
    assert np.bincount(test_labels, minlength=10).tolist() == [36] * 10
    train_labels = [parse_datum(v).label for _, v in train]
    assert (np.bincount(train_labels, minlength=10)
            == np.bincount(digits.target, minlength=10) - 36).all()
    # The first training record is image train_idx[0], scaled 0..16 -> 0..255.
    train_idx, _ = tool.split(digits.target)
    datum = parse_datum(train[0][1])
    expected = (digits.images[train_idx[0]].astype(int) * 255 // 16).astype(np.uint8)
    assert datum.label == digits.target[train_idx[0]]
    assert np.array_equal(datum_to_array(datum), expected[None])
    # Classes are mixed in record order, not grouped.
    assert len(set(train_labels[:30])) >= 8


def test_split_is_fixed_disjoint_and_complete(tool):
    labels = sklearn_datasets.load_digits().target
    a_train, a_test = tool.split(labels)
    b_train, b_test = tool.split(labels)
    assert np.array_equal(a_train, b_train) and np.array_equal(a_test, b_test)
    assert sorted(np.concatenate([a_train, a_test]).tolist()) == list(range(len(labels)))


def test_mean_file_and_idempotence(tool, converted):
    mean = read_binaryproto(converted / tool.MEAN_FILE)
    records = read_all(converted / tool.TRAIN_DB)
    images = np.stack([datum_to_array(parse_datum(v)) for _, v in records]).astype(np.float64)
    assert mean.shape == (1, 1, 8, 8)
    assert np.allclose(mean[0], images.mean(axis=0), atol=1e-4)
    assert tool.convert(converted) is None  # present: skipped
    before = read_all(converted / tool.TEST_DB)
    assert tool.convert(converted, force=True) == (1437, 360)
    assert read_all(converted / tool.TEST_DB) == before


@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_demo_net_data_layers_load_the_lmdbs(tool, converted, phase):
    net = read_net_param(REPO / "models/digits/train_test.prototxt")
    solver = read_solver_param(REPO / "models/digits/solver.prototxt")
    (param,) = [layer for layer in net.layer if layer.type == "Data"
                and layer.include[0].phase == phase]
    name = tool.TRAIN_DB if phase == TRAIN else tool.TEST_DB
    assert param.data_param.source == f"data/digits/{name}"
    if phase == TEST:  # one test pass covers the 360 held-out images exactly
        assert param.data_param.batch_size * solver.test_iter[0] == 360
    param.data_param.source = str(converted / name)
    layer = create_layer(param, LayerContext(phase=phase, seed=1))
    top = [Blob(()), Blob(())]
    layer.setup([], top)
    layer.forward([], top)
    layer.close()
    batch = param.data_param.batch_size
    records = read_all(converted / name)[:batch]
    expected = np.stack([datum_to_array(parse_datum(v)) for _, v in records]) / 256
    assert top[0].shape == (batch, 1, 8, 8)
    assert np.allclose(top[0].data, expected)
    assert np.array_equal(top[1].data, [parse_datum(v).label for _, v in records])

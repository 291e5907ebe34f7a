"""Weights from .caffemodel.h5 files (Caffe's HDF5 layout data/<layer>/<blob index>) in
Net.copy_from, and `train --weights a,b` copying from each file in turn."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from mgcaffe.errors import NetError
from mgcaffe.formats import protoio
from mgcaffe.formats.protoio import parse_net_text
from mgcaffe.layer_types.base import TEST
from mgcaffe.net import Net

NET = """
name: "two_ip"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { name: "shared_w" } inner_product_param { num_output: 3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        param { name: "shared_w" } inner_product_param { num_output: 3 } }
"""


def _net():
    return Net(parse_net_text(NET), TEST)


def _write_h5(path, layers: dict[str, dict[str, np.ndarray]]):
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for name, blobs in layers.items():
            group = data.create_group(name)
            for index, values in blobs.items():
                group.create_dataset(index, data=values)


def test_copy_from_reads_caffemodel_h5(tmp_path):
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    b1, b2 = np.full(3, 0.5, np.float32), np.full(3, -2.0, np.float32)
    path = tmp_path / "w.caffemodel.h5"
    # ip2 omits blob 0: it shares ip1's weight, which is loaded there (Caffe's rule).
    _write_h5(path, {"ip1": {"0": w, "1": b1}, "ip2": {"1": b2}, "gone": {"0": w}})
    net = _net()
    net.copy_from(str(path))
    np.testing.assert_array_equal(net.params["ip1"][0].data, w)
    np.testing.assert_array_equal(net.params["ip2"][0].data, w)
    np.testing.assert_array_equal(net.params["ip1"][1].data, b1)
    np.testing.assert_array_equal(net.params["ip2"][1].data, b2)
    # Caffe tells the formats apart by content, not by name.
    renamed = tmp_path / "w.caffemodel"
    renamed.write_bytes(path.read_bytes())
    other = Net(parse_net_text(NET), TEST, weights=str(renamed))
    np.testing.assert_array_equal(other.params["ip2"][1].data, b2)


@pytest.mark.parametrize("layers, words", [
    ({"ip1": {"1": np.zeros(3, np.float32)}}, "layer 'ip1' has no blob 0 in the weights"),
    ({"ip1": {"0": np.zeros((3, 2), np.float32), "1": np.zeros(3, np.float32)}},
     r"layer 'ip1' blob 0: the weights have shape \(3, 2\), the net expects \(3, 3\)"),
    ({"ip1": {str(i): np.zeros(3, np.float32) for i in range(3)}},
     "layer 'ip1' has 3 parameter blobs in the weights but 2 in the net"),
])
def test_bad_h5_weights_name_file_and_layer(tmp_path, layers, words):
    path = tmp_path / "bad.caffemodel.h5"
    _write_h5(path, layers)
    with pytest.raises(NetError, match=f"{path}: {words}"):
        _net().copy_from(str(path))


def test_train_weights_from_two_files_in_turn(model, cli):
    # a.caffemodel sets the ip layer; b.caffemodel.h5 then overrides its bias only.
    net = Net(model.net_file, TEST)
    rng = np.random.default_rng(0)
    weight = rng.standard_normal(net.params["ip"][0].shape).astype(np.float32)
    net.params["ip"][0].data[...] = weight
    net.params["ip"][1].data[...] = 7.0
    net.save(str(model.dir / "a.caffemodel"))
    bias = np.array([1.0, -1.0], np.float32)
    _write_h5(model.dir / "b.caffemodel.h5", {"ip": {"0": weight, "1": bias}})
    solver = model.solver(prefix=model.dir / "ft")
    with open(solver) as f:
        text = f.read().replace("snapshot: 10", "snapshot: 0")
    with open(solver, "w") as f:
        f.write(text)
    rc, err = cli("train", "-solver", solver, "-iterations", "0",
                  "-weights", f"{model.dir}/a.caffemodel,{model.dir}/b.caffemodel.h5")
    assert rc == 0, err
    assert err.index(f"Finetuning from {model.dir}/a.caffemodel\n") < err.index(
        f"Finetuning from {model.dir}/b.caffemodel.h5\n")
    result = protoio.read_caffemodel(model.dir / "ft_iter_0.caffemodel")
    layer = next(layer for layer in result.layer if layer.name == "ip")
    np.testing.assert_array_equal(np.asarray(layer.blobs[0].data).reshape(weight.shape),
                                  weight)
    np.testing.assert_array_equal(layer.blobs[1].data, bias)


@pytest.mark.timeout(20)
def test_copy_from_a_fifo_is_refused_not_waited_on(tmp_path):
    import os  # noqa: PLC0415

    from mgcaffe.errors import MgcaffeError  # noqa: PLC0415

    fifo = tmp_path / "w.caffemodel"
    os.mkfifo(fifo)
    with pytest.raises(MgcaffeError, match="not a regular file"):
        _net().copy_from(str(fifo))

"""Snapshots: file names, contents, Caffe's layouts; 200 straight == 100 + restore + 100."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from mgcaffe.errors import SolverError
from mgcaffe.formats import protoio

# multistep keeps current_step in the state; momentum keeps history; Adam needs the iter.
SGD = """type: "SGD"
base_lr: 0.1
lr_policy: "multistep"
gamma: 0.5
stepvalue: 50
stepvalue: 150
momentum: 0.9
weight_decay: 0.001
max_iter: 200
"""
ADAM = """type: "Adam"
base_lr: 0.01
lr_policy: "inv"
gamma: 0.01
power: 0.75
momentum: 0.9
momentum2: 0.999
max_iter: 200
"""


@pytest.mark.parametrize("fields, fmt", [(SGD, "BINARYPROTO"), (ADAM, "BINARYPROTO"),
                                         (SGD, "HDF5")])
def test_resume_is_bit_identical(tiny, fields, fmt):
    fields += f"snapshot_format: {fmt}\n"
    straight = tiny.solver(fields, name="straight")
    straight.step(200)

    first = tiny.solver(fields + "snapshot: 100", name="halves")
    first.step(100)
    suffix = ".h5" if fmt == "HDF5" else ""
    state = tiny.dir / f"halves_iter_100.solverstate{suffix}"
    assert state.exists() and (tiny.dir / f"halves_iter_100.caffemodel{suffix}").exists()

    second = tiny.solver(fields, name="halves")
    assert not np.array_equal(second.net.learnable_params[0].data,
                              first.net.learnable_params[0].data)
    second.restore(str(state))
    assert second.iter == 100
    if "multistep" in fields:
        assert second.current_step == 1
    second.step(100)
    for a, b in zip(straight.net.learnable_params, second.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)


def test_binaryproto_snapshot_contents(tiny, caplog):
    solver = tiny.solver(ADAM, name="s")
    solver.iter = 7
    with caplog.at_level("INFO", logger="mgcaffe"):
        model, state_path = solver.snapshot()
    assert model == str(tiny.dir / "s_iter_7.caffemodel")
    messages = [r.getMessage() for r in caplog.records]
    assert f"Snapshotting to binary proto file {model}" in messages
    assert f"Snapshotting solver state to binary proto file {state_path}" in messages
    weights = protoio.read_caffemodel(model)
    ip = next(layer for layer in weights.layer if layer.name == "ip")
    np.testing.assert_array_equal(protoio.blobproto_to_array(ip.blobs[0]),
                                  solver.net.params["ip"][0].data)
    state = protoio.read_solverstate(state_path)
    assert (state.iter, state.learned_net, state.current_step) == (7, model, 0)
    assert len(state.history) == 4  # Adam: m and v for the weight and the bias


def test_hdf5_snapshot_layout(tiny):
    solver = tiny.solver(SGD + "snapshot_format: HDF5", name="h")
    solver.step(3)
    model, state_path = solver.snapshot()
    assert model.endswith("h_iter_3.caffemodel.h5")
    assert state_path.endswith("h_iter_3.solverstate.h5")
    with h5py.File(model) as f:
        np.testing.assert_array_equal(f["data/ip/1"][()], solver.net.params["ip"][1].data)
        assert "data" in f["data"] and "0" not in f["data/data"]  # a group per layer
    with h5py.File(state_path) as f:
        assert int(f["iter"][()]) == 3 and f["learned_net"][()].decode() == model
        assert sorted(f["history"]) == ["0", "1"]
        np.testing.assert_array_equal(f["history/0"][()], solver.history[0])


def test_restore_rejects_wrong_history(tiny):
    adam = tiny.solver(ADAM, name="a")
    _, state_path = adam.snapshot()
    sgd = tiny.solver(SGD, name="b")
    with pytest.raises(SolverError, match="4 history blobs, a SGD solver for this net needs 2"):
        sgd.restore(state_path)


def test_snapshot_write_is_atomic(tiny, monkeypatch):
    solver = tiny.solver(SGD, name="x")
    model, _ = solver.snapshot()
    before = open(model, "rb").read()
    solver.step(1)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", fail)
    solver.iter = 0
    with pytest.raises(Exception, match="cannot write"):
        solver.snapshot()
    assert open(model, "rb").read() == before

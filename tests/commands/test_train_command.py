"""`mgcaffe train` through mgcaffe.cli.main: logs, snapshots, finetune, resume, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mgcaffe.backend import gpu_available
from mgcaffe.formats import protoio


def test_train_logs_and_snapshots(model, cli):
    solver = model.solver('test_iter: 2\ntest_interval: 10\n')
    rc, err = cli("train", "-solver", solver)
    assert rc == 0, err
    for line in ("Solver scaffolding done.", "Starting Optimization", "Solving dummy",
                 "Learning Rate Policy: fixed", "Iteration 0, Testing net (#0)",
                 "Iteration 10, lr = 0.01", "Optimization Done.",
                 f"Snapshotting to binary proto file {model.dir}/snap_iter_10.caffemodel",
                 "Snapshotting solver state to binary proto file "
                 f"{model.dir}/snap_iter_20.solverstate"):
        assert line in err
    assert re.search(r"\] Iteration 15 \([\d.e+-]+ iter/s, [\d.e+-]+s/5 iters\), "
                     r"loss = [\d.]+\n", err)
    assert re.search(r"\]     Train net output #0: loss = ([\d.]+) \(\* 1 = \1 loss\)", err)
    assert re.search(r"\]     Test net output #0: loss = [\d.]+", err)
    # glog line heads
    assert re.search(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \w+\.py:\d+\] ", err, re.M)
    assert sorted(p.name for p in model.dir.glob("snap_*")) == [
        "snap_iter_10.caffemodel", "snap_iter_10.solverstate",
        "snap_iter_20.caffemodel", "snap_iter_20.solverstate"]


def test_iterations_flag_and_snapshot_after_train(model, cli):
    rc, err = cli("train", "--solver", model.solver(), "--iterations", "7")
    assert rc == 0, err
    assert (model.dir / "snap_iter_7.caffemodel").exists()  # snapshot_after_train


def test_resume_continues_from_state(model, cli):
    assert cli("train", "--solver", model.solver())[0] == 0
    (model.dir / "snap_iter_20.caffemodel").unlink()
    rc, err = cli("train", "--solver", model.solver(), "--snapshot",
                  model.dir / "snap_iter_10.solverstate")
    assert rc == 0, err
    assert f"Resuming from {model.dir}/snap_iter_10.solverstate" in err
    assert "Iteration 10, lr" in err and "Iteration 5, lr" not in err
    assert (model.dir / "snap_iter_20.caffemodel").exists()


def test_finetune_from_weights(model, cli):
    assert cli("train", "--solver", model.solver(), "--iterations", "3")[0] == 0
    other = model.solver(name="other.prototxt", prefix=model.dir / "ft")
    text = open(other).read().replace("snapshot: 10", "snapshot: 0")
    open(other, "w").write(text)
    rc, err = cli("train", "--solver", other, "--iterations", "0",
                  "--weights", model.dir / "snap_iter_3.caffemodel")
    assert rc == 0, err
    assert f"Finetuning from {model.dir}/snap_iter_3.caffemodel" in err
    a = protoio.read_caffemodel(model.dir / "snap_iter_3.caffemodel")
    b = protoio.read_caffemodel(model.dir / "ft_iter_0.caffemodel")
    np.testing.assert_array_equal(a.layer[1].blobs[0].data, b.layer[1].blobs[0].data)


def test_relative_net_path_falls_back_to_solver_dir(model, cli, tmp_path_factory,
                                                    monkeypatch):
    solver = model.solver(net="net.prototxt", prefix=model.dir / "rel")
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    rc, err = cli("train", "--solver", solver, "--iterations", "1")
    assert rc == 0, err
    assert f"using {model.dir}/net.prototxt (relative to the solver file)" in err


@pytest.mark.skipif(gpu_available(), reason="checks the CPU fallback of a GPU-less machine")
def test_solver_mode_gpu_falls_back_to_cpu(model, cli):
    rc, err = cli("train", "--solver", model.solver("solver_mode: GPU\n"), "--iterations", "1")
    assert rc == 0, err
    assert "solver_mode is GPU but no GPU is usable" in err and "Use CPU." in err


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_divergence_exits_nonzero_and_keeps_snapshot(model, cli):
    solver = model.solver()
    text = open(solver).read()
    for a, b in (("base_lr: 0.01", "base_lr: 1e30"), ("snapshot: 10", "snapshot: 1")):
        text = text.replace(a, b)
    open(solver, "w").write(text)
    rc, err = cli("train", "--solver", solver)
    assert rc == 1
    last = err.strip().splitlines()[-1]
    m = re.match(r"mgcaffe train: error: iteration (\d+): (the loss is (nan|inf)|non-finite "
                 r"gradient in layer 'ip')", last)
    assert m, last
    good = protoio.read_caffemodel(model.dir / f"snap_iter_{m.group(1)}.caffemodel")
    assert np.isfinite(good.layer[1].blobs[0].data).all()
    assert not (model.dir / f"snap_iter_{int(m.group(1)) + 1}.caffemodel").exists()


def bad(model, cli, solver_text=None, *argv):
    args = ["train"]
    if solver_text is not None:
        path = model.dir / "bad.prototxt"
        path.write_text(solver_text)
        args += ["--solver", path]
    rc, err = cli(*args, *argv)
    lines = [line for line in err.splitlines() if "error:" in line]
    assert rc == 1 and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("change, words", [
    (("base_lr: 0.01", "base_lr: -0.1"), "bad.prototxt: base_lr: expected >= 0, found -0.1"),
    (('lr_policy: "fixed"', 'lr_policy: "cosine"'), "bad.prototxt: lr_policy: expected one "
                                                     "of fixed"),
    (("momentum: 0.9", 'momentum: 0.9\ntype: "Adamax"'), "bad.prototxt: type: expected one"),
    (("max_iter: 20", "max_iter: 20\ntest_iter: 5"), "bad.prototxt: test_iter is set"),
    (("max_iter: 20", "max_iter: 20\nregularization_type: 'L3'"), "regularization_type"),
    (("momentum: 0.9", 'momentum: 0.9\ntype: "AdaGrad"'), "bad.prototxt: momentum: expected "
     "0 (AdaGrad and RMSProp have no momentum), found 0.9 (Caffe aborts on it too"),
])
def test_bad_solver_fields(model, cli, change, words):
    text = open(model.solver()).read()
    assert change[0] in text
    assert words in bad(model, cli, text.replace(*change))


def test_missing_files(model, cli, tmp_path):
    assert "nope.prototxt: solver file not found" in bad(
        model, cli, None, "--solver", tmp_path / "nope.prototxt")
    text = open(model.solver(net=str(tmp_path / "missing_net.prototxt"))).read()
    assert "net: net file" in bad(model, cli, text) and "missing_net.prototxt" in bad(
        model, cli, text)
    assert "need a solver definition" in bad(model, cli, None)
    text = open(model.solver()).read()
    assert "w.caffemodel: weights file not found" in bad(
        model, cli, text, "--weights", tmp_path / "w.caffemodel")


def test_weights_and_snapshot_together(model, cli):
    assert "not both" in bad(model, cli, open(model.solver()).read(), "--weights", "a",
                             "--snapshot", "b")


def test_weights_with_mismatched_shapes(model, cli):
    assert cli("train", "--solver", model.solver(), "--iterations", "1")[0] == 0
    wide = model.write_net("wide.prototxt", out=3)
    text = open(model.solver(net=wide, name="wide_solver.prototxt")).read()
    line = bad(model, cli, text, "--weights", model.dir / "snap_iter_1.caffemodel")
    assert "layer 'ip'" in line and "(2, 4)" in line and "(3, 4)" in line


@pytest.mark.skipif(gpu_available(), reason="checks the error of a GPU-less machine")
def test_explicit_gpu_without_gpu_is_an_error(model, cli):
    assert "no GPU is usable" in bad(model, cli, open(model.solver()).read(), "--gpu", "0")

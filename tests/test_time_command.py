"""`mgcaffe time` (Caffe's `caffe time`), the profiler behind it and synthetic data layers."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.cli import main
from mgcaffe.comm.model.profile import load_profile
from mgcaffe.errors import NetError
from mgcaffe.layer_types.base import TEST
from mgcaffe.net import Net
from mgcaffe.net.synthetic_data import fill_labels, parse_shape_override, synthesize_data_layers
from mgcaffe.proto import caffe_pb2

# LeNet's learnable layers and their parameter counts (weights + biases), by hand:
# conv1 20x1x5x5 + 20, conv2 50x20x5x5 + 50, ip1 500x800 + 500, ip2 10x500 + 10.
LENET_PARAMS = {"conv1": 520, "conv2": 25050, "ip1": 400500, "ip2": 5010}


@pytest.fixture(autouse=True)
def restore_logging():
    """cli.main points the mgcaffe logger at this test's captured stderr; undo that, so no
    later log line goes to a closed stream."""
    logger = logging.getLogger("mgcaffe")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_time_deploy_net_logs_caffe_lines_and_writes_profile(repo_root, tmp_path, capsys):
    out = tmp_path / "lenet.json"
    rc = main(["time", "--model", str(repo_root / "models/lenet/lenet.prototxt"),
               "--iterations", "2", "--batch-size", "4", "--profile-out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    for line in ("Average Forward pass: ", "Average Backward pass: ",
                 "Average Forward-Backward: ", "*** Benchmark ends ***"):
        assert re.search(re.escape(line) + r"[0-9.e+-]+ ms\.|\*\*\*", err), line
    assert re.search(r"\]      conv1\tforward: [0-9.e+-]+ ms\.", err)
    assert re.search(r"\]        ip2\tbackward: [0-9.e+-]+ ms\.", err)
    assert err.count("forward-backward time: ") == 2
    # The paths the convolutions took, by their rules: conv1's 5x5 kernel on 1 channel has
    # 25 column rows (<= 32) and 24x24 outputs (>= 256); conv2's 8x8 outputs (<= 256).
    assert re.search(r"\]      conv1\tpath: im2col-per-sample \(25 <= 32 column rows", err)
    assert re.search(r"\]      conv2\tpath: im2col-batch-last \(64 <= 256 positions", err)
    assert "relu1\tpath" not in err  # one implementation: no line

    raw = json.loads(out.read_text())
    assert [layer.get("path") for layer in raw["layers"][:2]] == ["im2col-per-sample",
                                                                  "im2col-batch-last"]
    assert raw["model"] == "LeNet" and raw["batch_size"] == 4 and raw["dtype_bytes"] == 4
    assert [(layer["name"], layer["params"]) for layer in raw["layers"]] == \
        list(LENET_PARAMS.items())
    assert raw["forward_time"] > 0 and all(layer["backward_time"] > 0 for layer in raw["layers"])
    profile = load_profile(out)  # the planner accepts it
    assert profile.total_params == sum(LENET_PARAMS.values())


def test_time_train_net_with_synthetic_data(repo_root, tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main(["time", "-model", str(repo_root / "models/lenet/lenet_train_test.prototxt"),
               "-iterations", "1", "--synthetic-data", "--synthetic-shape", "data=3,1,28,28",
               "--profile-out", str(out)])
    assert rc == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    # Softmax loss over 10 classes with small random weights starts near ln(10).
    loss = float(re.search(r"Initial loss: ([0-9.e+-]+)", err).group(1))
    assert 1.0 < loss < 5.0
    assert json.loads(out.read_text())["batch_size"] == 3


def test_time_errors_are_one_line(repo_root, capsys):
    lenet = str(repo_root / "models/lenet/lenet.prototxt")
    assert main(["time", "--model", lenet, "--iterations", "0"]) == 1
    assert "--iterations must be >= 1" in capsys.readouterr().err
    assert main(["time", "--model", lenet, "--synthetic-shape", "data=1,x"]) == 1
    assert "NAME=N,C,H,W" in capsys.readouterr().err


# ----------------------------------------------------------------------------- profiler
def test_profile_backward_times_cover_the_whole_backward(repo_root):
    from mgcaffe.net.profiling import profile_net, timing_propagate_down

    net = Net(str(repo_root / "models/lenet/lenet.prototxt"), TEST)
    propagate = timing_propagate_down(net)
    # A deploy net: every bottom gets a diff except the data input's.
    assert propagate[net.layer_id("conv1")] == [False]
    assert all(all(flags) for i, flags in enumerate(propagate) if i > net.layer_id("conv1"))
    result = profile_net(net, 1)
    layers = result["profile"]["layers"]
    assert sum(layer["backward_time"] for layer in layers) == pytest.approx(
        sum(result["backward"]), rel=1e-9)
    # ip2's share is its own backward plus the layers above it (the softmax).
    ids = [net.layer_id(n) for n in ("ip2", "prob")]
    assert layers[-1]["backward_time"] == pytest.approx(
        sum(result["backward"][i] for i in ids), rel=1e-9)


# ----------------------------------------------------------------------------- synthetic data
def data_layer(kind, extra):
    return text_format.Parse(f'layer {{ name: "d" type: "{kind}" top: "data" top: "label" '
                             f'include {{ phase: TRAIN }} {extra} }}', caffe_pb2.NetParameter())


@pytest.mark.parametrize("kind, extra, shape", [
    ("Data", "data_param { batch_size: 8 } transform_param { crop_size: 27 }", (8, 3, 27, 27)),
    ("Data", "data_param { batch_size: 8 crop_size: 30 }", (8, 3, 30, 30)),
    ("Data", "data_param { batch_size: 8 }", (8, 3, 224, 224)),
    ("ImageData", "image_data_param { batch_size: 2 new_height: 40 new_width: 50 "
                  "is_color: false }", (2, 1, 40, 50)),
    ("MemoryData", "memory_data_param { batch_size: 5 channels: 2 height: 3 width: 4 }",
     (5, 2, 3, 4)),
    ("WindowData", "window_data_param { batch_size: 6 crop_size: 9 }", (6, 3, 9, 9)),
])
def test_synthetic_shapes_follow_the_documented_rule(kind, extra, shape):
    param, labels = synthesize_data_layers(data_layer(kind, extra))
    layer = param.layer[0]
    assert layer.type == "DummyData" and list(layer.top) == ["data", "label"]
    assert layer.include[0].phase == caffe_pb2.TRAIN
    assert tuple(layer.dummy_data_param.shape[0].dim) == shape
    assert tuple(layer.dummy_data_param.shape[1].dim) == (shape[0],)
    assert labels == ["label"]


def test_synthetic_overrides_batch_size_and_labels():
    param, labels = synthesize_data_layers(
        data_layer("Data", "data_param { batch_size: 8 }"),
        dict([parse_shape_override("data=4,1,28,28")]), batch_size=2)
    assert tuple(param.layer[0].dummy_data_param.shape[0].dim) == (2, 1, 28, 28)
    param.layer.add().CopyFrom(text_format.Parse(
        'name: "sink" type: "Silence" bottom: "data" bottom: "label"',
        caffe_pb2.LayerParameter()))
    net = Net(param, seed=0)
    fill_labels(net, labels, num_classes=3, seed=0)
    net.forward()
    values = net.blobs["label"].data
    assert values.shape == (2,) and set(values) <= {0.0, 1.0, 2.0}
    assert np.array_equal(values, np.floor(values))
    with pytest.raises(NetError, match="HDF5Data.*--synthetic-shape"):
        synthesize_data_layers(data_layer("HDF5Data", "hdf5_data_param { batch_size: 2 }"))


def test_adaptive_threads_settle_before_the_timed_passes(repo_root, monkeypatch, capsys):
    # `--threads adaptive` times each layer call site both ways in its first calls; the timed
    # passes of `time` must all run after those trials, or they report the trials.
    import mgcaffe.net.profiling as profiling  # noqa: PLC0415
    from mgcaffe.cpu import layer_way  # noqa: PLC0415

    timing, unsettled, calls, engines = [False], [], [0], []
    real_call, real_profile = layer_way.LayerWay.call, profiling.profile_net

    def call(self, key, fn, *args):
        if timing[0] and self.threads > 1:
            calls[0] += 1
            site = self._sites.get(key)
            if site is None or not site.settled():
                unsettled.append(key)
        return real_call(self, key, fn, *args)

    def profile_net(net, iterations, *, warmup=1, **kwargs):
        engines.append(net.cpu)
        if warmup:
            real_profile(net, warmup, warmup=0)
        timing[0] = True
        return real_profile(net, iterations, warmup=0, **kwargs)

    monkeypatch.setattr(layer_way.LayerWay, "call", call)
    monkeypatch.setattr(profiling, "profile_net", profile_net)
    rc = main(["time", "--model", str(repo_root / "models/lenet/lenet.prototxt"),
               "--iterations", "2", "--batch-size", "4", "--threads", "adaptive"])
    assert rc == 0, capsys.readouterr().err
    assert len(engines) == 1 and engines[0].adaptive  # the flag reached the net
    if engines[0].threads < 2:
        pytest.skip("one usable core: --threads adaptive has nothing to choose")
    assert calls[0] > 0
    assert unsettled == []


def test_time_runs_every_backward_once_untimed_before_timing(monkeypatch, repo_root):
    """A deploy net (no loss) runs no backward in the first pass: without a warm-up pass of
    the profile, the first timed backward would pay for the first calls (compiled loops
    loaded, buffers first touched)."""
    import mgcaffe.net.profiling as profiling  # noqa: PLC0415

    seen, real_profile = [], profiling.profile_net

    def profile_net(net, iterations, *, warmup=1, **kwargs):
        seen.append(warmup)
        return real_profile(net, iterations, warmup=warmup, **kwargs)

    monkeypatch.setattr(profiling, "profile_net", profile_net)
    rc = main(["time", "--model", str(repo_root / "models/lenet/lenet.prototxt"),
               "--iterations", "1", "--batch-size", "2", "--threads", "1"])
    assert rc == 0
    assert seen and seen[0] >= 1


@pytest.mark.parametrize("loops, path", [("0", "offset-passes"), ("1", "compiled-loops")])
def test_the_pooling_loops_switch_is_read_by_the_command(repo_root, monkeypatch, capsys,
                                                         loops, path):
    pytest.importorskip("numba", reason="the compiled pooling loops need numba")
    monkeypatch.setenv("MGCAFFE_POOLING_LOOPS", loops)
    rc = main(["time", "--model", str(repo_root / "models/lenet/lenet.prototxt"),
               "--iterations", "1", "--batch-size", "2"])
    assert rc == 0
    assert re.search(rf"\]      pool1\tpath: {path} ", capsys.readouterr().err)

"""protoio: text parsing and its errors, NetState filtering, binary weights and mean files,
atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from mgcaffe.errors import MgcaffeError, ParseError
from mgcaffe.formats import protoio
from mgcaffe.proto import caffe_pb2

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prototxt"
TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def fixture(name: str) -> str:
    return str(FIXTURES / name)


# ---------------------------------------------------------------------------------------------
# Text format and its errors


def test_features_net_parses_with_every_feature():
    net = protoio.read_net_param(fixture("features.prototxt"))
    layers = {layer.name: layer for layer in net.layer}
    assert net.force_backward
    assert list(layers["ip_a"].bottom) == list(layers["ip_b"].bottom) == ["data"]
    assert [p.name for p in layers["ip_a"].param] == ["shared_w", "shared_b"]
    assert [p.name for p in layers["ip_b"].param] == ["shared_w", "shared_b"]
    assert [(p.lr_mult, p.decay_mult) for p in layers["ip_a"].param] == [(1, 1), (2, 0)]
    assert list(layers["relu_a"].bottom) == list(layers["relu_a"].top) == ["ip_a"]
    assert list(layers["loss"].loss_weight) == [2]
    assert list(layers["loss"].propagate_down) == [True, False]
    assert list(layers["penalty"].loss_weight) == pytest.approx([0.01])
    assert [list(s.dim) for s in layers["data"].input_param.shape] == [[2, 3, 4, 4], [2, 5]]


@pytest.mark.parametrize("name, line, col, words", [
    ("bad_syntax.prototxt", 13, 37, "integer"),
    ("bad_unknown_field.prototxt", 15, 5, "kernel_sise"),
])
def test_syntax_errors_name_file_line_and_column(name, line, col, words):
    with pytest.raises(ParseError) as info:
        protoio.read_net_param(fixture(name))
    message = str(info.value)
    assert message.startswith(f"{fixture(name)}:{line}:{col}: ")
    assert words in message
    assert "\n" not in message


def test_parse_net_text_names_its_source():
    with pytest.raises(ParseError, match=r"^my.prototxt:2:9: .*no field named \"bogus\""):
        protoio.parse_net_text('name: "x"\nlayer { bogus: 1 }', source="my.prototxt")


def test_missing_file_is_a_parse_error_naming_it(tmp_path):
    missing = tmp_path / "nope.prototxt"
    with pytest.raises(ParseError, match="nope.prototxt: no such file"):
        protoio.read_net_param(missing)
    with pytest.raises(ParseError, match="nope.prototxt: no such file"):
        protoio.read_solver_param(missing)
    with pytest.raises(ParseError, match="nope.prototxt: no such file"):
        protoio.read_caffemodel(missing)


def test_binary_file_given_as_prototxt(tmp_path):
    path = tmp_path / "weights.prototxt"
    path.write_bytes(b"\x0a\xff\xfe\x00")
    with pytest.raises(ParseError, match="not a UTF-8 text file"):
        protoio.read_net_param(path)


def test_unknown_layer_type_is_left_to_the_net():
    net = protoio.read_net_param(fixture("unknown_layer_type.prototxt"))
    assert [layer.type for layer in net.layer] == ["Input", "Frobnicate"]


def test_read_net_param_copies_a_given_netparameter():
    original = caffe_pb2.NetParameter(name="n", input=["data"], input_dim=[1, 2, 3, 4])
    upgraded = protoio.read_net_param(original)
    assert list(original.input) == ["data"]          # untouched
    assert [layer.type for layer in upgraded.layer] == ["Input"]
    assert not upgraded.input


def test_prototxt_write_read_round_trip(tmp_path):
    net = protoio.read_net_param(fixture("features.prototxt"))
    protoio.write_prototxt(net, tmp_path / "copy.prototxt")
    assert protoio.read_net_param(tmp_path / "copy.prototxt") == net


# ---------------------------------------------------------------------------------------------
# Solvers


def test_solver_type_enum_becomes_type_string():
    solver = protoio.read_solver_param(fixture("solver_v1_type.prototxt"))
    assert solver.type == "Nesterov"
    assert not solver.HasField("solver_type")


def test_solver_type_and_type_disagreeing_is_an_error():
    with pytest.raises(ParseError, match=r"bad_solver_type.prototxt: solver_type: ADAM.*\"SGD\""):
        protoio.read_solver_param(fixture("bad_solver_type.prototxt"))


def test_solver_type_and_type_agreeing_is_accepted(tmp_path):
    path = tmp_path / "solver.prototxt"
    path.write_text('base_lr: 0.1\nsolver_type: ADAGRAD\ntype: "AdaGrad"\n')
    assert protoio.read_solver_param(path).type == "AdaGrad"


# ---------------------------------------------------------------------------------------------
# NetState rules (Caffe's StateMeetsRule and FilterNet)


def kept(net, phase, level=0, stages=()):
    return [layer.name for layer in protoio.filter_net(net, phase, level, stages).layer]


def test_filter_net_on_the_features_fixture():
    net = protoio.read_net_param(fixture("features.prototxt"))
    always = ["data", "ip_a", "ip_b", "relu_a", "sum", "loss", "penalty"]
    assert kept(net, TRAIN) == always + ["train_only", "not_in_test", "not_deploy"]
    assert kept(net, TEST) == always + ["test_only", "train_a_or_test", "not_deploy"]
    assert kept(net, TRAIN, stages=["a"]) == always + [
        "train_only", "needs_stage_a", "a_but_not_b", "train_a_or_test", "not_in_test",
        "not_deploy"]
    assert kept(net, TRAIN, stages=["a", "b"]) == always + [
        "train_only", "needs_stage_a", "train_a_or_test", "not_in_test", "not_deploy"]
    assert kept(net, TEST, level=1, stages=["deploy"]) == always + [
        "test_only", "level_1_to_2", "train_a_or_test"]
    assert "level_1_to_2" in kept(net, TEST, level=2)
    assert "level_1_to_2" not in kept(net, TEST, level=3)


def test_filter_net_sets_the_state_and_keeps_the_input_unchanged():
    net = protoio.read_net_param(fixture("features.prototxt"))
    before = net.SerializeToString()
    filtered = protoio.filter_net(net, TRAIN, level=3, stages=("x", "y"))
    assert net.SerializeToString() == before
    assert filtered.state.phase == TRAIN
    assert filtered.state.level == 3
    assert list(filtered.state.stage) == ["x", "y"]
    assert filtered.force_backward and filtered.name == "features"


def test_state_meets_rule_grid():
    # Each rule, and the states (phase, level, stages) it admits among a fixed grid.
    states = [(phase, level, stages) for phase in (TRAIN, TEST) for level in (0, 1, 2)
              for stages in ((), ("a",), ("a", "b"), ("b",))]
    rules = {
        "empty": (caffe_pb2.NetStateRule(), lambda p, lv, s: True),
        "test": (caffe_pb2.NetStateRule(phase=TEST), lambda p, lv, s: p == TEST),
        "min1": (caffe_pb2.NetStateRule(min_level=1), lambda p, lv, s: lv >= 1),
        "max1": (caffe_pb2.NetStateRule(max_level=1), lambda p, lv, s: lv <= 1),
        "a_and_b": (caffe_pb2.NetStateRule(stage=["a", "b"]),
                    lambda p, lv, s: "a" in s and "b" in s),
        "not_b": (caffe_pb2.NetStateRule(not_stage=["b"]), lambda p, lv, s: "b" not in s),
        "train_a_lvl2": (caffe_pb2.NetStateRule(phase=TRAIN, stage=["a"], min_level=2),
                         lambda p, lv, s: p == TRAIN and "a" in s and lv >= 2),
    }
    for name, (rule, expected) in rules.items():
        for phase, level, stages in states:
            state = caffe_pb2.NetState(phase=phase, level=level, stage=stages)
            assert protoio.state_meets_rule(state, rule) == expected(phase, level, stages), \
                (name, phase, level, stages)


def test_a_layer_with_include_and_exclude_is_an_error():
    net = protoio.read_net_param(fixture("bad_include_exclude.prototxt"))
    with pytest.raises(ParseError, match="layer 'both' has both include and exclude"):
        protoio.filter_net(net, TRAIN)


def test_filter_net_refuses_a_net_not_yet_upgraded():
    net = caffe_pb2.NetParameter(name="old")
    net.layers.add(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    with pytest.raises(ParseError, match="read_net_param"):
        protoio.filter_net(net, TRAIN)


# ---------------------------------------------------------------------------------------------
# .caffemodel weights


def weights_net(rng) -> tuple[caffe_pb2.NetParameter, dict[str, list[np.ndarray]]]:
    arrays = {"conv1": [rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                        rng.standard_normal(4).astype(np.float32)],
              "fc": [rng.standard_normal((10, 36)).astype(np.float32)]}
    net = caffe_pb2.NetParameter(name="w")
    for name, blobs in arrays.items():
        layer = net.layer.add(name=name, type="Convolution" if name == "conv1" else "InnerProduct")
        layer.blobs.extend(protoio.array_to_blobproto(blob) for blob in blobs)
    return net, arrays


def test_caffemodel_round_trip(tmp_path):
    net, arrays = weights_net(np.random.default_rng(0))
    path = tmp_path / "w.caffemodel"
    protoio.write_caffemodel(net, path)
    back = protoio.read_caffemodel(path)
    assert [layer.name for layer in back.layer] == ["conv1", "fc"]
    for layer in back.layer:
        got = [protoio.blobproto_to_array(bp) for bp in layer.blobs]
        assert len(got) == len(arrays[layer.name])
        for a, b in zip(got, arrays[layer.name]):
            assert a.dtype == np.float32 and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_caffemodel_written_by_protobuf_with_legacy_dims(tmp_path):
    # Built with protobuf's own API and written with plain file IO: trusts no mgcaffe writer.
    values = np.arange(2 * 3 * 2 * 2, dtype=np.float32) * 0.5 - 3
    net = caffe_pb2.NetParameter(name="legacy")
    layer = net.layer.add(name="conv", type="Convolution")
    bp = layer.blobs.add(num=2, channels=3, height=2, width=2)
    bp.data.extend(values.tolist())
    bias = layer.blobs.add(num=1, channels=1, height=1, width=2)
    bias.data.extend([7.0, -1.0])
    path = tmp_path / "legacy.caffemodel"
    path.write_bytes(net.SerializeToString())

    back = protoio.read_caffemodel(path)
    weight = protoio.blobproto_to_array(back.layer[0].blobs[0])
    assert weight.shape == (2, 3, 2, 2)
    np.testing.assert_array_equal(weight[1, 2, 0, 1], values[1 * 12 + 2 * 4 + 0 * 2 + 1])
    np.testing.assert_array_equal(weight.ravel(), values)
    bias_array = protoio.blobproto_to_array(back.layer[0].blobs[1])
    assert bias_array.shape == (1, 1, 1, 2)
    np.testing.assert_array_equal(bias_array.ravel(), [7.0, -1.0])


def test_caffemodel_with_v1_layers_is_upgraded(tmp_path):
    net = caffe_pb2.NetParameter(name="v1")
    v1 = net.layers.add(name="ip", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    v1.blobs.add(num=1, channels=1, height=2, width=3).data.extend([1, 2, 3, 4, 5, 6])
    path = tmp_path / "v1.caffemodel"
    path.write_bytes(net.SerializeToString())
    back = protoio.read_caffemodel(path)
    assert not back.layers
    assert [(layer.name, layer.type) for layer in back.layer] == [("ip", "InnerProduct")]
    np.testing.assert_array_equal(protoio.blobproto_to_array(back.layer[0].blobs[0]),
                                  [[[[1, 2, 3], [4, 5, 6]]]])


def test_corrupt_or_empty_caffemodel_is_a_parse_error(tmp_path):
    corrupt = tmp_path / "corrupt.caffemodel"
    corrupt.write_bytes(b"\xa2\x06\xff\xff\xff\xff\x0f")   # field 100, impossible length
    with pytest.raises(ParseError, match="corrupt.caffemodel: not a binary NetParameter"):
        protoio.read_caffemodel(corrupt)
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    with pytest.raises(ParseError, match="empty.caffemodel: a .caffemodel holds no layers"):
        protoio.read_caffemodel(empty)


# ---------------------------------------------------------------------------------------------
# Blobs and .binaryproto


def test_blobproto_prefers_double_data_and_reads_diff():
    bp = caffe_pb2.BlobProto()
    bp.shape.dim.extend([2, 2])
    bp.data.extend([9, 9, 9, 9])
    bp.double_data.extend([0.1, 0.2, 0.3, 1e-10])
    bp.diff.extend([1, 2, 3, 4])
    data = protoio.blobproto_to_array(bp)
    assert data.dtype == np.float32
    np.testing.assert_array_equal(data, np.float32([[0.1, 0.2], [0.3, 1e-10]]))
    exact = protoio.blobproto_to_array(bp, np.float64)
    assert exact[1, 1] == 1e-10
    np.testing.assert_array_equal(protoio.blobproto_to_array(bp, diff=True), [[1, 2], [3, 4]])
    assert protoio.blobproto_to_array(caffe_pb2.BlobProto(data=[1.0]), diff=True) is None


def test_blobproto_count_mismatch_names_the_blob():
    bp = caffe_pb2.BlobProto()
    bp.shape.dim.extend([2, 3])
    bp.data.extend([1.0] * 5)
    with pytest.raises(ParseError, match=r"conv1 blob 0: shape \[2, 3\] needs 6 values .* 5"):
        protoio.blobproto_to_array(bp, where="conv1 blob 0")


def test_array_to_blobproto_writes_blobshape_and_double_for_float64():
    single = protoio.array_to_blobproto(np.ones((2, 3), np.float32), diff=np.zeros((2, 3)))
    assert list(single.shape.dim) == [2, 3]
    assert not single.HasField("num")
    assert list(single.data) == [1.0] * 6 and len(single.diff) == 6
    double = protoio.array_to_blobproto(np.full(3, 0.1, dtype=np.float64))
    assert list(double.double_data) == [0.1] * 3 and not double.data
    mixed = protoio.array_to_blobproto(np.ones(2, np.float64), diff=np.ones(2, np.float32))
    assert len(mixed.double_diff) == 2 and not mixed.diff
    with pytest.raises(MgcaffeError, match="diff shape"):
        protoio.array_to_blobproto(np.ones(3), diff=np.ones(4))


@pytest.mark.parametrize("array", [
    np.random.default_rng(3).standard_normal((3, 2, 300)),                 # float64, long
    np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32),
    np.zeros((0, 3), np.float32),
    np.float32(2.5),
    np.arange(40),                                                         # ints -> float
], ids=["float64", "float32", "empty", "scalar", "int"])
def test_array_to_blobproto_equals_the_protobuf_api_message(array):
    expected = caffe_pb2.BlobProto()
    expected.shape.dim.extend(np.shape(array))
    if np.asarray(array).dtype == np.float64:
        expected.double_data.extend(np.ravel(array).tolist())
        expected.double_diff.extend((np.ravel(array) * 2).tolist())
    else:
        expected.data.extend(np.ravel(array).astype(np.float32).tolist())
        expected.diff.extend((np.ravel(array) * 2).astype(np.float32).tolist())
    assert protoio.array_to_blobproto(array, diff=np.asarray(array) * 2) == expected


def test_binaryproto_mean_file_with_legacy_dims(tmp_path):
    mean = np.random.default_rng(1).uniform(0, 255, (1, 3, 4, 5)).astype(np.float32)
    bp = caffe_pb2.BlobProto(num=1, channels=3, height=4, width=5)
    bp.data.extend(mean.ravel().tolist())
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(bp.SerializeToString())
    got = protoio.read_binaryproto(path)
    assert got.shape == (1, 3, 4, 5)
    np.testing.assert_array_equal(got, mean)


def test_binaryproto_round_trip(tmp_path):
    data = np.random.default_rng(2).standard_normal((3, 4, 4)).astype(np.float32)
    path = tmp_path / "m.binaryproto"
    protoio.write_binaryproto(data, path)
    parsed = caffe_pb2.BlobProto.FromString(path.read_bytes())
    assert list(parsed.shape.dim) == [3, 4, 4]
    np.testing.assert_array_equal(protoio.read_binaryproto(path), data)


def test_solverstate_round_trip(tmp_path):
    state = caffe_pb2.SolverState(iter=120, learned_net="snap_iter_120.caffemodel",
                                  current_step=2)
    state.history.append(protoio.array_to_blobproto(np.arange(3, dtype=np.float32)))
    path = tmp_path / "snap.solverstate"
    protoio.write_solverstate(state, path)
    assert caffe_pb2.SolverState.FromString(path.read_bytes()) == state
    assert protoio.read_solverstate(path) == state


# ---------------------------------------------------------------------------------------------
# Atomic writes


def test_atomic_write_creates_and_replaces_leaving_no_temporary(tmp_path):
    path = tmp_path / "out.bin"
    protoio.atomic_write_bytes(path, b"first")
    protoio.atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(protoio.os, "replace", failing_replace)
    with pytest.raises(MgcaffeError, match="out.bin: cannot write: No space left"):
        protoio.atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_atomic_write_into_a_missing_directory(tmp_path):
    with pytest.raises(MgcaffeError, match="missing/out.bin: cannot write"):
        protoio.atomic_write_bytes(tmp_path / "missing" / "out.bin", b"x")


def test_atomic_write_gives_ordinary_file_permissions(tmp_path):
    import os
    import stat

    from mgcaffe.formats.protoio import atomic_write_bytes

    target = tmp_path / "weights.caffemodel"
    atomic_write_bytes(target, b"abc")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert target.read_bytes() == b"abc"
    assert [p.name for p in tmp_path.iterdir()] == ["weights.caffemodel"]


# -- odd and huge inputs ----------------------------------------------------------------------
def test_fifo_and_device_are_refused_without_blocking(tmp_path):
    import threading

    fifo = tmp_path / "net.prototxt"
    os.mkfifo(fifo)
    errors = []

    def read():
        for reader in (protoio.read_net_param, protoio.read_caffemodel):
            try:
                reader(fifo)
            except ParseError as exc:
                errors.append(str(exc))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "reading a FIFO with no writer blocked"
    assert len(errors) == 2 and all("not a regular file" in e for e in errors), errors
    for reader in (protoio.read_net_param, protoio.read_solverstate):
        with pytest.raises(ParseError, match=r"/dev/zero: not a regular file"):
            reader("/dev/zero")


def test_prototxt_size_limit_and_its_variable(tmp_path, monkeypatch):
    path = tmp_path / "net.prototxt"
    path.write_text('name: "n"\n' + "# padding\n" * 20_000)  # ~200 KB
    monkeypatch.setenv(protoio.MAX_PROTOTXT_ENV, "0.1")
    with pytest.raises(ParseError, match=rf"net\.prototxt: \d+ bytes, more than the 104857 "
                                         rf"a prototxt may have; set {protoio.MAX_PROTOTXT_ENV}"):
        protoio.read_net_param(path)
    monkeypatch.setenv(protoio.MAX_PROTOTXT_ENV, "1")
    assert protoio.read_net_param(path).name == "n"
    monkeypatch.setenv(protoio.MAX_PROTOTXT_ENV, "lots")
    with pytest.raises(MgcaffeError, match="expected a size in MiB > 0"):
        protoio.read_net_param(path)
    monkeypatch.delenv(protoio.MAX_PROTOTXT_ENV)
    assert protoio.max_prototxt_bytes() == 16 << 20


def test_long_parse_reports_progress(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(protoio, "PROGRESS_LINES", 10)
    monkeypatch.setattr(protoio, "PROGRESS_SECONDS", 0.0)
    text = 'name: "n"\n' + "".join(f'layer {{ name: "l{i}" type: "ReLU" }}\n'
                                   for i in range(9000))
    caplog.set_level("INFO", "mgcaffe.formats.protoio")
    net = protoio.parse_text(text, caffe_pb2.NetParameter(), source="big.prototxt")
    assert len(net.layer) == 9000
    lines = [r.getMessage() for r in caplog.records if "Parsing big.prototxt" in r.getMessage()]
    # Every 4096 lines: at lines 4096 and 8192 of 9002.
    assert [line.split(" (")[0] for line in lines] == [
        "Parsing big.prototxt: line 4096 of 9002", "Parsing big.prototxt: line 8192 of 9002"]


def test_huge_token_is_quoted_as_an_excerpt(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text("name: \"n\"\n" + "x" * 1_000_000 + ": 1\n")
    with pytest.raises(ParseError) as exc:
        protoio.read_net_param(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:2:") and len(msg) < 600, msg[:700]
    path.write_text('name: "' + "y" * 1_000_000 + '" bogus\n')
    with pytest.raises(ParseError) as exc:
        protoio.read_net_param(path)
    assert len(str(exc.value)) < 600, str(exc.value)[:700]

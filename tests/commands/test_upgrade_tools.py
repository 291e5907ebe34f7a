"""upgrade_net_proto_text / upgrade_net_proto_binary / upgrade_solver_proto_text IN OUT:
the written files parse as the current format without any upgrade."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from google.protobuf import text_format

from mgcaffe.proto import caffe_pb2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prototxt"


def _raw_text(path, message):
    text_format.Parse(Path(path).read_text(), message)
    return message


def test_upgrade_net_proto_text_on_a_v0_net(tmp_path, cli):
    out = tmp_path / "net.prototxt"
    rc, err = cli("upgrade_net_proto_text", FIXTURES / "v0_padding.prototxt", out)
    assert rc == 0, err
    assert f"Wrote upgraded NetParameter text proto to {out}" in err
    written = _raw_text(out, caffe_pb2.NetParameter())
    expected = _raw_text(FIXTURES / "v0_padding_current.prototxt", caffe_pb2.NetParameter())
    assert written == expected
    # A current file is written back as it is, with a note.
    again = tmp_path / "again.prototxt"
    rc, err = cli("upgrade_net_proto_text", out, again)
    assert rc == 0 and "File already in latest proto format" in err
    assert _raw_text(again, caffe_pb2.NetParameter()) == expected


def test_upgrade_net_proto_binary_keeps_the_weights(tmp_path, cli):
    net = _raw_text(FIXTURES / "lenet_v1.prototxt", caffe_pb2.NetParameter())
    conv = next(layer for layer in net.layers if layer.name == "conv1")
    conv.blobs.add(num=20, channels=1, height=5, width=5).data.extend(
        np.arange(500, dtype=np.float32).tolist())
    (tmp_path / "v1.caffemodel").write_bytes(net.SerializeToString())
    rc, err = cli("upgrade_net_proto_binary", tmp_path / "v1.caffemodel",
                  tmp_path / "new.caffemodel")
    assert rc == 0, err
    new = caffe_pb2.NetParameter.FromString((tmp_path / "new.caffemodel").read_bytes())
    assert not new.layers and not new.input
    conv = next(layer for layer in new.layer if layer.name == "conv1")
    assert conv.type == "Convolution"
    assert list(conv.blobs[0].data) == list(range(500))


def test_upgrade_solver_proto_text(tmp_path, cli):
    (tmp_path / "old.prototxt").write_text('net: "n.prototxt"\nbase_lr: 0.1\nsolver_type: ADAM\n')
    rc, err = cli("upgrade_solver_proto_text", tmp_path / "old.prototxt",
                  tmp_path / "new.prototxt")
    assert rc == 0, err
    solver = _raw_text(tmp_path / "new.prototxt", caffe_pb2.SolverParameter())
    assert solver.type == "Adam" and not solver.HasField("solver_type")
    assert solver.net == "n.prototxt"


def test_unreadable_input_is_one_line(tmp_path, cli):
    (tmp_path / "bad.prototxt").write_text("layer { name: \n")
    rc, err = cli("upgrade_net_proto_text", tmp_path / "bad.prototxt", tmp_path / "o")
    lines = [line for line in err.splitlines() if "error:" in line]
    assert rc == 1 and len(lines) == 1 and "bad.prototxt:" in lines[0]
    assert not (tmp_path / "o").exists()


def test_a_problem_while_upgrading_writes_the_file_and_exits_1(tmp_path, cli):
    """Caffe's tool writes the upgraded net even when a V0 field had to be dropped (a concat
    layer's num_output), and says so with exit status 1 so that scripts notice."""
    out = tmp_path / "net.prototxt"
    rc, err = cli("upgrade_net_proto_text", FIXTURES / "v0_data.prototxt", out)
    assert rc == 1, err
    assert "num_output does not apply to layer type 'concat'" in err
    assert "Encountered error(s) while upgrading prototxt" in err
    net = _raw_text(out, caffe_pb2.NetParameter())
    assert [layer.type for layer in net.layer if layer.name == "cat"] == ["Concat"]

"""The committed mgcaffe/proto/caffe_pb2.py must be what `make proto` makes of proto/caffe.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mgcaffe.proto import caffe_pb2

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: a second caffe.proto would clash with ours in protobuf's default
# descriptor pool. The runtime re-serialises descriptors (e.g. float defaults), so both sides
# are compared as DESCRIPTOR.serialized_pb after loading, not as source text.
_DUMP = ("import sys; sys.path.insert(0, sys.argv[1]); import caffe_pb2; "
         "sys.stdout.buffer.write(caffe_pb2.DESCRIPTOR.serialized_pb)")


def fresh_serialized_descriptor(out_dir: Path, proto_dir: Path = ROOT / "proto") -> bytes:
    """Generate caffe_pb2 from `proto_dir`/caffe.proto into `out_dir`; its
    DESCRIPTOR.serialized_pb."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    status = protoc.main(["grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={out_dir}",
                          str(proto_dir / "caffe.proto")])
    assert status == 0, f"protoc failed on {proto_dir / 'caffe.proto'}"
    done = subprocess.run([sys.executable, "-c", _DUMP, str(out_dir)], capture_output=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def test_committed_caffe_pb2_matches_proto_source(tmp_path):
    fresh = fresh_serialized_descriptor(tmp_path)
    assert fresh == caffe_pb2.DESCRIPTOR.serialized_pb, (
        "mgcaffe/proto/caffe_pb2.py is out of date with proto/caffe.proto; run `make proto`")


def test_a_changed_proto_would_be_detected(tmp_path):
    # The comparison must be able to fail: a schema with one default changed differs.
    proto = tmp_path / "proto"
    proto.mkdir()
    text = (ROOT / "proto" / "caffe.proto").read_text()
    changed = text.replace("optional uint32 local_size = 1 [default = 5];",
                           "optional uint32 local_size = 1 [default = 7];")
    assert changed != text
    (proto / "caffe.proto").write_text(changed)
    out = tmp_path / "out"
    out.mkdir()
    assert fresh_serialized_descriptor(out, proto) != caffe_pb2.DESCRIPTOR.serialized_pb

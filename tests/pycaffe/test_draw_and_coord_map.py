"""mgcaffe.draw (DOT text always; images only where Graphviz's dot is installed), the
draw_net command, and mgcaffe.coord_map on hand-computed maps."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from google.protobuf import text_format

import mgcaffe
from mgcaffe import draw
from mgcaffe import layers as L
from mgcaffe import params as P
from mgcaffe.cli import main
from mgcaffe.coord_map import coord_map_from_to, crop
from mgcaffe.proto import caffe_pb2

NET = """
name: "drawn"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 1 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  param { lr_mult: 1 decay_mult: 1 }
  convolution_param { num_output: 2 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "drop" type: "Dropout" bottom: "pool" top: "d" include { phase: TRAIN } }
"""

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot program is not installed")


def parse():
    return text_format.Parse(NET, caffe_pb2.NetParameter())


def edges(source):
    return set(re.findall(r'^\s*"([^"]+)" -> "([^"]+)"', source, re.M))


def test_dot_source_nodes_edges_labels():
    source = draw.get_dot_source(parse(), "LR", display_lrm=True)
    assert source.startswith('digraph "drawn" {') and 'rankdir="LR"' in source
    assert edges(source) == {
        ("layer0_data", "blob_data"), ("blob_data", "layer1_conv"),
        ("layer1_conv", "blob_conv"), ("blob_conv", "layer2_relu"),  # in place: no way out
        ("blob_conv", "layer3_pool"), ("layer3_pool", "blob_pool"),
        ("blob_pool", "layer4_drop"), ("layer4_drop", "blob_d")}
    assert "conv\\n(Convolution)\\nkernel size: 3\\nstride: 2\\npad: 1" in source
    assert "pool: AVE" in source and "lr_mult 1, decay_mult 1" in source
    assert 'fillcolor="#FF5050"' in source  # convolutions are red
    assert '"conv" ->' not in source and 'label="2"' in source  # num_output on conv's edge
    test_only = draw.get_dot_source(parse(), "TB", phase=caffe_pb2.TEST)
    assert "drop" not in test_only and "conv (Convolution) kernel size: 3" in test_only


def test_text_formats_need_no_dot(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert draw.draw_net(parse(), "LR", ext="dot") == draw.get_dot_source(parse()).encode()
    with pytest.raises(draw.DrawError, match="needs Graphviz's `dot` program"):
        draw.draw_net(parse(), "LR", ext="png")
    out = tmp_path / "net.png"
    (tmp_path / "net.prototxt").write_text(NET)
    assert main(["draw_net", str(tmp_path / "net.prototxt"), str(out)]) == 1
    assert not out.exists()
    dot_out = tmp_path / "net.dot"
    assert main(["draw_net", str(tmp_path / "net.prototxt"), str(dot_out), "--rankdir",
                 "TB", "--phase", "test"]) == 0
    assert "drop" not in dot_out.read_text() and 'rankdir="TB"' in dot_out.read_text()


@needs_dot
def test_png_through_graphviz(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    out = tmp_path / "net.png"
    assert main(["draw_net", str(tmp_path / "net.prototxt"), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert draw.draw_net(parse(), "LR", ext="svg").lstrip().startswith(b"<?xml")


# ----------------------------------------------------------------------------- coord_map
def spec(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    n = mgcaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 32, 32]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool)
    n.deconv = L.Deconvolution(n.pool, num_output=1, kernel_size=2 * dstride, stride=dstride,
                               pad=dpad)
    return n


def test_coord_maps_by_hand():
    # Output coordinate y of a conv (kernel k, stride s, pad p) is centred on input
    # s*y + (k-1)/2 - p. conv 3/1/0 then pool 2/2 then deconv 4/2/0: an input x maps to
    # conv x-1, pool (x-1.5)/2, deconv 2*(x-1.5)/2 + 1.5 = x: the identity, b = 0.
    n = spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert ax == 1 and np.all(a == 1) and np.all(b == 0)
    # pad 2 on the conv shifts by 2: the deconv output starts 2 pixels before the input.
    n = spec(pad=2)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert np.all(a == 1) and np.all(b == -2)
    layer = crop(n.deconv, n.data)
    proto = mgcaffe.to_proto(layer)
    cp = proto.layer[-1].crop_param
    assert proto.layer[-1].type == "Crop" and cp.axis == 2 and list(cp.offset) == [2]
    # Built, the crop's output has the input's size and the offset Caffe applies.
    n.crop = layer
    net = mgcaffe.Net(n.to_proto(), mgcaffe.TEST)
    assert net.blobs["crop"].shape == net.blobs["data"].shape


def test_coord_map_errors():
    n = spec()
    n.ip = L.InnerProduct(n.deconv, num_output=3)
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.ip, n.data)
    n = spec(pool=3)  # pooled by 3, upsampled by 2
    with pytest.raises(AssertionError, match="scale mismatch"):
        crop(n.deconv, n.data)

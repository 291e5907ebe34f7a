"""V0 nets (2013-2014 `layers { layer { ... } }`): padding folding and field moves, in
prototxt and in binary .caffemodel files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe.errors import ParseError
from mgcaffe.formats import protoio
from mgcaffe.layer_types.base import TEST
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prototxt"


def test_v0_net_upgrades_to_the_hand_written_current_net():
    upgraded = protoio.read_net_param(FIXTURES / "v0_padding.prototxt")
    expected = protoio.read_net_param(FIXTURES / "v0_padding_current.prototxt")
    assert text_format.MessageToString(upgraded) == text_format.MessageToString(expected)
    assert not upgraded.layers
    assert "pad1" not in [layer.name for layer in upgraded.layer]


def test_v0_data_fields_move_to_their_parameter_messages(caplog):
    net = protoio.read_net_param(FIXTURES / "v0_data.prototxt")
    layers = {layer.name: layer for layer in net.layer}
    mnist = layers["mnist"]
    assert mnist.type == "Data"
    assert (mnist.data_param.source, mnist.data_param.batch_size,
            mnist.data_param.rand_skip) == ("mnist_lmdb", 16, 7)
    t = mnist.transform_param
    assert (t.scale, t.mean_file, t.crop_size, t.mirror) == (
        pytest.approx(1 / 256), "mean.binaryproto", 24, True)
    img = layers["img"].image_data_param
    assert layers["img"].type == "ImageData"
    assert (img.source, img.batch_size, img.shuffle, img.new_height, img.new_width) == (
        "list.txt", 4, True, 32, 30)
    win = layers["win"].window_data_param
    assert layers["win"].type == "WindowData"
    assert (win.fg_threshold, win.bg_threshold, win.fg_fraction, win.context_pad,
            win.crop_mode) == (pytest.approx(0.6), pytest.approx(0.4), pytest.approx(0.3),
                               16, "square")
    assert layers["cat"].concat_param.concat_dim == 0
    # num_output means nothing to a concat layer: Caffe drops it with a complaint.
    assert "num_output does not apply to layer type 'concat'" in caplog.text
    assert layers["loss"].type == "SoftmaxWithLoss" and not layers["loss"].top


def test_v0_net_builds_and_computes_what_the_current_net_does():
    v0 = Net(str(FIXTURES / "v0_padding.prototxt"), TEST)
    current = Net(str(FIXTURES / "v0_padding_current.prototxt"), TEST)
    assert v0.blobs["conv1"].shape == (2, 4, 5, 5)  # (8 + 2*2 - 3) // 2 + 1 = 5
    current.share_weights(v0)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    for net in (v0, current):
        net.blobs["data"].data[...] = x
        net.forward()
    np.testing.assert_array_equal(v0.blobs["prob"].data, current.blobs["prob"].data)


def _v0_caffemodel(path: Path, weights: dict[str, list[np.ndarray]]) -> None:
    """A binary V0 net as 2014 Caffe wrote it: blobs inside each `layers.layer`, 4-D
    num/channels/height/width shapes, the padding layer still present."""
    net = protoio.read_prototxt(FIXTURES / "v0_padding.prototxt", caffe_pb2.NetParameter())
    for entry in net.layers:
        for arr in weights.get(entry.layer.name, []):
            legacy = (1,) * (4 - arr.ndim) + arr.shape
            bp = entry.layer.blobs.add(num=legacy[0], channels=legacy[1], height=legacy[2],
                                       width=legacy[3])
            bp.data.extend(arr.ravel().tolist())
    protoio.write_message(net, path)


def test_v0_caffemodel_weights_load_into_a_current_net(tmp_path):
    rng = np.random.default_rng(1)
    weights = {"conv1": [rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                         rng.standard_normal(4).astype(np.float32)],
               # fc sees 4 x 3 x 3 (pool rounds up: (5 - 2) / 2 -> 1 + 2 = 3)
               "fc": [rng.standard_normal((5, 36)).astype(np.float32)]}
    path = tmp_path / "v0.caffemodel"
    _v0_caffemodel(path, weights)
    upgraded = protoio.read_caffemodel(path)
    assert [layer.name for layer in upgraded.layer] == [
        "input", "conv1", "relu1", "pool1", "norm1", "fc", "drop", "prob"]
    assert list(upgraded.layer[1].convolution_param.pad) == [2]
    net = Net(str(FIXTURES / "v0_padding_current.prototxt"), TEST)
    net.copy_from(str(path))
    for name, arrays in weights.items():
        for blob, arr in zip(net.params[name], arrays):
            np.testing.assert_array_equal(blob.data, arr)


def test_padding_into_a_non_conv_layer_is_an_error():
    text = ('input: "d" input_dim: 1 input_dim: 1 input_dim: 4 input_dim: 4 '
            'layers { layer { name: "p" type: "padding" pad: 1 } bottom: "d" top: "p" } '
            'layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }')
    with pytest.raises(ParseError, match="V0 layer 'r': a padding layer feeds this 'relu'"):
        protoio.parse_net_text(text, source="t.prototxt")


def test_unknown_v0_type_and_bottom_are_errors():
    with pytest.raises(ParseError, match="t.prototxt: V0 layer 'x': unknown V0 layer type "
                                         "'warp'; expected one of accuracy"):
        protoio.parse_net_text('layers { layer { name: "x" type: "warp" } }', "t.prototxt")
    with pytest.raises(ParseError, match="V0 layer 'c': unknown bottom blob 'nope'"):
        protoio.parse_net_text('layers { layer { name: "c" type: "conv" } bottom: "nope" }')


def test_current_field_in_a_v0_block_gets_a_v0_hint():
    path = FIXTURES / "bad_v0_field.prototxt"
    with pytest.raises(ParseError) as info:
        protoio.read_net_param(path)
    message = str(info.value)
    assert message.startswith(f"{path}:6:")
    assert "V0 `layers { layer {} }` block" in message and "kernelsize" in message
    assert "write current fields" not in message

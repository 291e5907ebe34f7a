"""NetSpec (mgcaffe.layers as L, mgcaffe.params as P): the text is what the prototxt is."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

import mgcaffe
from mgcaffe import layers as L
from mgcaffe import params as P
from mgcaffe.proto import caffe_pb2

LENET_TEXT = """
layer { name: "data" type: "DummyData" top: "data" top: "label"
  transform_param { scale: 0.00390625 }
  dummy_data_param { shape { dim: 4 dim: 1 dim: 28 dim: 28 } shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss"
  loss_weight: 2 }
"""


def lenet_spec():
    n = mgcaffe.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[4, 1, 28, 28]), dict(dim=[4])],
                                  transform_param=dict(scale=1.0 / 256), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"),
                            param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool1, num_output=10, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.loss = L.SoftmaxWithLoss(n.relu1, n.label, loss_weight=2)
    return n


def test_netspec_gives_the_prototxt_message_and_text():
    expected = text_format.Parse(LENET_TEXT, caffe_pb2.NetParameter())
    got = lenet_spec().to_proto()
    assert got == expected
    assert str(got) == str(expected)
    net = mgcaffe.Net(got, mgcaffe.TRAIN)
    assert net.layer_names == ["data", "conv1", "pool1", "ip1", "relu1", "loss"]
    assert net.blobs["conv1"].shape == (4, 20, 24, 24)


def test_anonymous_tops_are_named_by_type_and_count():
    data = L.Input(shape=dict(dim=[2, 3]))
    a = L.InnerProduct(data, num_output=4)
    b = L.InnerProduct(a, num_output=5)
    proto = L.Softmax(b).to_proto()
    assert [(lp.name, list(lp.bottom), list(lp.top)) for lp in proto.layer] == [
        ("Input1", [], ["Input1"]),
        ("InnerProduct1", ["Input1"], ["InnerProduct1"]),
        ("InnerProduct2", ["InnerProduct1"], ["InnerProduct2"]),
        ("Softmax1", ["InnerProduct2"], ["Softmax1"])]
    assert mgcaffe.to_proto(b) == mgcaffe.to_proto(b)  # names restart for every call


def test_ntop_zero_python_and_deconvolution_fields():
    n = mgcaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2, 4, 4]))
    n.a, n.b = L.Python(n.data, module="mymod", layer="Split2", param_str="k: 1", ntop=2)
    n.up = L.Deconvolution(n.a, num_output=2, kernel_size=2, stride=2, bias_term=False)
    n.quiet = L.Silence(n.b, ntop=0)
    proto = n.to_proto()
    py, up, quiet = proto.layer[1], proto.layer[2], proto.layer[3]
    assert list(py.top) == ["a", "b"] and py.name == "a"
    assert (py.python_param.module, py.python_param.layer, py.python_param.param_str) == \
        ("mymod", "Split2", "k: 1")
    assert up.convolution_param.kernel_size == [2] and up.convolution_param.stride == [2]
    assert not up.convolution_param.bias_term
    assert quiet.name == "quiet" and list(quiet.top) == [] and list(quiet.bottom) == ["b"]


def test_params_enums_and_type_errors():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX == 0
    assert P.Pooling.AVE == 1 and P.Eltwise.SUM == caffe_pb2.EltwiseParameter.SUM
    tops = L.DummyData(ntop=2)
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class "
                                        r"'tuple'>\)$"):
        L.Silence(tops, ntop=0)
    L.Silence(*tops, ntop=0)
    with pytest.raises(AttributeError):
        L.Convolution(L.Input(), no_such_field=1).to_proto()


def test_layers_namespace_is_not_the_implementations():
    # mgcaffe.layers is pycaffe's L; the implementations are mgcaffe.layer_types.
    import mgcaffe.layer_types  # noqa: PLC0415

    assert not hasattr(mgcaffe.layers, "__path__")
    assert callable(mgcaffe.layers.Convolution)
    assert "Convolution" in mgcaffe.layer_types.layer_types()

"""The bundled model definitions: each parses and upgrades, has the published structure and
parameter counts, and the generated ones are what their generators write.

A deep check that the nets build and run belongs to the Net tests; here a small independent
shape walk (conv, pool, inner product, concat, ...) counts each learnable layer's parameters.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from mgcaffe.formats import protoio
from mgcaffe.proto import caffe_pb2

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
# The authors' measured profiles, copied into the repo (tests/comm checks the copies).
PAPER = ROOT / "models" / "paper"
# Only these model folders are checked here (others belong to other suites).
FOLDERS = ("lenet", "cifar10_quick", "alexnet", "caffenet", "googlenet", "resnet50",
           "resnet101", "resnet152")
NETS = sorted(p for folder in FOLDERS for p in (MODELS / folder).glob("*.prototxt")
              if "solver" not in p.name)
SOLVERS = sorted(p for folder in FOLDERS for p in (MODELS / folder).glob("*solver*.prototxt"))
LEARNABLE_TYPES = {"Convolution", "Deconvolution", "InnerProduct", "Scale", "Bias", "PReLU",
                   "Embed"}


def net(relpath: str, phase=None) -> caffe_pb2.NetParameter:
    param = protoio.read_net_param(MODELS / relpath)
    return param if phase is None else protoio.filter_net(param, phase)


def type_counts(param: caffe_pb2.NetParameter) -> dict[str, int]:
    counts: dict[str, int] = {}
    for layer in param.layer:
        counts[layer.type] = counts.get(layer.type, 0) + 1
    return counts


def learnable_params(param: caffe_pb2.NetParameter, data_shape=(3, 224, 224)) -> list:
    """(name, parameter count) of each learnable layer, input side first, from a walk of
    blob shapes (C, H, W) through the net. Written here, independently of mgcaffe.net.
    `data_shape` is what a Data layer yields (its crop size, when set, replaces H and W)."""
    shapes: dict[str, tuple[int, ...]] = {}
    out = []
    for layer in param.layer:
        t, bottom = layer.type, (shapes[layer.bottom[0]] if layer.bottom else None)
        if t == "Input":
            for top, shape in zip(layer.top, layer.input_param.shape):
                shapes[top] = tuple(shape.dim[1:])
        elif t == "Data":
            crop = layer.transform_param.crop_size
            shapes[layer.top[0]] = (data_shape[0], crop, crop) if crop else tuple(data_shape)
        elif t == "Convolution":
            p = layer.convolution_param
            k, pad = p.kernel_size[0], (p.pad[0] if p.pad else 0)
            stride = p.stride[0] if p.stride else 1
            c, h, w = bottom
            size = [(x + 2 * pad - k) // stride + 1 for x in (h, w)]
            shapes[layer.top[0]] = (p.num_output, *size)
            out.append((layer.name, p.num_output * (c // p.group) * k * k
                        + (p.num_output if p.bias_term else 0)))
        elif t == "Pooling":
            p = layer.pooling_param
            c, h, w = bottom
            size = [math.ceil((x + 2 * p.pad - p.kernel_size) / p.stride) + 1 for x in (h, w)]
            shapes[layer.top[0]] = (c, *size)
        elif t == "InnerProduct":
            n = layer.inner_product_param.num_output
            shapes[layer.top[0]] = (n,)
            out.append((layer.name, n * math.prod(bottom) + n))
        elif t == "Concat":
            parts = [shapes[b] for b in layer.bottom]
            shapes[layer.top[0]] = (sum(s[0] for s in parts), *parts[0][1:])
        elif t == "Scale":
            shapes[layer.top[0]] = bottom
            out.append((layer.name, bottom[0] * (2 if layer.scale_param.bias_term else 1)))
        elif t in ("ReLU", "LRN", "Dropout", "BatchNorm", "Eltwise", "Softmax"):
            shapes[layer.top[0]] = bottom
        elif t not in ("SoftmaxWithLoss", "Accuracy"):
            raise AssertionError(f"shape walk does not know layer type {t}")
    return out


# ---------------------------------------------------------------------------------------------
# Every file parses


@pytest.mark.parametrize("path", NETS, ids=lambda p: str(p.relative_to(MODELS)))
def test_every_bundled_net_parses_in_current_format(path):
    param = protoio.read_net_param(path)
    assert param.layer and not param.layers
    assert not param.input and not param.input_dim and not param.input_shape
    names = [layer.name for layer in param.layer]
    for phase in (caffe_pb2.TRAIN, caffe_pb2.TEST):
        filtered = [layer.name for layer in protoio.filter_net(param, phase).layer]
        assert len(filtered) == len(set(filtered)), f"duplicate layer names in {path}"
    # Every bottom is produced by an earlier layer (in the phase the file is meant for).
    phase = caffe_pb2.TRAIN if "train" in path.name else caffe_pb2.TEST
    produced: set[str] = set()
    for layer in protoio.filter_net(param, phase).layer:
        missing = [b for b in layer.bottom if b not in produced]
        assert not missing, f"{path}: layer {layer.name} reads {missing} before they exist"
        produced.update(layer.top)
    assert names


def test_the_nets_and_solvers_are_all_found():
    assert len(NETS) == 12 and len(SOLVERS) == 4


@pytest.mark.parametrize("path", SOLVERS, ids=lambda p: str(p.relative_to(MODELS)))
def test_every_bundled_solver_parses_and_names_a_bundled_net(path):
    solver = protoio.read_solver_param(path)
    assert solver.base_lr > 0 and solver.max_iter > 0 and solver.type == "SGD"
    assert (ROOT / solver.net).is_file(), f"{path}: net {solver.net} not in the repository"


# ---------------------------------------------------------------------------------------------
# Structure and parameter counts


def test_lenet():
    train = net("lenet/lenet_train_test.prototxt", caffe_pb2.TRAIN)
    assert [layer.name for layer in train.layer] == [
        "mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "loss"]
    test = net("lenet/lenet_train_test.prototxt", caffe_pb2.TEST)
    assert "accuracy" in [layer.name for layer in test.layer]
    assert test.layer[0].data_param.batch_size == 100
    deploy = net("lenet/lenet.prototxt")
    counts = learnable_params(deploy)
    assert counts == [("conv1", 520), ("conv2", 25050), ("ip1", 400500), ("ip2", 5010)]
    assert learnable_params(train, data_shape=(1, 28, 28)) == counts


def test_cifar10_quick():
    deploy = net("cifar10_quick/cifar10_quick.prototxt")
    # conv 3->32, 32->32, 32->64 (5x5) and ip 64*4*4->64->10: 145578 weights and biases.
    assert sum(n for _, n in learnable_params(deploy)) == 145578
    pools = [layer.pooling_param.pool for layer in deploy.layer if layer.type == "Pooling"]
    assert pools == [caffe_pb2.PoolingParameter.MAX, caffe_pb2.PoolingParameter.AVE,
                     caffe_pb2.PoolingParameter.AVE]
    train = net("cifar10_quick/cifar10_quick_train_test.prototxt", caffe_pb2.TRAIN)
    assert learnable_params(train, data_shape=(3, 32, 32)) == learnable_params(deploy)


@pytest.mark.parametrize("model", ["alexnet", "caffenet"])
def test_alexnet_and_caffenet(model):
    param = net(f"{model}/deploy.prototxt")
    counts = dict(learnable_params(param))
    assert list(counts) == ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
    assert sum(counts.values()) == 60965224      # the published 61M of AlexNet
    groups = {layer.name: layer.convolution_param.group for layer in param.layer
              if layer.type == "Convolution"}
    assert groups == {"conv1": 1, "conv2": 2, "conv3": 1, "conv4": 2, "conv5": 2}
    order = [layer.name for layer in param.layer]
    # AlexNet normalises before pooling, CaffeNet pools before normalising.
    before = order.index("norm1") < order.index("pool1")
    assert before == (model == "alexnet")


def test_googlenet_structure():
    train = net("googlenet/train_val.prototxt", caffe_pb2.TRAIN)
    counts = type_counts(train)
    # 57 convolutions in the main trunk plus one in each auxiliary classifier; 2 + 2 + 1 fc.
    assert counts["Convolution"] == 59 and counts["InnerProduct"] == 5
    assert counts["Concat"] == 9 and counts["SoftmaxWithLoss"] == 3
    weights = {layer.name: list(layer.loss_weight) for layer in train.layer
               if layer.type == "SoftmaxWithLoss"}
    assert weights == {"loss1/loss": [pytest.approx(0.3)], "loss2/loss": [pytest.approx(0.3)],
                       "loss3/loss3": [1.0]}
    test = net("googlenet/train_val.prototxt", caffe_pb2.TEST)
    assert type_counts(test)["Accuracy"] == 6
    deploy = net("googlenet/deploy.prototxt")
    deploy_counts = type_counts(deploy)
    assert deploy_counts["Convolution"] == 57 and deploy_counts["InnerProduct"] == 1
    assert deploy.layer[-1].type == "Softmax"
    trunk = [name for name, _ in learnable_params(train) if not name.startswith(("loss1",
                                                                                "loss2"))]
    assert [name for name, _ in learnable_params(deploy)] == trunk


@pytest.mark.parametrize("depth, convs", [(50, 53), (101, 104), (152, 155)])
def test_resnet_structure(depth, convs):
    deploy = net(f"resnet{depth}/deploy.prototxt")
    counts = type_counts(deploy)
    assert counts["Convolution"] == convs and counts["InnerProduct"] == 1
    assert counts["BatchNorm"] == counts["Scale"] == convs
    assert counts["Eltwise"] == (convs - 5) // 3       # one per bottleneck block
    names = [layer.name for layer in deploy.layer]
    assert names[:6] == ["input", "conv1", "bn_conv1", "scale_conv1", "conv1_relu", "pool1"]
    assert names[-3:] == ["pool5", "fc1000", "prob"]
    for name in ("res2a_branch1", "res2a_branch2a", "bn2a_branch2a", "scale2a_branch2a",
                 "res2a", "res2a_relu", "res5c_branch2c", "res5c"):
        assert name in names
    assert all(layer.batch_norm_param.use_global_stats for layer in deploy.layer
               if layer.type == "BatchNorm")
    # Parameter counts (conv1 has a bias, the other convolutions none; Scale has gamma and
    # beta): torchvision's published totals plus conv1's 64 biases.
    published = {50: 25557032, 101: 44549160, 152: 60192808}
    assert sum(n for _, n in learnable_params(deploy)) == published[depth] + 64


@pytest.mark.parametrize("depth, long_stage_names", [
    (101, ["res3b3", "res4b22"]), (152, ["res3b7", "res4b35"])])
def test_resnet_long_stage_naming(depth, long_stage_names):
    names = {layer.name for layer in net(f"resnet{depth}/deploy.prototxt").layer}
    for name in long_stage_names:
        assert name in names and f"{name}_branch2c" in names
    assert "res4c" not in names and "res2c" in names and "res5c" in names


def test_resnet50_train_val_matches_deploy():
    train = net("resnet50/train_val.prototxt", caffe_pb2.TRAIN)
    deploy = net("resnet50/deploy.prototxt")
    assert learnable_params(train) == learnable_params(deploy)
    assert not any(layer.batch_norm_param.HasField("use_global_stats") for layer in train.layer)


# ---------------------------------------------------------------------------------------------
# Against the paper's layer lists (models/paper, copies of ../shared/paper)


def paper_layers(model: str) -> list[tuple[str, int]]:
    path = PAPER / f"{model}-k80.json"
    return [(layer["name"], layer["params"]) for layer in json.loads(path.read_text())["layers"]]


def test_googlenet_learnable_layers_match_the_paper_profile():
    expected = paper_layers("googlenet")
    train = net("googlenet/train_val.prototxt", caffe_pb2.TRAIN)
    assert len(expected) == 64
    assert learnable_params(train) == expected


def test_resnet50_learnable_layers_match_the_paper_profile():
    expected = paper_layers("resnet50")
    assert len(expected) == 107
    assert learnable_params(net("resnet50/deploy.prototxt")) == expected


# ---------------------------------------------------------------------------------------------
# Generated files are up to date


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tool, files", [
    ("gen_googlenet", ["train_val.prototxt", "deploy.prototxt"]),
    ("gen_resnet", ["resnet50/train_val.prototxt", "resnet50/deploy.prototxt",
                    "resnet101/deploy.prototxt", "resnet152/deploy.prototxt"]),
])
def test_generated_models_are_up_to_date(tool, files, tmp_path):
    load_tool(tool).main(["--out", str(tmp_path)])
    base = MODELS / "googlenet" if tool == "gen_googlenet" else MODELS
    for rel in files:
        assert (tmp_path / rel).read_text() == (base / rel).read_text(), (
            f"{base / rel} differs from what tools/{tool}.py writes; rerun it")

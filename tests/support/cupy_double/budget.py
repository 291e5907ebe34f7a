"""Launches, host syncs and bytes of one forward+backward iteration of a net on the double.

`measure(name, batch)` builds one of `NETS` (synthetic data) on the installed double's GPU,
runs one untimed iteration (first-use allocations, kernel caches), then counts the next
one: what benchmarks/bench_gpu_budgets.py reports and tests/gpu/test_gpu_budgets.py bounds.
Counts are deterministic: they follow from the code and the shapes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from google.protobuf import text_format

from mgcaffe.backend import Device
from mgcaffe.formats.protoio import read_net_param
from mgcaffe.layer_types.base import TRAIN
from mgcaffe.net import Net
from mgcaffe.net.synthetic_data import fill_labels, synthesize_data_layers
from mgcaffe.proto import caffe_pb2

__all__ = ["NETS", "measure", "train_net_param"]

REPO = Path(__file__).resolve().parents[3]

#: name -> (prototxt under the repository, default batch, shape overrides)
NETS = {
    "lenet": ("models/lenet/lenet_train_test.prototxt", 64, {"data": (1, 28, 28)}),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt", 100,
                      {"data": (3, 32, 32)}),
    "alexnet": ("models/alexnet/deploy.prototxt", 32, {}),
    "googlenet": ("models/googlenet/train_val.prototxt", 64, {}),
    "resnet50": ("models/resnet50/train_val.prototxt", 32, {}),
}

#: Targets of a forward+backward iteration on the GPU: launches within this many times the
#: layer passes; host syncs (the loss read back included).
LAUNCHES_PER_PASS = 3.0
SYNCS_PER_ITERATION = 2


def train_net_param(name: str, batch: int) -> tuple[caffe_pb2.NetParameter, list[str]]:
    """The TRAIN-phase NetParameter of `name` with synthetic data of `batch` (a deploy net
    gets a label Input and its final Softmax becomes SoftmaxWithLoss), and its label tops."""
    path, _, shapes = NETS[name]
    param = read_net_param(REPO / path)
    if any(layer.type == "Input" for layer in param.layer):
        return _deploy_to_train(param, batch), ["label"]
    shapes = {top: (batch, *shape) for top, shape in shapes.items()}
    return synthesize_data_layers(param, shapes, batch, replace_data=True)


def _deploy_to_train(param, batch):
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    for layer in out.layer:
        if layer.type == "Input":
            layer.input_param.shape[0].dim[0] = batch
            layer.top.append("label")
            layer.input_param.shape.add().dim.append(batch)
    last = out.layer[-1]
    if last.type == "Softmax":
        last.type = "SoftmaxWithLoss"
        last.bottom.append("label")
        last.top[0] = "loss"
    return out


def _layer_passes(net) -> int:
    forward = len(net.layers)
    backward = sum(1 for need in net.layer_need_backward if need)
    return forward + backward


def measure(name: str, batch: int | None = None, double=None, by_type: bool = False) -> dict:
    """Counts of one forward+backward iteration of NETS[name] at `batch` (default the
    table's) on the installed CuPy double `double`. With `by_type`, also launches per layer
    type, forward and backward."""
    batch = NETS[name][1] if batch is None else int(batch)
    param, labels = train_net_param(name, batch)
    text_format.MessageToString(param)  # (validates the copy early)
    net = Net(param, TRAIN, device=Device("gpu", 0), seed=1)
    fill_labels(net, labels, num_classes=10, seed=1)
    counters = double.counters
    per_type: Counter = Counter()
    if by_type:
        _attribute(net, counters, per_type)
    net.clear_param_diffs_for_pass()
    net.forward_backward()  # untimed first pass
    counters.reset()
    per_type.clear()
    net.clear_param_diffs_for_pass()
    net.forward_backward()
    totals = counters.totals()
    passes = _layer_passes(net)
    result = {"net": name, "batch": batch, "layers": len(net.layers), "layer_passes": passes,
              **totals, "launch_budget": int(LAUNCHES_PER_PASS * passes),
              "sync_budget": SYNCS_PER_ITERATION,
              "sync_sites": dict(counters.sync_sites.most_common()),
              "top_launches": dict(counters.launches_by_name.most_common(8))}
    if by_type:
        result["launches_by_type"] = dict(per_type.most_common())
    return result


def _attribute(net, counters, per_type: Counter) -> None:
    """Count each layer's launches under '<type> forward' / '<type> backward'."""
    for layer in net.layers:
        for stage in ("forward", "backward"):
            original = getattr(layer, stage)

            def counted(*args, _original=original, _key=f"{layer.type} {stage}", **kwargs):
                before = counters.launches
                try:
                    return _original(*args, **kwargs)
                finally:
                    per_type[_key] += counters.launches - before

            setattr(layer, stage, counted)

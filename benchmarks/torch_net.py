"""Caffe prototxt nets in PyTorch, for the benchmarks that set mgcaffe beside PyTorch: a small
interpreter of the layer types the benchmarked nets use (not a project dependency; `torch`
imports only where a benchmark asks for it), and a PyTorch DistributedDataParallel worker.

    build(net_param, generator) -> TorchNet   # params, steps, shapes, inputs, losses
    python benchmarks/torch_net.py --ddp-worker NET.prototxt --iterations N --warmup W
        (under mpiexec: one process per rank, gloo over TCP, MASTER_ADDR/MASTER_PORT from the
        environment, rank and size from MPICH's PMI_RANK/PMI_SIZE or Open MPI's
        OMPI_COMM_WORLD_RANK/SIZE; one thread per rank; prints one JSON line on rank 0)

A net's loss is the sum of its SoftmaxWithLoss tops, each times its `loss_weight` (Caffe's
rule; GoogleNet's auxiliary classifiers count 0.3), or, without a loss layer (deploy nets),
the sum of the last top.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class TorchNet:
    """A net as PyTorch callables: `steps` (callable, bottom names, top names) in order,
    `params` (leaf tensors with requires_grad), `shapes` per blob, `inputs` (Input tops) and
    `losses` ((top, loss_weight) of the loss layers)."""

    params: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    losses: list = field(default_factory=list)

    def forward(self, blobs: dict):
        """Run every step on `blobs` (the inputs filled in); the loss (module docstring)."""
        for f, b, tops in self.steps:
            blobs[tops[0]] = f(*[blobs[x] for x in b])
        if self.losses:
            return sum(w * blobs[top] for top, w in self.losses)
        out = blobs[self.steps[-1][2][0]]
        return out if out.dim() == 0 else out.sum()


def build(net, g) -> TorchNet:  # noqa: C901, PLR0915
    """The PyTorch form of `net` (a NetParameter of Input and computing layers only), its
    weights drawn from the torch.Generator `g`."""
    # ruff: noqa: E731 - one lambda per layer type reads best here
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: N812, PLC0415

    from mgcaffe.proto import caffe_pb2  # noqa: PLC0415

    tn = TorchNet()
    params, steps, shapes = tn.params, tn.steps, tn.shapes

    def weight(*shape):
        w = torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.01)
        params.append(w)
        return w

    def pair(values, default, h=0, w=0):
        if h or w:
            return int(h), int(w)
        values = list(values)
        return (int(values[0]), int(values[-1])) if values else (default, default)

    for layer in net.layer:
        t, b = layer.type, list(layer.bottom)
        if t == "Input":
            for top, s in zip(layer.top, layer.input_param.shape):
                shapes[top] = tuple(s.dim)
            continue
        shape = shapes[b[0]]
        if t == "Convolution":
            p = layer.convolution_param
            k = pair(p.kernel_size, 1, p.kernel_h, p.kernel_w)
            st = pair(p.stride, 1, p.stride_h, p.stride_w)
            pd = pair(p.pad, 0, p.pad_h, p.pad_w)
            groups = int(p.group)
            w = weight(p.num_output, shape[1] // groups, *k)
            bias = weight(p.num_output) if p.bias_term else None
            f = (lambda x, w=w, bias=bias, st=st, pd=pd, gr=groups:
                 F.conv2d(x, w, bias, st, pd, 1, gr))
        elif t == "InnerProduct":
            p = layer.inner_product_param
            k = 1
            for d in shape[1:]:
                k *= d
            w = weight(p.num_output, k)
            bias = weight(p.num_output) if p.bias_term else None
            f = lambda x, w=w, bias=bias: F.linear(x.flatten(1), w, bias)  # noqa: E731
        elif t == "Pooling":
            p = layer.pooling_param
            if p.global_pooling:
                k, st, pd = (shape[2], shape[3]), (1, 1), (0, 0)
            else:
                k = pair([p.kernel_size] if p.kernel_size else [], 1, p.kernel_h, p.kernel_w)
                st = pair([p.stride], 1, p.stride_h, p.stride_w)
                pd = pair([p.pad], 0, p.pad_h, p.pad_w)
            if p.pool == caffe_pb2.PoolingParameter.MAX:
                f = (lambda x, k=k, st=st, pd=pd:
                     F.max_pool2d(x, k, st, pd, ceil_mode=True))
            else:
                f = (lambda x, k=k, st=st, pd=pd:
                     F.avg_pool2d(x, k, st, pd, ceil_mode=True))
        elif t == "ReLU":
            f = F.relu
        elif t == "LRN":
            p = layer.lrn_param
            f = (lambda x, p=p: F.local_response_norm(x, int(p.local_size), p.alpha, p.beta,
                                                      p.k))
        elif t == "Dropout":
            f = lambda x, r=layer.dropout_param.dropout_ratio: F.dropout(x, r)  # noqa: E731
        elif t == "BatchNorm":
            c = shape[1]
            mean, var = torch.zeros(c), torch.ones(c)
            f = lambda x, m=mean, v=var: F.batch_norm(x, m, v, training=False)  # noqa: E731
        elif t == "Scale":
            c = shape[1]
            s = weight(c)
            bias = weight(c) if layer.scale_param.bias_term else None
            f = (lambda x, s=s, bias=bias: x * s.view(1, -1, 1, 1)
                 + (bias.view(1, -1, 1, 1) if bias is not None else 0))
        elif t == "Softmax":
            f = lambda x: F.softmax(x, dim=1)  # noqa: E731
        elif t == "SoftmaxWithLoss":
            f = lambda x, y: F.cross_entropy(x, y.long())  # noqa: E731
        elif t == "Concat":
            f = lambda *xs: torch.cat(xs, dim=1)  # noqa: E731
        elif t == "Eltwise":
            f = lambda *xs: sum(xs[1:], xs[0])  # noqa: E731
        else:
            raise SystemExit(f"torch worker: layer type {t} not supported")
        steps.append((f, b, list(layer.top)))
        if t == "SoftmaxWithLoss":
            weight_ = float(layer.loss_weight[0]) if len(layer.loss_weight) else 1.0
            tn.losses.append((layer.top[0], weight_))
        # shapes of the tops: run once on zeros (cheap next to the timed passes)
        with torch.no_grad():
            outs = f(*[torch.zeros(shapes[x]) for x in b])
        shapes[layer.top[0]] = tuple(outs.shape) if outs.dim() else ()

    tn.inputs = [t for layer in net.layer if layer.type == "Input" for t in layer.top]
    return tn


def train_net(prototxt: str | Path, batch: int):
    """The TRAIN phase of a train_val prototxt for `build`: its data layers as one Input layer
    of the shapes mgcaffe's synthetic data gives them at `batch` per rank (labels (batch,)),
    Accuracy left out (no backward)."""
    from mgcaffe.formats.protoio import filter_net, read_net_param  # noqa: PLC0415
    from mgcaffe.layer_types.base import TRAIN  # noqa: PLC0415
    from mgcaffe.net.synthetic_data import synthesize_data_layers  # noqa: PLC0415
    from mgcaffe.proto import caffe_pb2  # noqa: PLC0415

    param, _ = synthesize_data_layers(filter_net(read_net_param(str(prototxt)), TRAIN), None,
                                      batch)
    net = caffe_pb2.NetParameter(name=param.name)
    data = net.layer.add(name="input", type="Input")
    for layer in param.layer:
        if layer.type == "DummyData":
            for top, shape in zip(layer.top, layer.dummy_data_param.shape):
                data.top.append(top)
                dims = list(shape.dim)
                data.input_param.shape.add().dim.extend(dims[:1] if top == "label" else dims)
        elif layer.type != "Accuracy":
            copy = net.layer.add()
            copy.CopyFrom(layer)
            del copy.include[:]
            del copy.exclude[:]
    return net


def _rank_and_size() -> tuple[int, int]:
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def ddp_worker(prototxt: str, batch: int, iterations: int, warmup: int,
               hook: str = "none") -> None:
    """One rank of PyTorch DistributedDataParallel (gloo) training the net on random inputs:
    SGD with momentum 0.9, one thread; rank 0 prints the median iteration (forward start to
    the next forward start, the optimizer step included) over the timed iterations. `hook`
    "fp16" or "bf16": DDP's own compression hook (fp16_compress_hook, bf16_compress_hook)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    torch.set_num_threads(1)
    rank, size = _rank_and_size()
    dist.init_process_group("gloo", rank=rank, world_size=size)
    g = torch.Generator().manual_seed(0)
    tn = build(train_net(prototxt, batch), g)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(tn.params)

        def forward(self, blobs):
            return tn.forward(blobs)

    model = torch.nn.parallel.DistributedDataParallel(Wrapped())
    if hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: PLC0415
        model.register_comm_hook(None, getattr(default_hooks, f"{hook}_compress_hook"))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    stamps = []
    for _ in range(warmup + iterations + 1):
        stamps.append(time.perf_counter())
        blobs = {top: (torch.randint(0, 2, tn.shapes[top]).float() if len(tn.shapes[top]) == 1
                       else torch.randn(*tn.shapes[top], generator=g)) for top in tn.inputs}
        loss = model(blobs)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
    times = [b - a for a, b in zip(stamps[warmup:], stamps[warmup + 1:])]
    if rank == 0:
        print(json.dumps({"ddp_ms": statistics.median(times) * 1e3, "iterations": len(times),
                          "ranks": size, "bucket_mb": 25, "hook": hook,
                          "setup": f"torch {torch.__version__}, gloo, 1 thread per rank"}),
              flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ddp-worker", required=True, metavar="NET.prototxt")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hook", choices=("none", "fp16", "bf16"), default="none",
                   help="DDP's compression hook")
    a = p.parse_args(argv)
    ddp_worker(a.ddp_worker, a.batch, a.iterations, a.warmup, a.hook)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

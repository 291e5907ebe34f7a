"""`mgcaffe test`: score a trained model (Caffe's `caffe test`).

    mgcaffe test --model train_val.prototxt --weights W.caffemodel [--iterations 50]
                 [--gpu ID] [--level L] [--stage S]

Runs the TEST-phase net forward `--iterations` times, logging every batch's outputs
(`Batch i, name = v`), then the mean loss (`Loss: X`) and each output's mean.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from ..backend import CPU, to_host
from ..cpu import threads
from ..errors import NetError
from ..formats.protoio import require_layers
from ..layer_types.base import TEST
from ..net import Net
from ..net.weights import report_initialised
from ..proto import caffe_pb2
from ..solvers.base import select_device
from ..solvers.evaluation import number
from ..solvers.snapshot import load_weights
from ._engine import cpu_engine, layer_rules
from ._flags import (
    add_device_argument,
    add_state_arguments,
    device_from_flag,
    note_launcher,
    stages,
)

NAME = "test"
HELP = "score a model's TEST phase with trained weights (Caffe's `caffe test`)"

log = logging.getLogger("mgcaffe.commands.test")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="NET.prototxt", help="the net definition")
    parser.add_argument("--weights", metavar="W.caffemodel",
                        help="the trained weights (.caffemodel or .caffemodel.h5)")
    parser.add_argument("--iterations", type=int, default=50, metavar="N",
                        help="number of batches to score (default 50)")
    add_device_argument(parser)
    add_state_arguments(parser)
    threads.add_argument(parser)


def run(args) -> int:

    if not args.model:
        raise NetError("need a model definition to score: --model NET.prototxt")
    if not args.weights:
        raise NetError("need model weights to score: --weights W.caffemodel")
    if not all(s.strip() for s in args.weights.split(",")):
        raise NetError(f"--weights {args.weights!r}: an empty file name")
    if args.iterations <= 0:
        raise NetError(f"--iterations: expected > 0, found {args.iterations}")
    note_launcher(NAME)
    cpu = cpu_engine(getattr(args, "threads", None))
    device = device_from_flag(args.gpu) or CPU
    if device.kind == "gpu":
        device = select_device(caffe_pb2.SolverParameter(), device, "--gpu")
        log.info("Use GPU with device ID %d", device.index)
    else:
        log.info("Use CPU.")
    net = Net(args.model, TEST, level=args.level, stages=tuple(stages(args)), device=device,
              rules=layer_rules(), cpu=cpu)
    require_layers(net, args.model, "score")
    report_initialised(net, load_weights(net, args.weights), args.weights)
    log.info("Running for %d iterations.", args.iterations)
    totals = None
    loss = 0.0
    for i in range(args.iterations):
        net.forward()
        loss += net.loss
        values = [to_host(net.blobs[name].data).astype(np.float64).ravel()
                  for name in net.outputs]
        for name, vec in zip(net.outputs, values):
            for v in vec:
                log.info("Batch %d, %s = %s", i, name, number(v))
        totals = values if totals is None else [t + v for t, v in zip(totals, values)]
    log.info("Loss: %s", number(loss / args.iterations))
    for name, vec in zip(net.outputs, totals):
        weight = float(net.blob_loss_weights.get(name, 0.0))
        for v in vec:
            mean = v / args.iterations
            extra = f" (* {number(weight)} = {number(weight * mean)} loss)" if weight else ""
            log.info("%s = %s%s", name, number(mean), extra)
    return 0

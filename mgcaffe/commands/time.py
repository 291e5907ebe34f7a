"""`mgcaffe time`: benchmark a model layer by layer, as Caffe's `caffe time` does.

    mgcaffe time --model M.prototxt [--iterations 50] [--phase TRAIN|TEST] [--gpu ID|all]
                 [--synthetic-data [--synthetic-shape NAME=N,C,H,W ...] [--num-classes 10]]
                 [--batch-size N] [--profile-out P.json]

Logs Caffe's lines (`Average Forward pass: X ms.`, per layer `     conv1\tforward: X ms.`),
for a layer with several implementations the one it took (`     conv1\tpath: NAME (why)`),
and with --profile-out writes the per-learnable-layer profile the planner reads (see
`mgcaffe.net.profiling`). On a deploy net the backward still computes parameter gradients and
every bottom diff except the data input's. --synthetic-data replaces data layers that read
files by random data (shape rules: `mgcaffe.net.synthetic_data`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..backend import CPU
from ..cpu import parallel, threads
from ..cpu.engine import CpuEngine
from ..errors import NetError
from ..formats.outputs import check_output_path
from ..formats.protoio import atomic_write_bytes, read_net_to_build, require_layers
from ..layer_types.base import TEST, TRAIN
from ..net import Net, profiling
from ..net.synthetic_data import (
    fill_labels,
    parse_shape_override,
    synthesize_data_layers,
)
from ._engine import cpu_engine, layer_rules
from ._flags import add_device_argument, device_from_flag, note_launcher, stages

NAME = "time"
HELP = "benchmark a model's forward and backward passes, layer by layer (Caffe's `caffe time`)"

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, metavar="M.prototxt",
                        help="the net definition to time")
    parser.add_argument("--iterations", type=int, default=50, metavar="N",
                        help="number of timed forward-backward passes (default 50)")
    parser.add_argument("--phase", type=str.upper, choices=["TRAIN", "TEST"], default="TRAIN",
                        help="net phase (default TRAIN, as caffe time)")
    parser.add_argument("--level", type=int, default=0, help="net state level (default 0)")
    parser.add_argument("--stage", action="append", default=[], metavar="STAGE",
                        help="net state stage (repeat or comma-separate for several)")
    add_device_argument(parser)
    parser.add_argument("--synthetic-data", action="store_true",
                        help="replace Data/ImageData/HDF5Data/MemoryData/WindowData layers "
                             "by random data of the declared shape")
    parser.add_argument("--synthetic-shape", action="append", default=[],
                        metavar="NAME=N,C,H,W",
                        help="shape of a synthetic (or Input) top or layer, e.g. "
                             "data=64,1,28,28 (repeatable)")
    parser.add_argument("--num-classes", type=int, default=10, metavar="K",
                        help="synthetic labels are random integers in [0, K) (default 10)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="override the batch size of data and Input layers")
    parser.add_argument("--seed", type=int, default=None, help="random seed for fillers/data")
    parser.add_argument("--profile-out", metavar="P.json",
                        help="write the per-layer profile JSON the planner reads")
    parser.add_argument("--model-name", default=None,
                        help="`model` field of the profile (default: the net's name)")
    threads.add_argument(parser)


def build_net(args, cpu: CpuEngine | None = None):
    """The Net to time, with synthetic data layers when asked for; `cpu`: its CPU engine
    (None: the library default)."""

    param = read_net_to_build(args.model)
    shapes = dict(parse_shape_override(text) for text in args.synthetic_shape)
    labels = []
    if args.synthetic_data or shapes or args.batch_size:
        # Without --synthetic-data only Input layers take the shapes and batch size.
        param, labels = synthesize_data_layers(param, shapes, args.batch_size,
                                               replace_data=args.synthetic_data)
    device = device_from_flag(args.gpu) or CPU
    phase = TRAIN if args.phase == "TRAIN" else TEST
    net = Net(param, phase, level=args.level, stages=tuple(stages(args)), device=device,
              seed=args.seed, rules=layer_rules(), cpu=cpu)
    fill_labels(net, labels, args.num_classes, args.seed)
    return net


def run(args) -> int:

    if args.iterations < 1:
        raise NetError(f"--iterations must be >= 1, got {args.iterations}")
    check_output_path(args.profile_out, "--profile-out", NetError)  # written after timing
    note_launcher(NAME)
    net = build_net(args, cpu_engine(getattr(args, "threads", None)))
    require_layers(net, args.model, "time")
    log.info("Performing Forward")
    loss = net.forward_backward()  # also the warm-up pass Caffe does
    log.info("Initial loss: %g", loss)
    log.info("Performing Backward")
    # One untimed pass of every layer's backward (the pass above may run none: a deploy net
    # has no loss), so that the first calls' costs (compiled loops loaded from numba's cache,
    # buffers first touched) stay out of the timed iterations.
    warmup = 1
    if net.cpu.adaptive:
        # `--threads adaptive` times each layer call both ways in its first calls (after an
        # untimed one, TRIALS each); timing those calls would report the start-up trials,
        # not the steady state.
        # The profile passes run every layer's backward (the pass above may skip some).
        warmup = parallel.CALLS_TO_SETTLE
        log.info("Settling the adaptive thread choices: %d more warm-up passes", warmup)
    if net.device.kind == "cpu":  # how its layers run on the CPU, as the path lines say
        log.info("CPU: %s", net.cpu.describe())
    log.info("*** Benchmark begins ***")
    log.info("Testing for %d iterations.", args.iterations)
    result = profiling.profile_net(
        net, args.iterations, model=args.model_name or net.name or Path(args.model).stem,
        warmup=warmup,
        on_iteration=lambda j, s: log.info("Iteration: %d forward-backward time: %g ms.",
                                           j, s * 1e3))
    log.info("Average time per layer: ")
    for name, f, b, path in zip(result["layer_names"], result["forward"], result["backward"],
                                result["paths"]):
        log.info("%10s\tforward: %g ms.", name, f * 1e3)
        log.info("%10s\tbackward: %g ms.", name, b * 1e3)
        if path is not None:  # a layer with several implementations: the one it took
            log.info("%10s\tpath: %s", name, path)
    log.info("Average Forward pass: %g ms.", result["forward_time"] * 1e3)
    log.info("Average Backward pass: %g ms.", result["backward_time"] * 1e3)
    log.info("Average Forward-Backward: %g ms.", result["forward_backward_time"] * 1e3)
    log.info("Total Time: %g ms.", result["total_time"] * 1e3)
    log.info("*** Benchmark ends ***")
    if args.profile_out:

        text = json.dumps(result["profile"], indent=1) + "\n"
        atomic_write_bytes(args.profile_out, text.encode())
        log.info("Wrote the profile of %d learnable layers to %s",
                 len(result["profile"]["layers"]), args.profile_out)
    return 0

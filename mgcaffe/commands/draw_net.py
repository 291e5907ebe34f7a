"""`mgcaffe draw_net`: draw a network prototxt as a graph (Caffe's python/draw_net.py).

    mgcaffe draw_net NET.prototxt OUT.png [--rankdir LR|TB|BT|RL] [--phase TRAIN|TEST|ALL]
                     [--display_lrm]

The format is the output's extension. `.dot`/`.gv` write the Graphviz DOT source and need
nothing else; images (png, svg, pdf, ...) are rendered by Graphviz's `dot` program, and
the command says so in one line when it is not installed.
"""

from __future__ import annotations

import logging

from ..draw import draw_net_to_file
from ..errors import MgcaffeError
from ..formats.protoio import read_net_param
from ..proto import caffe_pb2

NAME = "draw_net"
HELP = "draw a network prototxt as a graph (DOT source, or an image through Graphviz)"

log = logging.getLogger(__name__)
_PHASES = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST, "ALL": None}


def add_arguments(parser) -> None:
    parser.add_argument("input_net_proto_file", metavar="NET.prototxt", help="the network")
    parser.add_argument("output_image_file", metavar="OUT",
                        help="output file; its extension is the format (png, svg, pdf, dot)")
    parser.add_argument("--rankdir", default="LR", choices=("LR", "TB", "BT", "RL"),
                        help="graph direction (default LR: left to right)")
    parser.add_argument("--phase", default="ALL", type=str.upper, choices=tuple(_PHASES),
                        help="draw only the layers of this phase (default ALL)")
    parser.add_argument("--display_lrm", action="store_true",
                        help="show each parameter's lr_mult and decay_mult")


def run(args) -> int:

    net = read_net_param(args.input_net_proto_file)
    try:
        draw_net_to_file(net, args.output_image_file, args.rankdir, _PHASES[args.phase],
                         args.display_lrm)
    except OSError as exc:
        raise MgcaffeError(f"{args.output_image_file}: cannot write: {exc.strerror}") from None
    log.info("Drawing net to %s", args.output_image_file)
    return 0

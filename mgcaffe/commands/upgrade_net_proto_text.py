"""`mgcaffe upgrade_net_proto_text IN OUT`: rewrite a net prototxt in the current format.

Caffe's tool: V0 and V1 `layers`, net-level inputs and old BatchNorm params are upgraded as
on load (see mgcaffe.formats.upgrade); a file already current is written out unchanged, with a log
line saying so.
"""

from __future__ import annotations

from ..formats.protoio import read_prototxt, write_prototxt
from ..proto import caffe_pb2
from ._upgrade import finish, upgrade_and_log

NAME = "upgrade_net_proto_text"
HELP = "upgrade a net prototxt to the current format (Caffe's upgrade_net_proto_text)"


def add_arguments(parser) -> None:
    parser.add_argument("input", metavar="IN", help="the net prototxt to read")
    parser.add_argument("output", metavar="OUT", help="the upgraded prototxt to write")


def run(args) -> int:
    net = read_prototxt(args.input, caffe_pb2.NetParameter())
    problems = upgrade_and_log(net, args.input)
    write_prototxt(net, args.output)
    return finish(problems, "text", args.output)

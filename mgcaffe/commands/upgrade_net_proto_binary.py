"""`mgcaffe upgrade_net_proto_binary IN OUT`: rewrite a binary net (a .caffemodel) in the
current format, weights kept (Caffe's tool; the same upgrades as on load)."""

from __future__ import annotations

from ..formats.protoio import read_message, write_message
from ..proto import caffe_pb2
from ._upgrade import finish, upgrade_and_log

NAME = "upgrade_net_proto_binary"
HELP = "upgrade a binary net / .caffemodel to the current format (Caffe's tool)"

def add_arguments(parser) -> None:
    parser.add_argument("input", metavar="IN", help="the binary NetParameter to read")
    parser.add_argument("output", metavar="OUT", help="the upgraded binary file to write")


def run(args) -> int:
    net = read_message(args.input, caffe_pb2.NetParameter())
    problems = upgrade_and_log(net, args.input)
    write_message(net, args.output)
    return finish(problems, "binary", args.output)

"""`mgcaffe upgrade_net_proto_text IN OUT`: rewrite a net prototxt in the current format.

Caffe's tool: V0 and V1 `layers`, net-level inputs and old BatchNorm params are upgraded as
on load (see mgcaffe.upgrade); a file already current is written out unchanged, with a log
line saying so.
"""

from __future__ import annotations

import logging

NAME = "upgrade_net_proto_text"
HELP = "upgrade a net prototxt to the current format (Caffe's upgrade_net_proto_text)"

log = logging.getLogger("mgcaffe.commands.upgrade")


def add_arguments(parser) -> None:
    parser.add_argument("input", metavar="IN", help="the net prototxt to read")
    parser.add_argument("output", metavar="OUT", help="the upgraded prototxt to write")


def upgrade_and_log(net, source: str):
    """Upgrade `net` in place (logging whether anything changed); returns it."""
    from ..proto import caffe_pb2  # noqa: PLC0415
    from ..upgrade import upgrade_net  # noqa: PLC0415

    before = caffe_pb2.NetParameter()
    before.CopyFrom(net)
    upgrade_net(net, source)
    if net == before:
        log.info("File already in latest proto format: %s", source)
    return net


def run(args) -> int:
    from ..proto import caffe_pb2  # noqa: PLC0415
    from ..protoio import read_prototxt, write_prototxt  # noqa: PLC0415

    net = read_prototxt(args.input, caffe_pb2.NetParameter())
    write_prototxt(upgrade_and_log(net, args.input), args.output)
    log.info("Wrote upgraded NetParameter text proto to %s", args.output)
    return 0

"""`mgcaffe upgrade_net_proto_text IN OUT`: rewrite a net prototxt in the current format.

Caffe's tool: V0 and V1 `layers`, net-level inputs and old BatchNorm params are upgraded as
on load (see mgcaffe.formats.upgrade); a file already current is written out unchanged, with a log
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


class _Problems(logging.Handler):
    """Counts the warnings the upgrade logs (a V0 field dropped, ...)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record) -> None:
        self.count += 1


def upgrade_and_log(net, source: str) -> int:
    """Upgrade `net` in place, logging whether anything changed; returns the number of
    problems the upgrade reported (Caffe's tools then write the file and exit 1)."""
    from ..formats.upgrade import upgrade_net  # noqa: PLC0415
    from ..proto import caffe_pb2  # noqa: PLC0415

    before = caffe_pb2.NetParameter()
    before.CopyFrom(net)
    problems = _Problems()
    upgrade_log = logging.getLogger("mgcaffe.formats.upgrade_v0")
    upgrade_log.addHandler(problems)
    try:
        upgrade_net(net, source)
    finally:
        upgrade_log.removeHandler(problems)
    if net == before:
        log.info("File already in latest proto format: %s", source)
    return problems.count


def finish(problems: int, kind: str, output: str) -> int:
    """Caffe's ending: the file is written either way; problems make the exit status 1.
    `kind`: "text" or "binary"."""
    if problems:
        log.error("Encountered error(s) while upgrading %s; see details above.",
                  "prototxt" if kind == "text" else "existing param")
    log.info("Wrote upgraded NetParameter %s proto to %s", kind, output)
    return 1 if problems else 0


def run(args) -> int:
    from ..formats.protoio import read_prototxt, write_prototxt  # noqa: PLC0415
    from ..proto import caffe_pb2  # noqa: PLC0415

    net = read_prototxt(args.input, caffe_pb2.NetParameter())
    problems = upgrade_and_log(net, args.input)
    write_prototxt(net, args.output)
    return finish(problems, "text", args.output)

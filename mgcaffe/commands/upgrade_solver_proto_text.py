"""`mgcaffe upgrade_solver_proto_text IN OUT`: rewrite a solver prototxt with the deprecated
`solver_type` enum replaced by the `type` string (Caffe's tool)."""

from __future__ import annotations

import logging

from ..formats.protoio import read_prototxt, write_prototxt
from ..formats.upgrade import upgrade_solver
from ..proto import caffe_pb2

NAME = "upgrade_solver_proto_text"
HELP = "upgrade a solver prototxt to the current format (Caffe's tool)"

log = logging.getLogger("mgcaffe.commands.upgrade")


def add_arguments(parser) -> None:
    parser.add_argument("input", metavar="IN", help="the solver prototxt to read")
    parser.add_argument("output", metavar="OUT", help="the upgraded prototxt to write")


def run(args) -> int:

    solver = read_prototxt(args.input, caffe_pb2.SolverParameter())
    if not solver.HasField("solver_type"):
        log.info("File already in latest proto format: %s", args.input)
    write_prototxt(upgrade_solver(solver, args.input), args.output)
    log.info("Wrote upgraded SolverParameter text proto to %s", args.output)
    return 0

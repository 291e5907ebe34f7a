"""What Caffe's two upgrade_net_proto tools share: the upgrade, logged, with its problems
counted, and their common ending (the file is written either way; problems exit 1)."""

from __future__ import annotations

import logging

from ..formats.upgrade import upgrade_net
from ..proto import caffe_pb2

log = logging.getLogger("mgcaffe.commands.upgrade")


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

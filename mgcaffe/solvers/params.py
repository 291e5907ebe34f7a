"""Reading and checking a SolverParameter: the solver file, its net paths, its field values.

Caffe checks most fields with CHECK macros when they are first used (often mid-training); we
check them all at construction so that a bad solver file fails at once with one line naming
the file and the field.
"""

from __future__ import annotations

import logging
import os

from ..errors import SolverError
from ..formats.protoio import read_solver_param
from ..formats.settings_check import check_solver_settings
from ..formats.upgrade import upgrade_solver
from ..proto import caffe_pb2
from .lr_policy import check_lr_policy

log = logging.getLogger("mgcaffe.solvers.params")

SOLVER_TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
TRAIN_NET_FIELDS = ("net", "net_param", "train_net", "train_net_param")


def load_solver_param(source) -> tuple[caffe_pb2.SolverParameter, str | None]:
    """(a private, upgraded copy of the SolverParameter, the solver file path or None).

    `source` is a path to a solver prototxt or a SolverParameter message.
    """
    if isinstance(source, caffe_pb2.SolverParameter):
        param = caffe_pb2.SolverParameter()
        param.CopyFrom(source)
        return upgrade_solver(param, "<solver>"), None
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise SolverError(f"{path}: solver file not found")

    param = read_solver_param(path)
    _default_snapshot_prefix(param, path)
    return param, path


def _default_snapshot_prefix(param, path: str) -> None:
    # Caffe (UpgradeSnapshotPrefixProperty): no prefix -> the solver file name without its
    # extension; a prefix that is a directory -> that directory / the solver file's stem.
    stem = os.path.splitext(os.path.basename(path))[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = os.path.splitext(path)[0]
        log.info("snapshot_prefix was not specified and is set to %s", param.snapshot_prefix)
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, stem)
        log.info("snapshot_prefix is a directory and is set to %s", param.snapshot_prefix)


def resolve_net_path(name: str, solver_path: str | None, field: str) -> str:
    """The file a `net:`/`train_net:`/`test_net:` entry names.

    Caffe opens it relative to the current directory; when it is not there we also try the
    solver file's directory (a solver copied with its net), and log which one was used.
    """
    source = solver_path or "<solver>"
    if os.path.isabs(name) or os.path.isfile(name):
        if os.path.isfile(name):
            return name
        raise SolverError(f"{source}: {field}: net file {name!r} not found")
    if solver_path:
        alt = os.path.join(os.path.dirname(os.path.abspath(solver_path)), name)
        if os.path.isfile(alt):
            log.info("%s: %r is not in the current directory; using %s (relative to the "
                     "solver file)", field, name, alt)
            return alt
        raise SolverError(f"{source}: {field}: net file {name!r} not found in the current "
                          f"directory {os.getcwd()} nor next to the solver file")
    raise SolverError(f"{source}: {field}: net file {name!r} not found in the current "
                      f"directory {os.getcwd()}")


def check_solver_param(p: caffe_pb2.SolverParameter, source: str = "<solver>") -> None:
    """Raise SolverError naming `source` and the field for any value Caffe would reject."""

    def bad(field, expected, found):
        raise SolverError(f"{source}: {field}: expected {expected}, found {found}")

    n_train = sum(p.HasField(f) for f in TRAIN_NET_FIELDS)
    if n_train == 0:
        raise SolverError(f"{source}: no train net: set one of {', '.join(TRAIN_NET_FIELDS)}")
    if n_train > 1:
        given = [f for f in TRAIN_NET_FIELDS if p.HasField(f)]
        raise SolverError(f"{source}: only one of {', '.join(TRAIN_NET_FIELDS)} may be set, "
                          f"found {', '.join(given)}")
    if p.type not in SOLVER_TYPES:
        bad("type", "one of " + ", ".join(SOLVER_TYPES), repr(p.type))
    if not p.HasField("base_lr"):
        raise SolverError(f"{source}: base_lr is not set")
    check_solver_settings(p, source)  # every float finite, ranges by the table
    check_lr_policy(p, source)
    for field in ("max_iter", "display", "snapshot", "test_interval", "stepsize"):
        if getattr(p, field) < 0:
            bad(field, ">= 0", getattr(p, field))
    for field in ("average_loss", "iter_size"):
        if getattr(p, field) < 1:
            bad(field, ">= 1", getattr(p, field))
    if p.regularization_type not in ("L1", "L2"):
        bad("regularization_type", '"L1" or "L2"', repr(p.regularization_type))
    if any(n <= 0 for n in p.test_iter):
        bad("test_iter", "values > 0", list(p.test_iter))
    _check_test_nets(p, source)


def _check_test_nets(p, source: str) -> None:
    n_generic = int(p.HasField("net")) + int(p.HasField("net_param"))
    n_specific = len(p.test_net) + len(p.test_net_param)
    n_iter = len(p.test_iter)
    if (n_generic and n_iter < n_specific) or (not n_generic and n_iter != n_specific):
        raise SolverError(f"{source}: test_iter must be given once per test net: "
                          f"{n_specific} test_net/test_net_param, {n_iter} test_iter")
    if p.test_state and len(p.test_state) != n_iter:
        raise SolverError(f"{source}: test_state must be unset or given once per test net "
                          f"({n_iter}), found {len(p.test_state)}")
    if n_iter and p.test_interval <= 0:
        raise SolverError(f"{source}: test_iter is set ({n_iter} test net(s)) but "
                          f"test_interval is {p.test_interval}: set test_interval > 0")

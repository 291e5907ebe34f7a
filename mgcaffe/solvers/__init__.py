"""Solvers (Caffe's update rules, lr policies, snapshots) and the pycaffe-style constructors.

`get_solver(path_or_param, **options)` builds the solver the parameter's `type` names;
`SGDSolver(path)`, `AdamSolver(path)`, ... build that type whatever the file says (pycaffe).
Options: device, rank, world_size, gradient_sync, iteration_hooks, action_function, dtype
(see `Solver`).
"""

from __future__ import annotations

from ..errors import SolverError
from .actions import SignalHandler, SolverAction
from .base import Solver
from .params import load_solver_param
from .sgd import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
)

SOLVER_CLASSES: dict[str, type[Solver]] = {
    cls.type: cls
    for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver, AdaDeltaSolver,
                AdamSolver)
}


def get_solver(source, **options) -> Solver:
    """The solver for a solver prototxt path or SolverParameter, of the type it names."""
    param, path = load_solver_param(source)
    cls = SOLVER_CLASSES.get(param.type)
    if cls is None:

        raise SolverError(f"{path or '<solver>'}: type: expected one of "
                          f"{', '.join(SOLVER_CLASSES)}, found {param.type!r}")
    return cls(param, solver_path=path, **options)


__all__ = ["get_solver", "Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver",
           "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "SOLVER_CLASSES",
           "SolverAction", "SignalHandler"]

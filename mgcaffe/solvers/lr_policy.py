"""Learning-rate policies (Caffe's SGDSolver::GetLearningRate), one function per policy.

Every policy maps (solver parameters, iteration, current_step) to (rate, current_step).
`current_step` is only changed by "step" (recomputed from the iteration) and "multistep"
(advanced by at most one stepvalue per call, as Caffe does; it is saved in the solver state
so that a resumed run continues on the same step).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import SolverError

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


def _fixed(p, it, step):
    return p.base_lr, step


def _step(p, it, step):
    step = it // p.stepsize
    return p.base_lr * math.pow(p.gamma, step), step


def _exp(p, it, step):
    return p.base_lr * math.pow(p.gamma, it), step


def _inv(p, it, step):
    return p.base_lr * math.pow(1.0 + p.gamma * it, -p.power), step


def _multistep(p, it, step):
    # One step per call, so a run that jumps past two stepvalues catches up one per iteration.
    if step < len(p.stepvalue) and it >= p.stepvalue[step]:
        step += 1
    return p.base_lr * math.pow(p.gamma, step), step


def _poly(p, it, step):
    return p.base_lr * math.pow(1.0 - it / p.max_iter, p.power), step


def _sigmoid(p, it, step):
    return p.base_lr / (1.0 + math.exp(-p.gamma * (it - p.stepsize))), step


_FUNCS = {"fixed": _fixed, "step": _step, "exp": _exp, "inv": _inv,
          "multistep": _multistep, "poly": _poly, "sigmoid": _sigmoid}


def check_lr_policy(param, source: str = "<solver>") -> None:
    """Raise SolverError when `param`'s lr_policy is unknown or lacks the fields it uses."""
    name = param.lr_policy
    if name not in _FUNCS:
        found = f"{name!r}" if name else "nothing"
        raise SolverError(f"{source}: lr_policy: expected one of {', '.join(POLICIES)}, "
                          f"found {found}")
    if name in ("step", "sigmoid") and param.stepsize <= 0:
        raise SolverError(f"{source}: lr_policy \"{name}\" needs stepsize > 0, "
                          f"found {param.stepsize}")
    if name in ("step", "exp", "inv", "multistep", "sigmoid") and param.gamma < 0:
        raise SolverError(f"{source}: lr_policy \"{name}\" needs gamma >= 0, "
                          f"found {param.gamma}")
    if name == "poly" and param.max_iter <= 0:
        raise SolverError(f"{source}: lr_policy \"poly\" needs max_iter > 0, "
                          f"found {param.max_iter}")
    if name == "multistep":
        values = list(param.stepvalue)
        if any(b <= a for a, b in zip(values, values[1:])):
            raise SolverError(f"{source}: stepvalue must increase, found {values}")


def learning_rate(param, iteration: int, current_step: int) -> tuple[float, int]:
    """(rate, new current_step) at `iteration` for `param` (a SolverParameter).

    The rate is rounded to float32, as Caffe stores it in a `Dtype`.
    """
    func = _FUNCS.get(param.lr_policy)
    if func is None:
        check_lr_policy(param)
    rate, step = func(param, int(iteration), int(current_step))
    return float(np.float32(rate)), step

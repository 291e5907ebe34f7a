"""Caffe's update arithmetic, one function per rule, in place on arrays of any backend.

Each function turns the (normalised, regularised) gradient `diff` into the value that
`Net.update()` subtracts from the weights, and updates the rule's history arrays. Arguments are
arrays of one shape and dtype (float32) from one array module; `scratch` is a same-shaped
buffer the caller owns. Scalars are Python floats, which keep float32 arrays float32 under
both numpy 2 and CuPy. The formulas follow src/caffe/solvers/*_solver.cpp step by step.
"""

from __future__ import annotations

from ..backend import get_array_module


def regularize_l2(diff, data, decay: float, scratch) -> None:
    """diff += decay * data (L2 weight decay: the gradient of decay/2 * ||w||^2)."""
    _xp(diff).multiply(data, decay, out=scratch)
    diff += scratch


def regularize_l1(diff, data, decay: float, scratch) -> None:
    """diff += decay * sign(data) (L1 weight decay; sign(0) = 0 as in caffe_cpu_sign)."""
    _xp(diff).sign(data, out=scratch)
    scratch *= decay
    diff += scratch


def sgd(diff, history, scratch, local_rate: float, momentum: float) -> None:
    """v = momentum*v + local_rate*g; update = v."""
    xp = _xp(diff)
    history *= momentum
    xp.multiply(diff, local_rate, out=scratch)
    history += scratch
    diff[...] = history


def nesterov(diff, history, scratch, local_rate: float, momentum: float) -> None:
    """v' = momentum*v + local_rate*g; update = (1+momentum)*v' - momentum*v."""
    scratch[...] = history                      # the old v, to step back from
    diff *= local_rate
    history *= momentum
    history += diff
    scratch *= -momentum
    diff[...] = history
    diff *= 1.0 + momentum
    diff += scratch


def adagrad(diff, history, scratch, local_rate: float, delta: float) -> None:
    """h += g^2; update = local_rate * g / (sqrt(h) + delta)."""
    xp = _xp(diff)
    xp.multiply(diff, diff, out=scratch)
    history += scratch
    xp.sqrt(history, out=scratch)
    scratch += delta
    diff /= scratch
    diff *= local_rate


def rmsprop(diff, history, scratch, local_rate: float, rms_decay: float,
            delta: float) -> None:
    """h = rms_decay*h + (1-rms_decay)*g^2; update = local_rate * g / (sqrt(h) + delta)."""
    xp = _xp(diff)
    xp.multiply(diff, diff, out=scratch)
    scratch *= 1.0 - rms_decay
    history *= rms_decay
    history += scratch
    xp.sqrt(history, out=scratch)
    scratch += delta
    diff /= scratch
    diff *= local_rate


def adadelta(diff, grad_history, update_history, scratch, local_rate: float,
             momentum: float, delta: float) -> None:
    """Zeiler's AdaDelta as Caffe writes it.

    g2 = m*g2 + (1-m)*g^2;  u = g * sqrt((dx2 + delta) / (g2 + delta));
    dx2 = m*dx2 + (1-m)*u^2;  update = local_rate * u.
    """
    xp = _xp(diff)
    xp.multiply(diff, diff, out=scratch)
    scratch *= 1.0 - momentum
    grad_history *= momentum
    grad_history += scratch
    # scratch = sqrt((dx2 + delta) / (g2 + delta)), built without a second buffer
    xp.add(grad_history, delta, out=scratch)
    xp.divide(update_history + delta, scratch, out=scratch)
    xp.sqrt(scratch, out=scratch)
    diff *= scratch
    xp.multiply(diff, diff, out=scratch)
    scratch *= 1.0 - momentum
    update_history *= momentum
    update_history += scratch
    diff *= local_rate


def adam(diff, m, v, scratch, local_rate: float, beta1: float, beta2: float, eps: float,
         t: int) -> None:
    """Adam with Caffe's folded bias correction; t is the 1-based step (iter + 1).

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
    update = local_rate * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps).
    """
    xp = _xp(diff)
    correction = (1.0 - beta2 ** t) ** 0.5 / (1.0 - beta1 ** t)
    m *= beta1
    xp.multiply(diff, 1.0 - beta1, out=scratch)
    m += scratch
    xp.multiply(diff, diff, out=scratch)
    scratch *= 1.0 - beta2
    v *= beta2
    v += scratch
    xp.sqrt(v, out=scratch)
    scratch += eps
    xp.divide(m, scratch, out=diff)
    diff *= local_rate * correction


def _xp(array):
    return get_array_module(array)

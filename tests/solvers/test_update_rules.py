"""Every solver type, a few iterations on the tiny net, against the update written out by hand
in float64 (per-parameter lr_mult 1/2 and decay_mult 1/0; L2 and L1 decay; clipping)."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.solvers import (
    AdaDeltaSolver,
    AdamSolver,
    NesterovSolver,
    SGDSolver,
    get_solver,
)

LR_MULT = (1.0, 2.0)
DECAY_MULT = (1.0, 0.0)


def expected_weights(tiny, w, b, hp: dict, iters: int, batch: int = 4):
    """Caffe's pipeline for `iters` iterations: clip, regularise, rule, w -= update."""
    params = [w.astype(np.float64), b.astype(np.float64)]
    h1 = [np.zeros_like(p) for p in params]
    h2 = [np.zeros_like(p) for p in params]
    kind, lr, m = hp["type"], hp["base_lr"], hp.get("momentum", 0.0)
    delta = hp.get("delta", 1e-8)
    for it in range(iters):
        start = it * batch % len(tiny.X)
        grads = list(tiny.reference_gradient(params[0], params[1], tiny.X[start:start + batch],
                                             tiny.Y[start:start + batch]))
        clip = hp.get("clip_gradients", -1)
        norm = np.sqrt(sum((g ** 2).sum() for g in grads))
        if clip >= 0 and norm > clip:
            grads = [g * clip / norm for g in grads]
        for i, p in enumerate(params):
            reg = np.sign(p) if hp.get("regularization_type") == "L1" else p
            g = grads[i] + hp.get("weight_decay", 0.0) * DECAY_MULT[i] * reg
            rate = lr * LR_MULT[i]
            if kind == "SGD":
                h1[i] = m * h1[i] + rate * g
                update = h1[i]
            elif kind == "Nesterov":
                old = h1[i]
                h1[i] = m * old + rate * g
                update = (1 + m) * h1[i] - m * old
            elif kind == "AdaGrad":
                h1[i] = h1[i] + g * g
                update = rate * g / (np.sqrt(h1[i]) + delta)
            elif kind == "RMSProp":
                d = hp["rms_decay"]
                h1[i] = d * h1[i] + (1 - d) * g * g
                update = rate * g / (np.sqrt(h1[i]) + delta)
            elif kind == "AdaDelta":
                h1[i] = m * h1[i] + (1 - m) * g * g
                u = g * np.sqrt((h2[i] + delta) / (h1[i] + delta))
                h2[i] = m * h2[i] + (1 - m) * u * u
                update = rate * u
            elif kind == "Adam":
                b2, t = hp["momentum2"], it + 1
                h1[i] = m * h1[i] + (1 - m) * g
                h2[i] = b2 * h2[i] + (1 - b2) * g * g
                correction = np.sqrt(1 - b2 ** t) / (1 - m ** t)
                update = rate * correction * h1[i] / (np.sqrt(h2[i]) + delta)
            params[i] = p - update
    return params


CASES = {
    "sgd": dict(type="SGD", base_lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-l1": dict(type="SGD", base_lr=0.1, momentum=0.9, weight_decay=0.05,
                   regularization_type="L1"),
    "sgd-clip": dict(type="SGD", base_lr=0.5, momentum=0.5, clip_gradients=0.05),
    "nesterov": dict(type="Nesterov", base_lr=0.1, momentum=0.9, weight_decay=0.01),
    "adagrad": dict(type="AdaGrad", base_lr=0.05, weight_decay=0.01),
    "rmsprop": dict(type="RMSProp", base_lr=0.01, rms_decay=0.9, delta=1e-6),
    "adadelta": dict(type="AdaDelta", base_lr=1.0, momentum=0.95, delta=1e-6,
                     weight_decay=0.01),
    "adam": dict(type="Adam", base_lr=0.05, momentum=0.9, momentum2=0.999),
}


def fields(hp: dict) -> str:
    out = ['lr_policy: "fixed"', "max_iter: 100"]
    for key, value in hp.items():
        out.append(f'{key}: "{value}"' if isinstance(value, str) else f"{key}: {value}")
    return "\n".join(out)


@pytest.mark.parametrize("case", list(CASES))
def test_rule_matches_hand_computation(tiny, case):
    hp = CASES[case]
    solver = tiny.solver(fields(hp))
    assert solver.type == hp["type"]
    w0, b0 = (np.array(blob.data) for blob in solver.net.params["ip"])
    solver.step(4)
    want_w, want_b = expected_weights(tiny, w0, b0, hp, 4)
    got_w, got_b = (blob.data for blob in solver.net.params["ip"])
    assert got_w.dtype == np.float32
    np.testing.assert_allclose(got_w, want_w, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got_b, want_b, rtol=2e-5, atol=2e-6)
    assert not np.allclose(got_w, w0, atol=1e-4)  # it did move


def test_clipping_logs(tiny, caplog):
    solver = tiny.solver(fields(CASES["sgd-clip"]))
    with caplog.at_level("INFO", logger="mgcaffe"):
        solver.step(1)
    assert any("Gradient clipping: scaling down gradients (L2 norm" in r.getMessage()
               for r in caplog.records)


def test_get_solver_dispatches_on_type(tiny):
    assert isinstance(tiny.solver(fields(CASES["adam"])), AdamSolver)
    assert isinstance(tiny.solver(fields(CASES["adadelta"])), AdaDeltaSolver)


def test_deprecated_solver_type(tiny):
    path = tiny.solver_file('lr_policy: "fixed"\nbase_lr: 0.1\nsolver_type: NESTEROV')
    assert isinstance(get_solver(path), NesterovSolver)


def test_class_constructor_overrides_type(tiny):
    # pycaffe's SGDSolver(path) builds SGD whatever the file's type says.
    solver = SGDSolver(tiny.solver_file(fields(CASES["adam"])))
    assert type(solver) is SGDSolver and solver.param.type == "SGD"

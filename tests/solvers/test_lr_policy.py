"""Every lr_policy against the formula evaluated by hand, and the bad-field errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mgcaffe.errors import SolverError
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers.lr_policy import check_lr_policy, learning_rate


def param(**fields) -> caffe_pb2.SolverParameter:
    p = caffe_pb2.SolverParameter(base_lr=0.1, max_iter=100)
    for key, value in fields.items():
        if key == "stepvalue":
            p.stepvalue.extend(value)
        else:
            setattr(p, key, value)
    return p


@pytest.mark.parametrize("fields, it, expected", [
    (dict(lr_policy="fixed"), 57, 0.1),
    (dict(lr_policy="step", gamma=0.5, stepsize=10), 25, 0.1 * 0.25),
    (dict(lr_policy="step", gamma=0.5, stepsize=10), 9, 0.1),
    (dict(lr_policy="exp", gamma=0.9), 3, 0.1 * 0.729),
    (dict(lr_policy="inv", gamma=0.01, power=0.75), 100, 0.1 * 2 ** -0.75),
    (dict(lr_policy="poly", power=2.0), 50, 0.1 * 0.25),
    (dict(lr_policy="sigmoid", gamma=0.1, stepsize=20), 30, 0.1 / (1 + math.exp(-1.0))),
    (dict(lr_policy="sigmoid", gamma=0.1, stepsize=20), 20, 0.05),
])
def test_policy_value(fields, it, expected):
    rate, _ = learning_rate(param(**fields), it, 0)
    assert rate == pytest.approx(expected, rel=1e-6)


def test_step_sets_current_step():
    assert learning_rate(param(lr_policy="step", gamma=0.5, stepsize=10), 35, 0)[1] == 3


def test_multistep_advances_one_step_per_call():
    p = param(lr_policy="multistep", gamma=0.1, stepvalue=[3, 5])
    step, rates = 0, []
    for it in range(7):
        rate, step = learning_rate(p, it, step)
        rates.append(rate)
    assert rates == pytest.approx([0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rel=1e-6)
    assert step == 2
    # Past both stepvalues at once (Caffe's quirk): only one step is taken per call.
    assert learning_rate(p, 10, 0) == (pytest.approx(0.01, rel=1e-6), 1)


def test_rate_is_float32():
    rate, _ = learning_rate(param(lr_policy="fixed", base_lr=0.1), 0, 0)
    assert rate == float(np.float32(0.1)) and rate != 0.1


@pytest.mark.parametrize("fields, words", [
    (dict(lr_policy="cosine"), "lr_policy: expected one of fixed"),
    (dict(), "found nothing"),
    (dict(lr_policy="step", gamma=0.5), "stepsize > 0"),
    (dict(lr_policy="exp", gamma=-1.0), "gamma >= 0"),
    (dict(lr_policy="multistep", gamma=0.1, stepvalue=[5, 3]), "stepvalue must increase"),
])
def test_bad_policy_fields(fields, words):
    with pytest.raises(SolverError, match=words):
        check_lr_policy(param(**fields), "s.prototxt")

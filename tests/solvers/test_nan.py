"""A non-finite loss or gradient stops training with a SolverError naming the iteration and
the layer; the last good snapshot stays intact."""

from __future__ import annotations

import numpy as np
import pytest

from mgcaffe.errors import SolverError
from mgcaffe.formats import protoio

FIELDS = """base_lr: 0.1
lr_policy: "fixed"
momentum: 0.9
max_iter: 100
snapshot: 5
"""


class At:
    """An iteration hook that runs `action(solver)` before iteration `iteration`."""

    def __init__(self, iteration, action):
        self.iteration, self.action = iteration, action

    def before_iteration(self, solver):
        if solver.iter == self.iteration:
            self.action(solver)


def poison_weights(solver):
    solver.net.params["ip"][0].data[0, 1] = np.inf


def poison_gradient(solver):
    # Parameter diffs accumulate in backward, so a NaN put there now survives it while
    # the loss stays finite.
    solver.net.params["ip"][1].diff[0] = np.nan


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in the softmax
def test_nonfinite_loss_names_iteration_and_first_layer(tiny):
    solver = tiny.solver(FIELDS, iteration_hooks=[At(7, poison_weights)])
    with pytest.raises(SolverError, match=r"iteration 7: the loss is nan .*layer 'ip', "
                                          r"top 'ip'"):
        solver.step(20)
    assert solver.iter == 7


def test_nonfinite_gradient_names_layer_and_keeps_snapshot(tiny):
    solver = tiny.solver(FIELDS, iteration_hooks=[At(8, poison_gradient)])
    with pytest.raises(SolverError, match=r"iteration 8: non-finite gradient in layer 'ip'"):
        solver.step(20)
    snapshot = tiny.dir / "solver_iter_5.caffemodel"
    assert sorted(p.name for p in tiny.dir.glob("*_iter_*")) == [
        "solver_iter_5.caffemodel", "solver_iter_5.solverstate"]
    weights = protoio.read_caffemodel(snapshot)
    for layer in weights.layer:
        for blob in layer.blobs:
            assert np.isfinite(protoio.blobproto_to_array(blob)).all()
    # The update of the bad iteration was not applied either.
    assert np.isfinite(solver.net.params["ip"][1].data).all()


def test_huge_finite_gradient_is_not_reported(tiny):
    # Squares overflow float32 but the values are finite: not an error (float64 recheck).
    def huge(solver):
        solver.net.params["ip"][1].diff[0] = 3e30

    solver = tiny.solver(FIELDS.replace("base_lr: 0.1", "base_lr: 1e-35"),
                         iteration_hooks=[At(2, huge)])
    solver.step(3)
    assert solver.iter == 3

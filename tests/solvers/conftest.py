"""A tiny real net for solver tests and a float64 reference of its gradient.

MemoryData (batch of 3-vectors) -> InnerProduct (2 outputs; weight lr_mult 1 decay_mult 1,
bias lr_mult 2 decay_mult 0, as Caffe's examples do) -> SoftmaxWithLoss.
"""

from __future__ import annotations

import numpy as np
import pytest

NET = """
name: "tiny"
layer {{ name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param {{ batch_size: {batch} channels: 3 height: 1 width: 1 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
  inner_product_param {{ num_output: 2
    weight_filler {{ type: "gaussian" std: 0.5 }}
    bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""

X = np.array([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7], [-0.2, 0.8, 0.1], [1.0, 1.0, -1.0],
              [0.0, -0.5, 0.9], [-1.2, 0.4, 0.3], [0.7, -0.9, -0.4], [0.2, 0.2, 1.1]])
Y = np.array([0, 1, 1, 0, 1, 0, 0, 1])


class Tiny:
    """Writes the tiny net and a solver file into a directory and builds solvers on them.

    Also carries the data (X, Y) and the reference gradient, since test modules cannot
    import conftest under pytest's importlib mode.
    """

    X = X
    Y = Y

    def __init__(self, directory):
        self.dir = directory

    @staticmethod
    def reference_gradient(w, b, xb, yb):
        return reference_gradient(w, b, xb, yb)

    @staticmethod
    def feed(net) -> None:
        feed(net)

    def solver_file(self, fields: str, batch: int = 4, name: str = "solver") -> str:
        net = self.dir / f"{name}_net.prototxt"
        net.write_text(NET.format(batch=batch))
        path = self.dir / f"{name}.prototxt"
        path.write_text(f'net: "{net}"\nrandom_seed: 7\nsnapshot_after_train: false\n'
                        f'snapshot_prefix: "{self.dir / name}"\n{fields}\n')
        return str(path)

    def solver(self, fields: str, batch: int = 4, name: str = "solver", **options):
        from mgcaffe.solvers import get_solver

        solver = get_solver(self.solver_file(fields, batch, name), **options)
        feed(solver.net)
        return solver


def feed(net) -> None:
    """Give the MemoryData layer the fixed 8 samples."""
    net.layers[0].set_input_arrays(X.reshape(8, 3, 1, 1).astype(np.float32),
                                   Y.astype(np.float32))


def reference_gradient(w, b, xb, yb):
    """d(mean softmax cross-entropy)/d(W, b) for logits = x W^T + b, in float64."""
    logits = xb @ w.T + b
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(yb)), yb] -= 1
    p /= len(yb)
    return p.T @ xb, p.sum(axis=0)


@pytest.fixture
def tiny(tmp_path):
    return Tiny(tmp_path)

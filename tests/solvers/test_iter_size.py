"""iter_size 2 with batch B gives the same training as batch 2B (gradient accumulation)."""

from __future__ import annotations

import numpy as np
import pytest

FIELDS = """base_lr: 0.2
lr_policy: "fixed"
momentum: 0.9
weight_decay: 0.01
max_iter: 100
type: "{type}"
"""


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_iter_size_equals_bigger_batch(tiny, kind):
    big = tiny.solver(FIELDS.format(type=kind), batch=4, name="big")
    small = tiny.solver(FIELDS.format(type=kind) + "iter_size: 2", batch=2, name="small")
    for a, b in zip(big.net.learnable_params, small.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)  # same seed, same start
    big.step(5)
    small.step(5)
    for a, b in zip(big.net.learnable_params, small.net.learnable_params):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6)

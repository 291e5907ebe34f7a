"""Per-layer updates: with a gradient sync that reduces layer by layer, each layer is updated
right before the next forward reads it, and the weights are exactly those of the update after
the barrier, for every solver type, iter_size, lr_mult/decay_mult, shared and frozen blobs."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mgcaffe.errors import SolverError
from mgcaffe.solvers import get_solver
from mgcaffe.solvers import snapshot as snap

NET = """
name: "layers"
layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 4 channels: 3 height: 1 width: 1 } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  param { name: "shared" lr_mult: 1 } param { lr_mult: 0 }
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
    bias_filler { type: "constant" value: 0.2 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
  param { name: "shared" lr_mult: 1 } param { lr_mult: 0.5 decay_mult: 3 }
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
    bias_filler { type: "constant" value: 0.3 } } }
layer { name: "ip4" type: "InnerProduct" bottom: "ip3" top: "ip4"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip4" bottom: "label" top: "loss" }
"""

X = np.random.default_rng(3).standard_normal((8, 3, 1, 1)).astype(np.float32)
Y = np.array([0, 1, 1, 0, 1, 0, 0, 1], np.float32)

TYPES = {
    "SGD": "momentum: 0.9",
    "Nesterov": "momentum: 0.9",
    "AdaGrad": "delta: 1e-6",
    "RMSProp": "rms_decay: 0.95 delta: 1e-6",
    "AdaDelta": "momentum: 0.9 delta: 1e-6",
    "Adam": "momentum: 0.9 momentum2: 0.999 delta: 1e-8",
}


class LayerSync:
    """A one-rank gradient sync that offers per-layer waits (nothing to reduce) and logs
    what the solver asks of it."""

    per_layer = True

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def on_learnable_done(self, k):
        self.calls.append(("done", k))

    def wait_layer(self, k):
        self.calls.append(("wait_layer", k))

    def wait(self):
        self.calls.append(("wait", 0))


def solver(tmp_path, kind, extra="", name="s", **options):
    net = tmp_path / f"{name}_net.prototxt"
    net.write_text(NET)
    path = tmp_path / f"{name}.prototxt"
    path.write_text(f'net: "{net}"\nbase_lr: 0.05\nlr_policy: "step"\nstepsize: 2\n'
                    f'gamma: 0.5\nweight_decay: 0.01\nmax_iter: 100\nrandom_seed: 11\n'
                    f'type: "{kind}"\n{TYPES[kind]}\nsnapshot_after_train: false\n'
                    f'snapshot_prefix: "{tmp_path / name}"\n{extra}\n')
    s = get_solver(str(path), **options)
    s.net.layers[0].set_input_arrays(X, Y)
    return s


def weights(s):
    return [b.data.copy() for b in s.net.learnable_params]


def histories(s):
    return [h.copy() for h in s.history]


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("iter_size", [1, 2])
def test_per_layer_updates_equal_the_barrier_bit_for_bit(tmp_path, kind, iter_size):
    extra = f"iter_size: {iter_size}\ndisplay: 2"
    barrier = solver(tmp_path, kind, extra, name="barrier")
    sync = LayerSync()
    layered = solver(tmp_path, kind, extra, name="layered", gradient_sync=sync)
    assert layered.per_layer_blockers() == []
    for steps in (1, 3, 2):  # step() ends with every update applied
        barrier.step(steps)
        layered.step(steps)
        for a, b in zip(weights(barrier), weights(layered)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(histories(barrier), histories(layered)):
            np.testing.assert_array_equal(a, b)
    assert ("wait", 0) not in sync.calls
    assert not layered.updates_pending


def test_each_layer_waits_only_before_its_next_forward(tmp_path):
    sync = LayerSync()
    s = solver(tmp_path, "SGD", name="order", gradient_sync=sync)
    L = len(s.net.learnable_layers)
    s.step(3)
    done = [("done", k) for k in range(L, 0, -1)]
    waits = [("wait_layer", k) for k in range(1, L + 1)]
    # backward hands every gradient over; the next iteration's forward waits layer by
    # layer, input side first, before its backward; step() finishes the last iteration's
    assert sync.calls == done + waits + done + waits + done + waits
    before = weights(s)
    s.step(1)  # the update of this iteration is applied before step() returns
    assert any(not np.array_equal(a, b) for a, b in zip(before, weights(s)))


def test_the_update_of_the_last_iteration_is_pending_until_the_next_forward(tmp_path):
    sync = LayerSync()
    s = solver(tmp_path, "SGD", name="pending", gradient_sync=sync)
    s._forward_backward()
    assert s.updates_per_layer  # this iteration's mode: per layer
    s.update_mode.current.update(sync)
    assert s.updates_pending
    owned = [i for layer in s.net.learnable_layers for i in layer.param_ids]
    before = weights(s)
    s.net.forward()  # the gate: every layer the forward reads is updated first
    assert not s.updates_pending
    after = weights(s)
    assert all(not np.array_equal(before[i], after[i]) for i in owned)


@pytest.mark.parametrize("setting, why", [
    ("clip_gradients: 10", "clip_gradients"),
    ("debug_info: true\ndisplay: 1", "debug_info"),
])
def test_settings_that_need_every_gradient_keep_the_barrier(tmp_path, caplog, setting, why):
    sync = LayerSync()
    s = solver(tmp_path, "SGD", setting, name="blocked", gradient_sync=sync)
    with caplog.at_level(logging.INFO, logger="mgcaffe.solvers"):
        s.step(3)
    assert sync.calls.count(("wait", 0)) == 3
    assert not any(c[0] == "wait_layer" for c in sync.calls)
    said = [r.getMessage() for r in caplog.records if "not layer by layer" in r.getMessage()]
    assert len(said) == 1 and why in said[0]


def test_a_gradients_ready_callback_keeps_the_barrier(tmp_path):
    sync = LayerSync()
    s = solver(tmp_path, "SGD", name="callback", gradient_sync=sync)
    seen = []
    s.add_callback(lambda: None, lambda: seen.append(s.net.learnable_params[0].diff.copy()))
    s.step(2)
    assert len(seen) == 2 and ("wait", 0) in sync.calls


def test_a_non_finite_gradient_names_its_layer_when_its_update_comes(tmp_path):
    class Poison(LayerSync):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def wait_layer(self, k):
            super().wait_layer(k)
            if k == 2:
                self.net.learnable_params[self.net.learnable_layers[1].param_ids[0]] \
                    .diff[...] = np.nan

    s = solver(tmp_path, "SGD", name="nan")
    s.gradient_sync = Poison(s.net)
    with pytest.raises(SolverError, match=r"iteration 0: non-finite gradient in layer 'ip2'"):
        s.step(2)
    assert not s.updates_pending


def test_a_snapshot_is_written_after_the_pending_updates(tmp_path):
    sync = LayerSync()
    barrier = solver(tmp_path, "Adam", "snapshot: 2", name="snapb")
    layered = solver(tmp_path, "Adam", "snapshot: 2", name="snapl", gradient_sync=sync)
    barrier.step(2)
    layered.step(2)
    a = snap.read_state(str(tmp_path / "snapb_iter_2.solverstate"))
    b = snap.read_state(str(tmp_path / "snapl_iter_2.solverstate"))
    assert len(a.history) == len(b.history) > 0
    for x, y in zip(a.history, b.history):
        np.testing.assert_array_equal(x, y)


def test_a_held_diff_array_reads_what_a_fresh_read_reads_after_per_layer_updates(tmp_path):
    # pycaffe users keep `diff = net.params[name][i].diff`; a layer's diffs cleared after
    # its update must not leave such an array with the old gradient where blob.diff reads 0
    sync = LayerSync()
    s = solver(tmp_path, "SGD", name="held", gradient_sync=sync)
    held = [b.diff for b in s.net.learnable_params]
    s.step(2)
    assert not s.updates_pending
    seen = [h.copy() for h in held]  # before any fresh read, which fills lazy zeros
    for i, blob in enumerate(s.net.learnable_params):
        np.testing.assert_array_equal(seen[i], blob.diff, err_msg=f"param {i}")

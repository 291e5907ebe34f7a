"""The loop's seams and bookkeeping: gradient_sync, iteration hooks, action requests,
average_loss, several test nets sharing the train net's weights."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mgcaffe.errors import SolverError
from mgcaffe.solvers import SolverAction

FIELDS = """base_lr: 0.1
lr_policy: "fixed"
momentum: 0.9
max_iter: 100
"""


class HalvingSync:
    """A gradient_sync that records the calls and halves the diffs in wait() (as averaging
    with a rank whose gradient is zero would)."""

    def __init__(self):
        self.calls, self.solver = [], None

    def on_learnable_done(self, k):
        self.calls.append(("done", k))

    def wait(self):
        self.calls.append("wait")
        for blob in self.solver.net.learnable_params:
            blob.diff *= 0.5


def test_gradient_sync_protocol(tiny):
    sync = HalvingSync()
    solver = tiny.solver(FIELDS + "iter_size: 2", batch=2, gradient_sync=sync)
    sync.solver = solver
    solver.step(3)
    # Only the last of the iter_size passes reports learnable layers (L = 1 here).
    assert sync.calls == [("done", 1), "wait"] * 3
    plain = tiny.solver(FIELDS.replace("0.1", "0.05") + "iter_size: 2", batch=2, name="p")
    plain.step(3)
    for a, b in zip(solver.net.learnable_params, plain.net.learnable_params):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-6, atol=1e-7)


class Recorder:
    def __init__(self, stop_after=None):
        self.events, self.stop_after = [], stop_after

    def before_iteration(self, solver):
        self.events.append(("before", solver.iter))

    def after_iteration(self, solver):
        self.events.append(("after", solver.iter))

    def should_stop(self):
        return self.stop_after is not None and self.events[-1] == ("after", self.stop_after)


def test_hooks_and_stop(tiny, caplog):
    hook = Recorder(stop_after=3)
    solver = tiny.solver(FIELDS, iteration_hooks=[hook])
    with caplog.at_level("INFO", logger="mgcaffe"):
        solver.solve()
    assert solver.iter == 3
    assert hook.events == [("before", 0), ("after", 1), ("before", 1), ("after", 2),
                           ("before", 2), ("after", 3)]
    assert "Optimization stopped early." in caplog.text


def test_a_stop_that_stays_asked_interrupts_the_test_pass_once(tiny, caplog):
    # a distributed run's hook keeps saying stop once it has (its agreement is final): the
    # test pass must end, not ask again forever
    class StoppedRun:
        def should_stop(self):
            return True

    solver = tiny.solver(FIELDS + "test_iter: 3\ntest_interval: 1",
                         iteration_hooks=[StoppedRun()])
    tiny.feed(solver.test_nets[0])
    with caplog.at_level("INFO", logger="mgcaffe"):
        solver.test(0)
    assert solver.stopped_early
    assert caplog.text.count("Test interrupted.") == 1
    assert "Test net output" not in caplog.text


def test_action_function_snapshot(tiny):
    requests = iter([SolverAction.NONE, SolverAction.SNAPSHOT])
    solver = tiny.solver(FIELDS, action_function=lambda: next(requests, SolverAction.NONE))
    solver.step(4)
    assert sorted(p.name for p in tiny.dir.glob("*_iter_*")) == [
        "solver_iter_2.caffemodel", "solver_iter_2.solverstate"]


def displayed_losses(text):
    return [float(v) for v in re.findall(r"Iteration \d+ \([^)]*\), loss = (\S+)", text)]


def test_average_loss_is_running_mean(tiny, caplog):
    with caplog.at_level("INFO", logger="mgcaffe"):
        tiny.solver(FIELDS + "display: 1", name="one").step(6)
    raw = displayed_losses(caplog.text)
    caplog.clear()
    with caplog.at_level("INFO", logger="mgcaffe"):
        tiny.solver(FIELDS + "display: 1\naverage_loss: 3", name="three").step(6)
    smoothed = displayed_losses(caplog.text)
    assert len(raw) == len(smoothed) == 6
    want = [np.mean(raw[max(0, i - 2):i + 1]) for i in range(6)]
    np.testing.assert_allclose(smoothed, want, rtol=1e-4)
    assert not np.allclose(smoothed, raw, rtol=1e-4)


def test_several_test_nets_share_weights(tiny, caplog):
    solver = tiny.solver(FIELDS + "test_iter: 2\ntest_iter: 1\ntest_interval: 2\n"
                                  "test_initialization: false\ntest_compute_loss: true\n"
                                  "test_state { stage: 'a' }\ntest_state { stage: 'b' }")
    assert len(solver.test_nets) == 2
    for net in solver.test_nets:
        tiny.feed(net)
        assert np.shares_memory(net.params["ip"][0].data, solver.net.params["ip"][0].data)
    with caplog.at_level("INFO", logger="mgcaffe"):
        solver.step(3)
    text = caplog.text
    assert "Iteration 0, Testing net" not in text
    assert "Iteration 2, Testing net (#0)" in text and "Iteration 2, Testing net (#1)" in text
    assert re.search(r"Test loss: [\d.]+", text)
    assert re.search(r"    Test net output #0: loss = ([\d.]+) \(\* 1 = \1 loss\)", text)


@pytest.mark.parametrize("extra, words", [
    ("test_iter: 2\ntest_interval: 2\ntest_state { stage: 'a' }\ntest_state { stage: 'b' }",
     "test_state must be unset or given once per test net (1), found 2"),
    ('net_param { name: "x" }', "only one of net, net_param, train_net, train_net_param"),
    ("iter_size: 0", "iter_size: expected >= 1, found 0"),
    ("average_loss: 0", "average_loss: expected >= 1"),
])
def test_bad_loop_fields(tiny, extra, words):
    with pytest.raises(SolverError, match=re.escape(words)):
        tiny.solver(FIELDS + extra)


def test_snapshot_prefix_directory_must_exist(tiny):
    path = tiny.solver_file(FIELDS)
    text = open(path).read().replace("snapshot_after_train: false", "snapshot: 10")
    text = re.sub(r'snapshot_prefix: ".*"', 'snapshot_prefix: "/nonexistent/dir/x"', text)
    open(path, "w").write(text)
    from mgcaffe.solvers import get_solver

    with pytest.raises(SolverError, match="cannot write to directory '/nonexistent/dir'"):
        get_solver(path)

"""Live training with a scheduled plan (`--comm=overlap`, `bytescheduler`, `dear`): two ranks as
threads of one process (LocalWorld). The communication thread runs the plan's parts beside the
next forward, each layer is updated right before its forward reads it; the weights after N
iterations must be exactly those of `synceasgd` (one all-reduce of everything, then Caffe's
update), for every solver type, with iter_size and lr_mult/decay_mult."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import SOLVER_TYPES, run_ranks, tiny_net
from google.protobuf import text_format

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.trainer import attach
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

pytestmark = pytest.mark.timeout(180)

# different data per rank (a gaussian filler seeded per rank)
NET = 'name: "tiny"\n' + tiny_net("""
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 2 } } }""")
TYPES = SOLVER_TYPES

FLAGS = ("comm", "merge", "bucket_mb", "profile", "network", "plan", "save_plan",
         "profile_iters", "timeline", "emulate_network", "emulate_nodes", "check_sync",
         "comm_timeout", "replan_after")


def make_solver(rank: int, size: int, kind: str, iter_size: int, extra: str = ""):
    param = caffe_pb2.SolverParameter()
    text_format.Merge(
        f'net_param {{ {NET} }} base_lr: 0.05 weight_decay: 0.001 lr_policy: "fixed" '
        f'max_iter: 100 display: 0 random_seed: {7 + rank} type: "{kind}" {TYPES[kind]} '
        f'iter_size: {iter_size} snapshot_after_train: false {extra}', param)
    return get_solver(param, rank=rank, world_size=size)


def train(tmp_path, comm: str, kind: str = "SGD", iter_size: int = 1, iters: int = 7,
          extra: str = "", **given):
    """`iters` iterations on two thread-ranks; (solvers, handles, per-layer iterations)."""
    network = tmp_path / "network.json"  # T(M) given: no start-up benchmark
    network.write_text(json.dumps({"fits": {"2": {"a": 2e-4, "b": 1e-8}}}))
    args = SimpleNamespace(**{**{f: None for f in FLAGS}, "comm": comm, "profile_iters": 2,
                              "network": str(network), "bucket_mb": 0.0001, **given})
    comms = LocalWorld(2, timeout=30).communicators()
    solvers = [make_solver(r, 2, kind, iter_size, extra) for r in range(2)]
    handles = [None, None]
    per_layer = [0, 0]  # iterations whose update waited layer by layer for the next forward

    class Count:
        def __init__(self, r):
            self.r = r

        def after_iteration(self, solver):
            per_layer[self.r] += bool(solver.updates_per_layer)

    def rank_main(r):
        with attach(solvers[r], args, comms[r]) as h:
            handles[r] = h
            solvers[r].iteration_hooks.append(Count(r))
            solvers[r].step(iters)

    _, errors = run_ranks(2, rank_main, timeout=120)
    assert errors == [None, None]
    return solvers, handles, per_layer


def weights(solver):
    return [np.array(b.data) for b in solver.net.learnable_params]


def history(solver):
    return [np.array(h) for h in getattr(solver, "history", [])]


@pytest.mark.parametrize("kind", list(TYPES))
def test_overlap_trains_exactly_as_synceasgd_for_every_solver_type(tmp_path, kind):
    reference, _, _ = train(tmp_path, "synceasgd", kind)
    solvers, handles, per_layer = train(tmp_path, "overlap", kind)
    h = handles[0]
    # the schedule really ran: its thread, per-layer updates after the profiled iterations
    assert h.plan.scheme == "overlap" and h.plan.schedule.update == "per-layer"
    assert h.executor.per_layer
    assert per_layer[0] >= 4 and per_layer == per_layer[::-1]
    for s in solvers:
        for a, b in zip(weights(s), weights(reference[0]), strict=True):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(history(s), history(reference[0]), strict=True):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(weights(solvers[0])[0],
                              weights(make_solver(0, 2, kind, 1))[0])  # it did train


@pytest.mark.parametrize("comm", ["overlap", "bytescheduler", "dear"])
def test_every_scheduled_scheme_with_iter_size_2_matches_synceasgd(tmp_path, comm):
    reference, _, _ = train(tmp_path, "synceasgd", "Adam", iter_size=2, iters=6)
    solvers, handles, per_layer = train(tmp_path, comm, "Adam", iter_size=2, iters=6)
    assert handles[0].plan.scheme == comm and per_layer[0] >= 3
    assert handles[0].plan.digest() == handles[1].plan.digest()
    for s in solvers:
        for a, b in zip(weights(s), weights(reference[0]), strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_summary_compares_the_forward_to_forward_period(tmp_path):
    _, handles, _ = train(tmp_path, "overlap", iters=8)
    summary = handles[0].summary()
    assert summary.startswith("iteration (forward start to the next forward start")
    assert "by plan overlap" in summary and "predicted" in summary


def test_a_solver_that_needs_every_gradient_falls_back_to_mgwfbp(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    reference, _, _ = train(tmp_path, "synceasgd", extra="clip_gradients: 0.01")
    solvers, handles, per_layer = train(tmp_path, "overlap", extra="clip_gradients: 0.01")
    assert handles[0].plan.scheme == "mgwfbp" and per_layer == [0, 0]
    said = [r.getMessage() for r in caplog.records if "--comm=overlap updates" in
            r.getMessage()]
    assert len(said) == 1 and "clip_gradients" in said[0]
    for a, b in zip(weights(solvers[0]), weights(reference[0]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_emulation_line_counts_the_scheduled_executor_s_own_all_reduces(tmp_path, caplog):
    """A scheduled plan all-reduces through a duplicate of the run's communicator: the closing
    EMULATION line must count that one's padded calls, not the idle original's."""
    caplog.set_level(logging.INFO)
    network = tmp_path / "emulated.json"
    network.write_text(json.dumps({"fits": {"2": {"a": 1e-3, "b": 0.0}}}))
    _, handles, _ = train(tmp_path, "overlap", iters=6, emulate_network=str(network),
                          emulate_nodes=2)
    assert handles[0].executor.per_layer
    [line] = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("EMULATION: slept")]
    calls = int(line.split(" in ")[1].split()[0])
    assert calls >= 6  # at least one padded all-reduce per iteration

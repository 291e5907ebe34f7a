"""The start-up agreement: ranks holding different settings all stop, naming the field and
the ranks; ranks that agree pass with one allgather."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from comm_fakes import run_ranks
from google.protobuf import text_format

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.agreement import agree_on_settings, describe_difference, settings_of
from mgcaffe.comm.training.options import options_from
from mgcaffe.comm.training.trainer import attach
from mgcaffe.errors import CommError
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

pytestmark = pytest.mark.timeout(120)

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 2 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc2" bottom: "label" top: "loss" }
"""


def flags(**given):
    names = ("comm", "merge", "bucket_mb", "profile", "network", "plan", "save_plan",
             "profile_iters", "timeline", "emulate_network", "emulate_nodes", "check_sync",
             "comm_timeout")
    return SimpleNamespace(**{**{f: None for f in names}, **given})


def make_solver(rank, size, batch=4):
    param = caffe_pb2.SolverParameter()
    text_format.Merge(f'net_param {{ {NET.replace("dim: 4", f"dim: {batch}")} }} '
                      'base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" max_iter: 100 '
                      'display: 0 type: "SGD" snapshot_after_train: false', param)
    param.random_seed = 7 + rank
    return get_solver(param, rank=rank, world_size=size)


def test_describe_difference_names_the_field_and_groups_the_ranks():
    same = {"solver base_lr": 0.1, "solver max_iter": 100}
    other = {"solver base_lr": 0.1, "solver max_iter": 50}
    assert describe_difference([same, same]) is None
    text = describe_difference([same, same, other, same])
    assert text == "ranks disagree on solver max_iter (ranks 0,1,3: 100; rank 2: 50)"
    # a field only one rank has is a difference too
    assert "extra" in describe_difference([same, {**same, "extra": 1}])


def test_agreeing_ranks_pass_with_one_allgather():
    comms = LocalWorld(3, timeout=10).communicators()
    calls = []
    for c in comms:
        inner = c.allgather
        c.allgather = lambda obj, inner=inner: (calls.append(1), inner(obj))[1]
    _, errors = run_ranks(3, lambda r: agree_on_settings(comms[r], {"a": 1, "b": [1, 2]}))
    assert errors == [None] * 3 and len(calls) == 3  # one allgather per rank


def test_every_rank_stops_naming_the_rank_that_differs():
    comms = LocalWorld(3, timeout=10).communicators()
    _, errors = run_ranks(3, lambda r: agree_on_settings(
        comms[r], {"solver type": "SGD" if r != 1 else "Nesterov", "batch": 8}))
    assert all(isinstance(e, CommError) for e in errors), errors
    for r, e in enumerate(errors):
        assert str(e).startswith(f"rank {r}: ranks disagree on solver type (ranks 0,2: "
                                 f"\"SGD\"; rank 1: \"Nesterov\")"), e


def _settings(**solver_fields):
    solver = make_solver(0, 1)
    for name, value in solver_fields.items():
        setattr(solver.param, name, value)
    return settings_of(solver, options_from(flags()))


def test_settings_hold_what_must_agree():
    s = _settings()
    assert s["learnable layers"] == ["fc1", "fc2"]
    assert s["parameter shapes"] == [["fc1", [[5, 6], [5]]], ["fc2", [[3, 5], [3]]]]
    assert s["solver base_lr"] == 0.1  # the float32 of the prototxt, shown as written
    assert s["solver max_iter"] == 100 and s["solver type"] == "SGD"
    # each distributed setting named as the user sets it: by its flag, once
    assert s["--comm"] == "mgwfbp" and s["whether --plan is given"] is False
    other = dict(s, **{"--comm": "wfbp"})
    assert describe_difference([s, other]) == ('ranks disagree on --comm (rank 0: "mgwfbp"; '
                                               'rank 1: "wfbp")')
    assert s["batch size of layer 'data'"] == 4
    other = settings_of(make_solver(0, 1, batch=3), options_from(flags()))
    assert describe_difference([s, other]) == ("ranks disagree on batch size of layer 'data' "
                                               "(rank 0: 4; rank 1: 3)")
    # a different rate, iteration count, clipping or snapshot interval is a difference
    for field, value in (("base_lr", 0.2), ("max_iter", 99), ("clip_gradients", 5.0),
                         ("iter_size", 2), ("snapshot", 10), ("lr_policy", "step")):
        diff = describe_difference([s, _settings(**{field: value})])
        assert diff is not None and f"solver {field}" in diff, field
    # but not the random seed (each rank may draw its own; rank 0's weights are broadcast)
    assert describe_difference([s, _settings(random_seed=99)]) is None


@pytest.mark.parametrize("field, value", [("base_lr", 0.2), ("max_iter", 7)])
def test_attach_refuses_ranks_with_different_solver_settings(field, value):
    comms = LocalWorld(2, timeout=10).communicators()
    solvers = [make_solver(r, 2) for r in range(2)]
    setattr(solvers[1].param, field, value)

    def rank_main(r):
        with attach(solvers[r], flags(comm="wfbp", profile_iters=2), comms[r]):
            solvers[r].step(2)

    _, errors = run_ranks(2, rank_main, timeout=60)
    for r, e in enumerate(errors):
        assert isinstance(e, CommError) and f"rank {r}: ranks disagree on solver {field}" \
            in str(e), e

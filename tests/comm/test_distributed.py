"""Distributed start-up and per-iteration agreements, with the real Solver on a tiny net,
two ranks as threads of one process (LocalWorld)."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import plan, run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.model.cost import CostModel
from mgcaffe.comm.model.profile import LayerProfile, Profile
from mgcaffe.comm.model.schemes import make_plan
from mgcaffe.comm.training.options import check_for_world
from mgcaffe.comm.training.trainer import (
    Options,
    agree_on_layers_and_plan,
    attach,
    benchmark_sizes,
    options_from,
)
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
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc3" type: "InnerProduct" bottom: "fc2" top: "fc3"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc3" bottom: "label" top: "loss" }
"""

FLAGS = ("comm", "merge", "bucket_mb", "profile", "network", "plan", "save_plan",
         "profile_iters", "timeline", "timeline_iters", "emulate_network", "emulate_nodes",
         "check_sync", "comm_timeout", "replan_after")


def flags(**given):
    return SimpleNamespace(**{**{f: None for f in FLAGS}, **given})


def solver_text(comm_param: str = "", max_iter: int = 100) -> str:
    return (f'net_param {{ {NET} }} base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 '
            f'lr_policy: "fixed" max_iter: {max_iter} display: 0 random_seed: {7} '
            f'type: "SGD" snapshot_after_train: false {comm_param}')


def make_solver(rank, size, comm_param=""):
    param = caffe_pb2.SolverParameter()
    from google.protobuf import text_format  # noqa: PLC0415

    text_format.Merge(solver_text(comm_param), param)
    # Different random seeds per rank: the weight broadcast must make them identical.
    param.random_seed = 7 + rank
    return get_solver(param, rank=rank, world_size=size)


def train(n, args, iters=6, comm_param="", per_rank=None, timeout=20):
    """Train `iters` iterations on n thread-ranks; returns (solvers, handles, errors)."""
    comms = LocalWorld(n, timeout=timeout).communicators()
    solvers = [make_solver(r, n, comm_param) for r in range(n)]
    handles = [None] * n

    def rank_main(r):
        a = args(r) if callable(args) else args
        with attach(solvers[r], a, comms[r]) as h:
            handles[r] = h
            if per_rank:
                per_rank(r, solvers[r])
            solvers[r].step(iters)

    _, errors = run_ranks(n, rank_main, timeout=60)
    return solvers, handles, errors


def weights(solver):
    return [np.array(b.data) for b in solver.net.learnable_params]


# ------------------------------------------------------------------ options
def test_flags_override_the_solver_comm_param():
    cp = caffe_pb2.CommParameter(comm="wfbp", merge="paper", bucket_mb=4, profile_iters=9,
                                 timeout=30, network="net.json")
    o = options_from(flags(comm="threshold", comm_timeout=5.0), cp, "s.prototxt")
    assert (o.comm, o.bucket_mb, o.profile_iters, o.timeout, o.network) == \
        ("threshold", 4.0, 9, 5.0, "net.json")
    assert o.scheme == "threshold"
    assert o.origin["comm"] == "--comm" and o.origin["bucket_mb"] == "s.prototxt: " \
        "comm_param.bucket_mb"
    # the file's old merge meant nothing beside another scheme: said, not an error
    assert o.notes == ["s.prototxt: comm_param.merge 'paper' is ignored with --comm "
                       "'threshold' (and deprecated: the scheme is comm alone); remove it"]


def test_defaults_and_the_old_merge_spelling():
    o = options_from(flags())
    assert (o.comm, o.scheme, o.timeout, o.profile_iters, o.notes) == \
        ("mgwfbp", "mgwfbp", 120.0, 5, [])
    o = options_from(flags(merge="paper"))
    assert o.comm == o.scheme == "mgwfbp-paper"
    assert o.notes == ["--merge paper is deprecated: use --comm=mgwfbp-paper"]
    o = options_from(flags(comm="mgwfbp", merge="optimal"))
    assert o.comm == "mgwfbp" and o.notes == ["--merge optimal is deprecated: use "
                                              "--comm=mgwfbp (the default)"]
    o = options_from(flags(), caffe_pb2.CommParameter(merge="paper"), "s.prototxt")
    assert o.comm == "mgwfbp-paper" and o.notes == [
        's.prototxt: comm_param.merge paper is deprecated: write comm: "mgwfbp-paper" instead']
    with pytest.raises(CommError, match="--merge paper goes with --comm=mgwfbp only, but "
                                        "--comm is 'wfbp'; leave --merge out"):
        options_from(flags(comm="wfbp", merge="paper"))
    defaults = caffe_pb2.CommParameter()  # the proto's defaults agree with Options'
    assert options_from(flags(), defaults) == Options()


@pytest.mark.parametrize("given, message", [
    (dict(comm="ring"), "--comm: expected one of wfbp, synceasgd, mgwfbp, mgwfbp-paper, "
                        "threshold, overlap, bytescheduler, dear, got 'ring'"),
    (dict(merge="greedy"), "--merge: expected one of optimal, paper"),
    (dict(bucket_mb=0.0), "--bucket-mb: must be > 0"),
    (dict(emulate_nodes=8), "--emulate-network and --emulate-nodes go together"),
    (dict(comm_timeout=-1.0), "--comm-timeout: must be > 0"),
    (dict(profile_iters=1), "--profile-iters: must be >= 2"),
    (dict(comm_backend="ucx"), "--comm-backend: expected one of auto, mpi, nccl"),
    (dict(comm_backend="nccl", emulate_network="n.json", emulate_nodes=8),
     "--emulate-network works with the MPI backend only"),
])
def test_invalid_options(given, message):
    with pytest.raises(CommError, match=message):
        options_from(flags(**given))


@pytest.mark.parametrize("field, value, message", [
    ("comm", "mgwbfp", "s.prototxt: comm_param.comm: expected one of wfbp, synceasgd, "
                       "mgwfbp, mgwfbp-paper, threshold, overlap, bytescheduler, dear, got "
                       "'mgwbfp'; did you mean 'mgwfbp'?"),
    ("merge", "greedy", "s.prototxt: comm_param.merge: expected one of optimal, paper, got "
                        "'greedy'"),
    ("bucket_mb", -1.0, "s.prototxt: comm_param.bucket_mb: must be > 0 MiB, got -1"),
    ("profile_iters", 1, "s.prototxt: comm_param.profile_iters: must be >= 2"),
    ("timeout", 0.0, "s.prototxt: comm_param.timeout: must be > 0 seconds, got 0"),
])
def test_comm_param_errors_name_the_solver_field(field, value, message):
    """A bad value in the solver file is blamed on the solver field, not on a flag nobody
    gave; the flag, when given, is named instead."""
    cp = caffe_pb2.CommParameter(**{field: value})
    with pytest.raises(CommError) as info:
        options_from(flags(), cp, "s.prototxt")
    assert str(info.value).startswith(message)
    assert "--" not in str(info.value).split(":")[1]


def test_a_saved_plan_decides_the_scheme_and_contradictions_are_refused(tmp_path):
    profile = Profile("tiny", 1, 4, 0.01, (LayerProfile("fc1", 35, 0.004),
                                           LayerProfile("fc2", 24, 0.001)))
    path = tmp_path / "p8.json"
    make_plan(profile, CostModel(1e-3, 1e-9, nodes=8), "wfbp", nodes=8).save(path)
    # --comm left out: the plan's scheme is what trains
    assert options_from(flags(plan=str(path))).scheme == "wfbp"
    assert options_from(flags(plan=str(path), comm="wfbp")).scheme == "wfbp"
    with pytest.raises(CommError, match=rf"--plan {path}: holds a wfbp plan, but --comm is "
                                        r"mgwfbp: the plan's groups would train, not mgwfbp's; "
                                        r"leave --comm out to train the plan, or leave --plan "
                                        r"out to plan mgwfbp"):
        options_from(flags(plan=str(path), comm="mgwfbp"))
    # a plan made for 8 nodes on 2 ranks: said once, with the remedy
    o = options_from(flags(plan=str(path)))
    assert check_for_world(o, 8) == []
    [note] = check_for_world(o, 2)
    assert note.startswith(f"--plan {path} was made for 8 nodes, this run has 2: ")
    assert "mgcaffe plan ... --nodes 2" in note
    o = options_from(flags(plan=str(path), emulate_network="n.json", emulate_nodes=8))
    assert check_for_world(o, 2) == []  # emulating the 8 it was made for


def test_a_saved_plan_whose_formats_compress_does_not_offer_is_said_once(tmp_path):
    profile = Profile("tiny", 1, 4, 0.01, (LayerProfile("fc1", 35_000_000, 0.004),
                                           LayerProfile("fc2", 24_000_000, 0.001)))
    path = tmp_path / "half.json"
    cost = CostModel(1e-3, 1e-8, nodes=2, wires=("float16",), cast=(("float16", 1e-11),))
    plan = make_plan(profile, cost, "wfbp", nodes=2)
    assert set(plan.formats) == {"float16"}  # the premise: a plan that compresses
    plan.save(path)
    [note] = check_for_world(options_from(flags(plan=str(path))), 2)
    assert note == (f"--plan {path} sends 2 of 2 messages as float16, which --compress none "
                    f"does not offer; the plan's formats travel as saved (give --compress "
                    f"auto, or plan again)")
    for compress in ("fp16", "auto"):
        assert check_for_world(options_from(flags(plan=str(path), compress=compress)), 2) == []
    [note] = check_for_world(options_from(flags(plan=str(path), compress="bf16")), 2)
    assert "as float16, which --compress bf16 does not offer" in note


def test_one_process_save_plan_needs_a_network_to_plan_for():
    with pytest.raises(CommError, match=r"--save-plan p.json: one process has no all-reduce "
                                        r"to plan for \(the plan would say a = b = 0\)"):
        check_for_world(options_from(flags(save_plan="p.json")), 1)
    assert check_for_world(options_from(flags(save_plan="p.json")), 2) == []
    emulated = flags(save_plan="p.json", emulate_network="n.json", emulate_nodes=8)
    assert check_for_world(options_from(emulated), 1) == []


def test_benchmark_sizes_cover_the_gradient():
    sizes = benchmark_sizes(10 << 20)
    assert sizes[0] == 4 and sizes[-1] == 10 << 20 and sizes == sorted(sizes)
    assert benchmark_sizes(100)[-1] == 1 << 20 and benchmark_sizes(1 << 30)[-1] == 64 << 20


# ------------------------------------------------------------------ agreement
def test_layer_and_plan_agreement_names_the_rank_that_differs():
    comms = LocalWorld(3, timeout=10).communicators()
    names = ["conv1", "fc1", "fc2"]
    plans = [plan(["fc2", "fc1", "conv1"])] * 2 + [plan(["fc2"], ["fc1", "conv1"])]

    def rank_main(r):
        agree_on_layers_and_plan(comms[r], names, [10, 20, 30], plans[r])

    _, errors = run_ranks(3, rank_main)
    assert all(isinstance(e, CommError) for e in errors)
    assert all("ranks disagree: rank 2 holds plan" in str(e) for e in errors)


def test_a_plan_switch_at_different_iterations_stops_every_rank():
    comms = LocalWorld(2, timeout=10).communicators()
    names = ["conv1", "fc1"]

    def rank_main(r):
        agree_on_layers_and_plan(comms[r], names, [1, 2], plan(["fc1", "conv1"]), 60 + r)

    _, errors = run_ranks(2, rank_main)
    assert all(isinstance(e, CommError) for e in errors)
    assert all("rank 1 switches to plan" in str(e) and "at iteration 61 but rank 0 at "
               "iteration 60" in str(e) for e in errors)


def test_layer_agreement_reports_a_different_net():
    comms = LocalWorld(2, timeout=10).communicators()
    nets = [["conv1", "fc1"], ["conv1", "fc9"]]

    def rank_main(r):
        agree_on_layers_and_plan(comms[r], nets[r], [1, 2], plan(list(reversed(nets[r]))))

    _, errors = run_ranks(2, rank_main)
    assert all("rank 1's learnable layers differ from rank 0's (position 1: 'fc9' vs 'fc1')"
               in str(e) for e in errors)


# ------------------------------------------------------------------ training on thread-ranks
@pytest.mark.parametrize("comm", ["wfbp", "synceasgd", "mgwfbp", "threshold"])
def test_ranks_start_and_stay_identical(comm):
    solvers, handles, errors = train(2, flags(comm=comm, profile_iters=3, bucket_mb=0.0001),
                                     iters=6)
    assert errors == [None, None]
    for a, b in zip(weights(solvers[0]), weights(solvers[1])):
        assert np.array_equal(a, b)
    # profiling ran on the first iterations; then each rank switched to the same plan
    assert handles[0].plan is not None and handles[0].plan.digest() == handles[1].plan.digest()
    assert [list(g) for g in handles[0].plan.groups] == handles[0].executor.groups
    assert handles[0].plan.scheme == comm  # the --comm value, also in the plan
    assert len(handles[0].grad_times) == 6 - 3  # timed after the plan was in place
    assert "predicted" in handles[0].summary()
    assert solvers[0].gradient_sync is None  # close() unhooked it


def test_replan_after_warm_up_plans_from_the_later_iterations_once_on_every_rank(tmp_path):
    # fc2's backward sleeps DELAY in iterations 0..SLOW_UNTIL-1: longer than the start-up
    # profile can extend (profile_iters 2: at most 8 iterations), so without the re-plan the
    # plan is made from slow iterations only.
    delay, slow_until, profile_iters, replan_after, iters = 0.03, 10, 2, 4, 16
    network = tmp_path / "n.json"
    network.write_text(json.dumps({"fits": {"2": {"a": 1e-4, "b": 1e-9}}}))

    messages = [[], []]  # per rank, per iteration: the all-reduces the executor had planned

    class Messages:
        def __init__(self, r, handle):
            self.r, self.handle = r, handle

        def gradients_ready(self, solver):
            messages[self.r].append(len(self.handle.executor.groups))

    def slow_at_first(r, solver):
        solver.iteration_hooks.append(Messages(r, solver.gradient_sync))
        layer = solver.net.layers[solver.net.layer_names.index("fc2")]
        backward = layer.backward

        def slow(*args, **kwargs):
            if solver.iter < slow_until:
                time.sleep(delay)
            return backward(*args, **kwargs)

        layer.backward = slow

    def fc2_time(handle):
        return next(layer["backward_time"] for layer in handle.profile_dict["layers"]
                    if layer["name"] == "fc2")

    def run(replan):
        return train(2, flags(comm="wfbp", profile_iters=profile_iters, network=str(network),
                              replan_after=replan), iters=iters, per_rank=slow_at_first)

    _, handles, errors = run(0)  # never re-planned: the start-up profile is the slow one
    assert errors == [None, None]
    assert [it for it, _ in handles[0].replanner.plan_switches] == [profile_iters]
    assert fc2_time(handles[0]) >= delay

    messages[0].clear()
    messages[1].clear()
    solvers, handles, errors = run(replan_after)
    assert errors == [None, None]
    # start-up plan after profile_iters iterations; the re-plan's profile starts replan_after
    # iterations later and lasts 4 x profile_iters; both ranks switch at the same iterations
    replan_at = profile_iters + replan_after + 4 * profile_iters
    assert [it for it, _ in handles[0].replanner.plan_switches] == [profile_iters, replan_at]
    assert handles[0].replanner.plan_switches == handles[1].replanner.plan_switches
    # the trainer gave the re-planner the start-up plan's warm-up as it measured it (each
    # slowed by fc2's delay): the re-plan check and the in-situ model's validation are judged
    # against these. A period ends at the next forward start, so at the re-plan the periods
    # known are one iteration behind the gradient times: of warm-up iterations 2..5 the
    # periods hold 2..4, the gradient times 3..5 (the first after the switch warms).
    r = handles[0].replanner
    assert len(r.warmup_periods) == len(r.warmup_measured) == replan_after - 1
    same_iterations = zip(r.warmup_measured[:-1], r.warmup_periods[1:])  # iterations 3, 4
    assert all(delay <= g <= p for g, p in same_iterations)
    assert min(r.warmup_periods) >= delay
    # the re-plan's profile: the median of iterations replan_at-7..replan_at-1, 3 slow of 7
    assert fc2_time(handles[0]) < delay / 2
    assert handles[0].replanner.startup_prediction >= delay > 2 * handles[0].plan.iteration_time
    assert [list(g) for g in handles[1].plan.groups] == handles[1].executor.groups
    assert len(handles[0].grad_times) == iters - replan_at  # measured against the re-plan
    # predicted: the median of the plan's timeline over the profiled iterations
    assert (f"predicted {handles[0].replanner.median_prediction * 1e3:.2f} ms by plan wfbp"
            in handles[0].summary())
    # no interference in the model: the re-plan's profile ran under the start-up plan (wfbp,
    # one message per layer) from the start-up plan's switch on
    assert messages[0] == messages[1] == [1] * profile_iters + [3] * (iters - profile_iters)
    for a, b in zip(weights(solvers[0]), weights(solvers[1])):
        assert np.array_equal(a, b)


def test_a_stop_request_on_one_rank_stops_every_rank_at_the_same_iteration():
    def per_rank(r, solver):
        if r == 1:  # as if SIGINT reached rank 1 during iteration 3
            solver.action_function = lambda: "stop" if solver.iter == 3 else "none"

    solvers, _, errors = train(2, flags(comm="wfbp", profile_iters=2), iters=10,
                               per_rank=per_rank)
    assert errors == [None, None]
    assert [s.iter for s in solvers] == [3, 3]


def test_check_sync_stops_every_rank_when_weights_diverge():
    class Corrupt:
        def after_iteration(self, solver):
            if solver.iter == 3:
                solver.net.learnable_params[0].data[0, 0] += 1.0

    def per_rank(r, solver):
        if r == 1:
            solver.iteration_hooks.insert(0, Corrupt())

    _, _, errors = train(2, flags(comm="wfbp", profile_iters=2, check_sync=2), iters=6,
                         per_rank=per_rank)
    assert all(isinstance(e, CommError) for e in errors)
    assert all("weights diverged at iteration 4: rank(s) [1] differ from rank 0" in str(e)
               for e in errors)


def test_plan_from_a_profile_is_saved_and_followed(tmp_path):
    profile = {"model": "tiny", "forward_time": 0.01, "layers": [
        {"name": "fc1", "params": 35, "backward_time": 0.004},
        {"name": "fc2", "params": 24, "backward_time": 0.001},
        {"name": "fc3", "params": 15, "backward_time": 0.001}]}
    network = {"fits": {"2": {"a": 0.002, "b": 1e-9}}}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    (tmp_path / "n.json").write_text(json.dumps(network))
    args = flags(profile=str(tmp_path / "p.json"), network=str(tmp_path / "n.json"),
                 save_plan=str(tmp_path / "plan.json"))
    solvers, handles, errors = train(2, args, iters=3)
    assert errors == [None, None]
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["scheme"] == "mgwfbp" and saved["a"] == 0.002
    assert handles[1].executor.groups == saved["groups"]
    assert handles[0].replanner.profiler is None  # no profiling with a profile given
    # the saved plan is reusable: both ranks read it, nothing is planned
    solvers, handles, errors = train(2, flags(plan=str(tmp_path / "plan.json")), iters=2)
    assert errors == [None, None] and handles[0].plan.digest() == saved["digest"]


def test_different_plans_on_two_ranks_stop_both(tmp_path):
    profile = {"model": "tiny", "forward_time": 0.01, "layers": [
        {"name": n, "params": p, "backward_time": 0.001}
        for n, p in (("fc1", 35), ("fc2", 24), ("fc3", 15))]}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    (tmp_path / "n.json").write_text(json.dumps({"fits": {"1": {"a": 1e-3, "b": 1e-9}}}))
    for comm in ("wfbp", "synceasgd"):
        _, handles, errors = train(1, flags(comm=comm, profile=str(tmp_path / "p.json"),
                                            network=str(tmp_path / "n.json"),
                                            save_plan=str(tmp_path / f"{comm}.json")), iters=1)
        assert errors == [None]

    def args(r):
        return flags(plan=str(tmp_path / ("wfbp.json" if r == 0 else "synceasgd.json")))

    _, _, errors = train(2, args, iters=1)
    assert all(isinstance(e, CommError) and "rank 1 holds plan" in str(e) for e in errors)


def test_a_plan_for_another_net_is_refused(tmp_path):
    other = {"model": "x", "forward_time": 0.01, "layers": [
        {"name": n, "params": 10, "backward_time": 0.001} for n in ("fc1", "fcX", "fc3")]}
    (tmp_path / "p.json").write_text(json.dumps(other))
    _, _, errors = train(1, flags(profile=str(tmp_path / "p.json")), iters=1)
    assert isinstance(errors[0], CommError)
    assert "'fcX' in the plan but 'fc2' in the net" in str(errors[0])


def test_single_rank_with_emulation_slows_each_allreduce(tmp_path):
    (tmp_path / "n.json").write_text(json.dumps({"fits": {"8": {"a": 0.02, "b": 0.0}}}))
    args = flags(comm="wfbp", emulate_network=str(tmp_path / "n.json"), emulate_nodes=8,
                 profile_iters=2)
    _, handles, errors = train(1, args, iters=4)
    assert errors == [None]
    h = handles[0]
    # profiling (2 iterations): one all-reduce after backward; then wfbp: one per layer
    assert h.comm.calls == 2 * 1 + 2 * 3
    assert h.plan.a == 0.02 and min(h.grad_times) >= 3 * 0.02 * 0.9


def test_rank_0_testing_longer_than_the_comm_timeout_is_not_a_fault():
    """Only rank 0 tests; the others wait at a barrier while rank 0's heartbeats say it is
    busy, longer than the (short) communication timeout."""
    import time  # noqa: PLC0415

    tested = []

    def per_rank(r, solver):
        solver.param.test_interval = 2
        if r == 0:
            solver.test_all = lambda: (tested.append(solver.iter), time.sleep(1.2))

    solvers, _, errors = train(2, flags(comm="wfbp", profile_iters=2, comm_timeout=0.5),
                               iters=5, per_rank=per_rank)
    assert errors == [None, None]
    assert tested == [0, 2, 4] and [s.iter for s in solvers] == [5, 5]


def test_nccl_backend_needs_a_gpu_solver():
    _, _, errors = train(1, flags(comm_backend="nccl"), iters=1)
    assert isinstance(errors[0], CommError)
    assert "--comm-backend nccl needs the solver on a GPU" in str(errors[0])


def test_auto_backend_on_the_cpu_uses_the_host_path():
    _, handles, errors = train(2, flags(comm="wfbp", profile_iters=2), iters=3)
    assert errors == [None, None]
    assert handles[0].executor.mode == "host" and handles[0].comm is not None


def test_a_plan_whose_layer_sizes_differ_from_the_net_is_refused(tmp_path):
    # same layer names as the net (fc1 has 5x7 weights + 5... = 35 parameters), other sizes
    wrong = {"model": "tiny", "forward_time": 0.01, "layers": [
        {"name": n, "params": p, "backward_time": 0.001}
        for n, p in (("fc1", 99), ("fc2", 24), ("fc3", 15))]}
    (tmp_path / "p.json").write_text(json.dumps(wrong))
    (tmp_path / "n.json").write_text(json.dumps({"fits": {"1": {"a": 1e-3, "b": 1e-9}}}))
    _, _, errors = train(1, flags(profile=str(tmp_path / "p.json"),
                                  network=str(tmp_path / "n.json"),
                                  save_plan=str(tmp_path / "plan.json")), iters=1)
    assert errors == [None]
    _, _, errors = train(1, flags(plan=str(tmp_path / "plan.json")), iters=1)
    assert isinstance(errors[0], CommError)
    assert "layer 'fc1' has 396 bytes of parameters in the plan but 140 in the net" \
        in str(errors[0])


def test_info_holds_one_line_summaries_and_details_go_to_the_verbose_level(tmp_path):
    """A run that profiles, plans, re-plans and traces: every INFO line is one short line
    (the plan, the re-plan, the closing line), the profile and the plan's groups come at
    the verbose level only, and the trace keeps the window asked for."""
    network = tmp_path / "net.json"
    network.write_text(json.dumps({"fits": {"2": {"a": 0.002, "b": 1e-9}}}))
    trace = tmp_path / "t.json"
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = logging.getLogger("mgcaffe")
    handler, level = Keep(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        _, handles, errors = train(2, flags(comm="mgwfbp", profile_iters=3, replan_after=2,
                                            network=str(network), timeline=str(trace),
                                            timeline_iters="10:13"), iters=20)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert errors == [None, None]
    info = [r.getMessage() for r in records if r.levelno >= logging.INFO
            and r.name == "mgcaffe.comm"]
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    assert info and all("\n" not in line and len(line) <= 300 for line in info), info
    assert [line for line in info if line.startswith("Plan mgwfbp (")] == [
        line for line in info if "all-reduce" in line and "predicted" in line
        and line.startswith("Plan ")]
    assert sum(line.startswith("Plan mgwfbp (") for line in info) == 2  # start-up, re-plan
    assert any(line.startswith("Distributed training: 2 ranks on 1 host") and
               line.endswith("--comm=mgwfbp") for line in info)
    assert any(line.startswith("profile (") for line in debug)  # the profile: verbose only
    assert not any(line.startswith("profile (") for line in info)
    assert any("  group 0: " in line for line in debug)
    assert any(line.startswith("iteration (forward start to reduced gradients): measured")
               for line in info)
    assert any(line.endswith(f"(iterations 10..12) to {trace}") for line in info)
    doc = json.loads(trace.read_text())
    assert {e["args"]["iter"] for e in doc["traceEvents"] if "args" in e and "iter" in
            e["args"]} == {10, 11, 12}
    assert doc["metadata"]["traced"] == "iterations 10..12"
    assert handles[0].plan.scheme == "mgwfbp"


def test_timeline_iters_needs_a_timeline_and_a_window():
    with pytest.raises(CommError, match="--timeline-iters: give --timeline TRACE.json too"):
        options_from(flags(timeline_iters="0:10"))
    with pytest.raises(CommError, match="--timeline-iters: expected A:B"):
        options_from(flags(timeline="t.json", timeline_iters="ten"))
    assert options_from(flags(timeline="t.json")).trace_window.last == 100

"""rho measured in situ during the re-plan window (mgcaffe.comm.training.insitu and the trainer)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import run_ranks
from google.protobuf import text_format

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.insitu import (
    K_MAX,
    calibrate,
    estimate,
    estimate_comm,
    last_arrivals,
    layer_overlaps,
)
from mgcaffe.comm.training.trainer import attach
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

pytestmark = pytest.mark.timeout(120)


def test_layer_overlaps_by_hand():
    # forward ends at 1; gradients: layer 2 at 3, layer 1 at 6. Messages: [2, 4) of 100 B,
    # [5, 9) of 200 B. Layer 2 runs [1, 3): 1 s of the first; layer 1 [3, 6): 1 s of each.
    rows = layer_overlaps(1.0, {2: 3.0, 1: 6.0}, [(2.0, 4.0, 100), (5.0, 9.0, 200)], 2)
    assert rows == [(3.0, [(100, 1.0), (200, 1.0)]), (2.0, [(100, 1.0)])]


def test_one_rho_recovered_from_a_known_slowdown():
    # rho = 1: in flight, backward does half its work; layer times 1 and 2 s undisturbed.
    # Overlapped: layer 2 (index 1) has a message in flight for b s, so it takes 2 + b/2.
    undisturbed = [[1.0, 2.0]] * 3
    overlapped = [[(1.0, []), (2.0 + b / 2, [(65536, b)])] for b in (0.4, 0.8, 1.2)]
    est = estimate(undisturbed, overlapped, [65536, 1 << 20])
    assert est.single == pytest.approx(1.0)
    assert est.one  # one class measured: one rho
    assert est.points == ((65536, pytest.approx(1.0)), (1 << 20, pytest.approx(1.0)))
    assert est.overlapped_iterations == 3 and est.busy_seconds == pytest.approx(2.4)
    assert est.whole == pytest.approx(1.0)  # every layer slowed only while in flight


def test_rho_per_size_when_one_number_does_not_fit():
    # small messages slow backward by +25% (x = 0.2), large ones by +300% (x = 0.75), in
    # each of 6 iterations with a little noise: one rho cannot fit both
    rng = np.random.default_rng(3)
    undisturbed = [[1.0, 1.0, 1.0]] * 5
    overlapped = []
    for _ in range(6):
        s, big = rng.uniform(0.3, 0.6), rng.uniform(0.3, 0.6)
        overlapped.append([(1.0 + 0.75 * big + rng.normal(0, 0.005), [(16 << 20, big)]),
                           (1.0 + 0.2 * s + rng.normal(0, 0.005), [(65536, s)]),
                           (1.0, [])])
    est = estimate(undisturbed, overlapped, [65536, 16 << 20])
    assert not est.one
    got = dict(est.points)
    assert got[65536] == pytest.approx(0.25, abs=0.05)
    assert got[16 << 20] == pytest.approx(3.0, rel=0.15)


def test_nothing_in_flight_gives_no_estimate():
    assert estimate([[1.0]], [[(1.0, [])]], [4]) is None
    assert estimate([[1.0]], [], [4]) is None


def test_one_sigma_recovered_from_known_message_times():
    # sigma = 1.5: a message progresses at 2/3 while backward runs, so one that overlaps
    # backward for o seconds takes T + o / 3; those sent after backward take T exactly
    its = [[(65536, 0.002 + o / 3, o, 0.002), (1 << 20, 0.010, 0.0, 0.010)]
           for o in (0.003, 0.006, 0.009)]
    est = estimate_comm(its, [65536, 1 << 20])
    assert est.single == pytest.approx(1.5) and est.one
    assert est.points == ((65536, pytest.approx(1.5)), (1 << 20, pytest.approx(1.5)))
    assert est.messages == 3 and est.overlap_seconds == pytest.approx(0.018)
    assert est.after == pytest.approx(1.0)
    assert "x1.50 for one sigma" in est.describe()


def test_sigma_per_size_when_one_number_does_not_fit():
    # small messages x1.1 (z = 1/11), large ones x2 (z = 1/2), with a little noise
    rng = np.random.default_rng(4)
    its = []
    for _ in range(6):
        o1, o2 = rng.uniform(0.002, 0.004), rng.uniform(0.01, 0.02)
        its.append([(65536, 0.001 + o1 / 11 + rng.normal(0, 1e-5), o1, 0.001),
                    (16 << 20, 0.05 + o2 / 2 + rng.normal(0, 1e-5), o2, 0.05)])
    est = estimate_comm(its, [65536, 16 << 20])
    assert not est.one
    got = dict(est.points)
    assert got[65536] == pytest.approx(1.1, rel=0.03)
    assert got[16 << 20] == pytest.approx(2.0, rel=0.03)


def test_no_message_during_backward_gives_no_sigma():
    assert estimate_comm([[(4, 0.1, 0.0, 0.1)]], [4]) is None
    assert estimate_comm([], [4]) is None
    # faster than modelled is not a speed-up: sigma stays >= 1
    assert estimate_comm([[(4, 0.05, 0.1, 0.1)]], [4]).single == 1.0


NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 2 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc3" type: "InnerProduct" bottom: "fc2" top: "fc3"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc3" bottom: "label" top: "loss" }
"""


def make_solver(rank, size):
    param = caffe_pb2.SolverParameter()
    text_format.Merge(f'net_param {{ {NET} }} base_lr: 0.01 lr_policy: "fixed" max_iter: 100 '
                      f'display: 0 random_seed: 7 type: "SGD" snapshot_after_train: false',
                      param)
    return get_solver(param, rank=rank, world_size=size)


@pytest.mark.slow
@pytest.mark.parametrize("comm", ["wfbp", "threshold"])
def test_trainer_measures_a_known_slowdown_in_situ_on_every_rank(tmp_path, comm):
    # Each fc layer's backward does WORK seconds of "work" that advances at 1/(1 + RHO) of
    # its speed while this rank's communication thread is inside an all-reduce; each
    # all-reduce lasts A seconds (emulated). The start-up "probe" (the network file) says
    # +5%; the re-plan window must measure RHO. With `threshold` (a 100 B bucket: fc3+fc2,
    # then fc1) the window's overlapped iterations alternate WFBP and the plan's 2 groups.
    # Each all-reduce needs A seconds of progress, made at 1/SIGMA while this rank's fc
    # layers compute backward: the window must measure SIGMA too.
    RHO, SIGMA, WORK, A = 1.0, 2.0, 0.010, 0.008
    profile_iters, replan_after, iters = 2, 2, 14
    network, emulated = tmp_path / "net.json", tmp_path / "emulated.json"
    network.write_text(json.dumps({"fits": {"2": {"a": A, "b": 1e-9,
                                                  "interference": [[64, 0.05]]}}}))
    emulated.write_text(json.dumps({"fits": {"2": {"a": A, "b": 0.0}}}))
    comms = LocalWorld(2, timeout=20).communicators()
    solvers = [make_solver(r, 2) for r in range(2)]
    handles = [None, None]
    messages = [[], []]

    class Messages:
        def __init__(self, r, handle):
            self.r, self.handle = r, handle

        def gradients_ready(self, solver):
            messages[self.r].append(len(self.handle.executor.groups))

    computing = [False, False]  # per rank: inside the fc layers' backward

    def slowed(r, solver, backward, first, last_layer):
        def run(*args, **kwargs):
            out = backward(*args, **kwargs)
            computing[r] |= first
            executor = solver.gradient_sync.executor
            work, last = 0.0, time.perf_counter()
            while work < WORK:
                busy = executor.in_flight
                time.sleep(0.0005)
                now = time.perf_counter()
                work += (now - last) / (1 + RHO) if busy else now - last
                last = now
            computing[r] &= not last_layer
            return out
        return run

    def sigma_slowed(r, allreduce_sum):
        def run(buf):
            allreduce_sum(buf)
            done, last = 0.0, time.perf_counter()
            while done < A:
                slow = computing[r]
                time.sleep(0.0005)
                now = time.perf_counter()
                done += (now - last) / SIGMA if slow else now - last
                last = now
        return run

    for r in range(2):
        comms[r].allreduce_sum = sigma_slowed(r, comms[r].allreduce_sum)

    def rank_main(r):
        args = SimpleNamespace(comm=comm, merge=None,
                               bucket_mb=100 / (1 << 20) if comm == "threshold" else None,
                               profile=None,
                               network=str(network), plan=None, save_plan=None,
                               profile_iters=profile_iters, timeline=None,
                               emulate_network=str(emulated), emulate_nodes=2,
                               check_sync=None, comm_timeout=20.0, replan_after=replan_after)
        solver = solvers[r]
        with attach(solver, args, comms[r]) as h:
            handles[r] = h
            solver.iteration_hooks.append(Messages(r, h))
            for name in ("fc1", "fc2", "fc3"):  # backward runs fc3, fc2, fc1
                layer = solver.net.layers[solver.net.layer_names.index(name)]
                layer.backward = slowed(r, solver, layer.backward, name == "fc3",
                                        name == "fc1")
            solver.step(iters)

    _, errors = run_ranks(2, rank_main, timeout=90)
    assert errors == [None, None]
    h0, h1 = handles
    replan_at = profile_iters + replan_after + 4 * profile_iters
    assert [it for it, _ in h0.replanner.plan_switches] == [profile_iters, replan_at]
    assert h0.replanner.plan_switches == h1.replanner.plan_switches
    # the window alternated one message (undisturbed) and one per layer (overlapped)
    window = messages[0][profile_iters + replan_after:replan_at]
    plan_messages = messages[0][profile_iters]  # the start-up plan's
    assert plan_messages == (3 if comm == "wfbp" else 2)
    kinds = [3] if plan_messages == 3 else [3, plan_messages]
    assert window == [m for i in range(profile_iters * 2) for m in (1, kinds[i % len(kinds)])]
    assert messages[0] == messages[1]
    assert h0.replanner.probe_interference == ((64, 0.05),)
    in_situ = h0.replanner.in_situ
    assert 0.6 * RHO <= in_situ.rho.single <= 1.5 * RHO
    # every rank measured the same points
    assert in_situ.cost.interference == h1.replanner.in_situ.cost.interference
    assert all(rho == pytest.approx(in_situ.rho.single) for _, rho in in_situ.cost.interference)
    # the all-reduces last at least A: against the model's a + b*M (a = A), at least 1
    assert 0.9 <= in_situ.comm_slowdown == h1.replanner.in_situ.comm_slowdown
    # sigma measured (each message as the last rank to enter it saw it); every rank
    # measured the same points
    assert in_situ.sigma is not None
    sigma = in_situ.sigma
    assert 0.7 * SIGMA <= sigma.single <= 1.4 * SIGMA, sigma.describe()
    assert in_situ.cost.comm_slowdown == h1.replanner.in_situ.cost.comm_slowdown == sigma.points
    # the re-plan uses them as calibrated on the start-up plan's iterations, the same on
    # every rank, and the plan carries them
    assert h0.cost == h1.cost
    scaled = in_situ.cost.scaled_interference(h0.replanner.scale)
    assert (h0.cost.interference, h0.cost.comm_slowdown) == (scaled.interference,
                                                             scaled.comm_slowdown)
    assert h0.plan.interference == h0.cost.interference
    assert h0.plan.comm_slowdown == h0.cost.comm_slowdown


def test_each_message_as_the_last_rank_to_enter_it_saw_it():
    # rank 0 waited 5 ms in the first message for rank 1, rank 1 4 ms in the second
    r0 = [[(4, 0.007, 0.002, 0.002), (8, 0.003, 0.0, 0.003)]]
    r1 = [[(4, 0.002, 0.001, 0.002), (8, 0.007, 0.001, 0.003)]]
    assert last_arrivals([r0, r1]) == [[r1[0][0], r0[0][1]]]
    # a rank whose iterations do not line up is left out; no rows at all: nothing
    assert last_arrivals([r0, [], [[r1[0][0]]]]) == r0
    assert last_arrivals([[], []]) == []


def test_calibrate_finds_the_scale_that_predicts_the_measured_iteration():
    def predict(k):  # 10 s with no interference, 2 s more per unit of scale
        return 10.0 + 2.0 * k

    assert calibrate(predict, 11.0) == pytest.approx(0.5, rel=1e-3)
    assert calibrate(predict, 9.0) == 0.0  # even none predicts more
    assert calibrate(predict, 50.0) == K_MAX  # even the cap predicts less
    assert calibrate(lambda k: 10.0, 12.0) == 1.0  # no information: as measured

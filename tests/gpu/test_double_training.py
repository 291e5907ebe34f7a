"""Every scheme `mgcaffe plan` lists trains on the GPU path: two ranks as threads of one
process on the CuPy double, gradients over NCCL's double (its own stream) or staged through
pinned memory over the host communicator, for every solver type. The weights after N
iterations equal one GPU process with the ranks' combined batch; the launches per iteration
of the communication stay within budget (counts are deterministic for a given plan).

The same under `mpiexec -n 2 mgcaffe train --gpu all`: tests/gpu/test_double_engine.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import cupy_double
import numpy as np
import pytest
from comm_fakes import SOLVER_TYPES, run_ranks, tiny_net
from google.protobuf import text_format

from mgcaffe.backend import Device, to_host
from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.model.schemes import SCHEMES, scheme_named
from mgcaffe.comm.training.trainer import attach
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

pytestmark = pytest.mark.timeout(240)

BATCH = 4  # per rank
NET = 'name: "tiny"\n' + tiny_net("""
layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: %d channels: 6 height: 1 width: 1 } }""")
TYPES = SOLVER_TYPES
FLAGS = ("comm", "merge", "bucket_mb", "profile", "network", "plan", "save_plan",
         "profile_iters", "timeline", "emulate_network", "emulate_nodes", "check_sync",
         "comm_timeout", "replan_after", "comm_backend")
ITERS = 6
SAMPLES = 2 * BATCH  # each rank cycles through two batches of its own


def data(rank: int):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((SAMPLES, 6, 1, 1)).astype(np.float32)
    y = (rng.integers(0, 3, SAMPLES)).astype(np.float32)
    return x, y


def combined():
    """What one process with the combined batch sees: batch i is rank 0's then rank 1's."""
    parts = [data(r) for r in (0, 1)]
    xs, ys = [], []
    for b in range(SAMPLES // BATCH):
        for x, y in parts:
            xs.append(x[b * BATCH:(b + 1) * BATCH])
            ys.append(y[b * BATCH:(b + 1) * BATCH])
    return np.concatenate(xs), np.concatenate(ys)


def make_solver(kind: str, batch: int, rank: int, size: int, device: Device):
    param = caffe_pb2.SolverParameter()
    text_format.Merge(
        f'net_param {{ {NET % batch} }} base_lr: 0.05 weight_decay: 0.001 lr_policy: "fixed" '
        f'max_iter: 100 display: 0 random_seed: 7 type: "{kind}" {TYPES[kind]} '
        f'snapshot_after_train: false', param)
    return get_solver(param, rank=rank, world_size=size, device=device)


def weights(solver):
    return [to_host(b.data).copy() for b in solver.net.learnable_params]


@pytest.fixture(scope="module")
def double():
    with cupy_double.installed(devices=2) as d:
        yield d


@pytest.fixture(scope="module")
def reference(double):
    """Per solver type: one GPU process, the combined batch."""
    cache = {}

    def get(kind):
        if kind not in cache:
            double.cupy.cuda.Device(0).use()
            solver = make_solver(kind, 2 * BATCH, 0, 1, Device("gpu", 0))
            solver.net.layers[0].set_input_arrays(*combined())
            solver.step(ITERS)
            cache[kind] = weights(solver)
        return cache[kind]

    return get


def train(double, tmp_path, scheme, kind, backend="nccl", iters=(ITERS,), hooks=None):
    """`iters` rounds of steps on two GPU thread-ranks; (solvers, handles, what `hooks(r,
    handle)` returned after each round)."""
    network = tmp_path / "network.json"  # T(M) given: no start-up benchmark
    network.write_text(json.dumps({"fits": {"2": {"a": 2e-4, "b": 1e-8}}}))
    args = SimpleNamespace(**{**{f: None for f in FLAGS}, "comm": scheme, "profile_iters": 2,
                              "network": str(network), "bucket_mb": 0.0001,
                              "comm_backend": backend})
    comms = LocalWorld(2, timeout=60).communicators()
    solvers, handles, seen = [None, None], [None, None], [[], []]

    def rank_main(r):
        double.cupy.cuda.Device(r).use()
        solvers[r] = s = make_solver(kind, BATCH, r, 2, Device("gpu", r))
        s.net.layers[0].set_input_arrays(*data(r))
        with attach(s, args, comms[r]) as h:
            handles[r] = h
            for n in iters:
                s.step(n)
                if hooks is not None:
                    seen[r].append(hooks(r, h))

    _, errors = run_ranks(2, rank_main, timeout=200)
    assert errors == [None, None], errors
    return solvers, handles, seen


def check_matches(solvers, want):
    ranks = [weights(s) for s in solvers]
    for a, b in zip(ranks[0], ranks[1]):
        np.testing.assert_array_equal(a, b)  # the ranks stay bit-identical
    for got, expected in zip(ranks[0], want, strict=True):
        scale = float(np.abs(expected).max())
        assert float(np.abs(got - expected).max()) <= 1e-5 * scale


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_and_solver_on_nccl_matches_one_process_with_the_combined_batch(
        double, reference, tmp_path, scheme, kind):
    solvers, handles, _ = train(double, tmp_path, scheme, kind)
    h = handles[0]
    assert h.plan.scheme == scheme and h.executor.mode == "stream"
    # the schedules really ran layer by layer on the device
    assert h.executor.per_layer == (scheme_named(scheme).schedule is not None)
    check_matches(solvers, reference(kind))
    assert not np.array_equal(weights(solvers[0])[0],
                              weights(make_solver(kind, BATCH, 0, 1, Device("gpu", 0)))[0])


@pytest.mark.parametrize("scheme", ["wfbp", "overlap", "bytescheduler", "dear"])
def test_staged_gradients_over_the_host_communicator_train_every_kind_of_plan(
        double, reference, tmp_path, scheme):
    solvers, handles, _ = train(double, tmp_path, scheme, "Adam", backend="mpi")
    assert handles[0].executor.mode == "staged" and handles[0].plan.scheme == scheme
    check_matches(solvers, reference("Adam"))


#: Launches of the communication per iteration on its own (NCCL) stream, at most: per
#: message one collective (a reduce-scatter of a part whose size the ranks' count does not
#: divide: two) and one division of what an all-reduce or all-gather summed; nothing else
#: for a net whose gradients lie in one flat buffer (no packing copies).
LAUNCHES_PER_MESSAGE = 2


@pytest.mark.parametrize("scheme", ["overlap", "bytescheduler", "dear", "mgwfbp"])
def test_launches_per_iteration_of_the_communication_within_budget(double, tmp_path, scheme):
    """Counted over the iterations between two steps, when the thread is idle; the plan
    is in place from iteration 2 (the profile's) and does not change after."""

    def count(r, h):
        c = double.counters
        stream = f"stream {h.executor.comm.stream.ptr:#x}"
        return (c.launches_by_stream[stream], len(h.executor.messages),
                sum(1 for m in h.executor.messages if m.kind in ("ar", "ag")),
                len(h.executor.program.runs), h.executor.in_place_groups,
                len(h.executor.groups))

    _, handles, seen = train(double, tmp_path, scheme, "SGD", iters=(3, 4), hooks=count)
    for r in (0, 1):
        (before, *_), (after, messages, summed, runs, in_place, groups) = seen[r]
        per_iteration = (after - before) / 4
        assert in_place == groups  # the trainer flattened the net's gradients
        assert per_iteration <= LAUNCHES_PER_MESSAGE * messages, (per_iteration, messages)
        # and exactly: one call per run (+ the reduce-scatter tails), one division per
        # all-reduce or all-gather run
        assert per_iteration >= runs + min(summed, runs)


class LayerSync:
    """A one-rank gradient sync that offers per-layer waits (nothing to reduce); `poison`:
    the learnable layer whose gradient turns NaN when the gate waits for it."""

    per_layer = True

    def __init__(self, net=None, poison=None):
        self.net, self.poison = net, poison

    def on_learnable_done(self, k):
        pass

    def wait_layer(self, k):
        if k == self.poison:
            blob = self.net.learnable_params[self.net.learnable_layers[k - 1].param_ids[0]]
            blob.diff[...] = np.nan

    def wait(self):
        pass


def test_per_layer_updates_on_the_device_check_the_gradients_with_one_read(double):
    """Each layer's update on the GPU checks its gradient without a host read per layer:
    the sums are read once per iteration; the weights are the barrier update's."""
    double.cupy.cuda.Device(0).use()
    solvers = {}
    for name, sync in (("barrier", None), ("layered", LayerSync())):
        s = solvers[name] = make_solver("Adam", BATCH, 0, 1, Device("gpu", 0))
        s.gradient_sync = sync
        s.net.layers[0].set_input_arrays(*data(0))
        s.step(1)
        double.counters.reset()
        s.step(3)
        solvers[name] = (s, double.counters.syncs)
    (layered, syncs), (barrier, barrier_syncs) = solvers["layered"], solvers["barrier"]
    # per iteration: the loss, and the gradients' check (LayerChecks.verify reads the
    # layers' sums at once; the barrier reads their global sum), not one read per layer
    assert syncs == barrier_syncs == 2 * 3
    for a, b in zip(weights(layered), weights(barrier)):
        np.testing.assert_array_equal(a, b)


def test_a_non_finite_gradient_on_the_device_names_its_layer(double):
    from mgcaffe.errors import SolverError

    double.cupy.cuda.Device(0).use()
    s = make_solver("SGD", BATCH, 0, 1, Device("gpu", 0))
    s.net.layers[0].set_input_arrays(*data(0))
    s.gradient_sync = LayerSync(s.net, poison=2)
    with pytest.raises(SolverError, match=r"iteration 0: non-finite gradient in layer 'fc2'"):
        s.step(2)
    assert not s.updates_pending

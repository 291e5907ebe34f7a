"""The communication thread running a schedule (comm/runtime/executor.py), on a local world of
fake ranks: parts, batches, reduce-scatter/all-gather, per-layer completion, and what goes
wrong. A merge plan is the barrier schedule of its groups: the same thread runs both."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from comm_fakes import GROUPS, SCHEDULES, FakeNet, flatten, run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.model.schedule import Schedule, barrier_schedule
from mgcaffe.comm.runtime.executor import GradientExecutor
from mgcaffe.comm.runtime.trace import Tracer
from mgcaffe.errors import CommError


def expected(n, iterations, seed=5):
    ref = [FakeNet(r, seed=seed) for r in range(n)]
    out = []
    for _ in range(iterations):
        per = []
        for r in range(n):
            ref[r].backward(None)
            per.append(ref[r].diffs())
        out.append([sum(x[i] for x in per) / n for i in range(len(per[0]))])
    return out


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("in_place", [False, True])
def test_every_rank_ends_with_the_average(name, in_place):
    n, iterations = 3, 3
    comms = LocalWorld(n).communicators()
    nets = [FakeNet(r, seed=5) for r in range(n)]
    if in_place:
        for net in nets:
            flatten(net)
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES[name])

    def rank(r):
        ex = GradientExecutor.from_net(nets[r], plan, comms[r], timeout=10)
        assert ex.in_place_groups == (2 if in_place else 0)
        got = []
        for _ in range(iterations):
            nets[r].backward(ex.on_learnable_done)
            if ex.per_layer:
                for k in (1, 2, 3, 4):
                    ex.wait_layer(k)
            else:
                ex.wait()
            got.append(nets[r].diffs())
        ex.close()
        return got

    results, errors = run_ranks(n, rank)
    assert not any(errors), errors
    want = expected(n, iterations)
    for r in range(n):
        for it in range(iterations):
            for a, b in zip(results[r][it], want[it]):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        if r:  # every rank bit-identical
            for a, b in zip(results[r][-1], results[0][-1]):
                np.testing.assert_array_equal(a, b)


def test_wait_layer_waits_for_this_iterations_gradient_not_the_last_ones():
    # each all-reduce of rank 0 waits 0.05 s first: wait_layer(1) right after backward must
    # not return on the previous iteration's completion
    world = LocalWorld(2, delay=lambda rank, seq, op: 0.05 if rank == 0 else 0.0)
    comms = world.communicators()
    nets = [FakeNet(r, seed=5) for r in range(2)]
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES["parts, input side first"])

    def rank(r):
        ex = GradientExecutor.from_net(nets[r], plan, comms[r], timeout=10)
        got = []
        for _ in range(3):
            nets[r].backward(ex.on_learnable_done)
            ex.wait_layer(1)
            got.append(nets[r].learnable_params[0].diff.copy())
            for k in (2, 3, 4):
                ex.wait_layer(k)
        ex.close()
        return got

    results, errors = run_ranks(2, rank)
    assert not any(errors), errors
    want = expected(2, 3)
    for it in range(3):
        np.testing.assert_allclose(results[1][it], want[it][0], rtol=1e-6)


def test_a_priority_plan_is_refused_every_rank_must_send_one_sequence():
    net = FakeNet(0)
    s = Schedule((1, 1), ("allreduce",) * 2, ((1, 0, "ar"), (0, 0, "ar")), "priority", 0,
                 "per-layer")
    comm = LocalWorld(1).communicators()[0]
    with pytest.raises(CommError, match="fixed sequence .* policy 'priority'"):
        GradientExecutor.from_net(net, SimpleNamespace(groups=GROUPS, schedule=s), comm)


def test_a_stalled_peer_is_named_after_the_timeout():
    comms = LocalWorld(2, timeout=30).communicators()
    net = FakeNet(0)
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES["parts, input side first"])
    ex = GradientExecutor.from_net(net, plan, comms[0], timeout=0.5)
    net.backward(ex.on_learnable_done)  # rank 1 never joins
    t0 = time.monotonic()
    with pytest.raises(CommError, match="rank 0: all-reduce of group 1 part 1 .* not done "
                                        "after 0.5 s"):
        ex.wait_layer(1)
    assert time.monotonic() - t0 < 5
    ex.close(join=False)


def test_a_failed_collective_surfaces_at_the_wait_with_the_rank():
    world = LocalWorld(2, fail=lambda rank, seq, op: rank == 1 and seq == 2)
    comms = world.communicators()
    nets = [FakeNet(r) for r in range(2)]
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES["parts, input side first"])

    def rank(r):
        ex = GradientExecutor.from_net(nets[r], plan, comms[r], timeout=2)
        nets[r].backward(ex.on_learnable_done)
        try:
            for k in (1, 2, 3, 4):
                ex.wait_layer(k)
        finally:
            ex.close(join=False)

    _, errors = run_ranks(2, rank)
    assert "rank 1: injected failure" in str(errors[1])


def test_duplicates_keep_the_threads_collectives_apart():
    comms = LocalWorld(2).communicators()
    dups = [None, None]

    def dup(r):
        dups[r] = comms[r].duplicate()

    run_ranks(2, dup)
    out = [None, None]

    def rank(r):
        # the main thread agrees on something while the other all-reduces on the duplicate
        buf = np.full(4, r + 1.0, np.float32)
        t = threading.Thread(target=dups[r].allreduce_sum, args=(buf,))
        t.start()
        flags = comms[r].any_true([r == 1])
        t.join()
        out[r] = (flags, buf.copy())

    _, errors = run_ranks(2, rank)
    assert not any(errors), errors
    for flags, buf in out:
        assert flags == [True]
        np.testing.assert_array_equal(buf, np.full(4, 3.0, np.float32))


def test_messages_of_an_iteration_are_traced_as_that_iteration():
    comm = LocalWorld(1).communicators()[0]
    net = FakeNet(0)
    tracer = Tracer(0)
    tracer.set_origin()
    plan = SimpleNamespace(groups=GROUPS, schedule=SCHEDULES["batches"])
    ex = GradientExecutor.from_net(net, plan, comm, timeout=5, tracer=tracer)
    tracer.iteration = 7
    net.backward(ex.on_learnable_done)
    ex.wait_layer(1)
    tracer.iteration = 8  # the next forward has begun
    for k in (2, 3, 4):
        ex.wait_layer(k)
    ex.close()
    spans = [e for e in tracer.events if e.get("cat") == "allreduce"]
    assert len(spans) == 5 and {e["args"]["iter"] for e in spans} == {7}
    assert [e["args"]["part"] for e in spans] == [1, 0, 2, 1, 0]


def test_a_merge_plan_runs_as_the_barrier_schedule_of_its_groups():
    """The same groups given plainly or with their barrier schedule: the same collectives,
    the same averages, bit for bit."""
    n = 2
    plans = {"groups": SimpleNamespace(groups=GROUPS),
             "barrier schedule": SimpleNamespace(groups=GROUPS, schedule=barrier_schedule(2))}
    out = {}
    for name, plan in plans.items():
        world = LocalWorld(n)
        comms = world.communicators()
        nets = [FakeNet(r, seed=5) for r in range(n)]

        def rank(r, plan=plan, nets=nets, comms=comms):
            with GradientExecutor.from_net(nets[r], plan, comms[r], timeout=10) as ex:
                assert not ex.per_layer and len(ex.messages) == 2
                nets[r].backward(ex.on_learnable_done)
                ex.wait()
            return nets[r].diffs()

        results, errors = run_ranks(n, rank)
        assert not any(errors), errors
        out[name] = (results, sorted((rank, op) for rank, _, op in world.calls))
    (a, calls_a), (b, calls_b) = out.values()
    assert calls_a == calls_b == [(r, "allreduce") for r in range(n) for _ in range(2)]
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)

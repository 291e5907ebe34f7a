"""The communication thread of Algorithm 2 on the in-process communicator."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from comm_fakes import FakeNet, flatten, plan, run_mpi, run_ranks

from mgcaffe.comm.backends.communicator import Communicator
from mgcaffe.comm.backends.local import LocalWorld, SingleCommunicator
from mgcaffe.comm.runtime.executor import GradientExecutor
from mgcaffe.comm.runtime.trace import Tracer
from mgcaffe.errors import CommError

pytestmark = pytest.mark.timeout(60)

PLANS = {
    "wfbp": plan(["fc2"], ["fc1"], ["conv2"], ["conv1"]),
    "synceasgd": plan(["fc2", "fc1", "conv2", "conv1"]),
    "merged": plan(["fc2", "fc1"], ["conv2", "conv1"]),
    "uneven": plan(["fc2"], ["fc1", "conv2", "conv1"]),
}


class Recording(Communicator):
    """Wraps a communicator and records the size of every all-reduce."""

    def __init__(self, inner):
        self.inner, self.rank, self.size = inner, inner.rank, inner.size
        self.sizes = []

    def allreduce_sum(self, buf):
        self.sizes.append(buf.size)
        self.inner.allreduce_sum(buf)

    def broadcast(self, obj, root=0):
        return self.inner.broadcast(obj, root)

    def allgather(self, obj):
        return self.inner.allgather(obj)

    def barrier(self):
        self.inner.barrier()

    def abort(self, code=1):
        self.inner.abort(code)


def group_sizes(net, groups):
    by_name = {layer.name: layer for layer in net.learnable_layers}
    return [sum(net.learnable_params[p].diff.size for n in g for p in by_name[n].param_ids)
            for g in groups]


@pytest.mark.parametrize("scheme", sorted(PLANS))
@pytest.mark.parametrize("n", [2, 3])
def test_groups_reduced_as_planned_and_averaged(scheme, n):
    world = LocalWorld(n, timeout=10)
    comms = [Recording(c) for c in world.communicators()]
    nets = [FakeNet(rank=r) for r in range(n)]
    iters = 3

    def rank_main(r):
        seen = []
        with GradientExecutor.from_net(nets[r], PLANS[scheme], comms[r], timeout=10) as ex:
            for _ in range(iters):
                nets[r].backward(hook=ex.on_learnable_done)
                ex.wait()
                seen.append(nets[r].diffs())
        return seen

    results, errors = run_ranks(n, rank_main)
    assert errors == [None] * n
    want = group_sizes(nets[0], PLANS[scheme].groups) * iters
    for c in comms:
        assert c.sizes == want  # exactly the planned groups, in order, once per iteration
    for it in range(iters):
        reduced = [results[r][it] for r in range(n)]
        for r in range(1, n):  # every rank holds bit-identical gradients
            for a, b in zip(reduced[0], reduced[r]):
                assert np.array_equal(a, b)


def test_average_matches_mean_of_rank_gradients():
    n = 2
    world = LocalWorld(n, timeout=10)
    comms = world.communicators()
    nets = [FakeNet(rank=r) for r in range(n)]
    # What each rank computes before reduction: replay the same generators.
    twins = [FakeNet(rank=r) for r in range(n)]
    for t in twins:
        t.backward()
    expected = [(a + b) / np.float32(2) for a, b in zip(twins[0].diffs(), twins[1].diffs())]

    def rank_main(r):
        with GradientExecutor.from_net(nets[r], PLANS["merged"], comms[r]) as ex:
            nets[r].backward(hook=ex.on_learnable_done)
            ex.wait()
        return nets[r].diffs()

    results, errors = run_ranks(n, rank_main)
    assert errors == [None, None]
    for got in results:
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


def test_buffer_allocated_once_and_reused():
    net = FakeNet()
    with GradientExecutor.from_net(net, PLANS["merged"], SingleCommunicator()) as ex:
        buf = ex.buffer
        before = buf.__array_interface__["data"][0]
        for _ in range(3):
            net.backward(hook=ex.on_learnable_done)
            ex.wait()
        assert ex.buffer is buf and buf.__array_interface__["data"][0] == before
        assert buf.size == sum(b.diff.size for b in net.learnable_params)


def test_backward_is_not_blocked_by_communication():
    """The hook is a queue put: a slow all-reduce must not slow the backward pass."""
    world = LocalWorld(2, timeout=10, delay=lambda rank, seq, op: 0.2)
    comms = world.communicators()
    nets = [FakeNet(rank=r) for r in range(2)]

    def rank_main(r):
        with GradientExecutor.from_net(nets[r], PLANS["wfbp"], comms[r]) as ex:
            t0 = time.perf_counter()
            nets[r].backward(hook=ex.on_learnable_done)
            t_backward = time.perf_counter() - t0
            ex.wait()
            return t_backward, time.perf_counter() - t0

    results, errors = run_ranks(2, rank_main)
    assert errors == [None, None]
    for t_backward, t_total in results:
        assert t_backward < 0.1 and t_total >= 0.8  # 4 groups x 0.2 s happen after backward


def test_wait_reraises_thread_failure_with_rank():
    world = LocalWorld(2, timeout=10, fail=lambda rank, seq, op: rank == 1 and seq == 2)
    comms = world.communicators()
    nets = [FakeNet(rank=r) for r in range(2)]

    def rank_main(r):
        ex = GradientExecutor.from_net(nets[r], PLANS["wfbp"], comms[r], timeout=3)
        try:
            nets[r].backward(hook=ex.on_learnable_done)
            ex.wait()
        finally:
            if r == 1:
                world.abort(1, 1)  # what fail_all does: the healthy rank must not hang
            ex.close()

    t0 = time.perf_counter()
    _, errors = run_ranks(2, rank_main)
    assert time.perf_counter() - t0 < 5
    assert isinstance(errors[1], CommError) and "rank 1" in str(errors[1])
    assert "injected failure" in str(errors[1])
    assert isinstance(errors[0], CommError) and "rank 0" in str(errors[0])


def test_watchdog_fires_when_a_peer_never_joins():
    """Rank 1 never runs backward: rank 0's wait() gives up, naming the group, not hanging."""
    world = LocalWorld(2, timeout=60)
    comm0 = world.communicators()[0]
    net = FakeNet()
    ex = GradientExecutor.from_net(net, PLANS["merged"], comm0, timeout=0.5)
    net.backward(hook=ex.on_learnable_done)
    t0 = time.perf_counter()
    with pytest.raises(CommError, match=r"rank 0: all-reduce of group 0 \(fc2, fc1; \d+ bytes\)"):
        ex.wait()
    assert time.perf_counter() - t0 < 2
    world.abort(0, 3)  # releases the thread blocked in the collective


def test_backward_stall_is_reported_by_the_thread():
    net = FakeNet()
    ex = GradientExecutor.from_net(net, PLANS["wfbp"], SingleCommunicator(), timeout=0.4)
    ex.on_learnable_done(4)  # fc2 arrives, then nothing
    with pytest.raises(CommError, match=r"rank 0: waited 0.4 s for the gradient of layer "
                                        r"'fc1' \(group 1\)"):
        ex.wait()
    ex.close()


def test_out_of_order_layer_is_an_error():
    net = FakeNet()
    ex = GradientExecutor.from_net(net, PLANS["wfbp"], SingleCommunicator(), timeout=5)
    ex.on_learnable_done(4)
    ex.on_learnable_done(2)
    with pytest.raises(CommError, match="reported layer 'conv2' but layer 'fc1' comes next"):
        ex.wait()
    with pytest.raises(CommError):  # the hook refuses to run on once the thread failed
        ex.on_learnable_done(1)
    ex.close()


@pytest.mark.parametrize("groups, message", [
    ([["fc2", "fc1"], ["conv1", "conv2"]], "position 2 .* 'conv1' in the plan but 'conv2'"),
    ([["fc2", "fc1", "conv2"]], "the plan has 3 learnable layers, the net 4"),
    ([["fc2", "fc1", "conv2", "conv1", "extra"]], "the plan also has 'extra'"),
])
def test_plan_must_match_the_net(groups, message):
    with pytest.raises(CommError, match=message):
        GradientExecutor.from_net(FakeNet(), plan(*groups), SingleCommunicator())


def test_shared_parameter_owned_twice_is_refused():
    net = FakeNet()
    net.learnable_layers[1].param_ids.append(0)  # conv2 claims conv1's weights too
    with pytest.raises(CommError, match="owned by both 'conv1' and 'conv2'"):
        GradientExecutor.from_net(net, PLANS["wfbp"], SingleCommunicator())


def test_plan_can_change_between_iterations():
    net = FakeNet()
    comm = Recording(SingleCommunicator())
    with GradientExecutor.from_net(net, PLANS["synceasgd"], comm) as ex:
        net.backward(hook=ex.on_learnable_done)
        ex.wait()
        ex.set_plan(PLANS["wfbp"])
        net.backward(hook=ex.on_learnable_done)
        ex.wait()
    assert comm.sizes == group_sizes(net, PLANS["synceasgd"].groups) + \
        group_sizes(net, PLANS["wfbp"].groups)


def test_trace_records_each_group_with_bytes():
    net = FakeNet()
    tracer = Tracer(rank=0)
    with GradientExecutor.from_net(net, PLANS["merged"], SingleCommunicator(),
                                   tracer=tracer) as ex:
        net.backward(hook=ex.on_learnable_done)
        ex.wait()
    ar = [e for e in tracer.events if e["cat"] == "allreduce"]
    assert [e["args"]["layers"] for e in ar] == PLANS["merged"].groups
    assert [e["args"]["bytes"] for e in ar] == [4 * s for s in
                                                group_sizes(net, PLANS["merged"].groups)]
    grads = [e for e in tracer.events if e["cat"] == "grad"]
    assert [e["name"] for e in grads] == ["fc2", "fc1", "conv2", "conv1"]


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_executor_under_mpi(n):
    """Every plan on a fake net under mpiexec: mean of the ranks' gradients, bit-identical on
    every rank, the planned groups in order (read back from the trace)."""
    checks = Path(__file__).resolve().parents[1] / "mpi" / "comm_checks.py"
    status, out, _ = run_mpi(n, [checks, "executor"], timeout=100)
    assert status == 0, out
    assert sorted(int(r) for r in re.findall(r"OK executor rank (\d+)", out)) == list(range(n))


def test_non_float32_gradients_are_refused():
    net = FakeNet()
    blob = net.learnable_params[2]
    blob.diff = blob.diff.astype(np.float64)
    with pytest.raises(CommError, match="layer 'conv2' parameter 2: gradient sync needs "
                                        "float32 numpy or CuPy diffs, got ndarray float64"):
        GradientExecutor.from_net(net, PLANS["wfbp"], SingleCommunicator())


class StreamComm(SingleCommunicator):
    """A device-streams communicator (the nccl.py protocol) on the host, recording calls."""

    device_streams = True

    def __init__(self):
        super().__init__()
        self.size = 2  # the sums double: as if a second rank held the same gradients
        self.calls = []
        self.marked = set()

    def mark_ready(self, k):
        self.calls.append(("mark", k))
        self.marked.add(k)

    def wait_ready(self, k):
        assert k in self.marked, "wait_ready before mark_ready"
        self.calls.append(("wait", k))

    def pack(self, pairs):
        self.calls.append(("pack", len(pairs)))
        for dst, src in pairs:
            np.copyto(dst, src)

    def allreduce_sum_async(self, buf):
        self.calls.append(("allreduce", buf.size))
        buf *= 2

    def unpack(self, pairs, divisor=1):
        self.calls.append(("unpack", len(pairs), divisor))
        for src, dst in pairs:
            np.divide(src, divisor, out=dst)

    def synchronize(self, what="", timeout=None):
        self.calls.append(("sync",))


def test_stream_path_follows_the_device_protocol():
    """mark on the main thread; per layer wait + pack; per group all-reduce + unpack; one
    synchronize per iteration, after the last group."""
    net, twin = FakeNet(), FakeNet()  # the twin computes the same local gradients
    comm = StreamComm()
    with GradientExecutor.from_net(net, PLANS["merged"], comm, data_path="stream") as ex:
        for _ in range(2):
            comm.calls.clear()
            net.backward(hook=ex.on_learnable_done)
            twin.backward()
            ex.wait()
            kinds = [c[0] for c in comm.calls]
            assert kinds.count("sync") == 1 and kinds[-1] == "sync"
            assert [c for c in comm.calls if c[0] == "allreduce"] == \
                [("allreduce", n) for n in group_sizes(net, PLANS["merged"].groups)]
            for k in (4, 3, 2, 1):  # each layer: marked, then waited for, then packed
                assert kinds.index("mark") <= comm.calls.index(("wait", k))
            assert [c[0] for c in comm.calls if c[0] in ("wait", "pack")] == ["wait", "pack"] * 4
    for got, local in zip(net.diffs(), twin.diffs()):
        np.testing.assert_allclose(got, local)  # summed "over two ranks", divided by 2


# ----------------------------------------------------------------------------- in place


class Sharing(Recording):
    """Records, for every all-reduce, whether its buffer is memory of `flat`."""

    def __init__(self, inner, flat):
        super().__init__(inner)
        self.flat = flat
        self.in_flat = []

    def allreduce_sum(self, buf):
        self.in_flat.append(np.shares_memory(buf, self.flat))
        super().allreduce_sum(buf)


def reduce_on_ranks(n, scheme, prepare, iters=2, **options):
    """Each of n thread-ranks: a FakeNet, `prepare(net)` (returns a comm wrapper or None),
    `iters` backward passes reduced by the plan; returns every rank's reduced gradients per
    iteration, the executors and the wrapped communicators."""
    world = LocalWorld(n, timeout=10)
    nets = [FakeNet(rank=r) for r in range(n)]
    comms = [prepare(net, c) for net, c in zip(nets, world.communicators())]
    executors = [None] * n

    def rank_main(r):
        seen = []
        with GradientExecutor.from_net(nets[r], PLANS[scheme], comms[r], timeout=10,
                                       **options) as ex:
            executors[r] = ex
            for _ in range(iters):
                nets[r].backward(hook=ex.on_learnable_done)
                ex.wait()
                seen.append(nets[r].diffs())
        return seen

    results, errors = run_ranks(n, rank_main)
    assert errors == [None] * n
    return results, executors, comms


@pytest.mark.parametrize("scheme", sorted(PLANS))
def test_flat_diffs_are_reduced_in_place_bit_identical_to_packing(scheme):
    n = 2
    packed, pack_ex, _ = reduce_on_ranks(n, scheme, lambda net, c: Recording(c))
    flat, flat_ex, comms = reduce_on_ranks(n, scheme, lambda net, c: Sharing(c, flatten(net)))
    groups = len(PLANS[scheme].groups)
    for ex, comm in zip(flat_ex, comms):
        assert ex.in_place_groups == groups and ex.packed_bytes == 0 and ex.buffer is None
        assert comm.in_flat == [True] * (groups * 2)  # every all-reduce on the net's buffer
    for ex in pack_ex:
        assert ex.in_place_groups == 0 and ex.packed_bytes > 0
    assert [c.sizes for c in comms] == [group_sizes(FakeNet(), PLANS[scheme].groups) * 2] * n
    for r in range(n):
        for it in range(2):
            for a, b in zip(flat[r][it], packed[r][it]):
                assert np.array_equal(a, b)


def test_groups_not_one_slice_are_packed():
    """Flattened in forward order, a layer's own blobs are one slice but two layers in
    backward order are not: single-layer groups in place, merged groups packed."""
    n = 2
    forward = [p for layer in FakeNet().learnable_layers for p in layer.param_ids]
    packed, _, _ = reduce_on_ranks(n, "uneven", lambda net, c: Recording(c))
    mixed, executors, comms = reduce_on_ranks(
        n, "uneven", lambda net, c: Sharing(c, flatten(net, forward)))
    for ex, comm in zip(executors, comms):
        assert ex.in_place_groups == 1  # ["fc2"] alone; ["fc1", "conv2", "conv1"] packed
        assert comm.in_flat == [True, False] * 2
        assert ex.packed_bytes == 2 * 4 * group_sizes(FakeNet(), [["fc1", "conv2", "conv1"]])[0]
    for r in range(n):
        for a, b in zip(mixed[r][-1], packed[r][-1]):
            assert np.array_equal(a, b)


def test_in_place_can_be_turned_off():
    _, executors, comms = reduce_on_ranks(2, "merged", lambda net, c: Sharing(c, flatten(net)),
                                          in_place=False)
    for ex, comm in zip(executors, comms):
        assert ex.in_place_groups == 0 and ex.packed_bytes > 0 and not any(comm.in_flat)


def test_a_replaced_diff_stops_the_in_place_path():
    """A layer that replaces a flattened diff instead of writing into it would have its
    gradient silently left out of the all-reduce: the thread refuses, naming the layer."""
    net = FakeNet()
    flatten(net)
    ex = GradientExecutor.from_net(net, PLANS["merged"], SingleCommunicator(), timeout=5)
    blob = net.learnable_params[net.learnable_layers[2].param_ids[0]]  # fc1's weights
    blob.diff = blob.diff.copy()
    with pytest.raises(CommError, match=r"rank 0: layer 'fc1' parameter 4: its diff is no "
                                        r"longer the slice of the gradient buffer"):
        # (the hook itself raises once the thread has failed: the rest of backward may)
        net.backward(hook=ex.on_learnable_done)
        ex.wait()
    ex.close()


def test_stream_path_in_place_skips_pack_and_unpack_copies():
    """Flattened device diffs on the stream path: each layer is still waited for on the
    stream, nothing is packed, and the group is divided in place on the stream."""
    net, twin = FakeNet(), FakeNet()
    flat = flatten(net)
    comm = StreamComm()
    with GradientExecutor.from_net(net, PLANS["merged"], comm, data_path="stream") as ex:
        net.backward(hook=ex.on_learnable_done)
        twin.backward()
        ex.wait()
    kinds = [c[0] for c in comm.calls]
    assert "pack" not in kinds and kinds.count("wait") == 4 and kinds[-1] == "sync"
    assert [c for c in comm.calls if c[0] == "unpack"] == [("unpack", 1, 2)] * 2
    assert ex.buffer is None and all(np.shares_memory(m.piece, flat) for m in ex.messages)
    for got, local in zip(net.diffs(), twin.diffs()):
        np.testing.assert_allclose(got, local)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_thread_nice_is_the_communication_thread_s_only():
    """(Raising the nice value needs no privilege, so the test does that.)"""
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    wanted = min(mine + 3, 19)
    with GradientExecutor.from_net(FakeNet(), PLANS["wfbp"], SingleCommunicator(),
                                   thread_nice=wanted) as ex:
        assert ex.favoured
        assert os.getpriority(os.PRIO_PROCESS, ex.thread.thread.native_id) == wanted
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    with GradientExecutor.from_net(FakeNet(), PLANS["wfbp"], SingleCommunicator()) as ex:
        assert not ex.favoured  # no nice asked for: left alone
        assert os.getpriority(os.PRIO_PROCESS, ex.thread.thread.native_id) == mine


class Gated(SingleCommunicator):
    """A 'two-rank' world whose second all-reduce waits for `release` (the first returns at
    once); every sum doubles the buffer, as if the other rank held the same gradients."""

    def __init__(self):
        super().__init__()
        self.size = 2
        self.release = threading.Event()
        self.calls = 0

    def allreduce_sum(self, buf):
        self.calls += 1
        if self.calls == 2:
            assert self.release.wait(5)
        buf *= 2


def test_host_groups_are_divided_by_the_waiting_main_thread():
    """While the communication thread still reduces the last group, wait() divides the
    groups already reduced (on the main thread, idle there), not the thread during backward."""
    net, twin = FakeNet(), FakeNet()
    flatten(net)
    comm, tracer = Gated(), Tracer(rank=0)
    with GradientExecutor.from_net(net, PLANS["merged"], comm, tracer=tracer) as ex:
        net.backward(hook=ex.on_learnable_done)
        twin.backward()
        threading.Timer(0.3, comm.release.set).start()
        ex.wait()
    averages = {e["name"]: e["tid"] for e in tracer.events if e["cat"] == "unpack"}
    assert averages["average g0"] == 0  # the compute row: the main thread divided it
    assert set(averages) == {"average g0", "average g1"}
    for got, local in zip(net.diffs(), twin.diffs()):
        assert np.array_equal(got, local)  # (2 * g) / 2

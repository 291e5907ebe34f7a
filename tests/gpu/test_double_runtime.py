"""The communication runtime's device paths on the CuPy double: every kind of schedule (whole
groups, parts, batches, reduce-scatter/all-gather, per-layer completion) over NCCL on its own
stream and staged through pinned host memory, on two ranks as threads (NCCL's double joins
them in-process). The averages are right; the per-layer completion is an event the compute
stream waits on, not a host wait; the collectives run on the communicator's stream."""

from __future__ import annotations

from types import SimpleNamespace

import cupy_double
import numpy as np
import pytest
from comm_fakes import GROUPS, SCHEDULES, device_blobs, rank_gradients, run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.backends.nccl import NcclCommunicator
from mgcaffe.comm.runtime.executor import GradientExecutor

pytestmark = pytest.mark.timeout(120)


def gradients(rank: int, iterations: int) -> list[list[np.ndarray]]:
    """Rank `rank`'s local gradients per iteration (comm_fakes.rank_gradients, this file's
    draw)."""
    return rank_gradients(rank, iterations, seed=17)


def run_executors(double, host_comms, schedule, flat, iterations=3, backend="nccl"):
    """Two thread-ranks running the fake net's backward into an executor; per rank: the
    reduced gradients per iteration, the executor, and what the gate did."""
    cupy = double.cupy
    plan = SimpleNamespace(groups=GROUPS, schedule=schedule)

    def rank(r):
        cupy.cuda.Device(r).use()
        comm = NcclCommunicator(host_comms[r], timeout=20) if backend == "nccl" \
            else host_comms[r]
        params, layers = device_blobs(cupy, flat)
        ex = GradientExecutor(layers, params, plan, comm, timeout=20)
        compute = cupy.cuda.get_current_stream()
        got, gated = [], []
        for grads in gradients(r, iterations):
            for layer in reversed(layers):
                for p in layer.param_ids:
                    params[p].diff[...] = cupy.asarray(grads[p])
                ex.on_learnable_done(layer.index)
            if ex.per_layer:
                for k in (1, 2, 3, 4):
                    before = len(compute.waited)
                    ex.wait_layer(k)
                    # the gate: the compute stream waits for layer k's event on the device
                    gated.append(len(compute.waited) - before)
            else:
                ex.wait()
            got.append([p.diff.get() for p in params])
        ex.close()
        return got, ex, gated

    results, errors = run_ranks(2, rank, timeout=60)
    assert errors == [None, None], errors
    return results


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("flat", [True, False], ids=["in place", "packed"])
@pytest.mark.parametrize("backend", ["nccl", "staged"])
def test_every_schedule_averages_on_the_device_paths(name, flat, backend):
    iterations = 3
    with cupy_double.installed(devices=2) as double:
        comms = LocalWorld(2, timeout=20).communicators()
        results = run_executors(double, comms, SCHEDULES[name], flat, iterations, backend)
        streams = dict(double.counters.launches_by_stream)
        names = dict(double.counters.launches_by_name)
        syncs = [site for site in double.counters.sync_sites if site.startswith("mgcaffe/")]
    want = [[(a + b) / np.float32(2) for a, b in zip(g0, g1)]
            for g0, g1 in zip(gradients(0, iterations), gradients(1, iterations))]
    for got, ex, gated in results:
        assert ex.mode == ("stream" if backend == "nccl" else "staged")
        assert ex.in_place_groups == (2 if flat and backend == "nccl" else 0)
        for it in range(iterations):
            for a, b in zip(got[it], want[it]):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        if ex.per_layer:
            assert gated == [1] * 4 * iterations, gated
    for a, b in zip(results[0][0][-1], results[1][0][-1]):
        np.testing.assert_array_equal(a, b)  # every rank bit-identical
    # host waits: none on the stream path's main thread (the gate is an event; NCCL's
    # synchronize polls an event on the communication thread), the staged path's on the
    # communication thread only
    assert all("staging.py" in site and " wait " in site for site in syncs), syncs
    if backend == "nccl":
        # every collective on a communicator's own stream, none on the compute stream
        nccl = {k: v for k, v in names.items() if k.startswith("nccl.")}
        assert nccl and not any(s.startswith("null") for s in streams if "nccl" in s)
        kinds = {m.kind for m in results[0][1].messages}
        if "rs" in kinds:
            assert names["nccl.reduceScatter"] > 0 and names["nccl.allGather"] > 0


def test_nccl_halves_leave_the_sum_with_a_tail_under_the_ranks_count():
    """7 elements over 2 ranks: blocks of 3 by NCCL's reduce-scatter, the last element
    all-reduced whole; the all-gather completes the sum on every rank."""
    with cupy_double.installed(devices=2) as double:
        cupy = double.cupy
        comms = LocalWorld(2, timeout=20).communicators()

        def rank(r):
            cupy.cuda.Device(r).use()
            comm = NcclCommunicator(comms[r], timeout=20)
            buf = cupy.asarray(np.arange(7, dtype=np.float32) * (r + 1))
            comm.reduce_scatter_sum(buf)
            comm.allgather_blocks(buf)
            return buf.get()

        results, errors = run_ranks(2, rank)
        calls = dict(double.counters.launches_by_name)
    assert errors == [None, None], errors
    for got in results:
        np.testing.assert_array_equal(got, np.arange(7, dtype=np.float32) * 3)
    assert calls["nccl.reduceScatter"] == 2 and calls["nccl.allGather"] == 2
    assert calls["nccl.allReduce"] == 2  # the tail, once per rank

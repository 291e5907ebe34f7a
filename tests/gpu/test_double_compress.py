"""Compressed gradients (float16) on the NCCL stream path, on the CuPy double: two ranks as
threads, every kind of schedule; the casts are kernels on the communicator's stream (counted),
the overflow check one host wait per compressed message; bfloat16 is refused on the device in
one line (CuPy has no bfloat16 arrays)."""

from __future__ import annotations

from types import SimpleNamespace

import cupy_double
import numpy as np
import pytest
from comm_fakes import GROUPS, SCHEDULES, device_blobs, rank_gradients, run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.backends.nccl import NcclCommunicator
from mgcaffe.comm.runtime.executor import GradientExecutor
from mgcaffe.errors import CommError

pytestmark = pytest.mark.timeout(120)


def gradients(rank: int, iterations: int) -> list[list[np.ndarray]]:
    """Rank `rank`'s local gradients per iteration (comm_fakes.rank_gradients, this file's
    draw)."""
    return rank_gradients(rank, iterations, seed=29)


def run(double, schedule, flat, formats, iterations=2, backend="nccl"):
    cupy = double.cupy
    comms = LocalWorld(2, timeout=20).communicators()
    plan = SimpleNamespace(groups=GROUPS, schedule=schedule, formats=formats)

    def rank(r):
        cupy.cuda.Device(r).use()
        comm = NcclCommunicator(comms[r], timeout=20) if backend == "nccl" else comms[r]
        params, layers = device_blobs(cupy, flat)
        ex = GradientExecutor(layers, params, plan, comm, timeout=20)
        assert ex.mode == ("stream" if backend == "nccl" else "staged")
        got = []
        for grads in gradients(r, iterations):
            for layer in reversed(layers):
                for p in layer.param_ids:
                    params[p].diff[...] = cupy.asarray(grads[p])
                ex.on_learnable_done(layer.index)
            if ex.per_layer:
                for k in (1, 2, 3, 4):
                    ex.wait_layer(k)
            else:
                ex.wait()
            got.append([p.diff.get() for p in params])
        ex.close()
        return got, ex

    results, errors = run_ranks(2, rank, timeout=60)
    assert errors == [None, None], errors
    return results


def round_bf16(x: np.ndarray) -> np.ndarray:
    m, e = np.frexp(x.astype(np.float64))
    return np.ldexp(np.rint(m * 256.0) / 256.0, e).astype(np.float32)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["barrier", "reduce-scatter, all-gather"])
def test_the_staged_path_casts_on_the_host_both_formats(fmt, name):
    """Device diffs over a host communicator: the payload is cast in pinned host memory,
    so bfloat16 is available there too."""
    with cupy_double.installed(devices=2) as double:
        results = run(double, SCHEDULES[name], False, [fmt, fmt], backend="staged")
    rnd = (lambda x: x.astype(np.float16).astype(np.float32)) if fmt == "float16" \
        else round_bf16
    half = np.float32(2)
    for it, (g0, g1) in enumerate(zip(gradients(0, 2), gradients(1, 2))):
        for p, (a, b) in enumerate(zip(g0, g1)):
            want = rnd(rnd(a / half) + rnd(b / half))
            for got, _ in results:
                np.testing.assert_array_equal(got[it][p], want)


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("flat", [True, False], ids=["in place", "packed"])
def test_float16_on_the_stream_path_equals_the_numpy_reference(name, flat):
    iterations = 2
    with cupy_double.installed(devices=2) as double:
        results = run(double, SCHEDULES[name], flat, ["float16", "float16"], iterations)
    half = np.float32(2)
    for it, (g0, g1) in enumerate(zip(gradients(0, iterations), gradients(1, iterations))):
        for p, (a, b) in enumerate(zip(g0, g1)):
            # two ranks: the float16 sum of the two halves, rounded once (what NCCL sums)
            want = ((a / half).astype(np.float16) + (b / half).astype(np.float16)
                    ).astype(np.float32)
            for got, _ in results:
                np.testing.assert_array_equal(got[it][p], want)


def test_the_casts_are_kernels_on_the_stream_and_counted():
    """Barrier plan, 2 groups, 2 iterations, 2 ranks (8 messages). float32: the all-reduce
    and one division per message. float16: the division is the cast in (a divide into the
    float16 payload), then the all-reduce in float16, the check (isfinite, all) and its
    one-element read, and the cast back (copyto); every launch on NCCL's stream; one wire
    buffer per rank."""
    counts = {}
    for fmt in ("float16", "float32"):
        with cupy_double.installed(devices=2) as double:
            run(double, SCHEDULES["barrier"], True, [fmt, fmt])
            counts[fmt] = dict(double.counters.launches_by_name)
            streams = dict(double.counters.launches_by_stream)
        assert not any(s.startswith("null") for s in streams if "nccl" in s)
    f16, f32 = counts["float16"], counts["float32"]
    messages = 2 * 2 * 2  # groups x iterations x ranks
    for names in (f16, f32):
        assert names["nccl.allReduce"] == names["divide"] == messages
    assert f16["isfinite"] == f16["all"] == f16["copyto"] == messages
    assert "isfinite" not in f32 and "copyto" not in f32
    assert f16["memcpy d2h"] - f32["memcpy d2h"] == messages  # the check's answer
    assert f16["zeros"] - f32["zeros"] == 2  # a wire buffer per rank, made once


def test_bfloat16_on_the_device_is_refused_in_one_line():
    with cupy_double.installed(devices=2) as double:
        cupy = double.cupy
        comms = LocalWorld(2, timeout=20).communicators()
        plan = SimpleNamespace(groups=GROUPS, formats=["bfloat16", "bfloat16"])

        def rank(r):
            cupy.cuda.Device(r).use()
            comm = NcclCommunicator(comms[r], timeout=20)
            params, layers = device_blobs(cupy, True)
            with pytest.raises(CommError) as err:
                GradientExecutor(layers, params, plan, comm, timeout=20)
            return str(err.value)

        results, errors = run_ranks(2, rank, timeout=60)
    assert errors == [None, None], errors
    for msg in results:
        assert "\n" not in msg and "bfloat16 is not available" in msg
        assert "available: float32, float16" in msg

"""Communicators: the in-process world (with its checks) and MPI under mpiexec."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from comm_fakes import run_mpi, run_ranks

from mgcaffe.comm.backends.local import LocalWorld, SingleCommunicator
from mgcaffe.comm.backends.mpi import launched_by_mpi
from mgcaffe.comm.training.trainer import world
from mgcaffe.errors import CommError

CHECKS = Path(__file__).resolve().parents[1] / "mpi" / "comm_checks.py"


def test_single_rank_without_launcher_does_not_use_mpi(monkeypatch):
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    comm, rank, size = world(log_level=None)
    assert isinstance(comm, SingleCommunicator) and (rank, size) == (0, 1)
    buf = np.arange(5, dtype=np.float32)
    comm.allreduce_sum(buf)
    assert np.array_equal(buf, np.arange(5, dtype=np.float32))
    assert comm.broadcast("x") == "x" and comm.allgather(3) == [3]


def test_launcher_detection():
    assert launched_by_mpi({"PMI_RANK": "0"})
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    assert not launched_by_mpi({"HOME": "/"})


@pytest.mark.parametrize("bad, message", [
    (np.zeros(3, np.float64), "must be float32"),
    (np.zeros((4, 4), np.float32)[:, 1], "must be C-contiguous"),
    ([1.0, 2.0], "must be a numpy array"),
])
def test_allreduce_buffer_is_checked(bad, message):
    with pytest.raises(CommError, match=f"rank 0: all-reduce buffer {message}"):
        SingleCommunicator().allreduce_sum(bad)


def test_local_world_collectives():
    n = 3
    comms = LocalWorld(n, timeout=5).communicators()

    def rank_main(r):
        c = comms[r]
        buf = np.full(4, r + 1, np.float32)
        c.allreduce_sum(buf)
        arr = np.full(2, float(r), np.float32)
        c.broadcast(arr, root=2)
        return (buf.tolist(), arr.tolist(), c.broadcast({"r": r}, root=1), c.allgather(r),
                c.any_true([r == 0, False]))

    results, errors = run_ranks(n, rank_main)
    assert errors == [None] * n
    for res in results:
        assert res == ([6.0] * 4, [2.0, 2.0], {"r": 1}, [0, 1, 2], [True, False])


def test_local_world_refuses_mismatched_collectives():
    comms = LocalWorld(2, timeout=1).communicators()

    def rank_main(r):
        if r == 0:
            comms[0].allreduce_sum(np.zeros(3, np.float32))
        else:
            comms[1].barrier()

    _, errors = run_ranks(2, rank_main)
    assert any(isinstance(e, CommError) and "is barrier here but allreduce" in str(e)
               for e in errors)


def test_local_world_times_out_naming_missing_ranks():
    comms = LocalWorld(3, timeout=0.3).communicators()
    with pytest.raises(CommError, match=r"rank 0: barrier #1 timed out after 0.3 s waiting for "
                                        r"rank\(s\) \[1, 2\]"):
        comms[0].barrier()


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n, wait", [(2, "poll"), (4, "poll"), (2, "block")])
def test_mpi_collectives(n, wait):
    status, out, _ = run_mpi(n, [CHECKS, "collectives", "--wait", wait], timeout=90)
    assert status == 0, out
    # launcher output of several ranks may interleave within a line: search, do not split
    assert sorted(int(r) for r in re.findall(r"OK collectives rank (\d+)", out)) == \
        list(range(n)), out


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_mpi_allreduce_releases_the_gil():
    """While the communication thread is blocked in MPI_Allreduce, the main thread runs Python
    at (nearly) its full rate: the backward pass really overlaps communication."""
    status, out, _ = run_mpi(2, [CHECKS, "gil", "--wait", "block"], timeout=90)
    assert status == 0, out
    result = json.loads(re.search(r"RESULT (\{.*?\})", out).group(1))
    # held GIL: the main thread could not run at all (ratio ~0); CPU contention from other
    # processes on this 2-core machine moves the ratio around 1
    assert result["ratio"] > 0.2, result


def test_blas_releases_the_gil():
    """The other half of the overlap: while the main thread is inside a large matrix product
    (backward's GEMMs), another thread keeps running Python. A held GIL would stop it."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    def spin(seconds):
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n

    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    # one BLAS thread: the question is the GIL, and a second BLAS thread would take the core
    # the counting thread needs on a 2-core machine
    with threadpool_limits(limits=1, user_api="blas"):
        baseline = spin(0.3) / 0.3
        a = np.random.default_rng(0).standard_normal((1500, 1500), dtype=np.float32)
        counted = []
        t = threading.Thread(target=lambda: counted.append(spin(0.4) / 0.4))
        t.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.4:  # GEMMs for the whole time the thread counts
            a @ a
        t.join()
    assert counted[0] > 0.2 * baseline, (counted, baseline)

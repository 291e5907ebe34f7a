"""Faults end every rank quickly: watchdog, failures in a rank or its communication thread,
SIGKILL and a stuck peer under mpiexec; weight checksums."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from comm_fakes import run_mpi, run_ranks

from mgcaffe.comm.backends.local import LocalWorld, SingleCommunicator
from mgcaffe.comm.training.faults import Watchdog, check_in_sync, weights_checksum
from mgcaffe.errors import CommError

CHECKS = Path(__file__).resolve().parents[1] / "mpi" / "comm_checks.py"


def test_watchdog_fires_on_a_stuck_operation():
    fired = []
    wd = Watchdog(SingleCommunicator(), 0.2, on_expire=fired.append)
    t0 = time.perf_counter()
    with wd.guard("all-reduce of group 7"):
        while not fired and time.perf_counter() - t0 < 3:
            time.sleep(0.01)
    assert fired == ["all-reduce of group 7"]
    assert 0.15 < time.perf_counter() - t0 < 1.0
    wd.close()


def test_watchdog_quiet_when_operations_finish_in_time():
    fired = []
    wd = Watchdog(SingleCommunicator(), 0.3, on_expire=fired.append)
    for _ in range(20):
        with wd.guard("quick"):
            time.sleep(0.02)
    time.sleep(0.4)
    wd.close()
    assert fired == [] and wd.expired is None


def test_watchdog_guards_cost_no_thread_wakeup():
    """A guard per all-reduce: the watchdog thread must not be woken for each one (a thread
    switch per message slows backward on busy cores); a short deadline still wakes it."""
    fired = []
    wd = Watchdog(SingleCommunicator(), 60.0, on_expire=fired.append)
    time.sleep(0.05)  # the thread has looked once and sleeps
    before = wd.checks
    for _ in range(200):
        with wd.guard("all-reduce"):
            pass
    assert wd.checks - before <= 2  # (its idle look once a second may fall in here)
    t0 = time.perf_counter()
    with wd.guard("stuck", timeout=0.1):
        while not fired and time.perf_counter() - t0 < 3:
            time.sleep(0.01)
    assert fired == ["stuck"] and time.perf_counter() - t0 < 0.5
    wd.close()


def test_watchdog_default_aborts_the_world():
    world = LocalWorld(2, timeout=30)
    comms = world.communicators()
    wd = Watchdog(comms[0], 0.2)
    with pytest.raises(CommError, match="aborted by rank 0 \\(exit status 3\\)"):
        with wd.guard("barrier"):
            comms[0].barrier()  # rank 1 never comes; the abort releases us
    assert world.aborted == (0, 3)


def test_check_in_sync_names_diverged_ranks():
    comms = LocalWorld(3, timeout=5).communicators()
    weights = [[np.ones(5, np.float32), np.zeros(3, np.float32)] for _ in range(3)]
    weights[2][1][0] = 1e-7

    def rank_main(r):
        check_in_sync(comms[r], weights[r], iteration=40)

    _, errors = run_ranks(3, rank_main)
    assert all(isinstance(e, CommError) for e in errors)
    assert "weights diverged at iteration 40: rank(s) [2] differ from rank 0" in str(errors[0])
    assert weights_checksum(weights[0]) == weights_checksum(weights[1])


def test_check_in_sync_passes_identical_weights():
    comms = LocalWorld(2, timeout=5).communicators()
    _, errors = run_ranks(2, lambda r: check_in_sync(comms[r], [np.ones(4, np.float32)], 1))
    assert errors == [None, None]


# ------------------------------------------------------------------ under mpiexec
FAULTS = {
    # fault: (seconds every rank must be gone by, what the log must say)
    "raise-main": (20, "rank 1: RuntimeError: injected failure in the main thread"),
    "raise-thread": (20, "rank 1: communication thread failed: RuntimeError: injected"),
    "sigkill": (20, None),
    "stall": (25, "rank 0: all-reduce of group"),
}


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_ends_every_rank(fault):
    limit, message = FAULTS[fault]
    status, out, seconds = run_mpi(2, [CHECKS, "faulty", "--fault", fault, "--timeout", "3"],
                                   timeout=60)
    assert status not in (None, 0), out
    assert f"FAULT {fault} rank 1" in out, out
    assert "no fault happened" not in out
    assert seconds < limit, out
    if message:
        assert message in out, out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_under_four_ranks():
    status, out, seconds = run_mpi(4, [CHECKS, "faulty", "--fault", "sigkill", "--rank", "2",
                                       "--timeout", "3"], timeout=60)
    assert status not in (None, 0) and seconds < 30, out


def test_threads_left_running_by_this_module_are_daemons():
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("mgcaffe-"))

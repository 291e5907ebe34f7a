"""Network emulation: each all-reduce lasts at least a + b*M, and only the all-reduce."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mgcaffe.comm.backends.emulate import EmulatedCommunicator, sleep_overshoot
from mgcaffe.comm.backends.local import SingleCommunicator
from mgcaffe.comm.model.cost import CostModel


class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.slept = []

    def clock(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


def test_sleeps_for_the_difference():
    fc = FakeClock()
    cost = CostModel(1e-3, 1e-9)
    comm = EmulatedCommunicator(SingleCommunicator(), cost, 8, sleep=fc.sleep, clock=fc.clock,
                                overshoot=0.0)
    buf = np.zeros(250_000, np.float32)  # 1 MB: 1 ms + 1 ms
    comm.allreduce_sum(buf)
    assert fc.slept == [pytest.approx(2e-3)]
    assert comm.padded_s == pytest.approx(2e-3) and comm.calls == 1


def test_no_sleep_when_the_real_call_is_slower():
    fc = FakeClock()

    class Slow(SingleCommunicator):
        def allreduce_sum(self, buf):
            fc.t += 1.0

    comm = EmulatedCommunicator(Slow(), CostModel(1e-3, 0.0), 8, sleep=fc.sleep,
                                clock=fc.clock, overshoot=0.0)
    comm.allreduce_sum(np.zeros(4, np.float32))
    assert fc.slept == []


def test_real_time_is_at_least_the_model():
    cost = CostModel(3e-3, 2e-9)
    comm = EmulatedCommunicator(SingleCommunicator(), cost, 8)
    buf = np.zeros(1 << 18, np.float32)
    for _ in range(3):
        t0 = time.perf_counter()
        comm.allreduce_sum(buf)
        took = time.perf_counter() - t0
        # at least the model up to the sleep correction, and not grossly more
        assert cost.time(buf.nbytes) - comm.overshoot - 1e-4 <= took < cost.time(buf.nbytes) + 0.05


def test_other_collectives_are_not_slowed():
    fc = FakeClock()
    comm = EmulatedCommunicator(SingleCommunicator(), CostModel(1.0, 0.0), 8, sleep=fc.sleep,
                                clock=fc.clock, overshoot=0.0)
    comm.barrier()
    assert comm.broadcast("x") == "x" and comm.allgather(1) == [1]
    assert comm.any_true([True]) == [True]
    assert fc.slept == []
    assert "EMULATION" in comm.describe() and "8 emulated nodes" in comm.describe()


def test_sleep_overshoot_is_small_and_non_negative():
    assert 0.0 <= sleep_overshoot() < 5e-3


def test_the_halves_of_an_all_reduce_last_half_of_it_each():
    fc = FakeClock()
    comm = EmulatedCommunicator(SingleCommunicator(), CostModel(1e-3, 1e-9), 8, sleep=fc.sleep,
                                clock=fc.clock, overshoot=0.0)
    buf = np.zeros(250_000, np.float32)  # T = 2 ms
    comm.reduce_scatter_sum(buf)
    comm.allgather_blocks(buf)
    assert fc.slept == [pytest.approx(1e-3), pytest.approx(1e-3)]
    twin = comm.duplicate()  # the same emulation over a duplicate of the real one
    assert twin.cost == comm.cost and twin.inner is not comm.inner

"""kernels.layer_way: a layer call site runs on one thread when that measured faster."""

from __future__ import annotations

import threading

import numpy as np

from mgcaffe.cpu import layer_way, parallel
from mgcaffe.cpu.engine import CpuEngine
from mgcaffe.cpu.layer_way import LayerWay
from mgcaffe.cpu.parallel import ChunkRunner, for_each_chunk


class FakeBlas:
    """Stands for a threadpoolctl library controller: records the thread counts set."""

    def __init__(self, threads):
        self.threads = threads
        self.history = []

    @property
    def num_threads(self):
        return self.threads

    def set_num_threads(self, n):
        self.threads = n
        self.history.append(n)


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def make_layer(clock, blas, cost, runner):
    """A 'layer' whose call costs cost[blas threads] and runs a chunk split it records."""
    seen = []

    def layer():
        names = set()
        for_each_chunk(np, 4, lambda a, b: names.add(threading.current_thread().name),
                       cache_sized=False, runner=runner)
        seen.append((blas.threads, len(names) > 1 or None))
        clock.now += cost[blas.threads]
        return "out"
    return layer, seen


def test_a_layer_that_is_faster_on_one_thread_settles_there_and_restores_the_blas():
    clock, blas = Clock(), FakeBlas(2)
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, adaptive=False)
    way = LayerWay(2, blas=[blas], clock=clock)
    layer, seen = make_layer(clock, blas, {2: 5.0, 1: 1.0}, runner)
    for _ in range(parallel.CALLS_TO_SETTLE):
        assert way.call("conv1", layer) == "out"
    assert way.way("conv1") is False
    seen.clear()
    for _ in range(10):
        way.call("conv1", layer)
    assert seen == [(1, None)] * 10  # BLAS at one thread, chunks on the calling thread only
    assert blas.threads == 2          # put back after every call


def test_a_layer_that_pays_on_all_threads_keeps_them_and_sites_are_separate():
    clock, blas = Clock(), FakeBlas(2)
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, adaptive=False)
    way = LayerWay(2, blas=[blas], clock=clock)
    fast, _ = make_layer(clock, blas, {2: 0.5, 1: 1.0}, runner)
    slow, _ = make_layer(clock, blas, {2: 5.0, 1: 1.0}, runner)
    for _ in range(parallel.CALLS_TO_SETTLE):
        way.call("a", fast)
        way.call("b", slow)
    assert (way.way("a"), way.way("b")) == (True, False)


def test_an_error_in_the_layer_still_restores_the_blas():
    clock, blas = Clock(), FakeBlas(2)
    way = LayerWay(2, blas=[blas], clock=clock)
    calls = []

    def failing():
        calls.append(blas.threads)
        raise ValueError("bad layer")

    for _ in range(parallel.CALLS_TO_SETTLE):
        try:
            way.call("x", failing)
        except ValueError:
            pass
    assert 1 in calls and blas.threads == 2


def test_off_unless_the_engine_is_adaptive():
    assert CpuEngine(2).layer_way.threads == 1  # plain calls: reproducible bits
    assert CpuEngine(2, adaptive=True).layer_way.threads == 2
    # any array module other than numpy: a plain call
    assert layer_way.call_layer(object(), LayerWay(2), "k", lambda: 7) == 7


def test_a_one_thread_call_restores_the_count_it_found_not_its_own():
    """Another net's setting (or the user's) stays: a LayerWay of 2 threads that runs a
    call on one BLAS thread puts back the 3 it found, not 2."""
    clock, blas = Clock(), FakeBlas(3)
    way = LayerWay(2, blas=[blas], clock=clock)
    layer, seen = make_layer(clock, blas, {3: 5.0, 1: 1.0}, ChunkRunner(1))
    for _ in range(parallel.CALLS_TO_SETTLE):
        way.call("conv1", layer)
    assert 1 in [threads for threads, _ in seen]
    assert blas.threads == 3 and blas.history[-1] == 3


def test_a_layer_call_names_its_call_site_for_the_chunk_runner():
    """The net's layer calls go through call_layer: inside, the runner's records are the
    layer call's own (parallel.call_site); after it, and off numpy, none is named."""
    seen = []
    way = LayerWay(1)
    layer_way.call_layer(np, way, ("conv1", 0), lambda: seen.append(parallel.site_scope()))
    layer_way.call_layer(object(), way, ("conv1", 1),
                         lambda: seen.append(parallel.site_scope()))
    assert seen == [("conv1", 0), None]
    assert parallel.site_scope() is None

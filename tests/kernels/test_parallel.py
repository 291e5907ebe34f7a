"""kernels.parallel: chunks cover the range once, run on several threads, errors surface."""

from __future__ import annotations

import signal
import threading

import numpy as np
import pytest

from mgcaffe.cpu import parallel
from mgcaffe.cpu.parallel import ChunkRunner, for_each_chunk


def record_chunks(runner, count, **options):
    chunks, lock = [], threading.Lock()

    def body(start, stop):
        with lock:
            chunks.append((start, stop))

    for_each_chunk(np, count, body, runner=runner, **options)
    return sorted(chunks)


def covers_once(chunks, count):
    return [i for start, stop in chunks for i in range(start, stop)] == list(range(count))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("count", [1, 2, 7, 64])
@pytest.mark.parametrize("item_elements, chunk_elements", [(1, 1), (10, 25), (100, 10)])
def test_cache_sized_chunks_cover_the_range_once(threads, count, item_elements,
                                                 chunk_elements):
    runner = ChunkRunner(threads, chunk_elements=chunk_elements, serial_below=0)
    chunks = record_chunks(runner, count, item_elements=item_elements)
    assert covers_once(chunks, count)
    grain = max(1, chunk_elements // item_elements)
    assert all(stop - start <= grain for start, stop in chunks)


@pytest.mark.parametrize("threads, count, expected", [(2, 8, 2), (3, 8, 3), (4, 2, 2)])
def test_one_chunk_per_thread_without_cache_sizing(threads, count, expected):
    runner = ChunkRunner(threads, chunk_elements=1, serial_below=0)
    chunks = record_chunks(runner, count, cache_sized=False)
    assert covers_once(chunks, count)
    assert len(chunks) == expected


def test_small_work_and_other_array_modules_get_one_call():
    runner = ChunkRunner(2, chunk_elements=1, serial_below=100)
    assert record_chunks(runner, 9, item_elements=11) == [(0, 9)]  # 99 elements < 100
    assert len(record_chunks(runner, 10, item_elements=10)) > 1
    calls = []
    # Any module other than numpy (CuPy) parallelises each call itself: one call.
    for_each_chunk(object(), 50, lambda a, b: calls.append((a, b)), runner=runner)
    assert calls == [(0, 50)]
    for_each_chunk(np, 0, lambda a, b: calls.append((a, b)), runner=runner)
    assert calls == [(0, 50)]


def test_chunks_run_on_two_threads_at_once():
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0)
    barrier = threading.Barrier(2, timeout=10)
    names = set()

    def body(start, stop):
        names.add(threading.current_thread().name)
        barrier.wait()  # only returns when a second thread is inside a chunk too

    for_each_chunk(np, 2, body, cache_sized=False, runner=runner)
    assert len(names) == 2


def test_an_error_in_a_chunk_is_raised_in_the_caller_and_stops_the_hand_out():
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0)
    done = []

    def body(start, stop):
        if start == 3:
            raise RuntimeError("chunk 3 failed")
        done.append(start)

    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        for_each_chunk(np, 100, body, runner=runner)
    assert len(done) < 99
    # The runner still works afterwards.
    assert covers_once(record_chunks(runner, 10), 10)


def test_a_nested_call_runs_serially_instead_of_waiting_on_busy_threads():
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0)
    inner = []

    def body(start, stop):
        for_each_chunk(np, 4, lambda a, b: inner.append((a, b)), runner=runner)

    for_each_chunk(np, 4, body, runner=runner)
    assert sorted(inner) == sorted([(i, i + 1) for i in range(4)] * 4)


def test_runner_rejects_bad_sizes():
    with pytest.raises(ValueError, match="threads and chunk_elements must be >= 1"):
        ChunkRunner(0)
    with pytest.raises(ValueError, match="threads and chunk_elements must be >= 1"):
        ChunkRunner(2, chunk_elements=0)


def test_default_threads_are_the_thread_choice(monkeypatch):
    from mgcaffe.cpu import cores

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    assert parallel.default_threads() == 3 == cores.choose().threads


class FakeClock:
    """A clock the body advances: threaded calls 'take' `threaded` s, serial ones `serial`."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def timed_body(clock, cost, seen):
    def body(start, stop):
        threaded = threading.current_thread().name.startswith("mgcaffe-chunks") or \
            getattr(parallel._in_chunk, "active", False)
        seen.append(threaded)
        clock.now += cost[threaded] / 4  # 4 chunks per call below
    return body


@pytest.mark.parametrize("threaded_cost, settles_threaded", [(5.0, False), (0.25, True)])
def test_a_call_site_settles_on_the_faster_way(threaded_cost, settles_threaded):
    """A decisive winner (5.6x and 3.6x past the margin, beyond DECISIVE) runs for
    RETRY_EVERY calls."""
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, clock=clock)
    cost = {True: threaded_cost, False: 1.0}
    seen = []
    body = timed_body(clock, cost, seen)
    for _ in range(parallel.CALLS_TO_SETTLE):  # the untimed first call, the trials
        seen.clear()
        for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is settles_threaded
    runs = []
    for _ in range(parallel.RETRY_EVERY - 1 - parallel.CALLS_TO_SETTLE):
        seen.clear()
        for_each_chunk(np, 4, body, runner=runner)
        runs.append(any(seen))
    assert runs == [settles_threaded] * len(runs)


@pytest.mark.parametrize("threaded_cost, settled_after_two", [
    (3.0, False), (0.4, True),   # one way took >= DECISIVE times the other: no more trials
    (1.5, None), (0.7, None),    # closer: both ways get all their trials
])
def test_trials_alternate_and_end_early_when_one_way_loses_by_far(threaded_cost,
                                                                   settled_after_two):
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, clock=clock)
    cost = {True: threaded_cost, False: 1.0}
    seen = []
    body = timed_body(clock, cost, seen)
    ways = []
    for _ in range(3):
        seen.clear()
        for_each_chunk(np, 4, body, runner=runner)
        ways.append(any(seen))
    assert ways == [True, True, False]  # an untimed threaded call, then one call each way
    assert runner.way(body, 4, 1) is (None if settled_after_two is None else settled_after_two)
    if settled_after_two is not None:
        seen.clear()
        for_each_chunk(np, 4, body, runner=runner)
        assert any(seen) is settled_after_two  # the third call already runs the faster way


def test_the_first_call_is_not_timed():
    """Its one-time costs (allocation, compiling, starting threads) are not the way's speed."""
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, clock=clock)
    cost = {True: 100.0, False: 1.0}  # the first, threaded call pays 100x
    body = timed_body(clock, cost, [])
    for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is None
    cost[True] = 0.5  # from then on the threads pay
    for _ in range(parallel.CALLS_TO_SETTLE - 1):
        for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is True


def test_close_ways_are_retried_sooner_than_decisive_ones():
    site = parallel.CallSite()
    m = parallel.THREADED_MARGIN
    for threaded, serial in ((1.0, 1.0), (0.95 * m, 1.0)):
        site.estimate = {True: threaded, False: serial}
        assert site.retry_every() == parallel.RETRY_SOONEST
    halfway = 1 + (parallel.DECISIVE - 1) / 2  # halfway to DECISIVE: halfway in calls
    site.estimate = {True: halfway * m, False: 1.0}
    assert site.retry_every() == round(parallel.RETRY_EVERY / 2)
    for threaded, serial in ((4.0, 1.0), (0.2, 1.0)):
        site.estimate = {True: threaded, False: serial}
        assert site.retry_every() == parallel.RETRY_EVERY


def test_a_site_a_disturbed_trial_settled_on_one_thread_is_corrected_soon():
    """Both threaded trials slowed to the serial time (the second core taken meanwhile):
    the site settles serial, but so narrowly that the threads are tried again within
    RETRY_SOONEST calls, and their real speed wins it back."""
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, clock=clock)
    cost = {True: 1.0, False: 1.0}
    body = timed_body(clock, cost, [])
    for _ in range(parallel.CALLS_TO_SETTLE):
        for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is False
    cost[True] = 0.5
    for _ in range(parallel.RETRY_SOONEST):
        for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is True


def test_a_settled_site_follows_a_change_of_load():
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, clock=clock)
    cost = {True: 0.5, False: 1.0}  # idle: the threads pay
    body = timed_body(clock, cost, [])
    for _ in range(parallel.CALLS_TO_SETTLE):
        for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is True
    cost[True] = 8.0  # a busy machine: each hand-off waits for a core
    for _ in range(4 * parallel.RETRY_EVERY):
        for_each_chunk(np, 4, body, runner=runner)
    assert runner.way(body, 4, 1) is False


def test_layer_calls_keep_separate_records_of_the_same_body_and_sizes():
    """Two layers hand out the same code over the same chunk count (as every convolution on
    the per-sample columns does): within their own `call_site` each settles on its own
    faster way, instead of one record comparing one layer's time with the other's."""
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0, clock=clock)
    costs = {"small": {True: 0.5, False: 1.0}, "large": {True: 50.0, False: 10.0}}
    cost = {}
    body = timed_body(clock, cost, [])
    for _ in range(parallel.CALLS_TO_SETTLE):
        for layer in ("small", "large"):
            cost.update(costs[layer])
            with parallel.call_site(layer):
                for_each_chunk(np, 4, body, runner=runner)
    assert parallel.site_scope() is None
    assert runner.way(body, 4, 1, scope="small") is True
    assert runner.way(body, 4, 1, scope="large") is False
    assert runner.way(body, 4, 1) is None  # no run outside a layer call


def test_both_ways_give_the_same_chunks():
    clock = FakeClock()
    runner = ChunkRunner(2, chunk_elements=25, serial_below=0, clock=clock)
    results = [record_chunks(runner, 64, item_elements=10)
               for _ in range(parallel.CALLS_TO_SETTLE)]
    assert all(r == results[0] for r in results) and covers_once(results[0], 64)


@pytest.mark.skipif(not hasattr(parallel.os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_helper_threads():
    runner = ChunkRunner(2, chunk_elements=1, serial_below=0)
    assert covers_once(record_chunks(runner, 4), 4)  # helpers started in the parent
    pid = parallel.os.fork()
    if pid == 0:  # the child: the inherited executor has no threads; a run must not hang
        signal.alarm(20)  # a hang kills the child: the test fails instead of waiting
        ok = covers_once(record_chunks(runner, 4), 4)
        parallel.os._exit(0 if ok else 1)
    _, status = parallel.os.waitpid(pid, 0)
    assert parallel.os.waitstatus_to_exitcode(status) == 0

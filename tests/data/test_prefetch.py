"""The prefetch thread: order, errors reaching the consumer, close(), no hang on a dead thread."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from mgcaffe.data.prefetch import Prefetcher
from mgcaffe.errors import DataError


def test_batches_arrive_in_order_and_queue_is_bounded():
    counter = itertools.count()
    p = Prefetcher(lambda: next(counter), depth=2, poll_s=0.01)
    try:
        assert [p.get(timeout=5) for _ in range(5)] == [0, 1, 2, 3, 4]
        time.sleep(0.1)
        # At most depth queued plus one being put: the producer is not running ahead freely.
        assert next(counter) <= 5 + 2 + 1
    finally:
        p.close()


def test_producer_error_surfaces_in_order_with_its_message():
    items = iter([1, 2])

    def produce():
        try:
            return next(items)
        except StopIteration:
            raise DataError("layer 'data': LMDB 'x' record '0003' is broken") from None

    p = Prefetcher(produce, depth=4, poll_s=0.01)
    assert p.get(timeout=5) == 1 and p.get(timeout=5) == 2
    for _ in range(2):  # every later get raises it again
        with pytest.raises(DataError, match="record '0003' is broken"):
            p.get(timeout=5)
    p.close()


def test_foreign_exception_is_wrapped_naming_the_owner():
    def produce():
        raise KeyError("label")

    p = Prefetcher(produce, name="layer 'd' (Data)", poll_s=0.01)
    with pytest.raises(DataError, match="layer 'd' \\(Data\\).*KeyError.*label") as info:
        p.get(timeout=5)
    assert isinstance(info.value.__cause__, KeyError)
    p.close()


def test_close_stops_a_blocked_producer():
    p = Prefetcher(lambda: 0, depth=1, poll_s=0.01)
    time.sleep(0.05)  # queue full: the producer is blocked putting
    assert p.alive
    p.close()
    assert not p.alive
    with pytest.raises(DataError, match="closed"):
        p.get()


def test_thread_that_died_silently_does_not_hang_the_consumer():
    class Dying(Prefetcher):
        def _run(self):
            return  # the thread ends without a batch or an error

    p = Dying(lambda: 0, poll_s=0.01)
    start = time.monotonic()
    with pytest.raises(DataError, match="stopped without a batch"):
        p.get()
    assert time.monotonic() - start < 2


def test_live_but_stuck_producer_times_out():
    release = threading.Event()
    p = Prefetcher(lambda: release.wait(), poll_s=0.01)
    with pytest.raises(DataError, match="no batch after 0.2 s"):
        p.get(timeout=0.2)
    release.set()
    p.close()


def test_thread_is_a_daemon():
    p = Prefetcher(lambda: 0, poll_s=0.01)
    assert p._thread.daemon
    p.close()

"""OnlineProfile's robust statistics: medians over a recent window, stability, spread."""

from __future__ import annotations

import pytest

from mgcaffe.comm.timing import OnlineProfile


def _feed(prof, forward, backward):
    # ready(k) for k = L..1 from a forward span [0, forward] and per-layer backward times
    t, ready = forward, {}
    for k in range(len(backward), 0, -1):
        t += backward[k - 1]
        ready[k] = t
    prof.add(0.0, forward, ready)


def test_median_of_recent_iterations_forgets_the_warm_up():
    prof = OnlineProfile("m", ["a", "b"], [10, 20], skip=1)
    _feed(prof, 9.0, [9.0, 9.0])  # skipped
    for _ in range(3):
        _feed(prof, 5.0, [4.0, 6.0])  # still warming: 13x slower than later
    for _ in range(4):
        _feed(prof, 0.4, [0.3, 0.5])
    assert len(prof) == 7
    assert not prof.stable()  # old half ~15, new half ~1.2
    p = prof.profile(recent=4)
    assert p.forward_time == 0.4
    assert [layer.backward_time for layer in p.layers] == pytest.approx([0.3, 0.5])
    assert prof.profile().forward_time == 0.4  # median of 7 with 4 fast ones


def test_stable_profile_and_its_spread_line():
    prof = OnlineProfile("m", ["a", "b"], [10, 20], skip=0)
    for jitter in (1.0, 1.02, 0.98, 1.01, 0.99, 1.0):
        _feed(prof, 1e-3 * jitter, [1e-3, 2e-3 * jitter])
    assert prof.stable()
    line = prof.describe_spread()
    assert "over 6 iteration(s)" in line and "median 4.00 ms" in line
    assert "0 of 2 layer(s)" in line


def test_too_few_samples_count_as_stable():
    prof = OnlineProfile("m", ["a"], [1], skip=0)
    _feed(prof, 1.0, [1.0])
    _feed(prof, 9.0, [9.0])
    assert prof.stable()

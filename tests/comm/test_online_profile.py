"""OnlineProfile's robust statistics: medians over a recent window, stability, spread."""

from __future__ import annotations

import pytest

from mgcaffe.comm.runtime.timing import OnlineProfile


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


def test_profile_is_the_median_of_ready_times_not_the_sum_of_layer_medians():
    from mgcaffe.comm.runtime.timing import median_profile  # noqa: PLC0415

    # ready times [t_f, ready(2), ready(1)]: [1, 2, 3], [1, 2, 7], [1, 6, 7]; the slow
    # moment falls on another layer each time. Per-layer medians would say 1 + 1 + 1 = 3
    # although two of the three iterations took 7.
    samples = [(1.0, [1.0, 1.0]), (1.0, [5.0, 1.0]), (1.0, [1.0, 5.0])]
    p = median_profile(samples, "m", ["a", "b"], [10, 20])
    assert p.forward_time == 1.0
    assert [layer.backward_time for layer in p.layers] == [5.0, 1.0]  # ready medians 2, 7
    assert [layer.params for layer in p.layers] == [10, 20]


def test_slowest_by_iteration_waits_for_whichever_rank_is_late_in_each_iteration():
    from mgcaffe.comm.runtime.timing import slowest_by_iteration  # noqa: PLC0415

    fast, late = (1.0, [1.0, 1.0]), (1.0, [6.0, 1.0])  # iterations of 3 and of 8
    rank0 = [(100.0, [100.0, 100.0]), fast, late, fast]  # one older sample: not aligned
    rank1 = [late, fast, fast]
    # per iteration the step takes 8, 8, 3 (median 8); each rank's own median is 3
    p = slowest_by_iteration([rank0, rank1], "m", ["a", "b"], [10, 20])
    assert p.forward_time == 1.0
    assert [layer.backward_time for layer in p.layers] == [6.0, 1.0]
    with pytest.raises(ValueError, match="no samples"):
        slowest_by_iteration([rank0, []], "m", ["a", "b"], [10, 20])


def test_prediction_is_the_median_of_each_iterations_timeline():
    from types import SimpleNamespace  # noqa: PLC0415

    from mgcaffe.comm.model.cost import CostModel  # noqa: PLC0415
    from mgcaffe.comm.training.replanner import Learnables, median_prediction  # noqa: PLC0415

    # layers a (input side), b; every message takes 1 s; wfbp sends b, then a.
    # Iterations (t_f, [t_b(a), t_b(b)]) and their timelines by hand:
    #   ready(b) = 1, ready(a) = 1: b 1-2, a 2-3 -> 3
    #   ready(b) = 0, ready(a) = 3: b 0-1, a 3-4 -> 4
    #   ready(b) = 0, ready(a) = 1: b 0-1, a 1-2 -> 2      median 3
    # while the median profile (ready(b) = 0, ready(a) = 1) would predict 2.
    steps = [(0.0, [0.0, 1.0]), (0.0, [3.0, 0.0]), (0.0, [1.0, 0.0])]
    net = Learnables("m", ["a", "b"], [1, 1], 4)
    plan = SimpleNamespace(groups=[["b"], ["a"]])
    assert median_prediction(plan, steps, CostModel(1.0, 0.0), net) == 3.0

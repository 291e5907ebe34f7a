"""T_ar from measurements: the measured curve, the fit check, and the re-plan's correction."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mgcaffe.comm.model.cost import CostModel, fit_relative
from mgcaffe.comm.model.cost_fit import (
    SizeTimes,
    check_fit,
    correct,
    fit_measured,
    monotone,
    summarise,
)
from mgcaffe.errors import PlanError

# The shape the issue measured over TCP at 1 Gbit/s between two hosts (seconds): a line
# through the small sizes predicts the 53.5 MB message 30% short.
SIZES = [4, 64, 1024, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 53_500_000]
TIMES = [60e-6, 62e-6, 80e-6, 0.4e-3, 3.1e-3, 11e-3, 46e-3, 175e-3, 580e-3]
SPREADS = [(t * 0.97, t * 1.04) for t in TIMES]


def test_monotone_by_hand():
    assert monotone([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert monotone([3, 2, 1]) == [2, 2, 2]
    assert monotone([1, 2, 3]) == [1, 2, 3]
    # a heavy point holds its value; the light one moves to it
    assert monotone([1, 5, 2], [1, 1, 1e9]) == pytest.approx([1, 2, 2], rel=1e-6)
    assert monotone([]) == []
    with pytest.raises(PlanError, match="positive finite weights"):
        monotone([1, 2], [1, 0])


def test_the_measured_curve_fits_every_size_the_line_misses():
    line, _ = fit_relative(SIZES, TIMES)
    assert check_fit(line, SIZES, TIMES, SPREADS).poor  # what the issue saw
    cost = fit_measured(SIZES, TIMES, SPREADS)
    assert cost.kind == "piecewise" and (cost.a, cost.b) == (line.a, line.b)
    check = check_fit(cost, SIZES, TIMES, SPREADS)
    assert check.outside() == [] and not check.poor and check.worst_error == 0
    assert cost.time(53_500_000) == 580e-3


def test_a_noisy_dip_is_smoothed_within_its_spread():
    # 4 KB measured faster than 1 KB by noise: the curve must not decrease, and the noisier
    # point (wide spread) yields, staying within its own spread
    sizes, times = [1024, 4096, 16384], [100e-6, 90e-6, 300e-6]
    spreads = [(98e-6, 102e-6), (70e-6, 120e-6), (290e-6, 310e-6)]
    cost = fit_measured(sizes, times, spreads)
    knots = [t for _, t in cost.times]
    assert knots == sorted(knots)
    assert check_fit(cost, sizes, times, spreads).outside() == []
    assert knots[0] == pytest.approx(100e-6, rel=0.01)  # the precise point barely moves


def test_the_curve_keeps_every_size_within_its_spread_when_a_curve_can():
    # the first, tightly measured size is slower than the next two (start-up benchmark over
    # TCP: 4 B 69.5 us, 64 B 58 us): least squares pulls 4 B below its spread, although a
    # non-decreasing curve through all three spreads exists (66-67 us at every size)
    sizes, times = [4, 64, 1024], [69.5e-6, 58e-6, 60e-6]
    spreads = [(66e-6, 73e-6), (50e-6, 70e-6), (59e-6, 67e-6)]
    cost = fit_measured(sizes, times, spreads)
    knots = [t for _, t in cost.times]
    assert knots == sorted(knots)
    assert check_fit(cost, sizes, times, spreads).outside() == []
    # where no non-decreasing curve meets every spread the least-squares curve stays
    apart = [(68e-6, 71e-6), (56e-6, 60e-6), (58e-6, 62e-6)]
    cost = fit_measured(sizes, times, apart)
    assert [t for _, t in cost.times] == pytest.approx(monotone(times, [
        1 / (hi - lo) ** 2 for lo, hi in apart]))


def test_check_fit_names_the_misses():
    cost = CostModel(0.0, 1e-8)  # 10 ms per MB
    check = check_fit(cost, [1_000_000, 2_000_000], [10e-3, 30e-3],
                      [(9e-3, 11e-3), (28e-3, 32e-3)])
    assert check.outside() == [2_000_000]
    assert check.misses() == [(2_000_000, pytest.approx(-1 / 3))]
    assert check.poor and check.worst_error == pytest.approx(1 / 3)
    assert "1 of 2 size(s) predicted outside their measured spread" in check.summary()
    # outside the spread but by less than 10%: not poor
    assert not check_fit(cost, [1_000_000], [10.5e-3], [(10.4e-3, 10.6e-3)]).poor


def test_summarise_groups_by_size_with_numpy_percentiles():
    rng = random.Random(3)
    xs = [rng.uniform(1, 2) for _ in range(11)]
    out = summarise([(64, x) for x in xs] + [(4, 1.0)])
    assert [s.nbytes for s in out] == [4, 64] and out[0].count == 1
    s = out[1]
    assert s.count == 11 and s.median == pytest.approx(np.median(xs))
    assert (s.p25, s.p75) == pytest.approx(tuple(np.percentile(xs, [25, 75])))


def _sizes(nbytes, times):
    xs = sorted(times)
    return SizeTimes(nbytes, float(np.median(xs)), float(np.percentile(xs, 25)),
                     float(np.percentile(xs, 75)), len(xs))


def test_correct_replaces_the_sizes_that_differ_and_keeps_the_rest():
    cost = fit_measured(SIZES, TIMES, SPREADS)
    # the whole gradient takes 650 ms in training (the issue), 4 MB as at start-up
    big = _sizes(53_500_000, [0.64, 0.65, 0.66, 0.65, 0.655])
    same = _sizes(4 << 20, [45e-3, 46e-3, 47e-3])
    fixed, changed = correct(cost, [same, big])
    assert changed == [big]
    assert fixed.time(53_500_000) == pytest.approx(0.65)
    assert fixed.time(4 << 20) == cost.time(4 << 20)
    assert fixed.time(1 << 20) == cost.time(1 << 20)
    assert "corrected at 1 size(s)" in fixed.origin
    # agreeing or too few messages: the model is returned as it was
    assert correct(cost, [same]) == (cost, [])
    assert correct(cost, [_sizes(53_500_000, [0.65, 0.66])]) == (cost, [])


def test_correct_follows_the_median_of_messages_that_take_two_speeds():
    # seven of nine whole gradients at 515 ms, two at 590-610 ms; T 596 ms (the start-up
    # benchmark's back-to-back calls) lies inside their 10-90% range but above the middle
    # half: the closing line measures the median iteration, so T becomes the median
    cost = CostModel(0, 0, times=((1 << 20, 10e-3), (53_500_000, 0.596)))
    twice = _sizes(53_500_000, [0.515] * 7 + [0.59, 0.61])
    assert twice.p25 < 0.596 and not twice.p75 >= 0.596
    fixed, changed = correct(cost, [twice])
    assert changed == [twice] and fixed.time(53_500_000) == pytest.approx(0.515)


def test_correct_keeps_t_non_decreasing_by_moving_the_start_up_points():
    cost = CostModel(0, 0, times=((1 << 20, 10e-3), (4 << 20, 40e-3), (16 << 20, 160e-3)))
    # 2 MB messages take 60 ms in training: more than the 4 MB start-up point
    slow = _sizes(2 << 20, [59e-3, 60e-3, 61e-3])
    fixed, _ = correct(cost, [slow])
    knots = [t for _, t in fixed.times]
    assert knots == sorted(knots)
    assert fixed.time(2 << 20) == pytest.approx(60e-3, rel=1e-5)  # the real message holds
    assert fixed.time(4 << 20) == pytest.approx(60e-3, rel=1e-5)  # the start-up point yields
    assert fixed.time(16 << 20) == 160e-3


def test_correct_reads_a_line_as_points_so_the_correction_stays_local():
    line = CostModel(1e-4, 8e-9)
    big = _sizes(50_000_000, [0.6, 0.61, 0.62])
    fixed, changed = correct(line, [big])
    assert changed == [big] and fixed.kind == "piecewise"
    assert fixed.time(50_000_000) == pytest.approx(0.61)
    for m in (4, 1024, 1 << 20, 4 << 20):  # far below it: the line, unchanged
        assert fixed.time(m) == pytest.approx(line.time(m))

"""T_ar(M) from measurements: the measured curve, how well a model fits, and its correction.

Pure functions of measured all-reduce times (the start-up benchmark's, or the real messages a
training run sent):

- `fit_measured(sizes, medians, spreads)`: the `piecewise` CostModel through the measured
  medians, made non-decreasing by weighted isotonic regression (a noisy size yields to its
  neighbours in proportion to its spread) and then moved into every size's spread where a
  non-decreasing curve through them all exists, with the paper's line a + b*M
  (`fit_relative`) of the same points as its a and b.
- `check_fit(cost, sizes, medians, spreads)`: per size, whether the model predicts it within
  its measured 10th-90th percentile spread; `FitCheck.poor` when some size is missed beyond
  its spread by more than POOR_MISS (the plan may then be far from the best).
- `summarise(samples)` and `correct(cost, measured)`: the re-plan's correction. `measured`
  holds the real messages' times per size; where the model's T lies outside the middle half
  of a size's real messages (their interquartile range), that size's median becomes a point
  of the curve (replacing a start-up
  point of the same size), and the start-up points yield where they would make T decrease
  (isotonic regression with the real messages weighted far above them). A `paper` model is
  first read as points of its line at the start-up benchmark's sizes (factors of 4), so that a
  correction stays local to the sizes measured.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import PlanError
from .cost import CostModel, fit_relative

__all__ = ["MIN_SAMPLES", "POOR_MISS", "FitCheck", "SizeTimes", "check_fit", "correct",
           "fit_measured", "monotone", "summarise"]

POOR_MISS = 0.10  # a size missed beyond its spread by more than this share of its median
MIN_SAMPLES = 3  # messages of one size needed before they correct T there
_TRUSTED = 1e6  # weight of a real message's time against a start-up point's


def monotone(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool
    adjacent violators): a run that decreases is replaced by its weighted mean."""
    ws = [1.0] * len(values) if weights is None else [float(w) for w in weights]
    if len(ws) != len(values) or not all(w > 0 and math.isfinite(w) for w in ws):
        raise PlanError(f"monotone: need {len(values)} positive finite weights")
    blocks: list[list[float]] = []  # [weight, mean, count]
    for v, w in zip(values, ws):
        blocks.append([w, float(v), 1])
        while len(blocks) > 1 and blocks[-2][1] > blocks[-1][1]:
            w2, v2, n2 = blocks.pop()
            w1, v1, n1 = blocks.pop()
            blocks.append([w1 + w2, (w1 * v1 + w2 * v2) / (w1 + w2), n1 + n2])
    out: list[float] = []
    for _, v, n in blocks:
        out += [v] * int(n)
    return out


def _weight(median: float, spread: tuple[float, float] | None) -> float:
    """1 / width^2 of the spread (a floor of 1% of the median: a spread of one sample)."""
    width = 0.0 if spread is None else spread[1] - spread[0]
    width = max(width, 0.01 * median, 1e-9)
    return 1.0 / (width * width)


def fit_measured(sizes: Sequence[int], medians: Sequence[float],
                 spreads: Sequence[tuple[float, float]] | None = None) -> CostModel:
    """The `piecewise` T_ar through measured medians (bytes, seconds), never decreasing, with
    the relative-error line of the same points as a and b (origin "measured")."""
    sizes = [int(m) for m in sizes]
    if len(sizes) != len(medians) or (spreads is not None and len(spreads) != len(sizes)):
        raise PlanError(f"fit_measured: {len(sizes)} sizes, {len(medians)} times"
                        + ("" if spreads is None else f", {len(spreads)} spreads"))
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    xs = [sizes[i] for i in order]
    ys = [float(medians[i]) for i in order]
    spans = [None if spreads is None else spreads[i] for i in order]
    line, _ = fit_relative(xs, ys)
    knots = monotone(ys, [_weight(y, s) for y, s in zip(ys, spans)])
    if spreads is not None:
        knots = _within_spreads(knots, spans)
    return CostModel(line.a, line.b, origin="measured", times=tuple(zip(xs, knots)))


def _within_spreads(knots: list[float], spans: Sequence[tuple[float, float]]) -> list[float]:
    """The non-decreasing `knots` moved into every size's spread where a non-decreasing curve
    through all the spreads exists: each clamped to [the highest lower end at or below its
    size, the lowest upper end at or above it]; both ends never decrease with the size, so
    the result does not either. Where no such curve exists the knots stay as they are (some
    size is missed whatever the curve: `check_fit` says which)."""
    low = list(np.maximum.accumulate([lo for lo, _ in spans]))
    high = list(np.minimum.accumulate([hi for _, hi in spans][::-1])[::-1])
    if any(lo > hi for lo, hi in zip(low, high)):
        return knots
    return [min(max(k, lo), hi) for k, lo, hi in zip(knots, low, high)]


@dataclass(frozen=True)
class FitCheck:
    """How well a model predicts measured sizes: per size (bytes, measured median, p10, p90,
    predicted)."""

    rows: tuple[tuple[int, float, float, float, float], ...]

    @property
    def worst_error(self) -> float:
        """max over sizes of |predicted - median| / median."""
        return max((abs(p - t) / t for _, t, _, _, p in self.rows if t > 0), default=0.0)

    @property
    def rms(self) -> float:
        """Root-mean-square of predicted - median, seconds."""
        return math.sqrt(statistics.fmean((p - t) ** 2 for _, t, _, _, p in self.rows))

    def outside(self) -> list[int]:
        """Sizes predicted outside their measured p10-p90 spread."""
        return [m for m, _, lo, hi, p in self.rows if not lo <= p <= hi]

    def misses(self) -> list[tuple[int, float]]:
        """(bytes, relative error) of the sizes missed beyond their spread by more than
        POOR_MISS of their median, worst first."""
        out = [(m, (p - t) / t) for m, t, lo, hi, p in self.rows
               if not lo <= p <= hi and t > 0 and abs(p - t) / t > POOR_MISS]
        return sorted(out, key=lambda x: -abs(x[1]))

    @property
    def poor(self) -> bool:
        """Whether some size is missed beyond its spread by more than POOR_MISS."""
        return bool(self.misses())

    def summary(self) -> str:
        """One phrase: the worst error and the count outside the spread."""
        return (f"worst {self.worst_error * 100:.1f}%, rms {self.rms * 1e3:.3g} ms, "
                f"{len(self.outside())} of {len(self.rows)} size(s) predicted outside their "
                f"measured spread")


def check_fit(cost: CostModel, sizes: Sequence[int], medians: Sequence[float],
              spreads: Sequence[tuple[float, float]] | None = None) -> FitCheck:
    """`cost` against measured medians (and their p10-p90 spreads; none: the median alone)."""
    spans = spreads if spreads is not None else [(t, t) for t in medians]
    return FitCheck(tuple((int(m), float(t), float(lo), float(hi), cost.link_time(m))
                          for m, t, (lo, hi) in zip(sizes, medians, spans)))


@dataclass(frozen=True)
class SizeTimes:
    """The measured times of one message size: median, 25th and 75th percentile, count."""

    nbytes: int
    median: float
    p25: float
    p75: float
    count: int


def summarise(samples: Sequence[tuple[int, float]]) -> list[SizeTimes]:
    """(bytes, seconds) samples grouped by size, smallest first."""
    by_size: dict[int, list[float]] = {}
    for m, t in samples:
        by_size.setdefault(int(m), []).append(float(t))
    out = []
    for m in sorted(by_size):
        xs = by_size[m]
        median, p25, p75 = (float(v) for v in np.percentile(xs, [50, 25, 75]))
        out.append(SizeTimes(m, median, p25, p75, len(xs)))
    return out


def _line_points(cost: CostModel, largest: int) -> list[tuple[int, float]]:
    """The line a + b*M at 4 B, 16 B, ... (factors of 4) and at `largest`."""
    sizes, m = [], 4
    while m < largest:
        sizes.append(m)
        m *= 4
    sizes.append(max(largest, 8))
    return [(s, cost.link_time(s)) for s in sizes]


def correct(cost: CostModel, measured: Sequence[SizeTimes], min_samples: int = MIN_SAMPLES,
            largest: int = 0) -> tuple[CostModel, list[SizeTimes]]:
    """`cost` with T corrected at the measured sizes it misses (see the module docstring):
    (the corrected model, the sizes that changed it). A size needs `min_samples` messages;
    the model is returned unchanged when T lies within every size's interquartile range.
    Not the 10th-90th percentile range: the closing line measures the median iteration,
    and training's messages of one size can take two speeds (over 1 Gbit/s TCP the whole
    GoogleNet gradient took about 515 ms in seven of nine iterations, 575-615 ms in the
    other two, while the start-up benchmark's back-to-back calls put T at 596 ms: inside
    that range, 15% above the median). `largest`: the
    largest message the plan may send (the whole gradient), up to which a `paper` model's
    line is kept as points (beyond the last point T follows the last segment's slope)."""
    differing = [s for s in measured if s.count >= min_samples
                 and not s.p25 <= cost.link_time(s.nbytes) <= s.p75]
    if not differing:
        return cost, []
    largest = max(largest, *(s.nbytes for s in measured))
    base = list(cost.times) if cost.times else _line_points(cost, largest)
    new = {s.nbytes: s.median for s in differing}
    points = sorted([(m, t, 1.0) for m, t in base if m not in new]
                    + [(m, t, _TRUSTED) for m, t in new.items()])
    knots = monotone([t for _, t, _ in points], [w for _, _, w in points])
    origin = f"{cost.origin or 'model'}, corrected at {len(differing)} size(s) in training"
    # measured in training: the start-up fit's doubt no longer applies
    corrected = dataclasses.replace(cost, origin=origin, doubt="",
                                    times=tuple((m, t) for (m, _, _), t in zip(points, knots)))
    return corrected, differing

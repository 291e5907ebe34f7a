"""Timing a training net layer by layer, for the trace and the start-up profile.

`NetTimer` wraps one Net instance's `forward_step` and `backward_step` (the net calls them
through `self`, so an instance attribute takes their place; net.py is not changed and the
wrappers are removed again with `remove()`). Each step is one layer, or a chain of layers
the net runs as one (layer_types.norm_chain); each is timed, and with a tracer becomes an
event on the compute row named after its layer (a chain: forward its first, backward its
last).

`OnlineProfile` turns the times of a few real training iterations into the planner's
profile: t_f from the first to the last forward layer, and for learnable layer k the time
from the previous gradient (layer k+1's, or the end of forward for layer L) to k's gradient,
as `mgcaffe.comm.model.profile` defines backward_time. Profiling the training iterations
themselves (instead of extra passes) leaves the data order untouched.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from ..model.profile import LayerProfile, Profile
from .trace import COMPUTE

__all__ = ["NetTimer", "OnlineProfile", "as_profile", "median_profile", "per_iteration_slowest",
           "slowest", "slowest_by_iteration"]


class NetTimer:
    """Times every forward_step/backward_step call of `net` (optionally into `tracer`)."""

    def __init__(self, net: Any, tracer: Any = None, clock=time.perf_counter,
                 synchronize=None):
        self.net = net
        self.tracer = tracer
        self.clock = clock
        self.synchronize = synchronize  # GPU: wait for the layer's kernels before timing
        self.forward_start = 0.0  # of the latest forward pass
        self.forward_end = 0.0
        self.forward_begin: dict[int, float] = {}  # net layer -> its step's start, latest pass
        self._installed = False

    def install(self) -> NetTimer:
        if self._installed:
            return self
        net, tracer = self.net, self.tracer
        forward_step, backward_step = net.forward_step, net.backward_step
        names = net.layer_names
        sync = self.synchronize

        def clock():
            if sync is not None:
                sync()
            return self.clock()

        def timed_forward(i, *args, **kwargs):
            t0 = clock()
            if i == 0:
                self.forward_start = t0
            self.forward_begin[i] = t0
            try:
                return forward_step(i, *args, **kwargs)
            finally:
                self.forward_end = t1 = clock()
                if tracer is not None:
                    tracer.span(names[i], "forward", COMPUTE, t0, t1)

        def timed_backward(i, *args, **kwargs):
            t0 = clock()
            try:
                return backward_step(i, *args, **kwargs)
            finally:
                if tracer is not None:
                    tracer.span(names[i], "backward", COMPUTE, t0, clock())

        net.forward_step = timed_forward
        net.backward_step = timed_backward
        self._installed = True
        return self

    def remove(self) -> None:
        """Put the net's own methods back (no timing cost from here on)."""
        if self._installed:
            for name in ("forward_step", "backward_step"):
                self.net.__dict__.pop(name, None)
            self._installed = False


class OnlineProfile:
    """Collects, per training iteration, the forward span and each gradient's ready time."""

    def __init__(self, model: str, names: list[str], params: list[int],
                 batch_size: int | None = None, skip: int = 1):
        self.model = model
        self.names = list(names)  # input side first
        self.params = list(params)
        self.batch_size = batch_size
        self.skip = skip  # the first iterations warm caches and allocate: not representative
        self.samples: list[tuple[float, list[float]]] = []
        self._seen = 0

    def add(self, forward_start: float, forward_end: float, ready: dict[int, float]) -> None:
        """One iteration: forward start/end and ready[k] for k = 1..L (clock seconds)."""
        self._seen += 1
        if self._seen <= self.skip:
            return
        L = len(self.names)
        backward = [0.0] * L
        previous = forward_end
        for k in range(L, 0, -1):
            backward[k - 1] = max(0.0, ready[k] - previous)
            previous = ready[k]
        self.samples.append((max(0.0, forward_end - forward_start), backward))

    def __len__(self) -> int:
        return len(self.samples)

    def profile(self, recent: int | None = None) -> Profile:
        """The median over the collected iterations (robust to one slow iteration), or over
        the `recent` latest ones (after a drift the older ones are stale): see
        `median_profile`."""
        samples = self.samples[-recent:] if recent else self.samples
        return median_profile(samples, self.model, self.names, self.params, self.batch_size)

    def window(self, recent: int | None = None) -> list[tuple[float, list[float]]]:
        """The `recent` latest samples (all without it): (t_f, [t_b per layer]) each, to be
        gathered from every rank for `slowest_by_iteration`."""
        return list(self.samples[-recent:] if recent else self.samples)

    def _totals(self, samples) -> list[float]:
        return [f + math.fsum(b) for f, b in samples]

    def stable(self, tolerance: float = 0.1) -> bool:
        """Whether the median forward+backward time of the older half of the samples and of
        the newer half agree within `tolerance` (relative): the warm-up is over. Fewer than
        4 samples cannot be judged and count as stable (a short profile was asked for)."""
        n = len(self.samples)
        if n < 4:
            return True
        old = statistics.median(self._totals(self.samples[:n // 2]))
        new = statistics.median(self._totals(self.samples[n // 2:]))
        return abs(old - new) <= tolerance * max(old, new)

    def describe_spread(self, recent: int | None = None) -> str:
        """One line: the forward+backward time's median and 10-90th percentile range over the
        iterations, and how many layers' backward times vary by more than half their median
        (interquartile range)."""
        samples = self.samples[-recent:] if recent else self.samples
        totals = sorted(self._totals(samples))

        def pct(q):
            return totals[min(len(totals) - 1, int(q * (len(totals) - 1) + 0.5))]

        wide = 0
        for i in range(len(self.names)):
            xs = sorted(s[1][i] for s in samples)
            med = statistics.median(xs)
            iqr = xs[(3 * (len(xs) - 1)) // 4] - xs[(len(xs) - 1) // 4]
            wide += iqr > 0.5 * med
        return (f"profile spread over {len(samples)} iteration(s): t_f + t_b median "
                f"{statistics.median(totals) * 1e3:.2f} ms, p10-p90 {pct(0.1) * 1e3:.2f}-"
                f"{pct(0.9) * 1e3:.2f} ms; {wide} of {len(self.names)} layer(s) with an "
                f"interquartile range above half their median")


def ready_times(sample: tuple[float, list[float]]) -> list[float]:
    """[t_f, ready(L), ready(L-1), ..., ready(1)] of one iteration's (t_f, [t_b per layer])."""
    forward, backward = sample
    out, t = [forward], forward
    for bt in reversed(backward):
        t += bt
        out.append(t)
    return out


def as_profile(sample: tuple[float, list[float]], model: str, names: list[str],
               params: list[int], batch_size: int | None = None) -> Profile:
    """One iteration's (t_f, [t_b per layer]) as a Profile."""
    forward, backward = sample
    return Profile(model, batch_size, 4, forward, tuple(
        LayerProfile(n, p, bt) for n, p, bt in zip(names, params, backward)))


def median_profile(samples: list[tuple[float, list[float]]], model: str, names: list[str],
                   params: list[int], batch_size: int | None = None) -> Profile:
    """The profile whose t_f and gradient ready times are the medians of the iterations'.

    The median of each ready time, not of each layer's backward time: under load a slow
    moment lands on a different layer each iteration, and the sum of per-layer medians then
    falls short of the median iteration (the last ready time here is the median t_f + t_b).
    Coordinate-wise medians of ordered sequences are ordered, so no time is negative."""
    readies = [ready_times(s) for s in samples]
    med = [statistics.median(r[i] for r in readies) for i in range(len(readies[0]))]
    L = len(names)
    backward = [0.0] * L
    for i in range(1, L + 1):  # med[i] is ready(L + 1 - i)
        backward[L - i] = max(0.0, med[i] - med[i - 1])
    layers = tuple(LayerProfile(n, p, bt) for n, p, bt in zip(names, params, backward))
    return Profile(model, batch_size, 4, med[0], layers)


def slowest(profiles: list[Profile]) -> Profile:
    """The profile of the synchronous step: gradient l is ready on EVERY rank only at the
    latest of the ranks' ready times, ready(l) = max over ranks of t_f + sum_{j>=l} t_b(j),
    so the all-reduce of l cannot start earlier. Returns a profile with those ready times
    (t_f the slowest forward; each backward_time the difference of consecutive readies)."""
    first = profiles[0]
    L = first.num_layers
    forward = max(p.forward_time for p in profiles)
    ready = [0.0] * (L + 2)
    for p in profiles:
        t = p.forward_time
        for l in range(L, 0, -1):
            t += p.layers[l - 1].backward_time
            ready[l] = max(ready[l], t)
    layers, previous = [], forward
    backward = [0.0] * L
    for l in range(L, 0, -1):
        backward[l - 1] = max(0.0, ready[l] - previous)
        previous = max(previous, ready[l])
    for layer, bt in zip(first.layers, backward):
        layers.append(LayerProfile(layer.name, layer.params, bt))
    return Profile(first.model, first.batch_size, first.dtype_bytes, forward, tuple(layers))


def slowest_by_iteration(windows: list[list[tuple[float, list[float]]]], model: str,
                         names: list[str], params: list[int],
                         batch_size: int | None = None) -> Profile:
    """The synchronous step's profile from every rank's samples of the same iterations
    (`OnlineProfile.window`, aligned at their newest end): per iteration the slowest rank's
    t_f and ready times, then their medians (`median_profile`). The median of the
    per-iteration maximum, not the maximum of per-rank medians: when the ranks' times vary
    independently, the step waits each iteration for whichever rank is late then."""
    return median_profile(per_iteration_slowest(windows), model, names, params, batch_size)


def per_iteration_slowest(windows: list[list[tuple[float, list[float]]]]
                          ) -> list[tuple[float, list[float]]]:
    """Per iteration (the ranks' windows aligned at their newest end), the slowest rank's t_f
    and ready times, as (t_f, [t_b per layer]) samples."""
    n = min(len(w) for w in windows)
    if n == 0:
        raise ValueError("slowest_by_iteration: a rank has no samples")
    steps = []
    for i in range(n):
        readies = [ready_times(w[len(w) - n + i]) for w in windows]
        latest = [max(r[j] for r in readies) for j in range(len(readies[0]))]
        L = len(latest) - 1
        backward = [0.0] * L
        for j in range(1, L + 1):  # latest[j] is ready(L + 1 - j)
            backward[L - j] = latest[j] - latest[j - 1]
        steps.append((latest[0], backward))
    return steps

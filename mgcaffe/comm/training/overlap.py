"""Training with a schedule that overlaps the next forward pass (`overlap`, `bytescheduler`,
`dear`, or a saved plan with a schedule): what its profile needs beyond the merge planner's.
The communication thread is the same for every plan (comm/runtime/executor.py).

- `plans_a_schedule`: whether the run plans (or was given) a schedule.
- `ForwardShape`: the per-layer forward and update times the schedule's plan needs
  (`LayerProfile.forward_time`, `update_time`), measured on the same profiled iterations as
  the backward times: each learnable layer's forward from its step's start to the next
  learnable layer's, less what the next forward waited there for the gradients and the
  update it applied (a layer-by-layer plan running while it is profiled), as fractions of
  that iteration's t_f (without those waits either), and the solver's update of each
  layer. Each rank's medians; the fractions averaged over the ranks, each update time the
  slowest rank's.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from ..model.profile import Profile
from ..model.schemes import scheme_named

__all__ = ["ForwardShape", "plans_a_schedule"]


def plans_a_schedule(scheme: str | None, plan: Any) -> bool:
    """Whether training runs a schedule: the scheme makes one, or a given plan holds one
    (its profile then measures each layer's forward and update: `ForwardShape`)."""
    if getattr(plan, "schedule", None) is not None:
        return True
    try:
        return scheme is not None and scheme_named(scheme).schedule is not None
    except Exception:  # noqa: BLE001 - a hand-made plan's label: the plan decides
        return False


class ForwardShape:
    """Per-layer forward fractions and update times over the profiled iterations."""

    def __init__(self, net: Any):
        self.layer_ids = [layer.layer_id for layer in net.learnable_layers]
        self.samples: list[tuple[list[float], list[float]]] = []

    def sample(self, timer: Any, gates: dict[int, float], updates: list[float] | None) -> None:
        """One iteration: the timer's step starts, the seconds the forward spent before
        layer k's step waiting and updating (`gates`), each layer's update seconds."""
        begins = timer.forward_begin
        t_f = timer.forward_end - timer.forward_start - sum(gates.values())
        if t_f <= 0 or 0 not in begins:
            return
        starts, last = [], timer.forward_start
        for layer_id in self.layer_ids:  # a layer run inside a chain starts with the chain
            last = begins.get(layer_id, max((t for i, t in begins.items() if i <= layer_id),
                                            default=last))
            starts.append(last)
        L = len(starts)
        ends = starts[1:] + [timer.forward_end]
        fractions = [max(0.0, e - s - (gates.get(k + 2, 0.0) if k + 1 < L else 0.0)) / t_f
                     for k, (s, e) in enumerate(zip(starts, ends))]
        self.samples.append((fractions, list(updates or [0.0] * L)))

    def mine(self, recent: int) -> tuple[list[float], list[float]] | None:
        """This rank's medians over its `recent` latest samples (None without any)."""
        samples = self.samples[-recent:]
        if not samples:
            return None
        L = len(self.layer_ids)
        return ([statistics.median(s[0][k] for s in samples) for k in range(L)],
                [statistics.median(s[1][k] for s in samples) for k in range(L)])

    @staticmethod
    def combine(per_rank: list) -> tuple[list[float], list[float]] | None:
        """The ranks' medians: fractions averaged, updates the slowest rank's."""
        found = [x for x in per_rank if x is not None]
        if not found:
            return None
        L = len(found[0][0])
        fractions = [statistics.fmean(f[k] for f, _ in found) for k in range(L)]
        total = sum(fractions)
        if total > 1:  # the segments cannot outlast t_f
            fractions = [x / total for x in fractions]
        return fractions, [max(u[k] for _, u in found) for k in range(L)]

    @staticmethod
    def apply(profile: Profile, shape: tuple[list[float], list[float]] | None) -> Profile:
        """`profile` with each layer's forward (its fraction of t_f) and update time."""
        if shape is None:
            return profile
        fractions, updates = shape
        return replace(profile, layers=tuple(
            replace(layer, forward_time=profile.forward_time * f, update_time=u)
            for layer, f, u in zip(profile.layers, fractions, updates)))

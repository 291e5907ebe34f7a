"""Per-layer updates: each layer's parameters updated when the next forward needs them.

With a gradient sync that reduces layer by layer (`per_layer` true, and `wait_layer(k)`), the
solver does not wait for every gradient after backward. Where Caffe's update runs it takes the
iteration's learning rate (logging it as Caffe does) and updates the parameter blobs no
learnable layer owns (lr_mult 0: their diffs are final after backward and never reduced); the
learnable layers are left to a gate on the net (`Net.set_param_gate`): before the forward of a
layer that reads layer k's parameters, the gate waits for k's reduced gradient, checks that it
is finite, applies the solver's update to k's blobs (normalise by iter_size, regularise, the
rule's update value, data -= diff: each blob's update is element-wise and independent of the
others', so the weights are bit-identical to the update after the barrier) and clears k's
diffs for the next backward. Whatever needs every weight (a test pass, a snapshot, the end of
`step`) finishes the pending layers first (`finish`).

Where a setting needs every gradient before any update the barrier stays (`blockers`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from ..errors import SolverError

__all__ = ["PerLayerUpdate", "blockers"]

log = logging.getLogger("mgcaffe.solvers")


def blockers(solver: Any) -> list[str]:
    """Why `solver` must update after every gradient is reduced ([] when it need not)."""
    reasons = []
    if solver.param.clip_gradients >= 0:
        reasons.append("clip_gradients scales every gradient by their global norm")
    if solver.param.debug_info:
        reasons.append("debug_info prints every gradient after backward")
    if any(hasattr(hook, "gradients_ready") for hook in solver.iteration_hooks):
        reasons.append("an on_gradients_ready callback reads every gradient")
    return reasons


class PerLayerUpdate:
    """The pending per-layer update of one iteration (module docstring). `solver` provides
    `update_param(i, rate)`, `learning_rate_now()`, `net`, `iter`; `sync` `wait_layer(k)`."""

    def __init__(self, solver: Any):
        self.solver = solver
        net = solver.net
        owned = {i for layer in net.learnable_layers for i in layer.param_ids}
        self._loose = [i for i in range(len(net.learnable_params)) if i not in owned]
        self.pending: set[int] = set()
        self.rate = 0.0
        self.iteration = 0
        self.sync: Any = None

    @property
    def active(self) -> bool:
        return bool(self.pending)

    def begin(self, sync: Any) -> None:
        """At Caffe's update point: the rate, the blobs of no learnable layer, and the gate."""
        s = self.solver
        self.rate = s.learning_rate_now()
        self.iteration = s.iter
        self.sync = sync
        for i in self._loose:
            s.update_param(i, self.rate)
        s.net.clear_param_diffs_of(self._loose)
        self.pending = {layer.index for layer in s.net.learnable_layers}
        if self.pending:
            s.net.set_param_gate(self.apply)

    def apply(self, k: int) -> None:
        """Learnable layer k's update, once its reduced gradient is there (the net's gate)."""
        if k not in self.pending:
            return
        s = self.solver
        self.sync.wait_layer(k)
        t0 = time.perf_counter()
        layer = s.net.learnable_layers[k - 1]
        if not math.isfinite(s.gradient_sumsq(layer.param_ids)):
            self.abandon()
            raise SolverError(f"iteration {self.iteration}: non-finite gradient in layer "
                              f"{layer.name!r}; training stopped, earlier snapshots are "
                              f"untouched")
        for i in layer.param_ids:
            s.update_param(i, self.rate)
        s.net.clear_param_diffs_of(layer.param_ids)  # marked: step's end fills what stays
        if s.update_times is not None:
            s.update_times[k - 1] = time.perf_counter() - t0
        self.pending.discard(k)
        if not self.pending:
            s.net.set_param_gate(None)
            s._update_iter = None

    def finish(self) -> None:
        """Every pending layer's update now (waiting for its gradient)."""
        for k in sorted(self.pending):
            self.apply(k)

    def abandon(self) -> None:
        """Drop what is pending (training stops): the gate comes off the net."""
        self.pending = set()
        self.solver.net.set_param_gate(None)

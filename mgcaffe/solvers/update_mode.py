"""How an iteration's update meets its gradients: the solver's update mode, one strategy object.

- `BarrierUpdate` (Caffe's): after backward the solver waits for every reduced gradient
  (`gradient_sync.wait()`), checks them (solvers/finite.py) and updates every parameter.
- `PerLayerUpdate`: with a gradient sync that reduces layer by layer (`per_layer` true, and
  `wait_layer(k)`), the solver does not wait after backward. Where Caffe's update runs it
  takes the iteration's learning rate (logging it as Caffe does) and updates the parameter
  blobs no learnable layer owns (lr_mult 0: their diffs are final after backward and never
  reduced); the learnable layers are left to a gate on the net (`Net.set_param_gate`): before
  the forward of a layer that reads layer k's parameters, the gate waits for k's reduced
  gradient (on a GPU the compute stream waits for it, not the host), checks it
  (`finite.LayerChecks`), applies the solver's update to k's blobs (normalise by iter_size,
  regularise, the rule's update value, data -= diff: each blob's update is element-wise and
  independent of the others', so the weights are bit-identical to the update after the
  barrier) and clears k's diffs for the next backward. Whatever needs every weight (a test
  pass, a snapshot, the end of `step`) finishes the pending layers first (`finish`).

`UpdateMode` chooses per iteration: per layer when the sync offers it and nothing needs every
gradient first (`blockers`: clip_gradients, debug_info, an on_gradients_ready callback; said
once in the log), else the barrier.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .finite import LayerChecks, check_gradients

__all__ = ["BarrierUpdate", "PerLayerUpdate", "UpdateMode", "blockers"]

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


class BarrierUpdate:
    """Caffe's update, after every gradient (module docstring)."""

    per_layer = False
    pending = False

    def __init__(self, solver: Any):
        self.solver = solver

    def after_backward(self, sync: Any) -> None:
        """Right after the iteration's last backward: wait for every reduced gradient."""
        if sync is not None:
            sync.wait()

    def update(self, sync: Any) -> None:
        """Where Caffe updates: check every gradient, then the solver's whole update."""
        s = self.solver
        s._sumsq = check_gradients(s.net, s.iter)  # clip_gradients reuses the norm
        s.apply_update()

    def finish(self) -> None:
        """Nothing is left pending."""


class PerLayerUpdate:
    """The pending per-layer update of one iteration (module docstring). `solver` provides
    `update_param(i, rate)`, `learning_rate_now()`, `net`, `iter`; `sync` `wait_layer(k)`."""

    per_layer = True

    def __init__(self, solver: Any):
        self.solver = solver
        net = solver.net
        owned = {i for layer in net.learnable_layers for i in layer.param_ids}
        self._loose = [i for i in range(len(net.learnable_params)) if i not in owned]
        self.layers: set[int] = set()  # learnable layers whose update is still to come
        self.rate = 0.0
        self.iteration = 0
        self.sync: Any = None
        self.checks = LayerChecks(net)

    @property
    def pending(self) -> bool:
        return bool(self.layers)

    def after_backward(self, sync: Any) -> None:
        """Nothing to wait for: each layer's gate waits for its own gradient."""

    def update(self, sync: Any) -> None:
        """At Caffe's update point: the rate, the blobs of no learnable layer, and the gate."""
        s = self.solver
        self.rate = s.learning_rate_now()
        self.iteration = s.iter
        self.sync = sync
        for i in self._loose:
            s.update_param(i, self.rate)
        s.net.clear_param_diffs_of(self._loose)
        self.layers = {layer.index for layer in s.net.learnable_layers}
        if self.layers:
            s.net.set_param_gate(self.apply)

    def apply(self, k: int) -> None:
        """Learnable layer k's update, once its reduced gradient is there (the net's gate)."""
        if k not in self.layers:
            return
        s = self.solver
        self.sync.wait_layer(k)
        t0 = time.perf_counter()
        layer = s.net.learnable_layers[k - 1]
        try:
            self.checks.check(k, self.iteration)
            for i in layer.param_ids:
                s.update_param(i, self.rate)
            s.net.clear_param_diffs_of(layer.param_ids)  # marked: step's end fills what stays
            if s.update_times is not None:
                s.update_times[k - 1] = time.perf_counter() - t0
            self.layers.discard(k)
            if not self.layers:
                s.net.set_param_gate(None)
                s._update_iter = None
                self.checks.verify(self.iteration)
        except BaseException:
            self.abandon()
            raise

    def finish(self) -> None:
        """Every pending layer's update now (waiting for its gradient)."""
        for k in sorted(self.layers):
            self.apply(k)

    def abandon(self) -> None:
        """Drop what is pending (training stops): the gate comes off the net."""
        self.layers = set()
        self.solver.net.set_param_gate(None)


class UpdateMode:
    """The solver's update mode, chosen each iteration (module docstring); `current` is the
    latest iteration's."""

    def __init__(self, solver: Any):
        self.solver = solver
        self.barrier = BarrierUpdate(solver)
        self._per_layer: PerLayerUpdate | None = None  # made on first use
        self.current: BarrierUpdate | PerLayerUpdate = self.barrier
        self._said = False  # the log has said why updates wait for every gradient

    @property
    def pending(self) -> bool:
        """Whether some layer's update of the last iteration still waits for its forward."""
        return self._per_layer is not None and self._per_layer.pending

    def finish(self) -> None:
        """Apply every pending per-layer update now (before a test, a snapshot, the end)."""
        if self._per_layer is not None:
            self._per_layer.finish()

    def choose(self) -> BarrierUpdate | PerLayerUpdate:
        """This iteration's mode: per layer when the sync offers it and nothing needs every
        gradient first (said once in the log otherwise)."""
        s = self.solver
        self.current = self.barrier
        if s.gradient_sync is None or not getattr(s.gradient_sync, "per_layer", False):
            return self.current
        reasons = blockers(s)
        if reasons and not self._said:
            self._said = True
            log.info("Updating after every gradient is reduced, not layer by layer: %s",
                     "; ".join(reasons))
        if not reasons:
            if self._per_layer is None:
                self._per_layer = PerLayerUpdate(s)
            self.current = self._per_layer
        return self.current

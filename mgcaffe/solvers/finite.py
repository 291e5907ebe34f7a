"""The solver's checks for non-finite values: the loss, the gradients, where they went wrong.

The loss (a host float already) is checked every iteration; the gradients every iteration
through one fused reduction, the global sum of squared diffs, which gradient clipping needs
anyway (one dot product per parameter blob and one device-to-host copy per iteration; cheap
next to forward/backward). Only when it is not finite are the blobs scanned one by one to
name the layer.

An update layer by layer checks each layer's gradient before applying it (`LayerChecks`).
On the host that costs nothing extra; on a GPU a host read per layer would be a host wait per
layer, so each layer's sum is written into a device vector instead and the vector is read
once, after the iteration's last layer: the weights of the layers updated meanwhile may have
taken the bad values, but training stops with the same error before anything is written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backend import to_host
from ..errors import SolverError

__all__ = ["LayerChecks", "check_gradients", "check_loss", "first_bad_output",
           "gradient_sumsq", "layer_of_param"]

_STOPPED = "training stopped, earlier snapshots are untouched"


def first_bad_output(net: Any) -> str:
    """Where the first non-finite activation is, scanning layers in forward order."""
    xp = net.xp
    for name, tops in net.top_names.items():
        for top in tops:
            if not bool(xp.isfinite(net.blobs[top].data).all()):
                return f"first non-finite output: layer {name!r}, top {top!r}"
    return "no layer output is non-finite"


def check_loss(loss: float, net: Any, iteration: int) -> None:
    """A non-finite loss stops training, naming the first layer whose output is."""
    if not math.isfinite(loss):
        raise SolverError(f"iteration {iteration}: the loss is {loss} "
                          f"({first_bad_output(net)}); {_STOPPED}")


def _sumsq(net: Any, ids) -> Any:
    """The sum of squares of the diffs `ids` index (all: None), as an array scalar of the
    net's array module (no host read)."""
    xp = net.xp
    total = None
    blobs = net.learnable_params
    # Overflow to inf is handled by the caller; numpy need not warn about it.
    with np.errstate(over="ignore", invalid="ignore"):
        for blob in blobs if ids is None else [blobs[i] for i in ids]:
            d = blob.diff.ravel()
            s = xp.dot(d, d)
            total = s if total is None else total + s
    return total


def gradient_sumsq(net: Any, ids=None) -> float:
    """Sum of squares of every learnable parameter diff, or of those `ids` index (one host
    transfer)."""
    total = _sumsq(net, ids)
    return 0.0 if total is None else float(total)


def check_gradients(net: Any, iteration: int) -> float:
    """The global sum of squared diffs; a SolverError naming the first layer (in backward
    order) with a non-finite gradient."""
    sumsq = gradient_sumsq(net)
    if math.isfinite(sumsq):
        return sumsq
    xp = net.xp
    bad = [i for i, b in enumerate(net.learnable_params) if not bool(xp.isfinite(b.diff).all())]
    if not bad:
        # Finite values whose float32 squares overflowed: recompute in float64.
        return sum(float((to_host(b.diff).astype(np.float64) ** 2).sum())
                   for b in net.learnable_params)
    raise SolverError(f"iteration {iteration}: non-finite gradient in layer "
                      f"{layer_of_param(net, bad)!r} (the first in backward order; {len(bad)} "
                      f"parameter blob(s) affected); {_STOPPED}")


def layer_of_param(net: Any, bad: list[int]) -> str:
    """The layer (last in forward order) owning one of the parameter blobs `bad` indexes."""
    bad_set = set(bad)
    for layer in reversed(net.learnable_layers):
        if bad_set & set(layer.param_ids):
            return layer.name
    wanted = {id(net.learnable_params[i]) for i in bad}
    for name in reversed(list(net.params)):
        if any(id(b) in wanted for b in net.params[name]):
            return name
    return f"learnable parameter #{bad[0]}"


class LayerChecks:
    """Each learnable layer's gradient checked before its own update (module docstring)."""

    def __init__(self, net: Any):
        self.net = net
        self.on_device = net.xp is not np
        self._sums: Any = None  # the device vector of the layers' sums, when on a device

    def check(self, k: int, iteration: int) -> None:
        """Learnable layer k's gradient, before its update: raise at once on the host, keep
        its sum on a device (`verify` reads them)."""
        layer = self.net.learnable_layers[k - 1]
        if not self.on_device:
            if not math.isfinite(gradient_sumsq(self.net, layer.param_ids)):
                raise self._error(layer.name, iteration)
            return
        if self._sums is None:
            self._sums = self.net.xp.zeros(len(self.net.learnable_layers), np.float32)
        total = _sumsq(self.net, layer.param_ids)
        self._sums[k - 1] = 0.0 if total is None else total

    def verify(self, iteration: int) -> None:
        """After the iteration's last layer: one read of the device sums (nothing on the
        host); the first layer in forward order whose gradient was not finite is named."""
        if self._sums is None:
            return
        sums = to_host(self._sums)
        for k, value in enumerate(sums, start=1):
            if not math.isfinite(float(value)):
                raise self._error(self.net.learnable_layers[k - 1].name, iteration)

    @staticmethod
    def _error(name: str, iteration: int) -> SolverError:
        return SolverError(f"iteration {iteration}: non-finite gradient in layer {name!r}; "
                           f"{_STOPPED}")

"""Numerical gradient checking for layers (Caffe's GradientChecker idea, in float64).

`check_layer_gradients` builds a layer in float64, draws a random projection R of its tops,
and compares the analytic gradient of  objective = sum_i sum(R_i * top_i)  with respect to
every checked bottom and parameter blob against central differences.
"""

from __future__ import annotations

import numpy as np

from mgcaffe.blob import Blob
from mgcaffe.layer_types.base import TRAIN, LayerContext
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.layer_types.registry import create_layer


def make_layer(param, bottom_shapes_or_arrays, phase=TRAIN, seed=0, dtype=np.float64,
               top_count=None, rules: LayerRules | None = None):
    """Create and set up a layer on numpy with the given bottoms; returns (layer, bottom, top).

    `bottom_shapes_or_arrays` holds arrays (used as data) or shapes (filled with standard
    normal values from `seed`). `rules`: the layers' path rules (default LayerRules()).
    """
    rng = np.random.default_rng(seed)
    ctx = LayerContext(phase=phase, xp=np, dtype=dtype, seed=seed,
                       rules=rules if rules is not None else LayerRules())
    layer = create_layer(param, ctx)
    bottom = []
    for i, item in enumerate(bottom_shapes_or_arrays):
        if isinstance(item, np.ndarray):
            blob = Blob(item.shape, dtype=dtype, name=f"bottom{i}")
            blob.data[...] = item
        else:
            blob = Blob(item, dtype=dtype, name=f"bottom{i}")
            blob.data[...] = rng.standard_normal(item)
        bottom.append(blob)
    n_top = top_count if top_count is not None else max(len(param.top), 1)
    top = [Blob((), dtype=dtype, name=f"top{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


#: What a bottom diff holds before the checked backward (it must be overwritten).
STALE_BOTTOM_DIFF = 123.0


def _objective(layer, bottom, top, projections):
    layer.forward(bottom, top)
    return sum(float(np.sum(t.data * r)) for t, r in zip(top, projections))


def check_layer_gradients(layer, bottom, top, check_bottom=None, check_params=True,
                          eps=1e-4, rtol=1e-3, atol=1e-5, max_checks=200, seed=1,
                          top_indices=None):
    """Assert analytic gradients match central differences; returns the max abs error.

    check_bottom: indices of bottoms to check (default all). top_indices: tops that carry
    the objective (default all). Up to `max_checks` randomly chosen elements are perturbed
    per blob, so large blobs stay cheap.
    """
    rng = np.random.default_rng(seed)
    if check_bottom is None:
        check_bottom = list(range(len(bottom)))
    if top_indices is None:
        top_indices = list(range(len(top)))
    layer.forward(bottom, top)
    projections = [
        rng.standard_normal(t.shape) if i in top_indices else np.zeros(t.shape)
        for i, t in enumerate(top)
    ]
    # Analytic gradients.
    for t, r in zip(top, projections):
        t.diff[...] = r
    # Stale memory under every diff, as in a net: parameter diffs cleared lazily over NaN (the
    # first write must overwrite, any other access see zeros), bottom diffs holding junk (a
    # layer writes them whole: Caffe's backward overwrites its bottoms' diffs).
    for p in layer.blobs:
        p.diff[...] = np.nan
        p.clear_diff_lazily()
    for b in bottom:
        b.diff[...] = STALE_BOTTOM_DIFF
    propagate = [i in check_bottom for i in range(len(bottom))]
    layer.backward(top, propagate, bottom)
    targets = [(f"bottom[{i}]", bottom[i]) for i in check_bottom]
    if check_params:
        targets += [(f"param[{i}]", p) for i, p in enumerate(layer.blobs)
                    if layer.param_propagate_down[i]]
    analytic = {name: blob.diff.copy() for name, blob in targets}
    worst = 0.0
    for name, blob in targets:
        flat = blob.data.reshape(-1)
        n = flat.size
        picks = rng.choice(n, size=min(n, max_checks), replace=False) if n else []
        grad = analytic[name].reshape(-1)
        for k in picks:
            saved = flat[k]
            flat[k] = saved + eps
            plus = _objective(layer, bottom, top, projections)
            flat[k] = saved - eps
            minus = _objective(layer, bottom, top, projections)
            flat[k] = saved
            numeric = (plus - minus) / (2 * eps)
            err = abs(numeric - grad[k])
            worst = max(worst, err)
            if not err <= atol + rtol * max(abs(numeric), abs(grad[k])):  # NaN fails too
                raise AssertionError(
                    f"layer {layer.name!r} ({layer.type}) {name} element {k}: "
                    f"analytic {grad[k]:.8g} vs numeric {numeric:.8g}"
                )
    layer.forward(bottom, top)
    return worst

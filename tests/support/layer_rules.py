"""Layer rules for tests: the defaults with a few thresholds or switches changed."""

from __future__ import annotations

from dataclasses import replace

from mgcaffe.layer_types.choice.rules import LayerRules


def changed(base: LayerRules | None = None, **layers) -> LayerRules:
    """`base` (default LayerRules()) with each named layer type's rules changed, e.g.
    changed(convolution={"winograd": False}, pooling={"compiled": False})."""
    rules = LayerRules() if base is None else base
    for name, changes in layers.items():
        rules = replace(rules, **{name: replace(getattr(rules, name), **changes)})
    return rules

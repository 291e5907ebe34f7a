"""The learnable layers of a built net: their numbering 1..L and what each forward reads.

Learnable layers are a first-class, documented order: learnable layer k (1 = input side ..
L = output side) is a layer that OWNS at least one parameter blob with lr_mult != 0 (a
shared parameter belongs to the first layer that declares its name). The engine calls
`on_learnable_done(k)` right after layer k's backward and the parameter gate before every
forward that reads layer k's parameters; the gradient sync and the planner number layers
the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from .builder import Graph

__all__ = ["LearnableLayer", "LearnableLayers", "number_learnable_layers"]


@dataclass(frozen=True)
class LearnableLayer:
    """Learnable layer `index` (1 = input side .. L = output side).

    layer_id indexes `net.layers`; param_ids index `net.learnable_params` (the blobs this
    layer owns with lr_mult != 0); count is their total number of elements.
    """

    index: int
    name: str
    layer_id: int
    param_ids: tuple[int, ...]
    count: int


@dataclass(frozen=True)
class LearnableLayers:
    """A net's learnable layers, and per net layer: its learnable index (`of_layer[i]`, None
    when it is not learnable) and the learnable layers whose parameters its forward reads
    (`reads[i]`; a sharer reads its owner's)."""

    layers: list[LearnableLayer]
    of_layer: list[int | None]
    reads: list[tuple[int, ...]]


def number_learnable_layers(g: Graph) -> LearnableLayers:
    """Number the learnable layers of a built graph, input side first."""
    layers: list[LearnableLayer] = []
    of_layer: list[int | None] = [None] * len(g.layers)
    for layer_id, name in enumerate(g.layer_names):
        ids = tuple(i for i, owner in enumerate(g.learnable_param_layer)
                    if owner == layer_id and g.params_lr[i] != 0)
        if ids:
            k = len(layers) + 1
            count = sum(g.learnable_params[i].count for i in ids)
            layers.append(LearnableLayer(k, name, layer_id, ids, count))
            of_layer[layer_id] = k
    owner_of = {j: layer.index for layer in layers for j in layer.param_ids}
    reads: list[set[int]] = [set() for _ in g.layers]
    for net_param, (layer_id, _) in enumerate(g.param_layer):
        k = owner_of.get(g.learnable_param_ids[net_param])
        if k is not None:
            reads[layer_id].add(k)
    return LearnableLayers(layers, of_layer, [tuple(sorted(ks)) for ks in reads])

"""BatchNorm, Scale and (optionally) ReLU in place on one blob, run as one sweep each way on
the CPU.

Why: ResNet-style nets follow every convolution by BatchNorm, a per-channel Scale with bias
and usually a ReLU, all in place. Run layer by layer, that is ten trips through an
activation-sized array forward (the statistics; the normalisation, its kept copy; Scale's
copy, its product; ReLU) and about eleven backward, and on a node whose cores share one
memory bus those trips, not arithmetic, are the time. Run as a chain (kernels.
batch_norm_loops: scaled_normalize, scaled_grad_sums, scaled_input_grad): the statistics,
then one sweep writing the normalised copy (BatchNorm's and Scale's kept input alike) and
the output; backward, one sweep of sums and one writing the bottom diff.

What the layers compute is unchanged: the blob holds the ReLU's output after forward and
BatchNorm's bottom diff after backward, the running statistics and Scale's parameter diffs
are updated as by the layers (forward bit for bit; the float64 sums in another order), and
each layer's own kept arrays are set, so any of them can still run alone afterwards. The
net runs a chain only when its whole run covers it (net.NetEngine: not under debug_info or
per-layer callbacks, which look at the layers one at a time).
"""

from __future__ import annotations

import numpy as np

from ..layer_types.batch_norm import BatchNormLayer
from ..layer_types.neuron import ReLULayer
from ..layer_types.scale_bias import ScaleLayer


class NormChain:
    """Layers [first, last] of a net: BatchNorm, Scale, and ReLU when there is one, in place
    on one blob."""

    def __init__(self, first: int, batch_norm: BatchNormLayer, scale: ScaleLayer,
                 relu: ReLULayer | None, blob):
        self.first, self.last = first, first + (2 if relu is not None else 1)
        self.batch_norm, self.scale, self.relu = batch_norm, scale, relu
        self.blob = blob

    def usable(self) -> bool:
        """Whether the chain can run as one sweep now (numpy, float32/float64, the compiled
        loops, Scale per channel over BatchNorm's rows)."""
        bn, sc, blob = self.batch_norm, self.scale, self.blob
        if bn.loops() is None or sc.choice is None or sc.choice.path != "compiled-rows" \
                or blob.data.dtype not in (np.float32, np.float64) or blob.num_axes < 2:
            return False
        n, c = blob.shape[:2]
        return sc.axis == 1 and tuple(sc._dims[:2]) == (n, c) and \
            all(b.count == c for b in sc.blobs)

    def _operands(self):
        """rows, and per row: Scale's scale and bias (the scale again where there is none)."""
        bn, sc = self.batch_norm, self.scale
        n, c = self.blob.shape[:2]
        rows = (n * c, self.blob.count // (n * c))
        g = np.tile(sc.blobs[0].data.reshape(-1), n)
        b = g if sc.bias_index is None else np.tile(sc.blobs[sc.bias_index].data.reshape(-1), n)
        return bn, sc, rows, g, b

    def forward(self) -> None:
        """The three forwards: BatchNorm's statistics, then one sweep for the normalised
        copy and the output."""
        bn, sc, rows, g, b = self._operands()
        loops = bn.loops()
        _, mean, std = bn.statistics_rows(loops, self.blob.data)
        n = self.blob.shape[0]
        # BatchNorm's kept copy (batch statistics) is Scale's kept input too.
        keep = (sc.own_input_copy(self.blob.shape) if bn.use_global_stats else
                sc.lend_input_copy(bn._x_norm))
        x, kept = self.blob.data.reshape(rows), keep.reshape(rows)
        mean_rows, std_rows = np.tile(mean, n), np.tile(std, n)
        relu = self.relu is not None
        bn.for_each_row(rows, lambda start, stop: loops.scaled_normalize(
            x, x, kept, mean_rows, std_rows, g, b, sc.bias_index is not None, relu,
            start, stop))

    def backward(self) -> None:
        """The three backwards: one sweep of sums (Scale's parameter gradients and
        BatchNorm's), one writing the bottom diff over the top diff."""
        bn, sc, rows, g, _ = self._operands()
        loops = bn.loops()
        n, c = self.blob.shape[:2]
        dy, y = self.blob.diff.reshape(rows), self.blob.data.reshape(rows)
        kept = sc._input_copy.reshape(rows)
        relu = self.relu is not None
        sums = np.empty((rows[0], 4))
        bn.for_each_row(rows, lambda start, stop: loops.scaled_grad_sums(
            dy, y, kept, g, relu, sums, start, stop))
        # Per channel, as Scale's own backward sums its rows (float64, then the blob's type).
        totals = sums.reshape(n, c, 4).sum(axis=0).astype(self.blob.data.dtype)
        if sc.bias_index is not None and sc.param_propagate_down[sc.bias_index]:
            bias = sc.blobs[sc.bias_index]
            bias.add_to_diff(totals[:, 0].reshape(bias.shape))
        if sc.param_propagate_down[0]:
            sc.blobs[0].add_to_diff(totals[:, 1].reshape(sc.blobs[0].shape))
        sum_d2, sum_d2_keep = np.tile(totals[:, 2], n), np.tile(totals[:, 3], n)
        std_rows = np.tile(bn._std.reshape(-1), n)
        scale = bn.dtype.type(-1.0 / (n * rows[1]))
        bn.for_each_row(rows, lambda start, stop: loops.scaled_input_grad(
            dy, y, kept, dy, g, sum_d2, sum_d2_keep, std_rows, scale, relu,
            bn.use_global_stats, start, stop))


class NormChains:
    """A net's chains, looked up by their first layer (forward runs) or their last
    (backward runs); iterating gives them in net order."""

    def __init__(self, chains: list[NormChain]):
        self._by_first = {c.first: c for c in chains}
        self._by_last = {c.last: c for c in chains}

    def starting_at(self, i: int) -> NormChain | None:
        return self._by_first.get(i)

    def ending_at(self, i: int) -> NormChain | None:
        return self._by_last.get(i)

    def __iter__(self):
        return iter(self._by_first.values())


def find_chains(layers, bottoms, tops) -> NormChains:
    """The chains of a net's layers (with their bottom and top blob lists): BatchNorm,
    then Scale with a learned per-channel scale, then optionally a ReLU of slope 0, each
    with one bottom and one top, all the same blob, and no loss weight."""
    def in_place(j, kind, blob):
        return j < len(layers) and isinstance(layers[j], kind) and \
            len(bottoms[j]) == 1 and bottoms[j][0] is blob and \
            len(tops[j]) == 1 and tops[j][0] is blob and \
            not any(layers[j].loss_weights)  # a loss on a layer's top: the layer runs alone

    chains = []
    i = 0
    while i + 1 < len(layers):
        blob = bottoms[i][0] if len(bottoms[i]) == 1 else None
        if blob is not None and in_place(i, BatchNormLayer, blob) and \
                in_place(i + 1, ScaleLayer, blob):
            relu = layers[i + 2] if in_place(i + 2, ReLULayer, blob) and \
                layers[i + 2].negative_slope == 0 else None
            chain = NormChain(i, layers[i], layers[i + 1], relu, blob)
            chains.append(chain)
            i = chain.last + 1
            continue
        i += 1
    return NormChains(chains)

"""pycaffe's Net: the name-keyed and batched Python API over the engine (net.NetEngine).

Caffe splits its Net the same way: the C++ Net runs layers by index, and
python/caffe/pycaffe.py attaches the Python conveniences to it: blobs, params and layers by
name, inputs and outputs by name, `forward(data=x)` and `backward(prob=d)`, the batched
`forward_all` / `forward_backward_all`, the MemoryData feed, save and load. Every net the
library builds (the solvers', the commands', `mgcaffe.Net`) is this class, so pycaffe code
finds the same API wherever its net comes from.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ..backend import to_host
from ..errors import NetError
from ..formats.protoio import write_caffemodel
from ..layer_types.base import TRAIN
from .net import NetEngine
from .weights import HDF5, copy_trained_layers_hdf5, write_weights

__all__ = ["Net"]


class Net(NetEngine):
    """A Caffe network with pycaffe's API; the engine underneath is `net.NetEngine`.

    `Net(model, phase=TRAIN, weights=None, **options)` (the options are the engine's:
    level, stages, device, dtype, seed, rank, world_size, rules, cpu); pycaffe's older
    positional form `Net(model, weights_path, phase)` is accepted too. `model` is a prototxt
    path or a NetParameter. `device` defaults to the CPU (the package's `mgcaffe.Net` uses
    the process-wide default set by `mgcaffe.set_mode_gpu()`/`set_device()`).

    By name, in net order: `blobs` {blob: Blob}, `params` {layer: its parameter blobs, for
    the layers that have some}, `blob_loss_weights` {blob: weight}, `bottom_names` and
    `top_names` {layer: [blob names]}, `layer_dict` {layer: layer}; `inputs` and `outputs`
    are blob names.
    """

    def __init__(self, model, phase=TRAIN, weights=None, **options):
        if isinstance(phase, (str, os.PathLike)):  # pycaffe's Net(model, weights, phase)
            phase, weights = weights, phase
            if phase is None:
                raise NetError(f"Net(model, {str(weights)!r}, phase): the older form needs "
                               f"the phase (mgcaffe.TRAIN or mgcaffe.TEST) after the weights")
        super().__init__(model, phase, weights, **options)
        g = self.graph
        self.blobs = OrderedDict(zip(g.blob_names, g.blobs))
        self.bottom_names = OrderedDict(
            (n, [g.blob_names[i] for i in ids]) for n, ids in zip(g.layer_names, g.bottom_ids))
        self.top_names = OrderedDict(
            (n, [g.blob_names[i] for i in ids]) for n, ids in zip(g.layer_names, g.top_ids))
        self.inputs = [g.blob_names[i] for i in g.input_ids]
        self.outputs = [g.blob_names[i] for i in g.output_ids]
        self.blob_loss_weights = OrderedDict(zip(g.blob_names, g.blob_loss_weights))
        self.params = OrderedDict((n, layer.blobs) for n, layer in zip(g.layer_names, g.layers)
                                  if layer.blobs)

    @property
    def layer_dict(self) -> OrderedDict:
        """pycaffe's {layer name: layer}, in net order."""
        return OrderedDict(zip(self.layer_names, self.layers))

    @property
    def _layer_names(self) -> list[str]:
        """pycaffe's name for `layer_names`."""
        return self.layer_names

    def forward(self, blobs=None, start: str | None = None, end: str | None = None,
                **inputs):
        """pycaffe's forward: set `inputs` (of the net's batch size, else pycaffe's "Input is
        not batch sized" error: reshape the input blob first), run layers
        `start`..`end` (names; default all) and return {name: data array} for the outputs
        (or, with `end`, that layer's tops) plus the names in `blobs`. The objective of the
        layers run is kept in `net.loss`."""
        start_i = self.layer_id(start) if start is not None else 0
        if end is not None:
            end_i = self.layer_id(end)
            wanted = self.top_names[end]
        else:
            end_i = len(self.layers) - 1
            wanted = self.outputs
        self._set_blobs(inputs, self.inputs, "data", "inputs")
        self.forward_from_to(start_i, end_i)
        return self._collect(list(wanted) + list(blobs or []), "data")

    def _set_blobs(self, values: dict, allowed: list[str], which: str, what: str) -> None:
        for name, value in values.items():
            if name not in allowed:
                raise NetError(f"net {self.name!r}: {name!r} is not one of the net {what} "
                               f"({', '.join(allowed) or 'none'})")
            blob = self.blobs[name]
            value = self.xp.asarray(value, dtype=self.dtype)
            if blob.shape and (not value.ndim or value.shape[0] != blob.shape[0]):
                kind = "Input" if which == "data" else "Diff"
                raise NetError(f"net {self.name!r}: {kind} is not batch sized: {name!r} got "
                               f"shape {value.shape}, the blob is {blob.shape} (reshape it "
                               f"first: net.blobs[{name!r}].reshape(...); net.reshape())")
            if which == "data":
                blob.data = value
            else:
                blob.diff = value

    def _collect(self, names: list[str], which: str) -> dict:
        out = {}
        for name in names:
            if name not in self.blobs:
                raise NetError(f"net {self.name!r}: no blob named {name!r}")
            out[name] = getattr(self.blobs[name], which)
        return out

    def backward(self, diffs=None, start: str | None = None, end: str | None = None,
                 on_learnable_done: Callable[[int], None] | None = None, **top_diffs):
        """pycaffe's backward: set output diffs from `top_diffs`, run layers `start`..`end`
        backwards (names; default all) and return {name: diff array} for the inputs (or,
        with `end`, that layer's bottoms) plus the names in `diffs`.

        `on_learnable_done(k)` is called right after learnable layer k's backward (k = L..1;
        also for a learnable layer whose backward was skipped, its diffs being final then).
        """
        start_i = self.layer_id(start) if start is not None else len(self.layers) - 1
        if end is not None:
            end_i = self.layer_id(end)
            wanted = self.bottom_names[end] or self.top_names[end]
        else:
            end_i = 0
            wanted = self.inputs
        self._set_blobs(top_diffs, self.outputs, "diff", "outputs")
        self.backward_from_to(start_i, end_i, on_learnable_done)
        return self._collect(list(wanted) + list(diffs or []), "diff")

    # -- pycaffe's batched passes
    def _batches(self, arrays: dict):
        """{name: array} cut into the net's batch size; the last batch padded with zeros."""
        if not arrays:
            yield {}
            return
        shape = self.blobs[next(iter(arrays))].shape if next(iter(arrays)) in self.blobs else ()
        size = shape[0] if shape else 1
        num = len(next(iter(arrays.values())))
        for start in range(0, num, size):
            batch = {}
            for name, value in arrays.items():
                part = np.asarray(value[start:start + size])
                if len(part) < size:
                    pad = np.zeros((size - len(part),) + part.shape[1:], dtype=part.dtype)
                    part = np.concatenate([part, pad])
                batch[name] = part
            yield batch

    def _batched(self, run, names, arrays: dict) -> dict:
        outs = {name: [] for name in names}
        for batch in self._batches(arrays):
            for name, value in run(batch).items():
                outs.setdefault(name, []).append(np.array(to_host(value), copy=True))
        total = len(next(iter(arrays.values()))) if arrays else None
        return {name: np.concatenate(parts)[:total] if parts else np.zeros(0)
                for name, parts in outs.items()}

    def forward_all(self, blobs=None, **inputs) -> dict:
        """pycaffe's forward_all: forward every batch of `inputs` (any number of items; the
        net's batch size per pass) and return {output or blob name: all items' data}."""
        names = list(dict.fromkeys(list(self.outputs) + list(blobs or [])))
        return self._batched(lambda b: self.forward(blobs=blobs, **b), names, inputs)

    def forward_backward_all(self, blobs=None, diffs=None, **arrays) -> tuple[dict, dict]:
        """pycaffe's forward_backward_all: for every batch, forward the inputs given and
        backward the output diffs given (both in `arrays`, by blob name); returns
        ({output or blob: all items' data}, {input or blob: all items' diff})."""
        inputs = {k: v for k, v in arrays.items() if k in self.inputs}
        tops = {k: v for k, v in arrays.items() if k not in inputs}
        out_names = list(dict.fromkeys(list(self.outputs) + list(blobs or [])))
        diff_names = list(dict.fromkeys(list(self.inputs) + list(diffs or [])))
        outs: dict = {name: [] for name in out_names}
        grads: dict = {name: [] for name in diff_names}
        forward_batches, backward_batches = self._batches(inputs), self._batches(tops)
        for fb, bb in itertools.zip_longest(forward_batches, backward_batches, fillvalue={}):
            for name, value in self.forward(blobs=blobs, **fb).items():
                outs.setdefault(name, []).append(np.array(to_host(value), copy=True))
            for name, value in self.backward(diffs=diffs, **bb).items():
                grads.setdefault(name, []).append(np.array(to_host(value), copy=True))
        total = len(next(iter(arrays.values()))) if arrays else None
        return ({n: np.concatenate(p)[:total] for n, p in outs.items() if p},
                {n: np.concatenate(p)[:total] for n, p in grads.items() if p})

    def backward_all(self, diffs=None, **output_diffs) -> dict:
        """pycaffe's backward_all: backward every batch of the output diffs given and return
        {input or blob name: all items' diff}."""
        names = list(dict.fromkeys(list(self.inputs) + list(diffs or [])))
        return self._batched(lambda b: self.backward(diffs=diffs, **b), names, output_diffs)

    # -- sharing, saving and loading by pycaffe's names
    def share_with(self, other: NetEngine) -> None:
        """pycaffe's name for share_weights."""
        self.share_weights(other)

    def save(self, path, write_diff: bool = False) -> None:
        """Write the weights as a binary .caffemodel (atomically) that BVLC Caffe loads."""
        write_caffemodel(self.to_proto(write_diff), path)

    def save_hdf5(self, path, write_diff: bool = False) -> None:
        """Write the weights in Caffe's HDF5 layout (.caffemodel.h5), atomically."""
        write_weights(self, str(path), HDF5, write_diff)

    def load_hdf5(self, path) -> None:
        """Load weights from Caffe's HDF5 layout, matching layers by name."""
        copy_trained_layers_hdf5(self, str(path))

    def set_input_arrays(self, data, labels) -> None:
        """pycaffe's MemoryData feed: hand arrays to the net's first layer (a MemoryData)."""
        first = self.layers[0] if self.layers else None
        if first is None or not hasattr(first, "set_input_arrays"):
            raise NetError(f"net {self.name!r}: set_input_arrays needs a MemoryData first layer, "
                           f"found {first.type if first else 'no layers'}")
        first.set_input_arrays(data, labels)

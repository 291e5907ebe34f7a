"""Net: a DAG of layers built from a NetParameter; forward, backward with a per-layer hook.

Semantics follow BVLC Caffe's Net (see docs/design.md, "Net contract"): phase/level/stage
filtering, automatic Split layers, in-place layers, loss weights, propagate_down,
force_backward, parameter sharing by ParamSpec name, reshaping when input shapes change.

Learnable layers are a first-class, documented order: `net.learnable_layers[k-1]` is learnable
layer k, numbered 1 (input side) .. L (output side). A layer is learnable when it OWNS at least
one parameter blob with lr_mult != 0 (shared parameters belong to the first layer that
declares their name). During backward, `on_learnable_done(k)` is called right after layer k's
backward, in the order L, L-1, ..., 1; at that moment layer k's parameter diffs are final for
this backward pass (every sharer's backward ran earlier, since sharers come after owners).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from google.protobuf import text_format

from ..backend import CPU, Device, to_host
from ..cpu.engine import CpuEngine
from ..cpu.layer_way import call_layer
from ..errors import NetError
from ..formats.protoio import filter_net, read_net_param, write_caffemodel
from ..layer_types.base import TEST, TRAIN
from ..layer_types.choice.rules import LayerRules
from ..proto import caffe_pb2
from . import debug as net_debug
from .builder import build_graph, insert_splits, name_index, wrap_layer_error
from .learnable import LearnableLayer, number_learnable_layers
from .norm_chain import find_chains
from .param_diffs import ParamDiffs
from .weights import (
    HDF5,
    copy_trained_layers,
    copy_trained_layers_hdf5,
    net_to_proto,
    share_trained_layers,
    write_weights,
)

__all__ = ["Net", "LearnableLayer", "TRAIN", "TEST"]

log = logging.getLogger("mgcaffe.net")


@dataclass
class LayerCallbacks:
    """pycaffe's per-layer callbacks (`net.before_forward(fn)` etc.), each called with the
    layer index; tuples, so a run in progress keeps the ones it started with."""

    before_forward: tuple = ()
    after_forward: tuple = ()
    before_backward: tuple = ()
    after_backward: tuple = ()

    def forward(self) -> tuple:
        return self.before_forward + self.after_forward

    def backward(self) -> tuple:
        return self.before_backward + self.after_backward


class Net:
    """A Caffe network. See the module docstring and docs/design.md for the contract.

    `Net(model, phase=TRAIN, weights=None, ...)`; pycaffe's older positional form
    `Net(model, weights_path, phase)` is accepted too. `model` is a prototxt path or a
    NetParameter. `device` defaults to the CPU (the pycaffe-style `mgcaffe.Net` uses the
    process-wide default set by `mgcaffe.set_mode_gpu()`/`set_device()`). `rules`: how the
    layers with several implementations choose one (`layer_types.choice.rules.LayerRules`;
    default its measured defaults). `cpu`: how it computes on the CPU, its own chunk runner
    and per-layer way (`cpu.engine.CpuEngine`; the commands pass the one their `--threads`
    choice made; default `CpuEngine.library_default()`, a new one per net); `net.cpu`.
    """

    #: Run BatchNorm, Scale (and ReLU) in place on one blob as one sweep each way where a
    #: forward or backward run covers all of them (layer_types.norm_chain; the CPU, not
    #: under debug_info or per-layer callbacks). False: always layer by layer.
    fuse_norm_chains = True

    def __init__(self, model, phase=TRAIN, weights=None, *, level: int = 0, stages=(),
                 device: Device | None = None, dtype=np.float32, seed: int | None = None,
                 rank: int = 0, world_size: int = 1, rules: LayerRules | None = None,
                 cpu: CpuEngine | None = None):
        if isinstance(phase, (str, os.PathLike)):  # pycaffe's Net(model, weights, phase)
            phase, weights = weights, phase
            if phase is None:
                raise NetError(f"Net(model, {str(weights)!r}, phase): the older form needs "
                               f"the phase (mgcaffe.TRAIN or mgcaffe.TEST) after the weights")
        if phase not in (TRAIN, TEST):
            raise NetError(f"Net: phase must be mgcaffe.TRAIN ({TRAIN}) or mgcaffe.TEST "
                           f"({TEST}), got {phase!r}")
        self.device = device or CPU
        self.xp = self.device.xp
        self.dtype = np.dtype(dtype)
        self.phase = phase
        #: This net's chunk runner and per-layer way (all threads or one BLAS thread).
        self.cpu = cpu if cpu is not None else CpuEngine.library_default()
        param = read_net_param(model)
        if not stages and param.HasField("state"):
            stages = tuple(param.state.stage)
        if not level and param.HasField("state"):
            level = param.state.level
        filtered = filter_net(param, phase, level, tuple(stages))
        if log.isEnabledFor(logging.INFO):
            log.info("Initializing net from parameters: \n%s",
                     text_format.MessageToString(filtered))
        self.net_param = insert_splits(filtered)
        self.name = self.net_param.name
        self.debug_info = bool(param.debug_info)  # Caffe's per-layer lines (net_debug.py)
        g = build_graph(self.net_param, phase, xp=self.xp, dtype=self.dtype, seed=seed,
                        rank=rank, world_size=world_size, rules=rules, cpu=self.cpu)
        self._adopt(g)
        for lp in self.net_param.layer:
            del lp.blobs[:]  # weights given inside the model now live in the Blobs only
        self.loss = 0.0
        if weights is not None:
            self.copy_from(weights)

    def _adopt(self, g) -> None:
        """Take over the built graph as this net's public attributes."""
        self.layers = g.layers
        self.layer_names = g.layer_names
        self._layer_index = name_index(g.layer_names)
        self.blobs = OrderedDict(zip(g.blob_names, g.blobs))
        self._bottom_vecs = [[g.blobs[i] for i in ids] for ids in g.bottom_ids]
        self._top_vecs = [[g.blobs[i] for i in ids] for ids in g.top_ids]
        self.bottom_names = OrderedDict(
            (n, [g.blob_names[i] for i in ids]) for n, ids in zip(g.layer_names, g.bottom_ids))
        self.top_names = OrderedDict(
            (n, [g.blob_names[i] for i in ids]) for n, ids in zip(g.layer_names, g.top_ids))
        self.inputs = [g.blob_names[i] for i in g.input_ids]
        self.outputs = [g.blob_names[i] for i in g.output_ids]
        self.blob_loss_weights = OrderedDict(zip(g.blob_names, g.blob_loss_weights))
        self.layer_need_backward = g.layer_need_backward
        self.bottom_need_backward = g.bottom_need_backward
        self.bottom_need_backward_unpruned = g.bottom_need_backward_unpruned
        self.params = OrderedDict((n, layer.blobs) for n, layer in zip(g.layer_names, g.layers)
                                  if layer.blobs)
        self.learnable_params = g.learnable_params
        self.params_lr = g.params_lr
        self.params_weight_decay = g.params_weight_decay
        self.param_owners = g.param_owner
        self._diffs = ParamDiffs(g.learnable_params, g.param_owner, g.params, self.xp,
                                 self.dtype)
        self._has_loss = [any(w != 0 for w in layer.loss_weights) for layer in g.layers]
        self._has_python_layer = any(layer.type == "Python" for layer in g.layers)
        self._learnable = number_learnable_layers(g)
        self._callbacks = LayerCallbacks()
        self._param_gate: Callable[[int], None] | None = None
        self._shapes = [self._shape_key(i) for i in range(len(self.layers))]
        self._chains = find_chains(self.layers, self._bottom_vecs, self._top_vecs)

    @property
    def learnable_layers(self) -> list[LearnableLayer]:
        """The learnable layers, input side first: `learnable_layers[k-1]` is layer k."""
        return self._learnable.layers

    # -- lookups
    def layer_id(self, name: str) -> int:
        """Index of the layer called `name` in `net.layers`."""
        try:
            return self._layer_index[name]
        except KeyError:
            raise NetError(f"net {self.name!r}: no layer named {name!r}") from None

    def layer_by_name(self, name: str):
        """The layer called `name` (Caffe's layer_by_name)."""
        return self.layers[self.layer_id(name)]

    @property
    def layer_dict(self) -> OrderedDict:
        """pycaffe's {layer name: layer}, in net order."""
        return OrderedDict(zip(self.layer_names, self.layers))

    @property
    def _layer_names(self) -> list[str]:
        """pycaffe's name for `layer_names`."""
        return self.layer_names

    # -- pycaffe's callbacks
    def before_forward(self, fn: Callable[[int], None]) -> None:
        """Call fn(i) before layer i's forward, for every layer run."""
        self._callbacks.before_forward += (fn,)

    def after_forward(self, fn: Callable[[int], None]) -> None:
        """Call fn(i) after layer i's forward."""
        self._callbacks.after_forward += (fn,)

    def before_backward(self, fn: Callable[[int], None]) -> None:
        """Call fn(i) before layer i's backward (for every layer in the range, as Caffe)."""
        self._callbacks.before_backward += (fn,)

    def after_backward(self, fn: Callable[[int], None]) -> None:
        """Call fn(i) after layer i's backward."""
        self._callbacks.after_backward += (fn,)

    def set_param_gate(self, gate: Callable[[int], None] | None) -> None:
        """Call gate(k) before the forward of every layer that reads learnable layer k's
        parameters, and in `forward_backward` for every learnable layer before backward
        (None: no gate). The solver uses it to update each layer's parameters only when the
        next forward needs them, while communication of the others goes on."""
        self._param_gate = gate

    # -- reshaping
    def _shape_key(self, i: int):
        return tuple(b.data.shape for b in self._bottom_vecs[i] + self._top_vecs[i])

    def _reshape_layer(self, i: int) -> None:
        layer, top = self.layers[i], self._top_vecs[i]
        layer.reshape(self._bottom_vecs[i], top)
        # A reshaped top is reallocated with a zero diff: restore its loss weight.
        for blob, weight in zip(top, layer.loss_weights):
            if weight:
                blob.diff[...] = weight
        self._shapes[i] = self._shape_key(i)

    def reshape(self) -> None:
        """Propagate input shapes through the net (pycaffe's net.reshape()).

        Layers without bottoms (inputs, data layers) keep the shapes they have: as in
        Caffe their reshape is a no-op, which is what lets `net.blobs['data'].reshape(...)`
        drive the rest of the net.
        """
        for i in range(len(self.layers)):
            if self._bottom_vecs[i]:
                self._guard(self.layers[i].param, "reshape", self._reshape_layer, i)

    @staticmethod
    def _guard(layer_param, stage: str, fn, *args):
        """fn(*args), an error re-raised naming the layer and the stage (wrap_layer_error)."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the layer
            err = wrap_layer_error(layer_param, stage, exc)
            if err is None:
                raise
            raise err from exc

    # -- forward
    def forward_layer(self, i: int) -> float:
        """Run layer i's forward (reshaping it first if its blob shapes changed); its loss."""
        layer = self.layers[i]
        bottom, top = self._bottom_vecs[i], self._top_vecs[i]
        if bottom and self._shape_key(i) != self._shapes[i]:
            self._guard(layer.param, "forward", self._reshape_layer, i)
        # on all threads or one, as the net's way says
        self._guard(layer.param, "forward", call_layer, self.xp, self.cpu.layer_way,
                    (id(layer), 0), layer.forward, bottom, top)
        return layer.device_loss(top) if self._has_loss[i] else 0.0

    def forward_step(self, i: int, end: int) -> tuple[int, float]:
        """Run layer i's forward, or that of the norm chain starting at i where the run goes
        on to layer `end` past it (see `fuse_norm_chains`); (the last layer run, its loss)."""
        chain = self._chains.starting_at(i)
        if chain is not None and chain.last <= end and self._chain_runs(chain, forward=True):
            layers = range(chain.first, chain.last + 1)
            for j in layers:
                if self._shape_key(j) != self._shapes[j]:
                    self._guard(self.layers[j].param, "reshape", self._reshape_layer, j)
            if chain.usable():  # still, after a reshape
                self._run_chain(chain, chain.forward, 0)
            else:
                for j in layers:
                    self.forward_layer(j)
            return chain.last, 0.0
        return i, self.forward_layer(i)

    def _chain_runs(self, chain, forward: bool, propagate=None) -> bool:
        """Whether a chain may run as one now: allowed, nothing watching its layers one at a
        time, usable, and in backward every layer of it giving its bottom a diff."""
        hooks = self._callbacks.forward() if forward else self._callbacks.backward()
        if not self.fuse_norm_chains or self.debug_info or hooks or not chain.usable():
            return False
        if forward:
            return True
        layers = range(chain.first, chain.last + 1)
        if propagate is not None:
            return all(list(propagate[j]) == [True] for j in layers)
        return all(self.layer_need_backward[j] and list(self.bottom_need_backward[j]) == [True]
                   for j in layers)

    def _run_chain(self, chain, run, phase: int) -> None:
        """run() for a chain (phase 0 forward, 1 backward), as a layer call of its own; an
        error names the chain's first layer."""
        self._guard(chain.batch_norm.param, ("forward", "backward")[phase], call_layer,
                    self.xp, self.cpu.layer_way, (id(chain), phase), run)

    def _forward_range(self, start: int, end: int) -> float:
        loss = 0.0
        i = start
        while i <= end:
            if self._param_gate is not None:
                chain = self._chains.starting_at(i)  # a chain runs as one: every layer's parameters
                last = chain.last if chain is not None and chain.last <= end else i
                for j in range(i, last + 1):
                    for k in self._learnable.reads[j]:
                        self._param_gate(k)
            for hook in self._callbacks.before_forward:
                hook(i)
            last, layer_loss = self.forward_step(i, end)
            if isinstance(loss, float) and loss == 0 and not isinstance(layer_loss, float):
                loss = layer_loss  # a device value: no device call for 0 + it
            else:
                loss += layer_loss
            if self.debug_info:
                net_debug.forward(self, i)
            for hook in self._callbacks.after_forward:
                hook(i)
            i = last + 1
        self.loss = loss = self._read_back(loss)
        return loss

    def _read_back(self, loss) -> float:
        """The loss as a float, and the layers' deferred device checks (`Layer.
        check_on_device`: label ranges) judged, with one read from the device."""
        checks = []
        for layer in self.layers:
            pending = getattr(layer, "deferred_checks", None)
            if pending:
                checks += pending
                pending.clear()
        if self.xp is np or (not checks and isinstance(loss, float)):
            return float(loss)
        xp = self.xp
        values = [xp.asarray(loss).reshape(1)] + [flag.reshape(1) for flag, _ in checks]
        # one device call converts and gathers them, one copy brings them
        host = to_host(xp.concatenate(values, dtype=np.float64))
        for (_, error), bad in zip(checks, host[1:]):
            if bad:
                raise error()
        return float(host[0])

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
        self._forward_range(start_i, end_i)
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

    # -- backward
    def backward_layer(self, i: int, propagate_down=None) -> None:
        """Run layer i's backward (propagate_down defaults to the net's rule for it)."""
        layer = self.layers[i]
        if propagate_down is None:
            propagate_down = self.bottom_need_backward[i]
        self._guard(layer.param, "backward", call_layer, self.xp, self.cpu.layer_way,
                    (id(layer), 1), layer.backward, self._top_vecs[i], propagate_down,
                    self._bottom_vecs[i])

    def backward_step(self, i: int, end: int, propagate=None) -> int:
        """Run layer i's backward (if it needs one), or that of the norm chain ending at i
        where the run goes on to layer `end` before it; the first layer run. `propagate`:
        every layer's propagate_down, each layer's backward then run whatever the net's rule
        (as `caffe time` does); default the net's rule."""
        chain = self._chains.ending_at(i)
        if chain is not None and chain.first >= end and \
                self._chain_runs(chain, forward=False, propagate=propagate):
            self._run_chain(chain, chain.backward, 1)
            return chain.first
        if propagate is not None or self.layer_need_backward[i]:
            self.backward_layer(i, None if propagate is None else propagate[i])
            if self.debug_info:
                net_debug.backward(self, i)
        return i

    def _backward_range(self, start: int, end: int,
                        on_learnable_done: Callable[[int], None] | None) -> None:
        learnable = self._learnable.of_layer
        i = start
        try:
            while i >= end:
                for hook in self._callbacks.before_backward:
                    hook(i)
                first = self.backward_step(i, end)
                for hook in self._callbacks.after_backward:
                    hook(i)
                for j in range(i, first - 1, -1):
                    if on_learnable_done is not None and learnable[j] is not None:
                        k = learnable[j]
                        self._diffs.settle_layer(self.learnable_layers[k - 1].param_ids)
                        on_learnable_done(k)
                i = first - 1
        finally:
            # what the backward did not write (frozen, skipped, or a failure half-way) is
            # zeros now: an array the user holds reads what a fresh read would
            self._diffs.settle()

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
        self._backward_range(start_i, end_i, on_learnable_done)
        return self._collect(list(wanted) + list(diffs or []), "diff")

    def forward_backward(self, on_learnable_done: Callable[[int], None] | None = None) -> float:
        """One forward and one backward over the whole net (data layers feed themselves);
        returns the loss. Parameter diffs accumulate: call clear_param_diffs() first."""
        loss = self._forward_range(0, len(self.layers) - 1)
        if self._param_gate is not None:  # before backward writes any parameter diff
            for layer in self.learnable_layers:
                self._param_gate(layer.index)
        self._backward_range(len(self.layers) - 1, 0, on_learnable_done)
        if self.debug_info:
            net_debug.all_params(self)
        return loss

    # -- parameters
    def reduced_param_ids(self) -> list[int]:
        """The `learnable_params` indices gradient sync reduces, in the order it communicates
        them: learnable layer L's blobs first .. layer 1's last, each layer's in order."""
        return [p for layer in reversed(self.learnable_layers) for p in layer.param_ids]

    def flatten_param_diffs(self, order=None):
        """Re-allocate parameter diffs as consecutive views of ONE contiguous buffer (Caffe's
        multi-GPU layout) and return it; it is also kept as `param_diff_buffer`.

        `order`: `learnable_params` indices in buffer order (default `reduced_param_ids()`,
        so that every group of consecutive learnable layers the gradient sync reduces is one
        slice of the buffer, all-reduced in place). Current values are kept, sharers keep
        aliasing their owner's diff, the other diffs stay as they are. Layers write into
        parameter diffs in place (`+=`, `out=`), so they write into the buffer; reshaping a
        flattened blob to another shape would give it a diff of its own again. Arrays held
        from before (`net.params[...][0].diff`) are no longer the blobs' diffs."""
        ids = self.reduced_param_ids() if order is None else [int(p) for p in order]
        return self._diffs.flatten(ids, f"net {self.name!r}: flatten_param_diffs")

    @property
    def flat_param_ids(self) -> tuple[int, ...]:
        """The `learnable_params` indices in the flat buffer, in its order (() before)."""
        return self._diffs.flat_ids

    #: Whether the solver's per-iteration clear (clear_param_diffs_for_pass) may clear
    #: lazily (Blob.clear_diff_lazily): the first backward writer then overwrites (GEMM
    #: beta = 0) instead of a fill and a read. False: a fill every time (the reference the
    #: tests compare against).
    lazy_param_diff_clear = True

    @property
    def param_diff_buffer(self):
        """The flat buffer of flatten_param_diffs (None before), its lazily cleared diffs
        zeroed first: code reading the buffer directly sees what `blob.diff` would."""
        return self._diffs.buffer

    @property
    def runs_user_code(self) -> bool:
        """Whether a forward or backward of this net runs code of the user's: a Python
        layer or a per-layer callback (before_forward etc.)."""
        return self._has_python_layer or bool(self._callbacks.forward()
                                              or self._callbacks.backward())

    def clear_param_diffs(self) -> None:
        """Zero every owned parameter diff, at once (pycaffe's clear_param_diffs): an array
        held from `net.params[name][i].diff` reads zeros when this returns."""
        self._diffs.clear()

    def clear_param_diffs_for_pass(self, user_code: bool = False) -> str:
        """Zero every owned parameter diff for a forward and backward that follow at once
        (the solver, once per iteration); returns how ("lazy" or "eager").

        Lazily (the first backward writer overwrites, no fill and no read) where
        `lazy_param_diff_clear` allows it and no code of the user's can look at the diffs
        before the backward has written them: neither the caller's (`user_code`, e.g.
        pycaffe's on_start callbacks) nor this net's (`runs_user_code`). What the backward
        does not write is filled at its end, so afterwards every diff, held or read afresh,
        holds its gradient. Call backward (forward_backward) before anything else reads."""
        return self._diffs.clear_for_pass(self.lazy_param_diff_clear,
                                          user_code or self.runs_user_code)

    def clear_param_diffs_of(self, param_ids) -> str:
        """Zero the diffs of these `learnable_params` indices for a backward to come (the
        solver's per-layer update, after a layer's update), lazily unless this net runs user
        code (as clear_param_diffs_for_pass); returns how. settle_param_diffs fills them."""
        return self._diffs.clear_some(param_ids, self.lazy_param_diff_clear,
                                      self.runs_user_code)

    def settle_param_diffs(self) -> None:
        """Fill the diffs still cleared lazily (an iteration that ended before its backward
        did): afterwards every diff array, held or read afresh, reads the same."""
        self._diffs.settle()

    @property
    def param_diff_clear_way(self) -> str | None:
        """How the last clear_param_diffs_for_pass cleared ("lazy"/"eager"; None before)."""
        return self._diffs.last_way

    def update(self) -> None:
        """Caffe's Net::Update: data -= diff for every owned parameter blob."""
        for blob in self.learnable_params:
            data = blob.data
            self.xp.subtract(data, blob.diff, out=data)

    def share_weights(self, other: Net) -> None:
        """Make this net's parameter data the arrays of `other`'s layers of the same name
        (Caffe's ShareTrainedLayersWith: test nets follow the train net's weights)."""
        share_trained_layers(self, other)

    def share_with(self, other: Net) -> None:
        """pycaffe's name for share_weights."""
        share_trained_layers(self, other)

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

    # -- weights
    def copy_from(self, source) -> None:
        """Load weights from a .caffemodel path or a NetParameter, matching layers by name."""
        copy_trained_layers(self, source)

    def to_proto(self, write_diff: bool = False) -> caffe_pb2.NetParameter:
        """The net with its parameter blobs as a NetParameter (what a .caffemodel holds)."""
        return net_to_proto(self, write_diff)

    def save(self, path, write_diff: bool = False) -> None:
        """Write the weights as a binary .caffemodel (atomically) that BVLC Caffe loads."""
        write_caffemodel(self.to_proto(write_diff), path)

    def save_hdf5(self, path, write_diff: bool = False) -> None:
        """Write the weights in Caffe's HDF5 layout (.caffemodel.h5), atomically."""
        write_weights(self, str(path), HDF5, write_diff)

    def load_hdf5(self, path) -> None:
        """Load weights from Caffe's HDF5 layout, matching layers by name."""
        copy_trained_layers_hdf5(self, str(path))

    # -- data and resources
    def set_input_arrays(self, data, labels) -> None:
        """pycaffe's MemoryData feed: hand arrays to the net's first layer (a MemoryData)."""
        first = self.layers[0] if self.layers else None
        if first is None or not hasattr(first, "set_input_arrays"):
            raise NetError(f"net {self.name!r}: set_input_arrays needs a MemoryData first layer, "
                           f"found {first.type if first else 'no layers'}")
        first.set_input_arrays(data, labels)

    def close(self) -> None:
        """Stop background work of the layers (data prefetch threads); idempotent."""
        for layer in self.layers:
            close = getattr(layer, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Net {self.name!r} {'TRAIN' if self.phase == TRAIN else 'TEST'}: "
                f"{len(self.layers)} layers, {len(self.learnable_layers)} learnable, "
                f"{self.device}>")

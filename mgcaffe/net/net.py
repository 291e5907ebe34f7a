"""The engine of a Net: a DAG of layers built from a NetParameter, run by layer index, with a
per-layer hook in backward.

Semantics follow BVLC Caffe's Net (see docs/design.md, "Net contract"): phase/level/stage
filtering, automatic Split layers, in-place layers, loss weights, propagate_down,
force_backward, parameter sharing by ParamSpec name, reshaping when input shapes change.
As Caffe's C++ Net, the engine runs layers by index (`forward_from_to`,
`backward_from_to`); pycaffe's name-keyed and batched API (`net.blobs`, `forward(data=x)`,
`forward_all`, ...) is `pycaffe.Net`, built on it, which is what `mgcaffe.net.Net` is.

Learnable layers are a first-class, documented order (learnable.py): `net.learnable_layers[k-1]`
is learnable layer k, numbered 1 (input side) .. L (output side). During backward,
`on_learnable_done(k)` is called right after layer k's backward, in the order L, L-1, ..., 1;
at that moment layer k's parameter diffs are final for this backward pass (every sharer's
backward ran earlier, since sharers come after owners).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from google.protobuf import text_format

from ..backend import CPU, Device, to_host
from ..cpu.engine import CpuEngine
from ..cpu.layer_way import call_layer
from ..errors import NetError
from ..formats.protoio import filter_net, read_net_to_build
from ..layer_types.base import TEST, TRAIN
from ..layer_types.choice.rules import LayerRules
from ..proto import caffe_pb2
from . import debug as net_debug
from .builder import build_graph, insert_splits, name_index, wrap_layer_error
from .learnable import LearnableLayer, number_learnable_layers
from .norm_chain import find_chains
from .param_diffs import ParamDiffs
from .weights import copy_trained_layers, net_to_proto, share_trained_layers

__all__ = ["NetEngine", "LearnableLayer", "TRAIN", "TEST"]

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


def _wiring(field: str, doc: str) -> property:
    """A read-only view of the built graph's `field` (builder.Graph), Caffe's vector of it."""
    return property(lambda self: getattr(self.graph, field), doc=doc)


class NetEngine:
    """A Caffe network's engine, by layer index. See the module docstring and
    docs/design.md for the contract; `mgcaffe.net.Net` adds pycaffe's API.

    `NetEngine(model, phase=TRAIN, weights=None, ...)`: `model` is a prototxt path or a
    NetParameter. `device` defaults to the CPU. `rules`: how the layers with several
    implementations choose one (`layer_types.choice.rules.LayerRules`; default its measured
    defaults). `cpu`: how it computes on the CPU, its own chunk runner and per-layer way
    (`cpu.engine.CpuEngine`; the commands pass the one their `--threads` choice made;
    default `CpuEngine.library_default()`, a new one per net); `net.cpu`.
    """

    #: Run BatchNorm, Scale (and ReLU) in place on one blob as one sweep each way where a
    #: forward or backward run covers all of them (layer_types.norm_chain; the CPU, not
    #: under debug_info or per-layer callbacks). False: always layer by layer.
    fuse_norm_chains = True
    #: Whether the solver's per-iteration clear (clear_param_diffs_for_pass) may clear
    #: lazily (Blob.clear_diff_lazily): the first backward writer then overwrites (GEMM
    #: beta = 0) instead of a fill and a read. False: a fill every time (the reference the
    #: tests compare against).
    lazy_param_diff_clear = True

    layer_need_backward = _wiring("layer_need_backward", "Per layer, whether it runs backward.")
    bottom_need_backward = _wiring("bottom_need_backward",
                                   "Per layer, which bottoms get a diff (propagate_down).")
    bottom_need_backward_unpruned = _wiring(
        "bottom_need_backward_unpruned",
        "bottom_need_backward before dropping the layers that reach no loss (`caffe time`).")
    params_lr = _wiring("params_lr", "Per learnable_params blob, its lr_mult.")
    params_weight_decay = _wiring("params_weight_decay",
                                  "Per learnable_params blob, its decay_mult.")
    param_owners = _wiring("param_owner", "Per parameter blob of every layer, -1 when it owns "
                           "its blob, else the index of the blob it shares.")

    def __init__(self, model, phase=TRAIN, weights=None, *, level: int = 0, stages=(),
                 device: Device | None = None, dtype=np.float32, seed: int | None = None,
                 rank: int = 0, world_size: int = 1, rules: LayerRules | None = None,
                 cpu: CpuEngine | None = None):
        if phase not in (TRAIN, TEST):
            raise NetError(f"Net: phase must be mgcaffe.TRAIN ({TRAIN}) or mgcaffe.TEST "
                           f"({TEST}), got {phase!r}")
        self.device = device or CPU
        self.xp = self.device.xp
        self.dtype = np.dtype(dtype)
        self.phase = phase
        #: This net's chunk runner and per-layer way (all threads or one BLAS thread).
        self.cpu = cpu if cpu is not None else CpuEngine.library_default()
        param = read_net_to_build(model)
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
        """Take over the built graph: what the engine runs with, by index."""
        #: The built wiring (builder.Graph): blob names and blobs, each layer's bottom and
        #: top ids, inputs, outputs, loss weights, parameters; what pycaffe's API names.
        self.graph = g
        self.layers = g.layers
        self.layer_names = g.layer_names
        self._layer_index = name_index(g.layer_names)
        self._bottom_vecs = [[g.blobs[i] for i in ids] for ids in g.bottom_ids]
        self._top_vecs = [[g.blobs[i] for i in ids] for ids in g.top_ids]
        self.learnable_params = g.learnable_params
        self._learnable = number_learnable_layers(g)
        self._diffs = ParamDiffs(g.learnable_params, g.param_owner, g.params, self.xp,
                                 self.dtype)
        self._has_loss = [any(w != 0 for w in layer.loss_weights) for layer in g.layers]
        self._has_python_layer = any(layer.type == "Python" for layer in g.layers)
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

    # -- pycaffe's callbacks (Caffe's Net keeps them: they run inside its loops)
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

    def forward_from_to(self, start: int, end: int) -> float:
        """Run layers `start`..`end` (indices, both run) forward, with the parameter gate
        and the callbacks; the objective of the layers run, also kept in `net.loss`
        (Caffe's ForwardFromTo)."""
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

    def backward_from_to(self, start: int, end: int,
                         on_learnable_done: Callable[[int], None] | None = None) -> None:
        """Run layers `start` down to `end` (indices, both run) backward, each that needs
        one, with the callbacks; `on_learnable_done(k)` right after learnable layer k's
        backward (k = L..1; also for a learnable layer whose backward was skipped, its diffs
        being final then). Caffe's BackwardFromTo."""
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

    def forward_backward(self, on_learnable_done: Callable[[int], None] | None = None) -> float:
        """One forward and one backward over the whole net (data layers feed themselves);
        returns the loss. Parameter diffs accumulate: call clear_param_diffs() first."""
        loss = self.forward_from_to(0, len(self.layers) - 1)
        if self._param_gate is not None:  # before backward writes any parameter diff
            for layer in self.learnable_layers:
                self._param_gate(layer.index)
        self.backward_from_to(len(self.layers) - 1, 0, on_learnable_done)
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

    def share_weights(self, other: NetEngine) -> None:
        """Make this net's parameter data the arrays of `other`'s layers of the same name
        (Caffe's ShareTrainedLayersWith: test nets follow the train net's weights)."""
        share_trained_layers(self, other)

    # -- weights
    def copy_from(self, source) -> None:
        """Load weights from a .caffemodel path or a NetParameter, matching layers by name."""
        copy_trained_layers(self, source)

    def to_proto(self, write_diff: bool = False) -> caffe_pb2.NetParameter:
        """The net with its parameter blobs as a NetParameter (what a .caffemodel holds)."""
        return net_to_proto(self, write_diff)

    def close(self) -> None:
        """Stop background work of the layers (data prefetch threads); idempotent."""
        for layer in self.layers:
            close = getattr(layer, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> NetEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Net {self.name!r} {'TRAIN' if self.phase == TRAIN else 'TEST'}: "
                f"{len(self.layers)} layers, {len(self.learnable_layers)} learnable, "
                f"{self.device}>")

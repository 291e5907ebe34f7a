"""Building a Net's graph from a filtered NetParameter, with Caffe's rules.

Two steps, as in Caffe's net.cpp and insert_splits.cpp:
1. `insert_splits`: a blob consumed by several layers (a use as a loss counts as a consumer)
   gets a Split layer whose tops `<blob>_<layer>_<topidx>_split_<k>` feed the consumers; the
   Split layer sums their diffs in backward.
2. `build_graph`: create and set up the layers in order, connect blobs (a top named like the
   bottom at the same index is in-place: the same Blob object), resolve parameter specs and
   sharing, and decide which layers and bottoms need backward.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from ..blob import Blob
from ..cpu.engine import CpuEngine
from ..errors import MgcaffeError, NetError
from ..formats.protoio import blobproto_to_array
from ..layer_types.base import Layer, LayerContext, Workspace
from ..layer_types.choice.rules import LayerRules
from ..layer_types.registry import create_layer
from ..proto import caffe_pb2

log = logging.getLogger("mgcaffe.net")

# ----------------------------------------------------------------------------- splits
def split_layer_name(layer_name: str, blob_name: str, top_index: int) -> str:
    """Caffe's name of the Split layer for top `top_index` (`blob_name`) of `layer_name`."""
    return f"{blob_name}_{layer_name}_{top_index}_split"


def split_blob_name(layer_name: str, blob_name: str, top_index: int, k: int) -> str:
    """Caffe's name of the k-th top of that Split layer."""
    return f"{blob_name}_{layer_name}_{top_index}_split_{k}"


def insert_splits(param: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """A copy of `param` with Split layers for every blob consumed more than once.

    A top with a non-zero explicit loss_weight counts as one consumer; its weight moves to
    the Split layer's first top (Caffe's rule).
    """
    last_producer: dict[str, tuple[int, int]] = {}
    source_of: dict[tuple[int, int], tuple[int, int]] = {}
    consumers: dict[tuple[int, int], int] = {}
    loss_weight_of: dict[tuple[int, int], float] = {}
    for i, layer in enumerate(param.layer):
        for j, name in enumerate(layer.bottom):
            if name not in last_producer:
                raise NetError(f"layer {layer.name!r}: unknown bottom blob {name!r} "
                               f"(bottom index {j}); no earlier layer produces it")
            top_idx = last_producer[name]
            source_of[(i, j)] = top_idx
            consumers[top_idx] = consumers.get(top_idx, 0) + 1
        for j, name in enumerate(layer.top):
            last_producer[name] = (i, j)
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            top_idx = last_producer[layer.top[j]]
            loss_weight_of[top_idx] = layer.loss_weight[j]
            if layer.loss_weight[j]:
                consumers[top_idx] = consumers.get(top_idx, 0) + 1

    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split: dict[tuple[int, int], int] = {}
    for i, source in enumerate(param.layer):
        layer = out.layer.add()
        layer.CopyFrom(source)
        for j in range(len(layer.bottom)):
            top_idx = source_of[(i, j)]
            if consumers.get(top_idx, 0) > 1:
                k = next_split.get(top_idx, 0)
                next_split[top_idx] = k + 1
                producer = param.layer[top_idx[0]].name
                layer.bottom[j] = split_blob_name(producer, layer.bottom[j], top_idx[1], k)
        for j, blob_name in enumerate(list(layer.top)):
            count = consumers.get((i, j), 0)
            if count <= 1:
                continue
            weight = loss_weight_of.get((i, j), 0.0)
            split = out.layer.add()
            split.name = split_layer_name(layer.name, blob_name, j)
            split.type = "Split"
            split.bottom.append(blob_name)
            for k in range(count):
                split.top.append(split_blob_name(layer.name, blob_name, j, k))
                if weight:
                    split.loss_weight.append(weight if k == 0 else 0.0)
            if weight:
                del layer.loss_weight[:]
                next_split[(i, j)] = next_split.get((i, j), 0) + 1
    return out


# ----------------------------------------------------------------------------- graph
#: The name Caffe gives the anonymous tops of AutoTopBlobs layers.
AUTO_TOP_NAME = "(automatic)"


@dataclass
class Graph:
    """Everything `build_graph` works out; the Net keeps these as its attributes.

    Ids index `layers` / `blob_names`. `params` lists every layer's parameter blobs in order;
    `param_owner[i]` is -1 for an owned blob, else the index (into `params`) of its owner.
    `learnable_params` are the owned blobs (Caffe's order), `learnable_param_ids[i]` maps
    `params[i]` to its learnable (owner's) index.
    """

    layers: list[Layer] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)
    blob_names: list[str] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    bottom_ids: list[list[int]] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    blob_need_backward: list[bool] = field(default_factory=list)
    bottom_need_backward: list[list[bool]] = field(default_factory=list)
    #: bottom_need_backward before pruning the layers that do not reach a loss (`caffe time`).
    bottom_need_backward_unpruned: list[list[bool]] = field(default_factory=list)
    layer_need_backward: list[bool] = field(default_factory=list)
    blob_loss_weights: list[float] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    params: list[Blob] = field(default_factory=list)
    param_layer: list[tuple[int, int]] = field(default_factory=list)
    param_owner: list[int] = field(default_factory=list)
    learnable_params: list[Blob] = field(default_factory=list)
    learnable_param_ids: list[int] = field(default_factory=list)
    learnable_param_layer: list[int] = field(default_factory=list)
    params_lr: list[float] = field(default_factory=list)
    params_weight_decay: list[float] = field(default_factory=list)


def _check_no_empty_tops(lp, tops, bottoms) -> None:
    """A data source (a layer without bottoms: Input, DummyData, Data, ...) whose top has a
    zero dimension (a batch size or channel count of 0) feeds nothing: later layers would
    divide by its size. Say where it comes from instead. Python layers may size their tops
    in forward, so they are left alone."""
    if bottoms or lp.type == "Python":
        return
    for name, blob in zip(lp.top, tops):
        if 0 in tuple(blob.shape):
            raise NetError(f"layer {lp.name!r} ({lp.type}): top {name!r} has shape "
                           f"{list(blob.shape)}, with a zero dimension; every dimension of "
                           "a data or Input top must be >= 1")


def wrap_layer_error(layer_param, stage: str, exc: Exception) -> NetError | None:
    """None when `exc` is an mgcaffe error already naming the layer (re-raise it as is);
    otherwise a NetError that names the layer, its type and the stage that failed."""
    if getattr(exc, "mgcaffe_user_layer", None):  # a Python layer's own error: keep it as is
        return None
    text = str(exc) or type(exc).__name__
    name = layer_param.name
    if isinstance(exc, MgcaffeError) and (f"'{name}'" in text or f'"{name}"' in text):
        return None
    detail = text if isinstance(exc, MgcaffeError) else f"{type(exc).__name__}: {text}"
    return NetError(f"layer {name!r} ({layer_param.type}): {stage} failed: {detail}")


class _Builder:
    """Appends layers one by one (Caffe's Net::Init loop); see `build_graph`."""

    def __init__(self, param, phase, xp, dtype, seed, rank, world_size, rules,
                 cpu: CpuEngine):
        self.param = param
        self.phase = phase
        self.xp = xp
        self.dtype = dtype
        # One scratch workspace per net: the layers' per-call temporaries share its buffers.
        # The net's chunk runner and adaptive flag: every layer's, never a process-wide one.
        self.ctx_args = dict(xp=xp, dtype=dtype, seed=seed, rank=rank, world_size=world_size,
                             workspace=Workspace(xp), rules=rules, chunk_runner=cpu.runner,
                             adaptive_blas=cpu.adaptive)
        self.g = Graph()
        self.blob_index: dict[str, int] = {}
        self.available: set[str] = set()
        self.has_lr: list[bool] = []
        self.has_decay: list[bool] = []
        self.param_name_index: dict[str, int] = {}
        self.memory_used = 0  # Caffe's "Memory required for data": top elements so far

    def build(self) -> Graph:
        for lp in self.param.layer:
            self.append_layer(lp)
        self.prune_backward()
        for layer_id in range(len(self.g.layers) - 1, -1, -1):
            log.info("%s %s backward computation.", self.g.layer_names[layer_id],
                     "needs" if self.g.layer_need_backward[layer_id] else "does not need")
        if self.param.force_backward:
            self.force_backward()
        g = self.g
        # Caffe keeps the remaining blobs in a std::set: outputs come out sorted by name.
        g.output_ids = [self.blob_index[name] for name in sorted(self.available)]
        self.share_params()
        for blob_id in g.output_ids:
            log.info("This network produces output %s", g.blob_names[blob_id])
        log.info("Network initialization done.")
        return g

    # -- one layer
    def append_layer(self, source: caffe_pb2.LayerParameter) -> None:
        g = self.g
        lp = caffe_pb2.LayerParameter()
        lp.CopyFrom(source)
        if not lp.HasField("phase"):
            lp.phase = self.phase
        layer_id = len(g.layers)
        if lp.propagate_down and len(lp.propagate_down) != len(lp.bottom):
            raise NetError(f"layer {lp.name!r}: propagate_down has {len(lp.propagate_down)} "
                           f"values for {len(lp.bottom)} bottoms; give none or one per bottom")
        ctx = LayerContext(phase=lp.phase, **self.ctx_args)
        log.info("Creating Layer %s", lp.name)
        layer = create_layer(lp, ctx)
        if lp.blobs:
            layer.blobs = [self.blob_from_proto(lp, i, bp) for i, bp in enumerate(lp.blobs)]
            # The values now live in the Blobs; do not keep a second copy in the message.
            del lp.blobs[:]
        g.layers.append(layer)
        g.layer_names.append(lp.name)

        need_backward = False
        bottoms, bottom_need = [], []
        for j, name in enumerate(lp.bottom):
            if name not in self.available:
                raise NetError(f"layer {lp.name!r}: unknown bottom blob {name!r} "
                               f"(bottom index {j})")
            blob_id = self.blob_index[name]
            self.available.discard(name)
            bottoms.append(blob_id)
            log.info("%s <- %s", lp.name, name)
            need = g.blob_need_backward[blob_id]
            if lp.propagate_down:
                need = bool(lp.propagate_down[j])
            bottom_need.append(need)
            need_backward |= g.blob_need_backward[blob_id]
        g.bottom_ids.append(bottoms)
        g.bottom_need_backward.append(bottom_need)

        tops = []
        for j, name in enumerate(lp.top):
            if j < len(lp.bottom) and name == lp.bottom[j]:
                tops.append(self.blob_index[name])  # in-place: the same Blob object
                log.info("%s -> %s (in-place)", lp.name, name)
            elif name in self.blob_index:
                raise NetError(f"layer {lp.name!r}: top blob {name!r} is produced by an "
                               f"earlier layer too (only in-place reuse, top {j} == bottom "
                               f"{j}, is allowed)")
            else:
                tops.append(self.new_blob(name))
                log.info("%s -> %s", lp.name, name)
            self.available.add(name)
            if lp.type == "Input":
                g.input_ids.append(tops[-1])
        if layer.auto_top_blobs:
            needed = max(layer.min_top or 0, layer.exact_num_top or 0)
            for _ in range(len(tops), needed):
                tops.append(self.new_blob(AUTO_TOP_NAME, anonymous=True))
                log.info("%s -> %s", lp.name, AUTO_TOP_NAME)
        g.top_ids.append(tops)

        bottom_blobs = [g.blobs[i] for i in bottoms]
        top_blobs = [g.blobs[i] for i in tops]
        try:
            layer.setup(bottom_blobs, top_blobs)
        except Exception as exc:  # noqa: BLE001 - re-raised with the layer's name
            err = wrap_layer_error(lp, "setup", exc)
            if err is None:
                raise
            raise err from exc
        _check_no_empty_tops(lp, top_blobs, bottom_blobs)
        for blob_id, weight in zip(tops, layer.loss_weights):
            g.blob_loss_weights[blob_id] = float(weight)
        self.log_setup(lp.name, top_blobs, layer.loss_weights)

        specs = list(layer.param.param)
        if len(specs) > len(layer.blobs):
            raise NetError(f"layer {lp.name!r}: {len(specs)} param specs for "
                           f"{len(layer.blobs)} parameter blobs")
        default = caffe_pb2.ParamSpec()
        layer.param_propagate_down = [
            (specs[i] if i < len(specs) else default).lr_mult != 0
            for i in range(len(layer.blobs))
        ]
        need_backward |= any(layer.param_propagate_down)
        for i in range(len(layer.blobs)):
            self.append_param(layer_id, i, specs[i] if i < len(specs) else default)
        g.layer_need_backward.append(need_backward)
        if need_backward:
            for blob_id in tops:
                g.blob_need_backward[blob_id] = True
        g.bottom_need_backward_unpruned.append(list(bottom_need))

    def log_setup(self, name: str, tops, loss_weights) -> None:
        """Caffe's set-up lines: each top's shape, its loss weight, the data memory so far."""
        log.info("Setting up %s", name)
        for j, blob in enumerate(tops):
            shape = tuple(blob.data.shape)
            count = blob.data.size
            log.info("Top shape: %s(%d)", "".join(f"{d} " for d in shape), count)
            if j < len(loss_weights) and loss_weights[j]:
                log.info("    with loss weight %s", f"{float(loss_weights[j]):.6g}")
            self.memory_used += count
        log.info("Memory required for data: %d", self.memory_used * self.dtype.itemsize)

    def new_blob(self, name: str, anonymous: bool = False) -> int:
        """A new blob; an anonymous one (an automatic top) is not reachable by name, so no
        later layer can take it as a bottom and it is not a net output (Caffe's rule)."""
        g = self.g
        blob_id = len(g.blobs)
        g.blobs.append(Blob((), xp=self.xp, dtype=self.dtype, name=name))
        g.blob_names.append(name)
        g.blob_need_backward.append(False)
        g.blob_loss_weights.append(0.0)
        if not anonymous:
            self.blob_index[name] = blob_id
        return blob_id

    def blob_from_proto(self, lp, index, blob_proto) -> Blob:
        values = blobproto_to_array(blob_proto, self.dtype,
                                    where=f"layer {lp.name!r} blob {index}")
        blob = Blob(values.shape, xp=self.xp, dtype=self.dtype, name=f"{lp.name}[{index}]")
        blob.data[...] = self.xp.asarray(values, dtype=self.dtype)
        return blob

    # -- parameters
    def append_param(self, layer_id: int, param_id: int, spec: caffe_pb2.ParamSpec) -> None:
        g = self.g
        layer = g.layers[layer_id]
        net_param_id = len(g.params)
        g.params.append(layer.blobs[param_id])
        g.param_layer.append((layer_id, param_id))
        name = spec.name
        if not name or name not in self.param_name_index:
            g.param_owner.append(-1)
            if name:
                self.param_name_index[name] = net_param_id
            g.learnable_param_ids.append(len(g.learnable_params))
            g.learnable_params.append(layer.blobs[param_id])
            g.learnable_param_layer.append(layer_id)
            self.has_lr.append(spec.HasField("lr_mult"))
            self.has_decay.append(spec.HasField("decay_mult"))
            g.params_lr.append(float(spec.lr_mult))
            g.params_weight_decay.append(float(spec.decay_mult))
            return
        owner_id = self.param_name_index[name]
        g.param_owner.append(owner_id)
        owner_layer, owner_param = g.param_layer[owner_id]
        mine, owner = layer.blobs[param_id], g.layers[owner_layer].blobs[owner_param]
        permissive = spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE
        if (mine.count != owner.count) if permissive else (mine.shape != owner.shape):
            raise NetError(
                f"layer {layer.name!r}: shared param {name!r} (param {param_id}) has shape "
                f"{mine.shape}, but its owner, layer {g.layer_names[owner_layer]!r} param "
                f"{owner_param}, has shape {owner.shape}"
                + (" (PERMISSIVE mode needs equal counts)" if permissive else ""))
        learnable_id = g.learnable_param_ids[owner_id]
        g.learnable_param_ids.append(learnable_id)
        for has, values, field_name in ((self.has_lr, g.params_lr, "lr_mult"),
                                        (self.has_decay, g.params_weight_decay, "decay_mult")):
            if not spec.HasField(field_name):
                continue
            value = float(getattr(spec, field_name))
            if has[learnable_id] and values[learnable_id] != value:
                raise NetError(f"layer {layer.name!r}: shared param {name!r} has {field_name} "
                               f"{value:g}, but layer {g.layer_names[owner_layer]!r} gave "
                               f"{values[learnable_id]:g}")
            has[learnable_id] = True
            values[learnable_id] = value

    def share_params(self) -> None:
        """Sharers alias their owner's data AND diff, so gradients accumulate in the owner."""
        g = self.g
        for i, owner in enumerate(g.param_owner):
            if owner >= 0:
                g.params[i].share(g.params[owner])

    # -- which layers need backward
    def prune_backward(self) -> None:
        """Caffe's second pass: drop backward for layers that do not reach a loss, and for
        layers none of whose tops need a diff (propagate_down: false above them)."""
        g = self.g
        under_loss: set[str] = set()
        skip_backprop: set[str] = set()
        for layer_id in range(len(g.layers) - 1, -1, -1):
            layer = g.layers[layer_id]
            contributes = False
            skip = True
            for j, blob_id in enumerate(g.top_ids[layer_id]):
                name = g.blob_names[blob_id]
                weight = layer.loss_weights[j] if j < len(layer.loss_weights) else 0.0
                if weight or name in under_loss:
                    contributes = True
                if name not in skip_backprop:
                    skip = False
                if contributes and not skip:
                    break
            if g.layer_need_backward[layer_id] and skip:
                g.layer_need_backward[layer_id] = False
                g.bottom_need_backward[layer_id] = [False] * len(g.bottom_ids[layer_id])
            if not contributes:
                g.layer_need_backward[layer_id] = False
            for j, blob_id in enumerate(g.bottom_ids[layer_id]):
                name = g.blob_names[blob_id]
                if contributes:
                    under_loss.add(name)
                else:
                    g.bottom_need_backward[layer_id][j] = False
                if not g.bottom_need_backward[layer_id][j]:
                    skip_backprop.add(name)

    def force_backward(self) -> None:
        """force_backward: every layer runs backward, into every bottom it allows."""
        g = self.g
        for layer_id, layer in enumerate(g.layers):
            g.layer_need_backward[layer_id] = True
            for j, blob_id in enumerate(g.bottom_ids[layer_id]):
                need = g.bottom_need_backward[layer_id][j] or layer.allow_force_backward(j)
                g.bottom_need_backward[layer_id][j] = need
                g.blob_need_backward[blob_id] = g.blob_need_backward[blob_id] or need
            layer.param_propagate_down = [True] * len(layer.blobs)


def build_graph(param: caffe_pb2.NetParameter, phase: int, *, xp, dtype, seed=None, rank=0,
                world_size=1, rules: LayerRules | None = None,
                cpu: CpuEngine | None = None) -> Graph:
    """Create and set up every layer of a filtered, split-inserted NetParameter; `rules`:
    the layers' path rules (default LayerRules()); `cpu`: the net's CpuEngine, whose runner
    and adaptive flag go into every layer's context (default CpuEngine.library_default())."""
    return _Builder(param, phase, xp, dtype, seed, rank, world_size,
                    rules if rules is not None else LayerRules(),
                    cpu if cpu is not None else CpuEngine.library_default()).build()


def name_index(names) -> OrderedDict:
    """name -> position, for the Net's lookups."""
    return OrderedDict((name, i) for i, name in enumerate(names))

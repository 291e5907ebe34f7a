"""The Layer contract (Caffe's): setup once, reshape when input shapes change, forward, backward.

A layer subclass
- declares `type` (the prototxt type string) and its blob counts (`exact_num_bottom`,
  `min_bottom`, `max_bottom`, `exact_num_top`, `min_top`, `max_top`; None = unchecked);
- reads its parameter message in `layer_setup` and creates `self.blobs` (learnable
  parameters, as `Blob`s of `self.dtype` on `self.xp`), unless they already exist (loaded);
- sizes its tops in `reshape`;
- writes `top[i].data` in `forward`;
- in `backward`, ADDS into parameter diffs (only where `self.param_propagate_down[i]`) and
  OVERWRITES `bottom[i].diff` (only where `propagate_down[i]`).

Layer code uses only `self.xp` array operations so that the same body runs on numpy and CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..blob import Blob
from ..errors import LayerError
from ..proto import caffe_pb2
from ..seeding import stable_hash
from .choice import Choice, Target, target_for
from .choice.rules import LayerRules

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST


class Workspace:
    """Scratch memory the layers of one net share: temporaries that live for one layer call.

    A layer asks for each temporary of a call by slot number (0, 1, 2, ...; two temporaries
    alive at once need two slots). Slot k is one buffer for the whole net, grown to the
    largest request, so a net holds per slot its largest layer's temporary instead of every
    layer's (layers run one at a time; the chunk threads of one call share its arrays).
    An array is valid until the next request of its slot: never keep one across calls.
    """

    def __init__(self, xp=np):
        self.xp = xp
        self._slots: dict[int, Any] = {}

    def array(self, slot: int, shape, dtype):
        """An uninitialised C-contiguous array of `shape` and `dtype` in slot `slot`."""
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        memory = self._slots.get(slot)
        if memory is None or memory.size < nbytes:
            memory = self._slots[slot] = self.xp.empty(max(nbytes, 1), dtype=np.uint8)
        return memory[:nbytes].view(dtype).reshape(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held by all slots."""
        return sum(int(m.size) for m in self._slots.values())


@dataclass
class LayerContext:
    """What a layer needs to know about the net it lives in; passed explicitly, never global.

    phase: caffe_pb2.TRAIN or TEST. xp: numpy or cupy. dtype: blob dtype (float32; tests use
    float64). seed: base seed of the net (fillers, dropout masks). rank/world_size: this
    process's share of the data in distributed training (record k is read by rank k % size).
    chunk_runner: the `cpu.parallel.ChunkRunner` that splits a layer's memory-bound CPU
    work over the cores: the net's own (`cpu.engine.CpuEngine.runner`, set by the net
    builder); None: on the calling thread alone. Unused on the GPU.
    adaptive_blas: whether the net's layer calls may run on one BLAS thread when that is
    faster (`--threads adaptive`, the net's CpuEngine): layers may then time ways whose last
    bits differ (InnerProduct's one-call weight gradient). False: results repeat bit for bit.
    workspace: a `Workspace` shared by the layers of one net for their per-call temporaries
    (None: each layer keeps its own; see `Layer.scratch`).
    rules: the `choice.rules.LayerRules` by which layers with several paths choose one.
    target: the `choice.Target` they choose for (None: the one `xp` implies, with the
    compiled loops that load in this process).
    """

    phase: int = TRAIN
    xp: Any = np
    dtype: Any = np.float32
    seed: int | None = None
    rank: int = 0
    world_size: int = 1
    extra: dict = field(default_factory=dict)
    chunk_runner: Any = None
    adaptive_blas: bool = False
    workspace: Workspace | None = None
    rules: LayerRules = field(default_factory=LayerRules)
    target: Target | None = None


class Layer:
    """Base class of every layer. See the module docstring for the contract."""

    type: ClassVar[str] = ""
    exact_num_bottom: ClassVar[int | None] = None
    min_bottom: ClassVar[int | None] = None
    max_bottom: ClassVar[int | None] = None
    exact_num_top: ClassVar[int | None] = None
    min_top: ClassVar[int | None] = None
    max_top: ClassVar[int | None] = None
    #: Loss layers: tops get a default loss_weight of 1 on the first top.
    is_loss: ClassVar[bool] = False
    #: Caffe's AutoTopBlobs: the net adds anonymous tops up to max(min_top, exact_num_top)
    #: when the definition names fewer (a loss layer written without a `top`).
    auto_top_blobs: ClassVar[bool] = False
    #: Layers that may not be forced to backprop into a given bottom (labels, Accuracy).
    equal_num_bottom_top: ClassVar[bool] = False

    def __init__(self, param: caffe_pb2.LayerParameter, ctx: LayerContext | None = None):
        self.param = param
        self.ctx = ctx or LayerContext()
        self.name = param.name
        self.phase = self.ctx.phase
        self.xp = self.ctx.xp
        self.dtype = np.dtype(self.ctx.dtype)
        self.blobs: list[Blob] = []
        self.param_propagate_down: list[bool] = []
        self.loss_weights: list[float] = []
        self._rng = None
        #: The implementation a layer with several took in its last reshape (choice/).
        self.choice: Choice | None = None

    # -- contract -------------------------------------------------------------------------
    def layer_setup(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Read parameters, create learnable blobs. Called once."""

    def reshape(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Size the tops (and internal buffers) for the bottoms' shapes."""
        raise NotImplementedError(f"{type(self).__name__}.reshape")

    def forward(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Compute top data from bottom data."""
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, top: list[Blob], propagate_down: list[bool], bottom: list[Blob]) -> None:
        """Add parameter gradients; overwrite bottom diffs where propagate_down."""

    def allow_force_backward(self, bottom_index: int) -> bool:
        """Whether force_backward may make this layer backprop into bottom[bottom_index]."""
        return True

    # -- provided -------------------------------------------------------------------------
    def setup(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Check blob counts, run layer_setup and reshape, and set up loss weights."""
        self.check_blob_counts(bottom, top)
        self.layer_setup(bottom, top)
        if len(self.param_propagate_down) != len(self.blobs):
            self.param_propagate_down = [True] * len(self.blobs)
        self.reshape(bottom, top)
        self.set_loss_weights(top)

    def check_blob_counts(self, bottom, top) -> None:
        def check(kind, n, exact, lo, hi):
            if exact is not None and n != exact:
                raise LayerError(f"layer {self.name!r} ({self.type}) takes {exact} {kind} "
                                 f"blob(s), got {n}")
            if lo is not None and n < lo:
                raise LayerError(f"layer {self.name!r} ({self.type}) takes at least {lo} "
                                 f"{kind} blob(s), got {n}")
            if hi is not None and n > hi:
                raise LayerError(f"layer {self.name!r} ({self.type}) takes at most {hi} "
                                 f"{kind} blob(s), got {n}")

        check("bottom", len(bottom), self.exact_num_bottom, self.min_bottom, self.max_bottom)
        check("top", len(top), self.exact_num_top, self.min_top, self.max_top)
        if self.equal_num_bottom_top and len(bottom) != len(top):
            raise LayerError(f"layer {self.name!r} ({self.type}) needs as many tops as bottoms, "
                             f"got {len(bottom)} bottoms and {len(top)} tops")

    def set_loss_weights(self, top: list[Blob]) -> None:
        """Caffe's rule: explicit loss_weight per top, else 1 for a loss layer's first top.

        A top with a non-zero weight gets its diff filled with that weight, so the net's
        backward starts from d(loss)/d(top) = weight.
        """
        weights = list(self.param.loss_weight)
        if weights and len(weights) != len(top):
            raise LayerError(f"layer {self.name!r}: {len(weights)} loss_weight values for "
                             f"{len(top)} tops")
        if not weights:
            weights = [1.0 if (self.is_loss and i == 0) else 0.0 for i in range(len(top))]
        self.loss_weights = [float(w) for w in weights]
        for blob, w in zip(top, self.loss_weights):
            if w != 0:
                blob.diff[...] = w

    def loss(self, top: list[Blob]) -> float:
        """This layer's contribution to the objective: sum of weight * sum(top data)."""
        return float(self.device_loss(top))

    def device_loss(self, top: list[Blob]):
        """`loss(top)` without reading it back: a float on the CPU, a 0-d device array on
        the GPU (the net adds the layers' and reads the sum once)."""
        total = 0.0
        for blob, w in zip(top, self.loss_weights):
            if w != 0:
                value = blob.data.sum()
                if self.xp is np:
                    total += w * float(value)
                else:  # no device calls for a weight of 1 and a first term
                    term = value if w == 1 else value * w
                    total = term if isinstance(total, float) and total == 0 else total + term
        return total

    def check_on_device(self, bad, error) -> None:
        """Raise `error()` where `bad` (a 0-d boolean array) is true: on the CPU at once; on
        the GPU when the net reads its loss back (the net takes `deferred_checks`, and one
        transfer brings the loss and every flag: no host wait per check). Outside a net, a
        check still pending from the previous call is judged on this one."""
        if self.xp is np:
            if bool(bad):
                raise error()
            return
        pending = self.__dict__.setdefault("deferred_checks", [])
        while pending:
            flag, late = pending.pop(0)
            if bool(flag):
                raise late()
        pending.append((bad, error))

    @property
    def rng(self):
        """A random generator on this layer's device, seeded from the net seed and the name."""
        if self._rng is None:
            seed = None
            if self.ctx.seed is not None:
                seed = (int(self.ctx.seed) * 1000003 + stable_hash(self.name)) % (2**63)
            self._rng = self.xp.random.default_rng(seed)
        return self._rng

    def scratch(self, slot: int, shape, dtype=None):
        """A temporary array for this call only (contents undefined, valid until this layer
        asks for the slot again): from the net's `ctx.workspace` when there is one, else a
        buffer this layer keeps per slot (reallocated when the shape or dtype changes)."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if self.ctx.workspace is not None:
            return self.ctx.workspace.array(slot, shape, dtype)
        shape = tuple(int(d) for d in shape)
        own = self.__dict__.setdefault("_scratch", {})
        array = own.get(slot)
        if array is None or array.shape != shape or array.dtype != dtype:
            array = own[slot] = self.xp.empty(shape, dtype=dtype)
        return array

    def new_blob(self, shape, name: str = "") -> Blob:
        """A zeroed blob of this layer's dtype on its device."""
        return Blob(shape, xp=self.xp, dtype=self.dtype, name=name or self.name)

    def choice_target(self) -> Target:
        """What this layer's path choice is made for: the context's target, else its xp's."""
        return self.ctx.target if self.ctx.target is not None else target_for(self.xp)

    def error(self, message: str) -> LayerError:
        """A LayerError whose message starts with this layer's name and type."""
        return LayerError(f"layer {self.name!r} ({self.type}): {message}")

    def __repr__(self) -> str:
        choice = getattr(self, "choice", None)
        path = f" path={choice.path}" if isinstance(choice, Choice) else ""
        return f"<{type(self).__name__} {self.name!r}{path}>"

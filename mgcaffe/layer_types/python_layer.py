"""`type: "Python"`: layers written by users against pycaffe's `caffe.Layer` contract.

A prototxt layer
    layer { type: "Python" name: "loss" bottom: "a" bottom: "b" top: "loss"
            python_param { module: "pyloss" layer: "EuclideanLossLayer" param_str: "..." } }
imports `module` from sys.path (PYTHONPATH and the working directory, as Caffe does) and
instantiates its class `layer`, a subclass of `mgcaffe.Layer` (`UserLayer` here), whose
methods follow pycaffe:

    setup(bottom, top)          once, before the first reshape (the user's own set-up step)
    reshape(bottom, top)        size the tops; called before EVERY forward, as Caffe does
    forward(bottom, top)        write top[i].data
    backward(top, propagate_down, bottom)   write bottom[i].diff where propagate_down[i]

Attributes the user's object can read: `self.param_str`, `self.phase` (mgcaffe.TRAIN/TEST),
`self.blobs` (its parameters; `self.blobs.add_blob(*shape)` adds one), `self.rank` and
`self.world_size` (this process's place in distributed training: a data layer without
bottoms reads record k when k % world_size == rank, say), `self.name` and `self.xp`
(numpy on the CPU; CuPy arrays on the GPU).

The user's class is NOT the internal layer: `PythonLayer` below is, and adapts the
internal contract (layer_setup / reshape / forward / backward, blob bookkeeping, loss
weights) to the user's methods. Its parameter blobs are the user object's `blobs` list,
so they are parameters like any other layer's: ParamSpec (`param { lr_mult }`) applies,
`net.save`/`copy_from` write and read them, distributed training all-reduces them with
the other learnable layers. `share_in_parallel` is accepted and has no effect: every
process of a distributed run holds its own instance.

An exception raised by the user's code propagates unchanged (its type and traceback), with
a note naming the layer and the method, so that callers catch what they raised.
"""

from __future__ import annotations

import importlib
import logging

from .. import caffe_alias
from ..blob import Blob
from ..errors import LayerError
from .base import Layer
from .registry import register_layer

log = logging.getLogger(__name__)

#: Attribute set on exceptions raised by user code, so that the net re-raises them as they are.
USER_ERROR_ATTR = "mgcaffe_user_layer"


def _import_user_module(name: str, where: str):
    """Import a layer module. One written for pycaffe (`import caffe`) gets mgcaffe as
    `caffe` (mgcaffe.caffe_alias, with a log line) when no real Caffe is importable, so that
    such modules work under `mgcaffe train` too; a real Caffe is never shadowed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != "caffe":
            raise

        other = caffe_alias.real_caffe()
        if caffe_alias.installed() or other is not None:
            raise ImportError(f"{exc} (a real Caffe is at {other}; mgcaffe does not shadow "
                              f"it: run under `python -m mgcaffe.caffe_alias --force`)"
                              if other else str(exc)) from exc
        caffe_alias.install()
        log.info("%s: module %r imports caffe: `caffe` is mgcaffe in this process "
                 "(mgcaffe.caffe_alias)", where, name)
        return importlib.import_module(name)


def _check_layer_class(obj, qualified: str, where: str) -> None:
    """Refuse a `layer:` that names something other than a Layer class (a function such as
    `os.system`, a module-level object, a class of another kind) with one line, before it is
    called with a LayerParameter and fails inside code that is not the user's layer."""
    if isinstance(obj, type) and issubclass(obj, UserLayer):
        return
    kind = ("a class that does not derive from the Layer base" if isinstance(obj, type)
            else f"a {type(obj).__name__}, not a class")
    raise LayerError(f"{where}: python_param layer {qualified!r} is {kind}; a Python layer's "
                     "`layer:` names a class deriving from caffe.Layer (mgcaffe.Layer) in "
                     "`module:`")


class BlobVec(list):
    """A layer's parameter blobs (pycaffe's BlobVec): a list with `add_blob(*shape)`."""

    def __init__(self, blobs=(), *, xp=None, dtype=None, name: str = ""):
        super().__init__(blobs)
        self._xp, self._dtype, self._name = xp, dtype, name

    def add_blob(self, *shape) -> Blob:
        """Append a zeroed blob of `shape` (ints, or one tuple) and return it."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        if self._xp is None:
            raise RuntimeError("add_blob: this layer is not part of a net yet; add blobs in "
                               "setup(), which the net calls")
        blob = Blob(shape, xp=self._xp, dtype=self._dtype, name=f"{self._name}[{len(self)}]")
        self.append(blob)
        return blob


class UserLayer:
    """Base class of Python layers (`mgcaffe.Layer`, pycaffe's `caffe.Layer`).

    Subclasses override setup, reshape, forward and backward (see the module docstring);
    the defaults of setup, reshape and backward do nothing, forward must be given.
    """

    def __init__(self, param=None):
        self.param = param
        self.blobs = BlobVec()
        self.param_str = param.python_param.param_str if param is not None else ""

    def setup(self, bottom, top):
        """Read `self.param_str`, check the blobs, add parameters; called once."""

    def reshape(self, bottom, top):
        """Size the tops (`top[i].reshape(*shape)`) for the bottoms' shapes."""

    def forward(self, bottom, top):
        """Compute the tops' data."""
        raise NotImplementedError(f"{type(self).__name__}.forward is not defined")

    def backward(self, top, propagate_down, bottom):
        """Write the bottoms' diffs where propagate_down[i]."""


@register_layer
class PythonLayer(Layer):
    """The adapter between the net and a user's `UserLayer` object (see module docstring)."""

    type = "Python"

    def __init__(self, param, ctx=None):
        pp = param.python_param
        where = f"layer {param.name!r} (Python)"
        if not pp.module or not pp.layer:
            raise LayerError(f"{where}: python_param needs module and layer (the class name)")
        try:
            module = _import_user_module(pp.module, where)
        except ImportError as exc:
            raise LayerError(f"{where}: cannot import module {pp.module!r} from sys.path "
                             f"(set PYTHONPATH to its folder): {exc}") from exc
        cls = getattr(module, pp.layer, None)
        if cls is None:
            raise LayerError(f"{where}: module {pp.module!r} ({getattr(module, '__file__', '?')}) "
                             f"has no class {pp.layer!r}")
        _check_layer_class(cls, f"{pp.module}.{pp.layer}", where)
        self.__dict__["impl"] = None
        super().__init__(param, ctx)
        impl = self._call(cls, "__init__", param)
        if not isinstance(getattr(impl, "blobs", None), list):
            impl.blobs = BlobVec()
        impl.param_str = pp.param_str
        impl.phase = self.phase
        impl.name = self.name
        impl.xp = self.xp
        impl.rank = self.ctx.rank
        impl.world_size = self.ctx.world_size
        self.__dict__["impl"] = impl
        self.blobs = impl.blobs

    # The user object's blobs ARE this layer's blobs (the builder may replace the list).
    @property
    def blobs(self):
        impl = self.__dict__.get("impl")
        return impl.blobs if impl is not None else self.__dict__.get("_blobs", [])

    @blobs.setter
    def blobs(self, value):
        vec = value if isinstance(value, BlobVec) else BlobVec(value)
        vec._xp, vec._dtype, vec._name = self.xp, self.dtype, self.name
        impl = self.__dict__.get("impl")
        if impl is not None:
            impl.blobs = vec
        else:
            self.__dict__["_blobs"] = vec

    def __getattr__(self, name):
        # net.layers[i].<attribute of the user's layer> works, as in pycaffe.
        impl = self.__dict__.get("impl")
        if impl is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(impl, name)

    def _call(self, fn, method: str, *args):
        try:
            return fn(*args)
        except Exception as exc:
            if not getattr(exc, USER_ERROR_ATTR, None):
                setattr(exc, USER_ERROR_ATTR, self.name)
                owner = self.param.python_param
                note = (f"in Python layer {self.name!r} ({owner.module}.{owner.layer}), "
                        f"{method}")
                if hasattr(exc, "add_note"):  # Python >= 3.11: shown with the traceback
                    exc.add_note(note)
                else:
                    log.error("%s: %s: %s", note, type(exc).__name__, exc)
            raise

    def layer_setup(self, bottom, top):
        self._call(self.impl.setup, "setup", bottom, top)

    def reshape(self, bottom, top):
        self._call(self.impl.reshape, "reshape", bottom, top)

    def forward(self, bottom, top):
        # Caffe reshapes a layer before every forward: Python layers whose output size
        # depends on the data (proposals, variable-size data layers) rely on it.
        shapes = [b.shape for b in top]
        self.reshape(bottom, top)
        for blob, shape, weight in zip(top, shapes, self.loss_weights):
            if weight and blob.shape != shape:
                blob.diff[...] = weight  # a reallocated loss top lost its weight
        self._call(self.impl.forward, "forward", bottom, top)

    def backward(self, top, propagate_down, bottom):
        self._call(self.impl.backward, "backward", top, list(propagate_down), bottom)

"""`cupy.ndarray` and the array functions of the double: numpy underneath, CuPy's rules on top.

Rules enforced as CuPy enforces them:
- a device array never converts to numpy implicitly (`np.asarray(dev)`: TypeError; `.get()`
  and `cupy.asnumpy` copy explicitly, and wait for the device);
- a numpy array (other than 0-d) is no operand of a device call (TypeError), nor the value
  of `dev[...] = host` (ValueError "non-scalar numpy.ndarray cannot be used for fill");
  `cupy.asarray`/`cupy.array`/`ndarray.set` are the host-to-device copies;
- the arrays of one call must live on the current device (ValueError);
- numpy functions applied to device arrays dispatch to the double's (NEP 13/18), as CuPy's
  do, and return device arrays.

Counting: each call that does device work counts one launch (views, `empty` and metadata
count none); reading a value on the host (`float(dev)`, `bool(dev)`, `.item()`, `.get()`,
`repr`, and the calls whose result size depends on the data: `nonzero`, boolean masks) counts
one host synchronisation at the calling line, with the bytes copied.
"""

from __future__ import annotations

import numbers
import operator

import numpy as np

__all__ = ["make_array_api"]

#: Functions whose result may be a view of an input: no launch when it is.
_VIEW_FUNCTIONS = {
    "reshape", "ravel", "transpose", "swapaxes", "moveaxis", "rollaxis", "squeeze",
    "expand_dims", "broadcast_to", "broadcast_arrays", "atleast_1d", "atleast_2d",
    "atleast_3d", "split", "array_split", "hsplit", "vsplit", "dsplit", "diagonal", "real",
    "imag", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "require",
    "flip", "fliplr", "flipud", "view", "as_strided", "sliding_window_view",
    "shape", "ndim", "size", "result_type", "can_cast", "min_scalar_type", "promote_types",
    "iscomplexobj", "isrealobj", "isscalar", "may_share_memory", "shares_memory",
    "get_array_module", "isfortran",
}
#: Allocations without initialisation.
_NO_LAUNCH = {"empty", "empty_like"}
#: Result size depends on the values: CuPy reads a count back from the device.
_SYNC_FUNCTIONS = {"nonzero", "argwhere", "flatnonzero", "unique", "compress", "extract",
                   "intersect1d", "setdiff1d", "union1d", "setxor1d", "trim_zeros"}
#: Host data these accept (a copy to the device): the creation functions.
_HOST_INPUT = {"array", "asarray", "asanyarray"}
#: Functions whose output is always host data (no device array).
_HOST_RESULT = {"shape", "ndim", "size", "result_type", "can_cast", "min_scalar_type",
                "promote_types", "iscomplexobj", "isrealobj", "isscalar", "may_share_memory",
                "shares_memory", "isfortran"}

_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "matmul": operator.matmul, "and": operator.and_, "or": operator.or_,
    "xor": operator.xor, "lshift": operator.lshift, "rshift": operator.rshift,
}
_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
            "eq": operator.eq, "ne": operator.ne}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs,
          "invert": operator.invert}


def make_array_api(state, names):
    """(ndarray class, function factory `function(name)`, ufunc factory, helpers) bound to
    `state` (cuda.State) and CuPy's `names` (names.cupy_names())."""
    counters = state.counters
    ndarray_names = names["cupy.ndarray"]
    ufunc_names = names["cupy.ufunc"]

    # ------------------------------------------------------------------ wrapping
    def device_of(array):
        return array._dev

    def unwrap(value, what, host_ok=False):
        """The numpy value behind a call argument (lists and tuples walked)."""
        if isinstance(value, ndarray):
            current = state.current_device()
            if value._dev != current:
                raise ValueError(f"Array device must be same as the current device: array "
                                 f"device = {value._dev} while current = {current} ({what})")
            return value._a
        if isinstance(value, np.ndarray):
            if value.ndim == 0 or host_ok:
                return value
            raise TypeError(f"Unsupported type {type(value)} (a numpy array passed to "
                            f"cupy.{what}: copy it with cupy.asarray first)")
        if isinstance(value, (list, tuple)):
            return type(value)(unwrap(v, what, host_ok) for v in value)
        if isinstance(value, dict):
            return {k: unwrap(v, what, host_ok) for k, v in value.items()}
        return value

    def wrap(value, parents=(), outs=None):
        """Device arrays for numpy results; `parents`: the inputs a view may come from;
        `outs`: {id(numpy out): device array} so that `out=` returns the caller's object."""
        if outs and id(value) in outs:
            return outs[id(value)]
        if isinstance(value, np.ndarray):
            owner = None
            for p in parents:
                if isinstance(p, ndarray) and np.may_share_memory(p._a, value):
                    owner = p._base if p._base is not None else p
                    break
            return ndarray._of(value, state.current_device(), owner)
        if isinstance(value, np.generic):  # CuPy reductions return 0-d device arrays
            return ndarray._of(np.asarray(value), state.current_device(), None)
        if isinstance(value, tuple):
            return tuple(wrap(v, parents, outs) for v in value)
        if isinstance(value, list):
            return [wrap(v, parents, outs) for v in value]
        return value

    def flat_inputs(args, kwargs):
        found = []

        def walk(v):
            if isinstance(v, ndarray):
                found.append(v)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    walk(x)
        for a in args:
            walk(a)
        for v in kwargs.values():
            walk(v)
        return found

    def is_view(result, inputs):
        if not isinstance(result, np.ndarray):
            return isinstance(result, (tuple, list)) and all(
                is_view(r, inputs) for r in result)
        return any(np.may_share_memory(i._a, result) for i in inputs)

    def call(name, fn, args, kwargs, host_ok=False):
        """Run numpy's `fn` on the unwrapped arguments and account for it as CuPy would."""
        inputs = flat_inputs(args, kwargs)
        plain_args = unwrap(list(args), name, host_ok)
        plain_kwargs = unwrap(dict(kwargs), name, host_ok)
        outs = {}
        out = kwargs.get("out")
        for o in (out if isinstance(out, tuple) else (out,)):
            if isinstance(o, ndarray):
                outs[id(o._a)] = o
        result = fn(*plain_args, **plain_kwargs)
        if name in _HOST_RESULT:
            return result
        if name in _SYNC_FUNCTIONS:
            counters.sync(f"cupy.{name}")
        if name in _NO_LAUNCH:
            state.counters.context(state.current_device())
        elif not (name in _VIEW_FUNCTIONS and not outs and is_view(result, inputs)):
            state.launch(name)
        return wrap(result, inputs, outs)

    def host_to_device(value, dtype=None, copy=True, order=None):
        """cupy.asarray / cupy.array of host data: one copy to the device."""
        host = np.array(value, dtype=dtype, copy=copy or None, order=order or "K")
        if not host.flags.c_contiguous and not host.flags.f_contiguous:
            host = np.ascontiguousarray(host)
        pinned = isinstance(value, np.ndarray) and state.is_pinned(value)
        counters.copy("h2d", host.nbytes, pinned)
        state.launch("memcpy h2d")
        device_copy = np.array(host, copy=True)
        return ndarray._of(device_copy, state.current_device(), None)

    # ------------------------------------------------------------------ ndarray
    class ndarray:  # noqa: N801 - CuPy's name
        """cupy.ndarray over a numpy array (see the module docstring)."""

        __slots__ = ("_a", "_dev", "_base", "__weakref__")
        __array_priority__ = 100.0

        def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
            self._a = np.empty(shape, dtype=dtype, order=order)
            self._dev = state.current_device()
            self._base = None
            state.counters.context(self._dev)

        @classmethod
        def _of(cls, array, device, owner):
            self = cls.__new__(cls)
            self._a, self._dev, self._base = array, device, owner
            return self

        # -- metadata (no device work)
        shape = property(lambda self: self._a.shape)
        dtype = property(lambda self: self._a.dtype)
        ndim = property(lambda self: self._a.ndim)
        size = property(lambda self: self._a.size)
        nbytes = property(lambda self: self._a.nbytes)
        itemsize = property(lambda self: self._a.itemsize)
        strides = property(lambda self: self._a.strides)
        flags = property(lambda self: self._a.flags)
        base = property(lambda self: self._base)

        @property
        def data(self):
            return _MemoryPointer(self._a.ctypes.data, self._dev)

        @property
        def device(self):
            return _Device(self._dev)

        @property
        def T(self):  # noqa: N802 - numpy's name
            return wrap(self._a.T, (self,))

        @property
        def mT(self):  # noqa: N802 - numpy's name
            return wrap(self._a.mT, (self,))

        @property
        def real(self):
            return wrap(self._a.real, (self,))

        @property
        def imag(self):
            return wrap(self._a.imag, (self,))

        def __len__(self):
            return len(self._a)

        def __iter__(self):
            for i in range(len(self._a)):
                yield self[i]

        # -- no implicit conversion to numpy
        def __array__(self, dtype=None, copy=None):
            raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                            "`.get()` to construct a NumPy array explicitly.")

        def _read(self, what):
            previous = state.enter_device(self._dev)  # CuPy reads through get()
            counters.sync(what)
            counters.copy("d2h", self._a.nbytes, False)
            state.set_device(previous)

        def __bool__(self):
            if self._a.size != 1:
                raise ValueError("The truth value of an array with more than one element "
                                 "is ambiguous. Use a.any() or a.all()")
            self._read("bool()")
            return bool(self._a)

        def __float__(self):
            self._read("float()")
            return float(self._a)

        def __int__(self):
            self._read("int()")
            return int(self._a)

        def __complex__(self):
            self._read("complex()")
            return complex(self._a)

        def __index__(self):
            raise TypeError("only integer scalar arrays can be converted to a scalar index")

        def __repr__(self):
            self._read("repr()")
            return repr(self._a)

        def __str__(self):
            self._read("str()")
            return str(self._a)

        def __format__(self, spec):
            self._read("format()")
            return format(self._a if self._a.ndim else self._a.item(), spec)

        def item(self, *args):
            self._read("item()")
            return self._a.item(*args)

        def tolist(self):
            self._read("tolist()")
            return self._a.tolist()

        def tobytes(self, order="C"):
            self._read("tobytes()")
            return self._a.tobytes(order)

        def get(self, stream=None, order="C", out=None, blocking=True):
            """Copy to the host: a numpy array (`out` when given); runs with the array's
            device current, as CuPy's does (`with self.device:`)."""
            previous = state.enter_device(self._dev)
            try:
                return self._get(stream, order, out, blocking)
            finally:
                state.set_device(previous)

        def _get(self, stream, order, out, blocking):
            if out is not None:
                if not isinstance(out, np.ndarray):
                    raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
                if out.dtype != self.dtype:
                    raise TypeError(f"{out.dtype} array cannot be obtained from "
                                    f"{self.dtype} array")
                if out.shape != self.shape:
                    raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, "
                                     f"actual shape: {out.shape}")
                if not (out.flags.c_contiguous or out.flags.f_contiguous):
                    raise RuntimeError("Non-contiguous array is not supported")
                out[...] = self._a
                result = out
            else:
                result = np.array(self._a, order=order, copy=True)
            pinned = out is not None and state.is_pinned(out)
            counters.copy("d2h", self._a.nbytes, pinned)
            state.launch("memcpy d2h") if stream is None else counters.launch(
                "memcpy d2h", stream.label)
            if blocking or not pinned:  # a copy into pageable memory returns when done
                counters.sync("ndarray.get")
            return result

        def set(self, arr, stream=None):
            """Copy host array `arr` (same shape and dtype) into this array, with the
            array's device current (as CuPy does)."""
            previous = state.enter_device(self._dev)
            try:
                self._set(arr, stream)
            finally:
                state.set_device(previous)

        def _set(self, arr, stream):
            if not isinstance(arr, np.ndarray):
                raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
            if self.dtype != arr.dtype:
                raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
            if self.shape != arr.shape:
                raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: "
                                 f"{arr.shape}")
            if not self._a.flags.c_contiguous:
                raise RuntimeError("Cannot set to non-contiguous array")
            self._a[...] = arr
            counters.copy("h2d", arr.nbytes, state.is_pinned(arr))
            state.launch("memcpy h2d") if stream is None else counters.launch(
                "memcpy h2d", stream.label)

        # -- indexing
        def _key(self, key, what):
            sync = False
            gather = False

            def conv(k):
                nonlocal sync, gather
                if isinstance(k, ndarray):
                    gather = True
                    if k.dtype == np.bool_:
                        sync = True
                    return unwrap(k, what)
                if isinstance(k, np.ndarray) and k.ndim:
                    gather = True
                    counters.copy("h2d", k.nbytes, state.is_pinned(k))
                    if k.dtype == np.bool_:
                        sync = True
                    return k
                if isinstance(k, list):
                    gather = True
                return k
            key = tuple(conv(k) for k in key) if isinstance(key, tuple) else conv(key)
            return key, sync, gather

        def __getitem__(self, key):
            unwrap(self, "__getitem__")
            key, sync, gather = self._key(key, "__getitem__")
            if sync:
                counters.sync("boolean mask indexing")
            result = self._a[key]
            if not gather and not isinstance(result, np.ndarray):
                # CuPy: integer indexing down to one element is a 0-d view, no kernel.
                result = self._a[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
            if gather:
                state.launch("take")
                return wrap(np.array(result), ())
            return wrap(result, (self,))

        def __setitem__(self, key, value):
            unwrap(self, "__setitem__")
            key, sync, _ = self._key(key, "__setitem__")
            if sync:
                counters.sync("boolean mask assignment")
            if isinstance(value, np.ndarray) and value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            if isinstance(value, (list, tuple)):
                raise TypeError(f"Unsupported type {type(value)}")
            if isinstance(value, ndarray) and self._a.size and np.may_share_memory(
                    value._a, self._a):
                value = ndarray._of(value._a.copy(), value._dev, None)  # CuPy copies first
            self._a[key] = unwrap(value, "__setitem__")
            state.launch("fill" if not isinstance(value, ndarray) else "copy")

        # -- arithmetic
        def fill(self, value):
            if isinstance(value, np.ndarray) and value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            if isinstance(value, ndarray) and value.shape != ():
                raise ValueError("non-scalar cupy.ndarray cannot be used for fill")
            unwrap(self, "fill")
            self._a.fill(unwrap(value, "fill"))
            state.launch("fill")

        def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
            if not copy and np.dtype(dtype) == self.dtype:
                return self
            return call("astype", lambda a: a.astype(dtype, order=order), (self,), {})

        def copy(self, order="C"):
            return call("copy", lambda a: a.copy(order=order), (self,), {})

        def view(self, dtype=None, type=None):  # noqa: A002 - CuPy's argument name
            unwrap(self, "view")
            out = wrap(self._a.view() if dtype is None else self._a.view(dtype), (self,))
            if type is not None and type is not ndarray:  # a subclass, as CuPy allows
                sub = type.__new__(type)
                sub._a, sub._dev, sub._base = out._a, out._dev, out._base
                out = sub
            return out

        def scatter_add(self, slices, value):
            call("scatter_add", lambda a, v: np.add.at(a, slices, v), (self, value), {})

        def __dlpack__(self, *args, **kwargs):
            raise TypeError("the CuPy double has no DLPack")

        # -- NEP 13 / 18: numpy functions on device arrays run the double's
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            target = function(ufunc.__name__)
            if method != "__call__":
                target = getattr(target, method)
            return target(*inputs, **kwargs)

        def __array_function__(self, func, types, args, kwargs):
            if func.__module__ not in ("numpy", "numpy._core.multiarray",
                                       "numpy._core.fromnumeric", "numpy._core.numeric",
                                       "numpy._core.shape_base", "numpy.lib._function_base_impl",
                                       "numpy._core.multiarray_umath"):
                return NotImplemented
            return function(func.__name__)(*args, **kwargs)

    ndarray.__module__ = "cupy"
    ndarray.__qualname__ = "ndarray"

    def method(name):
        def run(self, *args, **kwargs):
            return call(name, lambda a, *r, **k: getattr(a, name)(*r, **k), (self,) + args,
                        kwargs)
        run.__name__ = name
        return run

    for name in ndarray_names:
        if name not in ndarray.__dict__ and hasattr(np.ndarray, name) and \
                callable(getattr(np.ndarray, name)):
            setattr(ndarray, name, method(name))

    def binary(op, name, reflected=False, inplace=False):
        def run(self, other):
            if isinstance(other, (list, tuple)) or (
                    isinstance(other, np.ndarray) and other.ndim):
                raise TypeError(f"Unsupported type {type(other)}")
            if not isinstance(other, (ndarray, numbers.Number, np.generic, np.ndarray)):
                return NotImplemented
            if inplace:
                unwrap(self, name)
                result = op(self._a, unwrap(other, name))
                if result is not self._a:  # an in-place op numpy did out of place
                    self._a[...] = result
                state.launch(name)
                return self
            a, b = (other, self) if reflected else (self, other)
            return call(name, op, (a, b), {})
        return run

    for short, op in _BINARY.items():
        setattr(ndarray, f"__{short}__", binary(op, short))
        setattr(ndarray, f"__r{short}__", binary(op, short, reflected=True))
        iop = getattr(operator, f"i{short}")
        setattr(ndarray, f"__i{short}__", binary(iop, f"i{short}", inplace=True))
    for short, op in _COMPARE.items():
        setattr(ndarray, f"__{short}__", binary(op, short))
    ndarray.__hash__ = None
    for short, op in _UNARY.items():
        setattr(ndarray, f"__{short}__", lambda self, op=op, short=short: call(
            short, op, (self,), {}))

    # ------------------------------------------------------------------ functions
    class ufunc:  # noqa: N801 - CuPy's name
        """A CuPy ufunc: call, and `at`, `reduce`, `accumulate`, `reduceat`, `outer`."""

        def __init__(self, np_ufunc):
            self._u = np_ufunc
            self.__name__ = self.name = np_ufunc.__name__
            self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs

        def __call__(self, *args, **kwargs):
            return call(self.name, self._u, args, kwargs)

        def __getattr__(self, attr):
            if attr not in ufunc_names or not hasattr(self._u, attr):
                raise AttributeError(f"'cupy.ufunc' object has no attribute '{attr}'")
            fn = getattr(self._u, attr)
            return lambda *args, **kwargs: call(f"{self.name}.{attr}", fn, args, kwargs)

        def __repr__(self):
            return f"<ufunc '{self.name}'>"

    cache: dict = {}

    def function(name):
        """The double's cupy.`name` for a name CuPy and numpy share (cached)."""
        if name in cache:
            return cache[name]
        if name not in names["cupy"]:
            raise AttributeError(f"module 'cupy' has no attribute '{name}'")
        target = getattr(np, name, None)
        if target is None:
            raise AttributeError(f"the CuPy double does not implement cupy.{name} (CuPy "
                                 f"has it)")
        if isinstance(target, np.ufunc):
            result = ufunc(target)
        elif callable(target) and not isinstance(target, type):
            def result(*args, _name=name, _fn=target, **kwargs):
                if _name in _HOST_INPUT:
                    return asarray_like(_name, *args, **kwargs)
                return call(_name, _fn, args, kwargs)
            result.__name__ = name
        else:
            result = target  # dtypes, constants, numpy's scalar types: CuPy's are numpy's
        cache[name] = result
        return result

    def asarray_like(name, a, dtype=None, *args, copy=None, order=None, **kwargs):
        if isinstance(a, ndarray):
            unwrap(a, name)
            if name != "array" and (dtype is None or np.dtype(dtype) == a.dtype) and \
                    not copy:
                return a
            return call(name, lambda x: np.array(x, dtype=dtype, order=order or "K",
                                                 copy=True), (a,), {})
        if isinstance(a, (list, tuple)) and any(isinstance(v, ndarray) for v in a):
            return call("stack", lambda *xs: np.array(xs, dtype=dtype), tuple(a), {})
        return host_to_device(a, dtype=dtype, order=order)

    class _MemoryPointer:
        def __init__(self, ptr, device_id):
            self.ptr, self.device_id, self.mem = int(ptr), int(device_id), None

    _Device = None  # set by bind_device below

    def bind_device(device_class):
        nonlocal _Device
        _Device = device_class

    return ndarray, function, ufunc, bind_device, unwrap, wrap, call, host_to_device

"""Blob: a named N-d array of data and a same-shaped array of gradients (diff), as in Caffe."""

from __future__ import annotations

from math import prod

import numpy as np

from .backend import host_assignable
from .errors import NetError


class _DiffState:
    """Whether a diff (shared by every blob aliasing it) is logically zero but not yet
    written: `clear_diff_lazily` sets it, the first access fills the zeros or overwrites."""

    __slots__ = ("zero",)

    def __init__(self):
        self.zero = False


class Blob:
    """Data and diff arrays of one shape, on one device.

    `data` and `diff` are writable arrays of the blob's array module (`xp`); write into them
    in place (`blob.data[...] = x`) or assign an array of the same shape; on the GPU, `x` may
    also be a numpy array (copied to the device, as pycaffe does). Blobs created by
    `share_data`/`share_diff` alias another blob's arrays, which is how in-place layers and
    shared parameters work.

    Lazy zeroing (parameter diffs, once per iteration): `clear_diff_lazily()` only marks the
    diff as zero. Every read of `diff` then fills the zeros first, so any code sees a zeroed
    diff; a writer that overwrites every element (a GEMM with beta = 0) asks
    `diff_for_write()` instead and skips the fill and the read.
    """

    __slots__ = ("_data", "_diff", "_dstate", "xp", "dtype", "name")

    def __init__(self, shape=(), xp=np, dtype=np.float32, name: str = ""):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.name = name
        shape = tuple(int(d) for d in shape)
        self._check_shape(shape)
        self._data = self._own(xp.zeros(shape, dtype=self.dtype))
        self._diff = self._own(xp.zeros(shape, dtype=self.dtype))
        self._dstate = _DiffState()

    def _own(self, array):
        # On the GPU: a view that also takes numpy arrays in `[...] =` (backend).
        return host_assignable(array, self.xp)

    def _check_shape(self, shape):
        if any(d < 0 for d in shape):
            raise NetError(f"blob {self.name!r}: negative dimension in shape {shape}")

    @property
    def data(self):
        """The values (forward)."""
        return self._data

    @data.setter
    def data(self, value):
        self._assign("data", value)

    @property
    def diff(self):
        """The gradients of the objective with respect to the values (backward)."""
        if self._dstate.zero:  # cleared lazily and not written yet: the zeros, now
            self._diff.fill(0)
            self._dstate.zero = False
        return self._diff

    @diff.setter
    def diff(self, value):
        self._assign("diff", value)

    def _assign(self, which, value):
        target = self._data if which == "data" else self._diff
        value = self.xp.asarray(value)
        if value.shape != target.shape:
            raise NetError(
                f"blob {self.name!r}: cannot assign {which} of shape {value.shape} "
                f"to a blob of shape {target.shape}; call reshape first"
            )
        target[...] = value
        if which == "diff":
            self._dstate.zero = False  # every element written

    # -- lazily zeroed diffs
    def clear_diff_lazily(self) -> None:
        """Make the diff zero without writing it yet (the next access fills or overwrites;
        also for every blob sharing this diff)."""
        self._dstate.zero = True

    @property
    def diff_is_lazy_zero(self) -> bool:
        """Whether the diff is cleared lazily and not written since."""
        return self._dstate.zero

    def diff_for_write(self):
        """(diff array, overwrite) for a writer that adds into the diff. With overwrite True
        the diff was cleared lazily: the caller must WRITE every element (GEMM beta = 0,
        `out=`, `[...] =`) before anything reads it, its values being stale; else it adds
        (`+=`, beta = 1) as usual. The lazy mark is gone either way."""
        overwrite = self._dstate.zero
        self._dstate.zero = False
        return self._diff, overwrite

    def add_to_diff(self, value) -> None:
        """diff += value, or diff = value where the diff was cleared lazily (no fill)."""
        diff, overwrite = self.diff_for_write()
        if overwrite:
            diff[...] = value
        else:
            diff += value

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def count(self) -> int:
        """Number of elements."""
        return int(prod(self._data.shape))

    @property
    def num_axes(self) -> int:
        return self._data.ndim

    def legacy_shape(self, index: int) -> int:
        """Caffe's LegacyShape: dimension `index` of a blob of at most 4 axes, 1 where the
        blob has fewer axes (num, channels, height, width)."""
        if self.num_axes > 4:
            raise NetError(f"blob {self.name!r}: num/channels/height/width need at most 4 "
                           f"axes, the shape is {self.shape}; use .shape")
        if index >= self.num_axes or index < -self.num_axes:
            return 1
        return int(self.shape[index])

    num = property(lambda self: self.legacy_shape(0), doc="Legacy dimension 0 (pycaffe).")
    channels = property(lambda self: self.legacy_shape(1), doc="Legacy dimension 1 (pycaffe).")
    height = property(lambda self: self.legacy_shape(2), doc="Legacy dimension 2 (pycaffe).")
    width = property(lambda self: self.legacy_shape(3), doc="Legacy dimension 3 (pycaffe).")

    def count_range(self, start: int, end: int | None = None) -> int:
        """Product of the dimensions start..end-1 (Caffe's count(start, end))."""
        return int(prod(self.shape[start:end]))

    def canonical_axis(self, axis: int) -> int:
        """Axis index with negative values counted from the end; errors name the blob."""
        n = self.num_axes
        if not -n <= axis < max(n, 1):
            raise NetError(f"blob {self.name!r}: axis {axis} out of range for shape {self.shape}")
        return axis + n if axis < 0 else axis

    def reshape(self, *shape) -> None:
        """Change the shape. With the same element count the values are kept (Caffe keeps
        its memory: the same values in the new shape, views stay aliased); otherwise the
        arrays are reallocated, zeroed.

        Accepts `reshape(2, 3)` or `reshape((2, 3))`, as pycaffe does.
        """
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        self._check_shape(shape)
        if shape == self.shape:
            return
        if prod(shape) == self.count and self._data.flags.c_contiguous \
                and self._diff.flags.c_contiguous:
            self._data = self._own(self._data.reshape(shape))
            self._diff = self._own(self._diff.reshape(shape))
            return
        self._data = self._own(self.xp.zeros(shape, dtype=self.dtype))
        self._diff = self._own(self.xp.zeros(shape, dtype=self.dtype))
        self._dstate = _DiffState()  # a diff of its own, zeros already

    def reshape_like(self, other: Blob) -> None:
        self.reshape(other.shape)

    def share_data(self, other: Blob) -> None:
        """Make this blob's data the same array as `other`'s (shapes must hold equal counts)."""
        if other.count != self.count:
            raise NetError(
                f"blob {self.name!r}: cannot share data with {other.name!r}: "
                f"{self.shape} vs {other.shape}"
            )
        self._data = self._own(other._data.reshape(self.shape))

    def share_diff(self, other: Blob) -> None:
        """Make this blob's diff the same array as `other`'s."""
        if other.count != self.count:
            raise NetError(
                f"blob {self.name!r}: cannot share diff with {other.name!r}: "
                f"{self.shape} vs {other.shape}"
            )
        self._diff = self._own(other._diff.reshape(self.shape))
        self._dstate = other._dstate  # one array, one lazy-zero mark

    def use_diff_storage(self, storage) -> None:
        """Make `storage` (an array of the blob's shape, dtype and xp: typically a view into a
        larger buffer, Net.flatten_param_diffs) this blob's diff, keeping the current values.

        Only code that writes into `diff` in place (`+=`, `out=`, `[...] =`) keeps writing
        into `storage` afterwards; `reshape` to another shape allocates a fresh diff."""
        if tuple(storage.shape) != self.shape or storage.dtype != self.dtype:
            raise NetError(f"blob {self.name!r}: diff storage of shape {tuple(storage.shape)} "
                           f"{storage.dtype} for a blob of shape {self.shape} {self.dtype}")
        storage[...] = self.diff  # (zeros filled first if cleared lazily)
        self._diff = self._own(storage)
        self._dstate = _DiffState()

    def share(self, other: Blob) -> None:
        """Alias both data and diff (an in-place top, a shared parameter)."""
        self.share_data(other)
        self.share_diff(other)

    def __repr__(self) -> str:
        return f"Blob({self.name!r}, shape={self.shape}, dtype={self.dtype})"

"""The array backend: numpy on the CPU, CuPy on the GPU. The only module that imports cupy.

Layer code is written once against an array module `xp` (numpy or cupy); see
`get_array_module`. A `Device` names where a net's blobs live and carries its array module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import MgcaffeError


def _import_cupy():
    try:
        import cupy  # noqa: PLC0415 - optional dependency, imported only when asked for
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise MgcaffeError(
            "GPU mode needs CuPy: install it with `pip install mgcaffe[gpu]` "
            f"(import failed: {exc})"
        ) from exc
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return gpu_count() > 0


def gpu_count() -> int:
    """How many CUDA devices CuPy sees (CUDA_VISIBLE_DEVICES applied; no context is made);
    0 when CuPy is missing or sees none."""
    try:
        cupy = _import_cupy()
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return 0


@dataclass(frozen=True)
class Device:
    """Where blobs live: `Device("cpu")` or `Device("gpu", 0)`."""

    kind: str = "cpu"
    index: int = 0

    def __post_init__(self):
        if self.kind not in ("cpu", "gpu"):
            raise MgcaffeError(f"unknown device kind {self.kind!r}: expected 'cpu' or 'gpu'")

    @property
    def xp(self) -> Any:
        """The array module for this device (numpy or cupy)."""
        if self.kind == "cpu":
            return np
        cupy = _import_cupy()
        cupy.cuda.Device(self.index).use()
        return cupy

    def __str__(self) -> str:
        return "CPU" if self.kind == "cpu" else f"GPU {self.index}"


CPU = Device("cpu")


def is_device_array(array) -> bool:
    """Whether `array` is a CuPy array (or of a subclass of one), without importing CuPy."""
    return any(c.__module__.split(".")[0] == "cupy" for c in type(array).__mro__[:-1])


def get_array_module(*arrays) -> Any:
    """numpy or cupy, whichever the arrays belong to (numpy when none is a CuPy array)."""
    for a in arrays:
        if is_device_array(a):
            return _import_cupy()
    return np


def to_host(array) -> np.ndarray:
    """A numpy copy (or view, on the CPU) of an array from either backend."""
    if isinstance(array, np.ndarray):
        return array
    if is_device_array(array):
        return array.get()
    return np.asarray(array)


_HOST_ASSIGNABLE: dict[int, type] = {}


def host_assignable(array, xp) -> Any:
    """`array` itself on the CPU; on the GPU a view of it whose `[...] = numpy_array` copies
    the values to the device (pycaffe's `blob.data[...] = images`, which CuPy refuses:
    "non-scalar numpy.ndarray cannot be used for fill"). Everything else is CuPy's."""
    if xp is np:
        return array
    cls = _HOST_ASSIGNABLE.get(id(xp))
    if cls is None or cls.__mro__[1] is not xp.ndarray:

        class HostAssignable(xp.ndarray):
            """A CuPy array that also accepts host arrays as `[key] =` values."""

            __slots__ = ()

            def __setitem__(self, key, value):
                if isinstance(value, np.ndarray) and value.ndim:
                    value = xp.asarray(value)  # one host-to-device copy, as pycaffe makes
                super().__setitem__(key, value)

        cls = _HOST_ASSIGNABLE[id(xp)] = HostAssignable
    return array if type(array) is cls else array.view(type=cls)


def to_device(array, xp) -> Any:
    """The array on the device of array module `xp` (no copy when it is already there)."""
    if xp is np:
        return to_host(array)
    return xp.asarray(array)


class HostToDevice:
    """Copies host batches into device arrays the way a data loader should: through
    page-locked (pinned) host buffers, so that the copy is one asynchronous DMA on the
    current stream instead of a staged copy from pageable memory.

    `copy(slot, host, target)` writes numpy array `host` into `target` (same shape; cast to
    its dtype). On the CPU that is a plain assignment. On the GPU each slot (one per top)
    has two pinned buffers used in turn; a buffer is written again only after the copy that
    last read it has finished (its event; normally long done, so no wait)."""

    def __init__(self, xp):
        self.xp = xp
        self._buffers: dict[int, list] = {}
        self._turn: dict[int, int] = {}

    def copy(self, slot: int, host, target) -> None:
        xp = self.xp
        if xp is np:
            target[...] = host
            return
        host = np.asarray(host)
        pair = self._buffers.get(slot)
        if pair is None or pair[0][0].shape != target.shape or \
                pair[0][0].dtype != target.dtype:
            pinned = _import_cupyx().empty_pinned
            pair = self._buffers[slot] = [[pinned(target.shape, target.dtype), None]
                                          for _ in range(2)]
        turn = self._turn[slot] = 1 - self._turn.get(slot, 1)
        buffer, event = pair[turn]
        if event is not None and not event.done:
            event.synchronize()  # the GPU is two batches behind: wait for that copy
        np.copyto(buffer, host.reshape(target.shape), casting="unsafe")
        if target.flags.c_contiguous:
            target.set(buffer)
        else:
            target[...] = xp.asarray(buffer)
        pair[turn][1] = xp.cuda.get_current_stream().record()


def _import_cupyx():
    _import_cupy()
    import cupyx  # noqa: PLC0415 - optional dependency, with CuPy

    return cupyx

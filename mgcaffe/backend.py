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
    try:
        cupy = _import_cupy()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means "no usable GPU"
        return False


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


def get_array_module(*arrays) -> Any:
    """numpy or cupy, whichever the arrays belong to (numpy when none is a CuPy array)."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            return _import_cupy()
    return np


def to_host(array) -> np.ndarray:
    """A numpy copy (or view, on the CPU) of an array from either backend."""
    if isinstance(array, np.ndarray):
        return array
    if type(array).__module__.startswith("cupy"):
        return array.get()
    return np.asarray(array)


def to_device(array, xp) -> Any:
    """The array on the device of array module `xp` (no copy when it is already there)."""
    if xp is np:
        return to_host(array)
    return xp.asarray(array)

"""The MemoryData layer: batches cut from arrays handed over from Python."""

from __future__ import annotations

import numpy as np

from ..backend import HostToDevice
from .base import Layer
from .registry import register_layer


@register_layer
class MemoryData(Layer):
    """Serves consecutive batches of arrays given by `set_input_arrays(data, labels)`.

    Tops: data (batch_size, channels, height, width), label (batch_size,). The count must be
    a multiple of batch_size; after the last batch it starts over. No transforms are applied
    to the arrays (Caffe's Reset skips them too).
    """

    type = "MemoryData"
    exact_num_bottom = 0
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.memory_data_param
        self.batch_size = int(p.batch_size)
        self.item_shape = (int(p.channels), int(p.height), int(p.width))
        if self.batch_size <= 0 or min(self.item_shape) <= 0:
            raise self.error("batch_size, channels, height and width must be specified and "
                             "positive in memory_data_param")
        self._data: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self._to_device: HostToDevice | None = None  # through pinned memory on the GPU
        self.pos = 0

    def reshape(self, bottom, top):
        top[0].reshape((self.batch_size, *self.item_shape))
        top[1].reshape((self.batch_size,))

    def set_input_arrays(self, data, labels) -> None:
        """Use `data` (N, C, H, W) and `labels` (N values) from the next forward on.

        N must be a positive multiple of batch_size; reading restarts at the first item.
        """
        data = np.ascontiguousarray(data, dtype=self.dtype)
        labels = np.ascontiguousarray(labels, dtype=self.dtype)
        n = data.shape[0] if data.ndim else 0
        if data.ndim != 4 or data.shape[1:] != self.item_shape:
            raise self.error(f"data array has shape {data.shape}, expected (N, "
                             f"{', '.join(map(str, self.item_shape))})")
        if labels.size != n or (labels.ndim and labels.shape[0] != n):
            raise self.error(f"data and labels must have the same first dimension: "
                             f"{data.shape} vs {labels.shape}")
        if n == 0 or n % self.batch_size:
            raise self.error(f"the number of items ({n}) must be a positive multiple of "
                             f"batch_size ({self.batch_size})")
        self._data, self._labels = data, labels.reshape(n)
        self.pos = 0

    reset = set_input_arrays

    def forward(self, bottom, top):
        if self._data is None:
            raise self.error("needs input arrays: call set_input_arrays(data, labels) first")
        end = self.pos + self.batch_size
        if self._to_device is None:
            self._to_device = HostToDevice(self.xp)
        self._to_device.copy(0, self._data[self.pos:end], top[0].data)
        self._to_device.copy(1, self._labels[self.pos:end], top[1].data)
        self.pos = end % self._data.shape[0]

    def backward(self, top, propagate_down, bottom):
        """Nothing to back-propagate into."""

    def close(self) -> None:
        """No thread to stop; present so every data layer can be closed alike."""

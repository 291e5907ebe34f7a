"""HDF5Output: write bottom[0] and bottom[1] to an HDF5 file as datasets "data" and "label".

The file (hdf5_output_param.file_name) is created, truncated, at setup. Each forward stores
the current batch, as 4-D (num, channels, height, width) datasets the way Caffe saves them
(trailing axes of size 1 added; more than 4 axes are kept as they are), replacing the
previous batch's (Caffe's own layer can store only one). No tops, no gradient.
"""

from __future__ import annotations

import numpy as np

from ..backend import to_host
from .base import Layer
from .registry import register_layer


def legacy_shape(shape):
    """Caffe's Reshape(num, channels, height, width) of a blob: pad to 4 axes with 1s."""
    return tuple(shape) + (1,) * (4 - len(shape)) if len(shape) <= 4 else tuple(shape)


@register_layer
class HDF5Output(Layer):
    """Save (data, label) batches to hdf5_output_param.file_name."""

    type = "HDF5Output"
    exact_num_bottom = 2
    exact_num_top = 0

    def layer_setup(self, bottom, top):
        self.file_name = self.param.hdf5_output_param.file_name
        if not self.file_name:
            raise self.error("hdf5_output_param.file_name is required")
        import h5py  # noqa: PLC0415 - only this layer needs it (~14 MB in every process)

        try:
            with h5py.File(self.file_name, "w"):
                pass
        except OSError as exc:
            raise self.error(f"failed to open HDF5 file {self.file_name!r}: {exc}") from None

    def reshape(self, bottom, top):
        if bottom[0].num_axes < 1 or bottom[1].num_axes < 1 or \
                bottom[0].shape[0] != bottom[1].shape[0]:
            raise self.error(f"data blob and label blob must have the same batch size, got "
                             f"shapes {bottom[0].shape} and {bottom[1].shape}")

    def forward(self, bottom, top):
        import h5py  # noqa: PLC0415 - see layer_setup

        with h5py.File(self.file_name, "a") as f:
            for name, blob in (("data", bottom[0]), ("label", bottom[1])):
                if name in f:
                    del f[name]
                values = np.asarray(to_host(blob.data)).reshape(legacy_shape(blob.shape))
                f.create_dataset(name, data=values)

    def backward(self, top, propagate_down, bottom):
        """No gradient (Caffe's does nothing either)."""

"""SoftmaxWithLoss's way on a GPU: a pure function of the blobs' dtype.

`gpu-cuda-kernels`: one CUDA kernel forward (softmax, loss and label checks per prediction)
and one backward (kernels/cuda_softmax_loss.py), for the dtypes the kernels are compiled for;
else `gpu-array-code`, the CPU's array code on the device.
"""

from __future__ import annotations

import numpy as np

from . import CUDA_KERNEL_TYPES, Choice


def choose_softmax_loss_gpu(dtype) -> Choice:
    """SoftmaxWithLoss's way on a GPU for blobs of `dtype`."""
    name = np.dtype(dtype).name
    if name in CUDA_KERNEL_TYPES:
        return Choice("gpu-cuda-kernels", "one CUDA kernel forward, one backward")
    return Choice("gpu-array-code", f"no CUDA kernel for {name}")

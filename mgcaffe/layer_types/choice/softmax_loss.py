"""SoftmaxWithLoss's way: a pure function of the predictions per sample, the ignore_label,
the blobs' dtype and the device.

On a CPU: `plain` (one prediction per sample, no ignore_label: fewer calls) or `general`.
On a GPU: `gpu-cuda-kernels`, one CUDA kernel forward (softmax, loss and label checks per
prediction) and one backward (kernels/cuda_softmax_loss.py), for the dtypes the kernels are
compiled for; else `gpu-array-code`, the CPU's general array code on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import CUDA_KERNEL_TYPES, Choice, Target


@dataclass(frozen=True)
class SoftmaxLossRules:
    """SoftmaxWithLoss's switch."""

    #: The common case (CPU, one prediction per sample, no ignore_label) with fewer calls.
    plain_path: bool = True


def choose_softmax_loss(inner: int, ignore_label: bool, dtype, target: Target,
                        rules: SoftmaxLossRules) -> Choice:
    """SoftmaxWithLoss's path for `inner` predictions per sample, with or without an
    ignore_label, for blobs of `dtype`."""
    if target.gpu:
        name = np.dtype(dtype).name
        if name in CUDA_KERNEL_TYPES:
            return Choice("gpu-cuda-kernels", "one CUDA kernel forward, one backward")
        return Choice("gpu-array-code", f"no CUDA kernel for {name}")
    if rules.plain_path and inner == 1 and not ignore_label:
        return Choice("plain", "one prediction per sample, no ignore_label")
    return Choice("general", "plain path off" if not rules.plain_path else
                  "several predictions per sample or an ignore_label")

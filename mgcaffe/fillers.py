"""Weight fillers, as Caffe's FillerParameter describes them. Seeded and reproducible.

Values are drawn on the host with a numpy Generator (initialisation is not a hot path) and
then written into the blob on its device. Fan-in and fan-out follow Caffe: for a blob of
shape (n, c, ...), fan_in = count / n and fan_out = count / c.
"""

from __future__ import annotations

import numpy as np

from .backend import to_device
from .errors import LayerError
from .proto import caffe_pb2
from .seeding import stable_hash

_VarianceNorm = caffe_pb2.FillerParameter


def _fans(shape) -> tuple[float, float]:
    count = int(np.prod(shape)) if shape else 1
    n = shape[0] if len(shape) > 0 and shape[0] else 1
    c = shape[1] if len(shape) > 1 and shape[1] else 1
    return count / n, count / c


def _variance_denominator(param, shape) -> float:
    fan_in, fan_out = _fans(shape)
    if param.variance_norm == _VarianceNorm.FAN_OUT:
        return fan_out
    if param.variance_norm == _VarianceNorm.AVERAGE:
        return (fan_in + fan_out) / 2.0
    return fan_in


def filler_values(param: caffe_pb2.FillerParameter, shape, rng: np.random.Generator,
                  where: str = "") -> np.ndarray:
    """A float64 host array of `shape` filled as `param` says; `where` names the blob in errors."""
    shape = tuple(int(d) for d in shape)
    kind = param.type
    if kind == "constant":
        return np.full(shape, param.value, dtype=np.float64)
    if kind == "uniform":
        return rng.uniform(param.min, param.max, size=shape)
    if kind == "gaussian":
        values = rng.normal(param.mean, param.std, size=shape)
        if param.sparse >= 0:
            # Caffe keeps each weight with probability sparse / num_outputs (shape[0]).
            num_outputs = shape[0] if shape else 1
            keep = rng.random(size=shape) < (param.sparse / num_outputs)
            values = values * keep
        return values
    if kind == "xavier":
        scale = np.sqrt(3.0 / _variance_denominator(param, shape))
        return rng.uniform(-scale, scale, size=shape)
    if kind == "msra":
        std = np.sqrt(2.0 / _variance_denominator(param, shape))
        return rng.normal(0.0, std, size=shape)
    if kind == "positive_unitball":
        values = rng.uniform(0.0, 1.0, size=shape)
        if len(shape) >= 1 and shape[0] > 0:
            rows = values.reshape(shape[0], -1)
            rows /= rows.sum(axis=1, keepdims=True)
        return values
    if kind == "bilinear":
        if len(shape) != 4 or shape[2] != shape[3]:
            raise LayerError(f"{where}: bilinear filler needs a 4-D blob with square kernels, "
                             f"got shape {shape}")
        k = shape[3]
        f = np.ceil(k / 2.0)
        c = (2 * f - 1 - f % 2) / (2.0 * f)
        coords = np.arange(k)
        weights_1d = 1 - np.abs(coords / f - c)
        kernel = np.outer(weights_1d, weights_1d)
        return np.broadcast_to(kernel, shape).copy()
    raise LayerError(f"{where}: unknown filler type {kind!r}; known: constant, uniform, gaussian, "
                     f"xavier, msra, positive_unitball, bilinear")


def fill_blob(blob, param: caffe_pb2.FillerParameter, rng: np.random.Generator) -> None:
    """Fill `blob.data` in place according to `param`, drawing from `rng` (a numpy Generator)."""
    values = filler_values(param, blob.shape, rng, where=f"blob {blob.name!r}")
    blob.data[...] = to_device(values.astype(blob.dtype), blob.xp)


def filler_rng(seed: int | None, layer_name: str) -> np.random.Generator:
    """The host generator a layer's fillers draw from: seeded from the net seed and its name."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng((int(seed), stable_hash(layer_name)))

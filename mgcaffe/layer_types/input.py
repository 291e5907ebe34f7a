"""Layers with no bottoms that produce blobs: Input, DummyData, Parameter."""

from __future__ import annotations

from ..fillers import fill_blob, filler_rng
from ..proto import caffe_pb2
from .base import Layer
from .layer_util import ensure_param_blob
from .registry import register_layer


def _dims(blob_shape) -> list[int]:
    return [int(d) for d in blob_shape.dim]


@register_layer
class InputLayer(Layer):
    """Net inputs: tops shaped by input_param.shape (one shape for all tops, or one per top).

    The caller writes the data (and may reshape the tops); forward and reshape leave them be.
    """

    type = "Input"
    exact_num_bottom = 0
    min_top = 1

    def layer_setup(self, bottom, top):
        shapes = self.param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(f"{len(shapes)} input_param shapes for {len(top)} tops; give one "
                             f"shape for all tops or one per top")
        for i, t in enumerate(top):
            if shapes:
                dims = _dims(shapes[0 if len(shapes) == 1 else i])
                if any(d < 0 for d in dims):
                    raise self.error(f"shape {dims} of top {i} has a negative dimension")
                t.reshape(dims)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass


@register_layer
class DummyDataLayer(Layer):
    """Tops filled by data_filler (none: constant 0; one for all tops; or one per top).

    Shapes from `shape` (one for all or one per top) or the legacy num/channels/height/width
    lists (each of length 1 or one per top). As in Caffe, tops with a constant filler are
    filled once at setup; the others are refilled on every forward.
    """

    type = "DummyData"
    exact_num_bottom = 0
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.dummy_data_param
        n = len(top)
        if len(p.data_filler) not in (0, 1, n):
            raise self.error(f"{len(p.data_filler)} data_filler for {n} tops; give 0, 1 or {n}")
        fillers = list(p.data_filler) or [caffe_pb2.FillerParameter(type="constant", value=0)]
        self.fillers = [fillers[0 if len(fillers) == 1 else i] for i in range(n)]
        for t, shape in zip(top, self._shapes(p, n)):
            t.reshape(shape)
        self._host_rng = filler_rng(self.ctx.seed, self.name)
        for t, filler in zip(top, self.fillers):
            if filler.type == "constant":
                self._fill(t, filler)

    def _shapes(self, p, n):
        legacy = {"num": p.num, "channels": p.channels, "height": p.height, "width": p.width}
        if any(len(v) for v in legacy.values()):
            if len(p.shape):
                raise self.error("give either shape or the legacy num/channels/height/width, "
                                 "not both")
            for name, values in legacy.items():
                if len(values) not in (1, n):
                    raise self.error(f"{len(values)} {name} values for {n} tops; give 1 or {n}")
            pick = lambda values, i: int(values[0 if len(values) == 1 else i])  # noqa: E731
            return [[pick(v, i) for v in legacy.values()] for i in range(n)]
        if len(p.shape) not in (1, n):
            raise self.error(f"{len(p.shape)} shapes for {n} tops; give 1 or {n}")
        return [_dims(p.shape[0 if len(p.shape) == 1 else i]) for i in range(n)]

    def _fill(self, blob, filler):
        """Draw on the device where the filler allows it; otherwise via the host filler."""
        dtype = self.dtype
        if filler.type == "constant":
            blob.data[...] = filler.value
        elif filler.type == "uniform":
            u = self.rng.random(blob.shape, dtype=dtype)
            blob.data[...] = u * dtype.type(filler.max - filler.min) + dtype.type(filler.min)
        elif filler.type == "gaussian" and filler.sparse < 0:
            z = self.rng.standard_normal(blob.shape, dtype=dtype)
            blob.data[...] = z * dtype.type(filler.std) + dtype.type(filler.mean)
        else:
            fill_blob(blob, filler, self._host_rng)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        for t, filler in zip(top, self.fillers):
            if filler.type != "constant":
                self._fill(t, filler)


@register_layer
class ParameterLayer(Layer):
    """A learned blob (shape parameter_param.shape, initialised to 0) exposed as the top.

    The top shares the blob's data; backward adds the top diff into the blob's diff (Caffe
    shares the diff too, which loses accumulation over iter_size)."""

    type = "Parameter"
    exact_num_bottom = 0
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        shape = _dims(self.param.parameter_param.shape)
        ensure_param_blob(self, 0, shape, caffe_pb2.FillerParameter(type="constant"), "param")

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)
        top[0].share_data(self.blobs[0])

    def forward(self, bottom, top):
        top[0].share_data(self.blobs[0])

    def backward(self, top, propagate_down, bottom):
        if self.param_propagate_down[0]:
            self.blobs[0].diff[...] += top[0].diff

"""The Data layer (an LMDB or LevelDB of Caffe Datum records) and the prefetching base of
the data layers.

Data layers have no bottoms and no backward. Batches are assembled on the host (numpy,
Pillow) by a prefetch thread and copied once into the tops on the layer's device.
"""

from __future__ import annotations

import os

import numpy as np

from ..backend import HostToDevice
from ..data.datum import datum_to_array, parse_datum
from ..data.db import open_db
from ..data.prefetch import Prefetcher
from ..data.transformer import DataTransformer
from ..errors import DataError
from ..formats.jsonio import read_regular_file
from ..proto import caffe_pb2
from ..seeding import host_rng, stream_seed
from .base import Layer
from .registry import register_layer

_LEGACY_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


#: A data layer's list file (image paths, HDF5 paths) beyond this is not one.
MAX_LIST_BYTES = 1 << 30


def read_list_file(source: str, what: str, kind: str) -> str:
    """The text of a data layer's list file `source` (`kind`: "image list", "HDF5 list"):
    only a regular file is read (a FIFO would block forever), of at most MAX_LIST_BYTES."""
    if not os.path.lexists(source):
        raise DataError(f"{what}: {kind} file {source!r} not found")
    try:
        data = read_regular_file(source, MAX_LIST_BYTES, DataError, f"{kind} file")
    except DataError as exc:
        raise DataError(f"{what}: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{what}: {kind} file {source!r} is not UTF-8 text (byte "
                        f"{exc.start})") from None


def transform_param_of(param: caffe_pb2.LayerParameter, legacy=None):
    """The layer's TransformationParameter; old nets kept scale/mean_file/crop_size/mirror in
    data_param or image_data_param (`legacy`), which Caffe moves into transform_param."""
    tp = caffe_pb2.TransformationParameter()
    tp.CopyFrom(param.transform_param)
    if legacy is not None:
        for field in _LEGACY_TRANSFORM_FIELDS:
            if legacy.HasField(field) and not tp.HasField(field):
                setattr(tp, field, getattr(legacy, field))
    return tp


class BasePrefetchingDataLayer(Layer):
    """A data layer whose batches come from `load_batch()` run on a prefetch thread.

    Subclasses implement `data_setup(top) -> list of top shapes` (called once, on the main
    thread) and `load_batch() -> tuple of host arrays, one per top` (called on the prefetch
    thread only, so the state it touches needs no lock). The thread starts at the first
    forward; `close()` stops it.
    """

    exact_num_bottom = 0

    def layer_setup(self, bottom, top):
        self._prefetcher: Prefetcher | None = None
        self._to_device: HostToDevice | None = None  # through pinned memory on the GPU
        self._closed = False
        self.prefetch_depth = int(self.param.data_param.prefetch)  # Caffe reads it for all
        self.top_shapes = [tuple(s) for s in self.data_setup(top)]

    def data_setup(self, top) -> list[tuple[int, ...]]:
        raise NotImplementedError(f"{type(self).__name__}.data_setup")

    def load_batch(self) -> tuple[np.ndarray, ...]:
        raise NotImplementedError(f"{type(self).__name__}.load_batch")

    def reshape(self, bottom, top):
        for blob, shape in zip(top, self.top_shapes):
            blob.reshape(shape)

    def forward(self, bottom, top):
        if self._closed:
            raise self.error("is closed")
        if self._prefetcher is None:
            self._prefetcher = Prefetcher(self._load_batch_and_state,
                                          depth=max(self.prefetch_depth, 1),
                                          name=f"layer {self.name!r} ({self.type})")
        batch, self._position = self._prefetcher.get()
        if self._to_device is None:
            self._to_device = HostToDevice(self.xp)
        for slot, (blob, array) in enumerate(zip(top, batch)):
            self._to_device.copy(slot, array, blob.data)

    def backward(self, top, propagate_down, bottom):
        """Data layers have nothing to back-propagate into."""

    # -- data position (exact resume) -----------------------------------------------------
    def source_state(self) -> dict | None:
        """JSON-able state of the source and the prefetch RNG, from which the next batch
        follows; None (the default) when the layer cannot say (it then restarts on resume,
        as in Caffe). Called on the thread that loads batches."""
        return None

    def set_source_state(self, state: dict) -> None:
        """Continue from a `source_state()` (the prefetch thread is stopped)."""
        raise self.error("cannot restore a data position")

    def _load_batch_and_state(self):
        batch = self.load_batch()
        return batch, self.source_state()  # taken before the next batch moves anything

    def data_position(self) -> dict | None:
        """The source state after the last batch the net consumed (prefetched batches not
        counted); None if the layer has no position to save."""
        if getattr(self, "_position", None) is not None:
            return self._position
        return self.source_state() if self._prefetcher is None else None

    def set_data_position(self, state: dict) -> None:
        """Make the next forward return the batch that followed `state` when it was saved."""
        if self._prefetcher is not None:  # drop the batches read ahead from the old place
            self._prefetcher.close()
            self._prefetcher = None
        self.set_source_state(state)
        self._position = state

    def close(self) -> None:
        """Stop the prefetch thread and release the source; the layer cannot forward after."""
        self._closed = True
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self.release()

    def release(self) -> None:
        """Free the data source (open databases); called once the thread has stopped."""

    @property
    def shard(self) -> tuple[int, int]:
        """(rank, world_size) for reading: record k is read only if k % world_size == rank.

        Caffe 1.0 shards only in TRAIN: test nets run on rank 0 alone and read everything.
        """
        if self.phase == caffe_pb2.TRAIN:
            return self.ctx.rank, self.ctx.world_size
        return 0, 1

    def stream_rng(self) -> np.random.Generator:
        """Generator for choices all ranks must share (shuffle order, rand_skip)."""
        return host_rng(stream_seed(self.ctx.seed, self.shard[1]), self.name)

    def transform_rng(self) -> np.random.Generator:
        """Generator for this rank's augmentation (crop offsets, mirror coins)."""
        return host_rng(self.ctx.seed, self.name, 1, self.ctx.rank)


@register_layer
class Data(BasePrefetchingDataLayer):
    """Reads Datum records from an LMDB or a LevelDB in key order, wrapping around; tops:
    data [, label].

    Top shapes come from the first record and the transform; every record must have the
    first one's size. In TRAIN with world_size N, rank r reads stream record k only if
    k % N == r.
    """

    type = "Data"
    min_top = 1
    max_top = 2

    def data_setup(self, top):
        p = self.param.data_param
        self.source = p.source
        self.batch_size = int(p.batch_size)
        if not self.source:
            raise self.error("data_param.source is not set")
        if self.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive")
        # Caffe's default backend is LEVELDB; without `backend` the source is read as what
        # its files are (an LMDB's data.mdb, a LevelDB's CURRENT).
        backend = p.backend if p.HasField("backend") else None
        skip = int(self.stream_rng().integers(p.rand_skip)) if p.rand_skip else 0
        rank, world_size = self.shard
        self.reader = open_db(self.source, backend, rank=rank, world_size=world_size,
                              skip=skip)
        tp = transform_param_of(self.param, p)
        if p.force_encoded_color:
            tp.force_color = True
        self.transformer = DataTransformer(tp, self.phase, rng=self.transform_rng(),
                                           dtype=self.dtype, name=f"layer {self.name!r}")
        key, value = self.reader.first()
        image = datum_to_array(parse_datum(value, self._what(key)), self.transformer.color,
                               self._what(key))
        self.record_shape = image.shape
        self.output_labels = len(top) > 1
        out = self.transformer.output_shape(image.shape, self._what(key))
        shapes = [(self.batch_size, *out)]
        if self.output_labels:
            shapes.append((self.batch_size,))
        return shapes

    def _what(self, key: bytes) -> str:
        return (f"layer {self.name!r}: {self.reader.kind} {self.source!r} record "
                f"{key.decode('utf-8', 'replace')!r}")

    def release(self) -> None:
        self.reader.close()

    def source_state(self):
        return {"reader": self.reader.state(),
                "transform_rng": self.transformer.rng.bit_generator.state}

    def set_source_state(self, state):
        try:
            self.reader.set_state(state["reader"])
            self.transformer.rng.bit_generator.state = state["transform_rng"]
        except (KeyError, TypeError, ValueError) as exc:
            raise self.error(f"saved data position is not usable ({exc})") from None

    def load_batch(self):
        data = np.empty(self.top_shapes[0], dtype=self.dtype)
        labels = np.empty((self.batch_size,), dtype=self.dtype)
        for i in range(self.batch_size):
            key, value = self.reader.next()
            what = self._what(key)
            datum = parse_datum(value, what)
            image = datum_to_array(datum, self.transformer.color, what)
            if image.shape != self.record_shape:
                c, h, w = self.record_shape
                raise DataError(f"{what} is {'x'.join(map(str, image.shape))}, expected "
                                f"{c}x{h}x{w} (the size of the first record)")
            self.transformer.transform(image, out=data[i], what=what)
            labels[i] = datum.label
        return (data, labels) if self.output_labels else (data,)

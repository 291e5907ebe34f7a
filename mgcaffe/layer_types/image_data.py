"""The ImageData layer: images named in a list file (`path label` per line), decoded by Pillow."""

from __future__ import annotations

import numpy as np

from ..data.image import decode_image
from ..data.transformer import DataTransformer
from ..errors import DataError
from .data import BasePrefetchingDataLayer, read_list_file, transform_param_of
from .registry import register_layer


def read_image_list(source: str, what: str) -> list[tuple[str, int, int]]:
    """(path, label, line number) for each non-blank line of a `path label` list file.

    As Caffe does, the label is whatever follows the LAST space, so paths may hold spaces.
    """
    text = read_list_file(source, what, "image list")
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip()
        if not line:
            continue
        path, _, label = line.rpartition(" ")
        try:
            entries.append((path, int(label), number))
        except ValueError:
            raise DataError(f"{what}: {source!r} line {number}: expected 'path label', got "
                            f"{line!r}") from None
        if not path:
            raise DataError(f"{what}: {source!r} line {number}: expected 'path label', got "
                            f"{line!r}")
    if not entries:
        raise DataError(f"{what}: image list {source!r} names no images")
    return entries


@register_layer
class ImageData(BasePrefetchingDataLayer):
    """Reads `root_folder + path` images in list order (shuffled each epoch if `shuffle`).

    Tops: data, label. Images are resized to new_height x new_width when both are set; every
    image must then have the first one's size. In TRAIN with world_size N, rank r reads record
    k only if k % N == r (all ranks shuffle identically).
    """

    type = "ImageData"
    exact_num_top = 2

    def data_setup(self, top):
        p = self.param.image_data_param
        self.what = f"layer {self.name!r} (ImageData)"
        if not p.source:
            raise self.error("image_data_param.source is not set")
        if p.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive")
        if (p.new_height > 0) != (p.new_width > 0):
            raise self.error("new_height and new_width must be set together")
        self.source, self.batch_size = p.source, int(p.batch_size)
        self.root_folder = p.root_folder
        self.color = bool(p.is_color)
        self.new_size = (int(p.new_height), int(p.new_width))
        self.shuffle = bool(p.shuffle)
        self.lines = read_image_list(self.source, self.what)
        self._stream_rng = self.stream_rng()
        self.order = np.arange(len(self.lines))
        # The stream RNG's state before each shuffle of `order` (each pass shuffles the last
        # pass's order in place, as Caffe): enough to rebuild it on resume.
        self._shuffles: list[dict] = []
        if self.shuffle:
            self._shuffle_order()
        self.pos = 0
        if p.rand_skip:
            skip = int(self._stream_rng.integers(p.rand_skip))
            if skip >= len(self.lines):
                raise self.error(f"rand_skip drew {skip} but the list has only "
                                 f"{len(self.lines)} images")
            self.pos = skip
        self.offset = 0  # k of the next record in the stream
        self.transformer = DataTransformer(transform_param_of(self.param, p), self.phase,
                                           rng=self.transform_rng(), dtype=self.dtype,
                                           name=self.what)
        first = self._read(self.order[self.pos])
        self.image_shape = first.shape
        out = self.transformer.output_shape(first.shape, self._where(self.order[self.pos]))
        return [(self.batch_size, *out), (self.batch_size,)]

    def _where(self, index: int) -> str:
        path, _, number = self.lines[index]
        return (f"{self.what}: image {self.root_folder + path!r} "
                f"(list {self.source!r} line {number})")

    def _read(self, index: int) -> np.ndarray:
        # Caffe concatenates root_folder and the path as strings (no separator added).
        return decode_image(self.root_folder + self.lines[index][0], color=self.color,
                            new_height=self.new_size[0], new_width=self.new_size[1],
                            what=self._where(index))

    def _next_index(self) -> int:
        """The next list index this rank reads; reshuffles at each pass's end (as Caffe)."""
        while True:
            index = int(self.order[self.pos])
            rank, world_size = self.shard
            keep = self.offset % world_size == rank
            self.offset += 1
            self.pos += 1
            if self.pos >= len(self.order):
                self.pos = 0
                if self.shuffle:
                    self._shuffle_order()
            if keep:
                return index

    def _shuffle_order(self) -> None:
        self._shuffles.append(self._stream_rng.bit_generator.state)
        self._stream_rng.shuffle(self.order)

    def source_state(self):
        # The order is kept as the RNG states that shuffled it (one per pass, a few hundred
        # bytes each), not as a permutation of the whole list.
        return {"pos": self.pos, "offset": self.offset, "images": len(self.lines),
                "stream_rng": self._stream_rng.bit_generator.state,
                "shuffles": list(self._shuffles),
                "transform_rng": self.transformer.rng.bit_generator.state}

    def set_source_state(self, state):
        try:
            if int(state["images"]) != len(self.lines):
                raise ValueError(f"saved for a list of {state['images']} images, "
                                 f"{self.source!r} has {len(self.lines)}")
            order = np.arange(len(self.lines))
            for rng_state in state["shuffles"]:
                self._stream_rng.bit_generator.state = rng_state
                self._stream_rng.shuffle(order)
            self._stream_rng.bit_generator.state = state["stream_rng"]
            self.transformer.rng.bit_generator.state = state["transform_rng"]
        except (KeyError, TypeError, ValueError) as exc:
            raise self.error(f"saved data position is not usable ({exc})") from None
        self.order, self._shuffles = order, list(state["shuffles"])
        self.pos, self.offset = int(state["pos"]), int(state["offset"])

    def load_batch(self):
        data = np.empty(self.top_shapes[0], dtype=self.dtype)
        labels = np.empty((self.batch_size,), dtype=self.dtype)
        for i in range(self.batch_size):
            index = self._next_index()
            image = self._read(index)
            if image.shape != self.image_shape:
                raise DataError(f"{self._where(index)} is {'x'.join(map(str, image.shape))}, "
                                f"expected {'x'.join(map(str, self.image_shape))} (the first "
                                "image's size; set new_height/new_width to resize)")
            self.transformer.transform(image, out=data[i], what=self._where(index))
            labels[i] = self.lines[index][1]
        return data, labels

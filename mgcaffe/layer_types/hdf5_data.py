"""The HDF5Data layer: rows of HDF5 datasets named by the tops, from a list of .h5 files."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DataError
from .data import BasePrefetchingDataLayer, read_list_file
from .registry import register_layer

if TYPE_CHECKING:  # h5py is imported when a file is read (it adds ~14 MB to every process)
    import h5py


def read_file_list(source: str, what: str) -> list[str]:
    """The non-blank lines (stripped) of a list file of HDF5 paths."""
    names = [n.strip() for n in read_list_file(source, what, "HDF5 list").splitlines()]
    names = [n for n in names if n]
    if not names:
        raise DataError(f"{what}: HDF5 list {source!r} names no files")
    return names


@register_layer
class HDF5Data(BasePrefetchingDataLayer):
    """Reads row after row of the datasets named by its tops, file after file, wrapping.

    Batches run across file boundaries. With `shuffle`, the file order is shuffled at each
    pass and the rows of each file each time it is used (as Caffe). No transforms (Caffe
    refuses transform_param here). In TRAIN with world_size N, rank r reads stream row k
    only if k % N == r.
    """

    type = "HDF5Data"
    min_top = 1

    def data_setup(self, top):
        p = self.param.hdf5_data_param
        self.what = f"layer {self.name!r} (HDF5Data)"
        if self.param.HasField("transform_param"):
            raise self.error("HDF5Data does not transform data; remove transform_param")
        if not p.source:
            raise self.error("hdf5_data_param.source is not set")
        if p.batch_size <= 0:
            raise self.error("hdf5_data_param.batch_size must be positive")
        self.batch_size = int(p.batch_size)
        self.shuffle = bool(p.shuffle)
        self.dataset_names = list(self.param.top)[: len(top)]
        if len(self.dataset_names) != len(top):
            raise self.error("each top must be named after the dataset it reads")
        self.files = read_file_list(p.source, self.what)
        self.row_shapes = self._row_shapes(self.files[0])
        self._stream_rng = self.stream_rng()
        self.file_order = np.arange(len(self.files))
        if self.shuffle:
            self._stream_rng.shuffle(self.file_order)
        self.file_pos = 0
        self.arrays: list[np.ndarray] | None = None
        self.rows = np.arange(0)
        self.row = 0
        self.offset = 0  # k of the next row in the stream
        self._shuffles: list[dict] = []  # RNG states before each shuffle of `rows` since
        # it was last arange (one file: each pass shuffles the last order, as Caffe)
        return [(self.batch_size, *shape) for shape in self.row_shapes]

    def _open(self, path: str) -> h5py.File:
        if not os.path.exists(path):
            raise DataError(f"{self.what}: HDF5 file {path!r} not found")
        import h5py  # noqa: PLC0415 - see the top of the module

        try:
            return h5py.File(path, "r")
        except OSError as exc:
            raise DataError(f"{self.what}: cannot open HDF5 file {path!r} ({exc})") from None

    def _datasets(self, f: h5py.File, path: str) -> list:
        import h5py  # noqa: PLC0415 - see the top of the module

        found = []
        for name in self.dataset_names:
            if name not in f or not isinstance(f[name], h5py.Dataset):
                raise DataError(f"{self.what}: HDF5 file {path!r} has no dataset {name!r} "
                                f"(it has {sorted(f.keys())})")
            found.append(f[name])
        rows = {d.shape[0] if d.ndim else 0 for d in found}
        if len(rows) != 1 or 0 in rows:
            raise DataError(f"{self.what}: HDF5 file {path!r}: datasets "
                            f"{self.dataset_names} need the same non-zero number of rows, "
                            f"found shapes {[d.shape for d in found]}")
        return found

    def _row_shapes(self, path: str) -> list[tuple[int, ...]]:
        with self._open(path) as f:
            return [tuple(d.shape[1:]) for d in self._datasets(f, path)]

    def _load(self, path: str) -> None:
        self._read_arrays(path)
        self.rows = np.arange(self.arrays[0].shape[0])
        self._shuffles = []
        self._shuffle_rows()
        self.row = 0

    def _shuffle_rows(self) -> None:
        if self.shuffle:
            self._shuffles.append(self._stream_rng.bit_generator.state)
            self._stream_rng.shuffle(self.rows)

    def _read_arrays(self, path: str) -> None:
        with self._open(path) as f:
            datasets = self._datasets(f, path)
            for d, expected in zip(datasets, self.row_shapes):
                if tuple(d.shape[1:]) != expected:
                    raise DataError(f"{self.what}: dataset {d.name!r} in {path!r} has rows "
                                    f"of shape {tuple(d.shape[1:])}, expected {expected} "
                                    f"(as in {self.files[0]!r})")
            self.arrays = [np.asarray(d[...], dtype=self.dtype) for d in datasets]

    def _next_row(self) -> int:
        """Advance to the next row this rank reads; returns its index in self.arrays."""
        while True:
            if self.arrays is None:
                self._load(self.files[self.file_order[self.file_pos]])
            elif self.row >= len(self.rows):
                self.file_pos += 1
                if self.file_pos == len(self.files):
                    self.file_pos = 0
                    if self.shuffle:
                        self._stream_rng.shuffle(self.file_order)
                if len(self.files) > 1:
                    self._load(self.files[self.file_order[self.file_pos]])
                else:
                    self.row = 0
                    self._shuffle_rows()
            rank, world_size = self.shard
            keep = self.offset % world_size == rank
            self.offset += 1
            row = int(self.rows[self.row])
            self.row += 1
            if keep:
                return row

    def source_state(self):
        # Row orders are kept as the RNG states that shuffled them, not as permutations.
        return {"files": len(self.files), "file_order": [int(i) for i in self.file_order],
                "file_pos": self.file_pos, "row": self.row, "offset": self.offset,
                "loaded": self.arrays is not None, "shuffles": list(self._shuffles),
                "stream_rng": self._stream_rng.bit_generator.state}

    def set_source_state(self, state):
        try:
            if int(state["files"]) != len(self.files):
                raise ValueError(f"saved for {state['files']} files, the list has "
                                 f"{len(self.files)}")
            self.file_order = np.asarray(state["file_order"], dtype=np.int64)
            self.file_pos, self.offset = int(state["file_pos"]), int(state["offset"])
            self.arrays, self.rows, self.row = None, np.arange(0), 0
            if state["loaded"]:
                self._read_arrays(self.files[self.file_order[self.file_pos]])
                self.rows = np.arange(self.arrays[0].shape[0])
                for rng_state in state["shuffles"]:
                    self._stream_rng.bit_generator.state = rng_state
                    self._stream_rng.shuffle(self.rows)
                self.row = int(state["row"])
            self._shuffles = list(state["shuffles"])
            self._stream_rng.bit_generator.state = state["stream_rng"]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise self.error(f"saved data position is not usable ({exc})") from None

    def load_batch(self):
        batch = [np.empty(shape, dtype=self.dtype) for shape in self.top_shapes]
        for i in range(self.batch_size):
            row = self._next_row()
            for out, array in zip(batch, self.arrays):
                out[i] = array[row]
        return tuple(batch)

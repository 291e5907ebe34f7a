"""Writing Caffe Datum LMDBs (what Caffe's convert_imageset and convert_mnist_data produce)."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterable
from typing import Any

from ..errors import DataError


def _lmdb():
    """The lmdb module, imported on first use: importing mgcaffe needs no LMDB library."""
    import lmdb  # noqa: PLC0415 - optional at import time (only LMDB sources need it)

    return lmdb


_FIRST_MAP_SIZE = 1 << 28


def _put_chunk(env: Any, chunk: list[tuple[bytes, bytes]]) -> None:
    """Write one transaction, doubling the map size whenever LMDB says it is full."""
    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in chunk:
                    txn.put(key, value)
            return
        except _lmdb().MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


def write_lmdb(path, datums: Iterable, keys: Iterable | None = None, chunk: int = 1000,
               overwrite: bool = False) -> int:
    """Write Datum messages (or serialized bytes) to a new LMDB directory; returns the count.

    Keys default to the zero-padded record number ("00000000", ...), so LMDB's key order is
    the order given. See `write_records` for the rest.
    """
    keys = keys if keys is not None else (f"{i:08d}" for i in itertools.count())
    return write_records(path, zip(keys, datums), chunk=chunk, overwrite=overwrite)


def write_records(path, records: Iterable[tuple], chunk: int = 1000,
                  overwrite: bool = False) -> int:
    """Write (key, Datum or bytes) pairs to a new LMDB directory; returns the count.

    See `LMDBWriter` for the transactions and the all-or-nothing rename.
    """
    with LMDBWriter(path, chunk=chunk, overwrite=overwrite) as writer:
        for key, datum in records:
            writer.put(key, datum)
    return writer.count


class LMDBWriter:
    """A new LMDB directory written record by record (as Caffe's db::NEW transactions).

    Transactions are committed every `chunk` records (as Caffe does). The database is built
    beside `path` and renamed into place by `close()`, so an interrupted run never leaves a
    partial database at `path`; used as a context manager, an exception discards it.
    """

    def __init__(self, path, chunk: int = 1000, overwrite: bool = False):
        self.path = os.fspath(path)
        if os.path.exists(self.path) and not overwrite:
            raise DataError(f"LMDB {self.path!r} already exists (pass overwrite=True to "
                            "replace it)")
        self.chunk = chunk
        self.count = 0
        self._partial = f"{self.path}.partial-{os.getpid()}"
        shutil.rmtree(self._partial, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._env = _lmdb().open(self._partial, map_size=_FIRST_MAP_SIZE, subdir=True)
        self._pending: list[tuple[bytes, bytes]] = []

    def put(self, key, datum) -> None:
        """Add one record: `key` str or bytes, `datum` a message or its serialized bytes."""
        key = key.encode() if isinstance(key, str) else bytes(key)
        value = datum if isinstance(datum, bytes) else datum.SerializeToString()
        self._pending.append((key, value))
        self.count += 1
        if len(self._pending) >= self.chunk:
            _put_chunk(self._env, self._pending)
            self._pending = []

    def close(self) -> None:
        """Commit what is pending and move the finished database to `path`."""
        if self._env is None:
            return
        if self._pending:
            _put_chunk(self._env, self._pending)
            self._pending = []
        self._env.close()
        self._env = None
        if os.path.exists(self.path):
            shutil.rmtree(self.path)
        os.replace(self._partial, self.path)

    def abort(self) -> None:
        """Discard the partial database."""
        if self._env is not None:
            self._env.close()
            self._env = None
        shutil.rmtree(self._partial, ignore_errors=True)

    def __enter__(self) -> LMDBWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

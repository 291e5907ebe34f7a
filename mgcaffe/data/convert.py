"""Writing Caffe Datum LMDBs and LevelDBs (what Caffe's convert_imageset and
convert_mnist_data produce)."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterable
from typing import Any

from ..errors import DataError
from ..proto import caffe_pb2
from .leveldb_store import open_error, plyvel

LMDB = caffe_pb2.DataParameter.LMDB
LEVELDB = caffe_pb2.DataParameter.LEVELDB


def _lmdb():
    """The lmdb module, imported on first use: importing mgcaffe needs no LMDB library."""
    import lmdb  # noqa: PLC0415 - optional at import time (only LMDB sources need it)

    return lmdb


_FIRST_MAP_SIZE = 1 << 28
_LEVELDB_WRITE_BUFFER = 1 << 28  # Caffe's db_leveldb.cpp: options.write_buffer_size


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
               overwrite: bool = False, backend: int = LMDB) -> int:
    """Write Datum messages (or serialized bytes) to a new LMDB (or, with `backend`
    LEVELDB, LevelDB) directory; returns the count.

    Keys default to the zero-padded record number ("00000000", ...), so the database's key
    order is the order given. See `write_records` for the rest.
    """
    keys = keys if keys is not None else (f"{i:08d}" for i in itertools.count())
    return write_records(path, zip(keys, datums), chunk=chunk, overwrite=overwrite,
                         backend=backend)


def write_records(path, records: Iterable[tuple], chunk: int = 1000,
                  overwrite: bool = False, backend: int = LMDB) -> int:
    """Write (key, Datum or bytes) pairs to a new database directory; returns the count.

    See `DBWriter` for the transactions and the all-or-nothing rename.
    """
    with open_writer(path, backend, chunk=chunk, overwrite=overwrite) as writer:
        for key, datum in records:
            writer.put(key, datum)
    return writer.count


def open_writer(path, backend: int = LMDB, chunk: int = 1000,
                overwrite: bool = False) -> DBWriter:
    """A new LMDBWriter or LevelDBWriter at `path`."""
    cls = LevelDBWriter if backend == LEVELDB else LMDBWriter
    return cls(path, chunk=chunk, overwrite=overwrite)


class DBWriter:
    """A new database directory written record by record (as Caffe's db::NEW transactions).

    Records are committed every `chunk` records (as Caffe does). The database is built
    beside `path` and renamed into place by `close()`, so an interrupted run never leaves a
    partial database at `path`; used as a context manager, an exception discards it.
    Subclasses open the partial directory (`_open`), write a chunk (`_write`) and close it
    (`_close_db`).
    """

    kind = ""

    def __init__(self, path, chunk: int = 1000, overwrite: bool = False):
        self.path = os.fspath(path)
        if os.path.exists(self.path) and not overwrite:
            raise DataError(f"{self.kind} {self.path!r} already exists (pass overwrite=True "
                            "to replace it)")
        self.chunk = chunk
        self.count = 0
        self._partial = f"{self.path}.partial-{os.getpid()}"
        shutil.rmtree(self._partial, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._db = self._open(self._partial)
        self._pending: list[tuple[bytes, bytes]] = []

    def _open(self, path: str) -> Any:
        raise NotImplementedError

    def _write(self, chunk: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def _close_db(self) -> None:
        self._db.close()

    def put(self, key, datum) -> None:
        """Add one record: `key` str or bytes, `datum` a message or its serialized bytes."""
        key = key.encode() if isinstance(key, str) else bytes(key)
        value = datum if isinstance(datum, bytes) else datum.SerializeToString()
        self._pending.append((key, value))
        self.count += 1
        if len(self._pending) >= self.chunk:
            self._write(self._pending)
            self._pending = []

    def close(self) -> None:
        """Commit what is pending and move the finished database to `path`."""
        if self._db is None:
            return
        if self._pending:
            self._write(self._pending)
            self._pending = []
        self._close_db()
        self._db = None
        if os.path.exists(self.path):
            shutil.rmtree(self.path)
        os.replace(self._partial, self.path)

    def abort(self) -> None:
        """Discard the partial database."""
        if self._db is not None:
            self._close_db()
            self._db = None
        shutil.rmtree(self._partial, ignore_errors=True)

    def __enter__(self) -> DBWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class LMDBWriter(DBWriter):
    """A new LMDB (see DBWriter); the map grows by doubling whenever LMDB says it is full."""

    kind = "LMDB"

    def _open(self, path: str) -> Any:
        return _lmdb().open(path, map_size=_FIRST_MAP_SIZE, subdir=True)

    def _write(self, chunk: list[tuple[bytes, bytes]]) -> None:
        _put_chunk(self._db, chunk)


class LevelDBWriter(DBWriter):
    """A new LevelDB (see DBWriter), one write batch per chunk, with Caffe's 256 MB write
    buffer."""

    kind = "LevelDB"

    def _open(self, path: str) -> Any:
        try:
            return plyvel().DB(path, create_if_missing=True, error_if_exists=True,
                               write_buffer_size=_LEVELDB_WRITE_BUFFER)
        except plyvel().Error as exc:
            raise open_error(path, exc) from None

    def _write(self, chunk: list[tuple[bytes, bytes]]) -> None:
        with self._db.write_batch() as batch:
            for key, value in chunk:
                batch.put(key, value)

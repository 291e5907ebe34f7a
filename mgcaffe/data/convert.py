"""Writing Caffe Datum LMDBs (what Caffe's convert_imageset and convert_mnist_data produce)."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterable

import lmdb

from ..errors import DataError

_FIRST_MAP_SIZE = 1 << 28


def _put_chunk(env: lmdb.Environment, chunk: list[tuple[bytes, bytes]]) -> None:
    """Write one transaction, doubling the map size whenever LMDB says it is full."""
    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in chunk:
                    txn.put(key, value)
            return
        except lmdb.MapFullError:
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

    Transactions are committed every `chunk` records (as Caffe does). The database is built
    beside `path` and renamed into place at the end, so an interrupted run never leaves a
    partial database at `path`.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise DataError(f"LMDB {path!r} already exists (pass overwrite=True to replace it)")
    partial = f"{path}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    count = 0
    env = lmdb.open(partial, map_size=_FIRST_MAP_SIZE, subdir=True)
    try:
        pending: list[tuple[bytes, bytes]] = []
        for key, datum in records:
            key = key.encode() if isinstance(key, str) else bytes(key)
            value = datum if isinstance(datum, bytes) else datum.SerializeToString()
            pending.append((key, value))
            count += 1
            if len(pending) >= chunk:
                _put_chunk(env, pending)
                pending = []
        if pending:
            _put_chunk(env, pending)
    except BaseException:
        env.close()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    env.close()
    if os.path.exists(path):
        shutil.rmtree(path)
    os.replace(partial, path)
    return count

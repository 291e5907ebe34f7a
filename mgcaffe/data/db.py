"""Sequential LMDB reading as Caffe's Data layer does it, with Caffe 1.0's sharding rule.

Records are read in key order and the cursor wraps to the first key after the last, forever.
Record k (0-based position in that endless stream, counted across wraps) is read by this
reader only if k % world_size == rank, so N readers with batch B together read exactly the
records one reader with batch N*B reads, in the same order.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..errors import DataError
from ..proto import caffe_pb2


def _lmdb():
    """The lmdb module, imported on first use: importing mgcaffe needs no LMDB library."""
    import lmdb  # noqa: PLC0415 - optional at import time (only LMDB sources need it)

    return lmdb


log = logging.getLogger("mgcaffe.data")

# LMDB forbids opening one environment twice in a process (py-lmdb raises), yet a train and
# a test net, or ranks run as threads, may read the same database: readers share one
# Environment per path, each with its own transaction and cursor.
_ENVS: dict[tuple, list] = {}  # _env_key -> [Environment, reference count]
_ENVS_LOCK = threading.Lock()


def _env_key(path: str) -> tuple:
    """Path and data file identity: a database rewritten in place gets a fresh environment."""
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    st = os.stat(data)
    return os.path.realpath(path), st.st_dev, st.st_ino


def _acquire_env(path: str) -> tuple[Any, tuple]:
    key = _env_key(path)
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            try:
                env = _lmdb().open(path, readonly=True, lock=False, readahead=False,
                                subdir=os.path.isdir(path))
            except _lmdb().Error as exc:
                raise DataError(f"LMDB {path!r}: cannot open ({exc})") from None
            try:
                _check_not_truncated(env, path)
            except DataError:
                env.close()
                raise
            entry = _ENVS[key] = [env, 0]
        entry[1] += 1
        return entry[0], key


def _check_not_truncated(env: Any, path: str) -> None:
    """Refuse a data file shorter than the pages its meta page says it has.

    LMDB maps the file and reads pages through the mapping: a page past the end of a
    truncated file (an interrupted copy, a full disk) is a SIGBUS that kills the process
    with no message. The meta pages are read with plain reads, so this check itself is safe.
    """
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    pages = int(env.info()["last_pgno"]) + 1
    need = pages * int(env.stat()["psize"])
    have = os.path.getsize(data)
    if have < need:
        raise DataError(f"LMDB {path!r}: {data} is truncated: {have} bytes, but the database "
                        f"has {pages} pages of {env.stat()['psize']} bytes ({need} bytes); "
                        "copy or convert it again")


def _release_env(key: tuple) -> None:
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _ENVS[key]
            entry[0].close()


def _check_lmdb_path(path: str) -> None:
    """Fail with a one-line error for a missing path or a LevelDB where an LMDB was expected."""
    if not os.path.exists(path):
        raise DataError(f"LMDB {path!r} not found")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "data.mdb")):
        if os.path.exists(os.path.join(path, "CURRENT")):
            raise DataError(f"{path!r} is a LevelDB; LEVELDB is not supported, convert it to "
                            "LMDB (e.g. tools/convert_imageset.py --backend lmdb)")
        raise DataError(f"LMDB {path!r} has no data.mdb: not an LMDB directory")
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    if os.path.isfile(data) and os.path.getsize(data) == 0:
        raise DataError(f"LMDB {path!r}: {data} is empty (0 bytes)")


class LMDBReader:
    """An endless, sharded, sequential reader of one LMDB's (key, value) records.

    `skip` records are passed over first (the data layer's rand_skip) and are not counted in
    k. The cursor and its read transaction are opened on the first `next()` call, so they
    belong to the thread that reads (the prefetch thread); `first()` uses its own short
    transaction.
    """

    def __init__(self, path, rank: int = 0, world_size: int = 1, skip: int = 0):
        self.path = os.fspath(path)
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"LMDB {self.path!r}: rank {rank} is not in 0..{world_size - 1}")
        _check_lmdb_path(self.path)
        self._env, self._env_key = _acquire_env(self.path)
        self._entries = int(self._env.stat()["entries"])
        if self._entries == 0:
            _release_env(self._env_key)
            self._env = None
            raise DataError(f"LMDB {self.path!r} has no records")
        self.rank = rank
        self.world_size = world_size
        self._skip = int(skip) % self._entries
        self.offset = 0  # k of the next record in the stream
        self._txn = None
        self._cursor = None

    def __len__(self) -> int:
        """Number of records in the whole database (all ranks)."""
        return self._entries

    def first(self) -> tuple[bytes, bytes]:
        """The first record in key order (to size the tops at setup); does not move the cursor."""
        with self._env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            cursor.first()
            return bytes(cursor.key()), bytes(cursor.value())

    def _open_cursor(self) -> None:
        self._txn = self._env.begin(buffers=False)
        self._cursor = self._txn.cursor()
        key = getattr(self, "_seek_key", None)
        self._seek_key = None
        if key is not None and self._cursor.set_key(key):
            return  # a restored position whose record is still there: O(log n)
        self._cursor.first()
        for _ in range((self._skip + self.offset) % self._entries):
            if not self._cursor.next():
                self._cursor.first()

    def state(self) -> dict:
        """Where the stream stands: k of the next record and that record's key (hex)."""
        if self._cursor is not None:
            key = bytes(self._cursor.key()).hex()
        else:
            pending = getattr(self, "_seek_key", None)
            key = pending.hex() if pending is not None else None
        return {"offset": self.offset, "key": key}

    def set_state(self, state: dict) -> None:
        """Continue from a `state()`: the cursor reopens at that record on the next read."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = self._cursor = None
        self.offset = int(state["offset"])
        key = state.get("key")
        self._seek_key = bytes.fromhex(key) if key else None

    def _advance(self) -> None:
        if not self._cursor.next():
            log.info("Restarting data prefetching from start.")
            self._cursor.first()

    def next(self) -> tuple[bytes, bytes]:
        """The next (key, value) this rank reads; wraps around at the end of the database."""
        if self._cursor is None:
            self._open_cursor()
        while True:
            keep = self.offset % self.world_size == self.rank
            record = (bytes(self._cursor.key()), bytes(self._cursor.value())) if keep else None
            self._advance()
            self.offset += 1
            if keep:
                return record

    def close(self) -> None:
        """Release the transaction and this reader's share of the environment."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = self._cursor = None
        if self._env is not None:
            _release_env(self._env_key)
            self._env = None


def iter_records(path):
    """Every (key, value) of an LMDB once, in key order (what Caffe's tools read)."""
    path = os.fspath(path)
    _check_lmdb_path(path)
    env, key = _acquire_env(path)
    try:
        with env.begin(buffers=False) as txn:
            for record_key, value in txn.cursor():
                yield bytes(record_key), bytes(value)
    finally:
        _release_env(key)


def open_db(path, backend: int = caffe_pb2.DataParameter.LMDB, rank: int = 0,
            world_size: int = 1, skip: int = 0) -> LMDBReader:
    """Open a Data layer's source; LEVELDB is refused with a message saying to convert."""
    if backend == caffe_pb2.DataParameter.LEVELDB:
        raise DataError(f"source {os.fspath(path)!r}: backend LEVELDB is not supported, "
                        "convert the database to LMDB and set `backend: LMDB`")
    return LMDBReader(path, rank=rank, world_size=world_size, skip=skip)

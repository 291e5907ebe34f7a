"""Sequential database reading as Caffe's Data layer does it, with Caffe 1.0's sharding rule.

Both of Caffe's backends are read: LMDB (`lmdb_store`) and LevelDB (`leveldb_store`).
Records are read in key order and the cursor wraps to the first key after the last, forever.
Record k (0-based position in that endless stream, counted across wraps) is read by this
reader only if k % world_size == rank, so N readers with batch B together read exactly the
records one reader with batch N*B reads, in the same order.
"""

from __future__ import annotations

import logging
import os

from ..errors import DataError
from ..proto import caffe_pb2
from .leveldb_store import LevelDBStore, is_leveldb
from .lmdb_store import LMDBStore

log = logging.getLogger("mgcaffe.data")

LMDB = caffe_pb2.DataParameter.LMDB
LEVELDB = caffe_pb2.DataParameter.LEVELDB
_STORES = {LMDB: LMDBStore, LEVELDB: LevelDBStore}
_NAMES = {LMDB: "LMDB", LEVELDB: "LEVELDB"}


def backend_named(name: str, flag: str = "-backend") -> int:
    """The DataParameter.DB value of a tool's backend flag ("lmdb", "leveldb", any case)."""
    value = {"lmdb": LMDB, "leveldb": LEVELDB}.get(name.lower())
    if value is None:
        raise DataError(f"{flag} {name}: expected lmdb or leveldb")
    return value


def detect_backend(path: str) -> int | None:
    """LMDB or LEVELDB, from what `path` holds (data.mdb, or CURRENT); None if neither."""
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "data.mdb")):
        return LMDB
    if is_leveldb(path):
        return LEVELDB
    return None


def choose_backend(path: str, backend: int | None) -> int:
    """The backend to read `path` with: `backend` when given (and the files agree), else the
    one its files show. Caffe's own default is LEVELDB; a source that omits `backend` is
    read as what it is."""
    found = detect_backend(path)
    if backend is None:
        if found is None:
            if not os.path.exists(path):
                raise DataError(f"database {path!r} not found")
            raise DataError(f"{path!r} is neither an LMDB (no data.mdb) nor a LevelDB (no "
                            "CURRENT file)")
        return found
    if found is not None and found != backend:
        raise DataError(f"{path!r} is a{'n' if found == LMDB else ''} {_NAMES[found]} "
                        f"database, but backend {_NAMES[backend]} was asked for: name "
                        f"{_NAMES[found]} as its backend (or leave the backend out: mgcaffe "
                        "reads what the files are)")
    return backend


def open_store(path, backend: int | None = None, ranks: int = 1):
    """This process's share of the database at `path` (an LMDBStore or LevelDBStore);
    `ranks`: how many ranks of the job read it (for a LevelDB's lock error)."""
    path = os.fspath(path)
    return _STORES[choose_backend(path, backend)](path, ranks)


class DBReader:
    """An endless, sharded, sequential reader of one database's (key, value) records.

    `skip` records are passed over first (the data layer's rand_skip) and are not counted in
    k. The cursor is opened on the first `next()` call, so it belongs to the thread that
    reads (the prefetch thread); `first()` uses a cursor of its own. `kind` is "LMDB" or
    "LevelDB".
    """

    def __init__(self, path, rank: int = 0, world_size: int = 1, skip: int = 0,
                 backend: int | None = None):
        self.path = os.fspath(path)
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"database {self.path!r}: rank {rank} is not in "
                            f"0..{world_size - 1}")
        self._store = open_store(self.path, backend, world_size)
        self.kind = self._store.kind
        self.rank = rank
        self.world_size = world_size
        self._skip = int(skip)
        self.offset = 0  # k of the next record in the stream
        self._cursor = None
        self._seek_key: bytes | None = None
        try:
            self.first()  # an empty database is refused now, not by the prefetch thread
        except DataError:
            self.close()
            raise

    def __len__(self) -> int:
        """Number of records in the whole database (all ranks)."""
        return self._store.count()

    def first(self) -> tuple[bytes, bytes]:
        """The first record in key order (to size the tops at setup); does not move the cursor."""
        cursor = self._store.cursor()
        try:
            if not cursor.first():
                raise DataError(f"{self.kind} {self.path!r} has no records")
            return cursor.key(), cursor.value()
        finally:
            cursor.close()

    def _open_cursor(self) -> None:
        self._cursor = self._store.cursor()
        key, self._seek_key = self._seek_key, None
        if key is not None and self._cursor.seek(key):
            return  # a restored position whose record is still there: O(log n)
        self._cursor.first()
        for _ in range((self._skip + self.offset) % len(self)):
            if not self._cursor.next():
                self._cursor.first()

    def state(self) -> dict:
        """Where the stream stands: k of the next record and that record's key (hex)."""
        if self._cursor is not None:
            key = self._cursor.key().hex()
        else:
            key = self._seek_key.hex() if self._seek_key is not None else None
        return {"offset": self.offset, "key": key}

    def set_state(self, state: dict) -> None:
        """Continue from a `state()`: the cursor reopens at that record on the next read."""
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None
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
            record = (self._cursor.key(), self._cursor.value()) if keep else None
            self._advance()
            self.offset += 1
            if keep:
                return record

    def close(self) -> None:
        """Release the cursor and this reader's share of the database."""
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None
        if self._store is not None:
            self._store.close()
            self._store = None


class LMDBReader(DBReader):
    """A DBReader of an LMDB (refuses any other database)."""

    def __init__(self, path, rank: int = 0, world_size: int = 1, skip: int = 0):
        super().__init__(path, rank=rank, world_size=world_size, skip=skip, backend=LMDB)


def iter_records(path, backend: int | None = None):
    """Every (key, value) of a database once, in key order (what Caffe's tools read)."""
    store = open_store(path, backend)
    try:
        yield from store.items()
    finally:
        store.close()


def open_db(path, backend: int | None = None, rank: int = 0, world_size: int = 1,
            skip: int = 0) -> DBReader:
    """Open a Data layer's source (`backend` None: whichever the files are)."""
    return DBReader(path, rank=rank, world_size=world_size, skip=skip, backend=backend)

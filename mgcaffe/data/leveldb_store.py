"""A LevelDB opened for reading (through plyvel), and the LevelDB writer's open.

LevelDB lets one process open a database at a time: opening takes an fcntl lock on the
file LOCK in its directory, which another process (or a second open in this one) cannot
take. Within a process, readers therefore share one open database per directory (a train
and a test net, ranks run as threads: Caffe's multi-GPU readers share one reader the same
way), each with its own iterator. Another process holding the database is refused with a
line naming the lock; ranks that are processes on one node cannot read one LevelDB, and
are told to convert it to LMDB, which any number of processes read at once.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import DataError
from .shared_handles import SharedHandles

KIND = "LevelDB"

#: What a user can do when the database is locked by another process.
CONVERT_HINT = ("convert it to LMDB, which any number of processes read at once "
                "(mgcaffe convert_db {path} {path}_lmdb, then `backend: LMDB` and that "
                "source)")


def plyvel():
    """The plyvel module, imported on first use: importing mgcaffe needs no LevelDB."""
    try:
        import plyvel as module  # noqa: PLC0415 - optional at import time (LevelDB only)
    except ImportError as exc:
        raise DataError(f"reading or writing a LevelDB needs the Python package plyvel "
                        f"({exc}): pip install plyvel (wheels exist for Linux x86-64 and "
                        "CPython 3.10-3.12; elsewhere it builds against libleveldb-dev)") \
            from None
    return module


_DBS = SharedHandles()  # (realpath, dev, inode of the directory) -> plyvel.DB


def is_leveldb(path: str) -> bool:
    """Whether `path` is a LevelDB directory (it has the CURRENT file that names its
    manifest)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "CURRENT"))


def _db_key(path: str) -> tuple:
    """Directory identity: a database rewritten in place (renamed over) is opened anew."""
    st = os.stat(path)
    return os.path.realpath(path), st.st_dev, st.st_ino


def open_error(path: str, exc: Exception, ranks: int = 1) -> DataError:
    """The one line for a LevelDB that plyvel could not open; `ranks`: how many ranks of
    this job read it (more than one: the other process is likely one of them)."""
    text = exc.args[0] if exc.args else str(exc)
    text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    if "lock" not in text.lower():
        return DataError(f"LevelDB {path!r}: cannot open ({text})")
    said = (f"LevelDB {path!r} is open in another process: its lock "
            f"{os.path.join(path, 'LOCK')} is held ({text}); LevelDB lets one process open "
            "a database at a time")
    convert = CONVERT_HINT.format(path=path)
    if ranks > 1:
        return DataError(f"{said}, and each of this job's {ranks} ranks opens it: ranks "
                         f"that are processes on one node cannot share one LevelDB; {convert}")
    return DataError(f"{said}; stop that process, or {convert}")


class _Cursor:
    """A LevelDB iterator (reading the state of the database when it was made), positioned
    on one record at a time."""

    def __init__(self, db: Any):
        self._iterator = db.iterator()
        self._record: tuple[bytes, bytes] | None = None

    def first(self) -> bool:
        self._iterator.seek_to_start()
        self._record = next(self._iterator, None)
        return self._record is not None

    def next(self) -> bool:
        self._record = next(self._iterator, None)
        return self._record is not None

    def seek(self, key: bytes) -> bool:
        self._iterator.seek(key)
        self._record = next(self._iterator, None)
        return self._record is not None and self._record[0] == key

    def key(self) -> bytes:
        return self._record[0]

    def value(self) -> bytes:
        return self._record[1]

    def close(self) -> None:
        self._iterator.close()


class LevelDBStore:
    """This process's share of one LevelDB (see the module docstring); `close()` releases
    it. ranks: how many ranks of the job read it (for the error when it is locked)."""

    kind = KIND

    def __init__(self, path: str, ranks: int = 1):
        self.path = path
        if not os.path.exists(path):
            raise DataError(f"LevelDB {path!r} not found")
        if not is_leveldb(path):
            raise DataError(f"LevelDB {path!r} has no CURRENT file: not a LevelDB directory")
        self._key = _db_key(path)
        self._count: int | None = None
        self._db = _DBS.acquire(self._key, lambda: self._open(path, ranks))

    @staticmethod
    def _open(path: str, ranks: int) -> Any:
        try:
            return plyvel().DB(path, create_if_missing=False)
        except plyvel().Error as exc:
            raise open_error(path, exc, ranks) from None

    def count(self) -> int:
        """Number of records (LevelDB keeps no count: one pass over the keys, remembered)."""
        if self._count is None:
            with self._db.iterator(include_value=False) as keys:
                self._count = sum(1 for _ in keys)
        return self._count

    def cursor(self) -> _Cursor:
        """A new cursor, not yet positioned."""
        return _Cursor(self._db)

    def items(self):
        """Every (key, value) once, in key order."""
        with self._db.iterator() as records:
            yield from records

    def close(self) -> None:
        """Release this share; the database closes (and unlocks) with the last one."""
        if self._db is not None:
            self._db = None
            _DBS.release(self._key)

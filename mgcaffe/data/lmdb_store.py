"""An LMDB opened for reading: one environment per database and process, a cursor per reader.

LMDB forbids opening one environment twice in a process (py-lmdb raises), yet a train and a
test net, or ranks run as threads, may read the same database: readers share one
Environment per path, each with its own transaction and cursor. Any number of processes may
read one LMDB at once.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import DataError
from .shared_handles import SharedHandles

KIND = "LMDB"


def _lmdb():
    """The lmdb module, imported on first use: importing mgcaffe needs no LMDB library."""
    import lmdb  # noqa: PLC0415 - optional at import time (only LMDB sources need it)

    return lmdb


_ENVS = SharedHandles()  # (realpath, dev, inode of data.mdb) -> Environment


def data_file(path: str) -> str:
    """The file holding the records: `path/data.mdb`, or `path` itself (subdir=False)."""
    return os.path.join(path, "data.mdb") if os.path.isdir(path) else path


def _env_key(path: str) -> tuple:
    """Path and data file identity: a database rewritten in place gets a fresh environment."""
    st = os.stat(data_file(path))
    return os.path.realpath(path), st.st_dev, st.st_ino


def _check_not_truncated(env: Any, path: str) -> None:
    """Refuse a data file shorter than the pages its meta page says it has.

    LMDB maps the file and reads pages through the mapping: a page past the end of a
    truncated file (an interrupted copy, a full disk) is a SIGBUS that kills the process
    with no message. The meta pages are read with plain reads, so this check itself is safe.
    """
    data = data_file(path)
    pages = int(env.info()["last_pgno"]) + 1
    need = pages * int(env.stat()["psize"])
    have = os.path.getsize(data)
    if have < need:
        raise DataError(f"LMDB {path!r}: {data} is truncated: {have} bytes, but the database "
                        f"has {pages} pages of {env.stat()['psize']} bytes ({need} bytes); "
                        "copy or convert it again")


def check_path(path: str) -> None:
    """Fail with a one-line error for a missing, empty or non-LMDB path."""
    if not os.path.exists(path):
        raise DataError(f"LMDB {path!r} not found")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "data.mdb")):
        raise DataError(f"LMDB {path!r} has no data.mdb: not an LMDB directory")
    data = data_file(path)
    if os.path.isfile(data) and os.path.getsize(data) == 0:
        raise DataError(f"LMDB {path!r}: {data} is empty (0 bytes)")


class _Cursor:
    """A read transaction and its cursor, positioned on one record at a time."""

    def __init__(self, env: Any):
        self._txn = env.begin(buffers=False)
        self._cursor = self._txn.cursor()

    def first(self) -> bool:
        return bool(self._cursor.first())

    def next(self) -> bool:
        return bool(self._cursor.next())

    def seek(self, key: bytes) -> bool:
        return bool(self._cursor.set_key(key))

    def key(self) -> bytes:
        return bytes(self._cursor.key())

    def value(self) -> bytes:
        return bytes(self._cursor.value())

    def close(self) -> None:
        self._txn.abort()


class LMDBStore:
    """This process's share of one LMDB (see the module docstring); `close()` releases it."""

    kind = KIND

    def __init__(self, path: str, ranks: int = 1):
        self.path = path
        check_path(path)
        self._key = _env_key(path)
        self._env = _ENVS.acquire(self._key, lambda: self._open(path))

    @staticmethod
    def _open(path: str) -> Any:
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
        return env

    def count(self) -> int:
        """Number of records."""
        return int(self._env.stat()["entries"])

    def cursor(self) -> _Cursor:
        """A new cursor (its own read transaction), not yet positioned."""
        return _Cursor(self._env)

    def items(self):
        """Every (key, value) once, in key order."""
        with self._env.begin(buffers=False) as txn:
            for key, value in txn.cursor():
                yield bytes(key), bytes(value)

    def close(self) -> None:
        """Release this share; the environment closes with the last one."""
        if self._env is not None:
            self._env = None
            _ENVS.release(self._key)

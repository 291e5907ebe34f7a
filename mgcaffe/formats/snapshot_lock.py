"""One training per snapshot prefix: an fcntl lock on `<prefix>.lock`.

The file holds "pid <pid> host <host>" of the holder, so that a second training with the same
`snapshot_prefix` refuses with one line naming the first. The lock is the kernel's: it goes
away with the process however it ends (even SIGKILL), so a stale file never blocks a restart.
The holder removes the file when it releases the lock.
"""

from __future__ import annotations

import fcntl
import os
import socket

from ..errors import SolverError

LOCK_SUFFIX = ".lock"

# path -> [fd, holders]: POSIX locks belong to the process and closing ANY descriptor of the
# file drops them, so one process keeps one descriptor per lock file and counts its holders.
_HELD: dict[str, list[int]] = {}


class SnapshotLock:
    """The held lock of one prefix; `release()` (or the process ending) frees it."""

    def __init__(self, path: str):
        self.path = path
        self._held = True

    def release(self) -> None:
        """Drop this hold; the last one removes the lock file and frees the lock."""
        if not self._held:
            return
        self._held = False
        entry = _HELD.get(self.path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _HELD[self.path]
        fd = entry[0]
        try:
            # Unlinked while still locked: a process that opened the old file sees (in
            # acquire) that the path names another file and starts over.
            if _same_file(fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: the kernel frees it
            pass

    def __enter__(self) -> SnapshotLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(prefix: str, what: str = "snapshot_prefix") -> SnapshotLock:
    """Lock `<prefix>.lock` or raise SolverError naming the process that holds it.

    Locks are per process (POSIX record locks): one process may build several solvers on
    one prefix (a test, a finetune after a train), other processes are refused.
    """
    path = os.path.abspath(prefix + LOCK_SUFFIX)
    if path in _HELD:
        _HELD[path][1] += 1
        return SnapshotLock(path)
    for _ in range(10):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SolverError(f"{what} {prefix!r}: cannot create the lock file {path}: "
                              f"{exc.strerror or exc}") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise SolverError(f"{what} {prefix!r} is in use by another training ({holder}, "
                              f"lock {path}); give this one another snapshot_prefix or wait "
                              "for it to end") from None
        if not _same_file(fd, path):
            os.close(fd)  # removed by its previous holder between our open and lock
            continue
        _write_holder(fd)
        _HELD[path] = [fd, 1]
        return SnapshotLock(path)
    raise SolverError(f"{what} {prefix!r}: could not lock {path} (it keeps being replaced)")


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _write_holder(fd: int) -> None:
    text = f"pid {os.getpid()} host {socket.gethostname()}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown"


def held_here(prefix: str) -> bool:
    """Whether this process holds the lock of `prefix`."""
    return os.path.abspath(prefix + LOCK_SUFFIX) in _HELD

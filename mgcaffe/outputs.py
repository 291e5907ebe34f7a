"""Output paths named by flags, checked before the work that ends in writing them.

A trace, plan or profile is written after the whole training or benchmark; a path that cannot
be written must fail at start, with one line, not after hours with a traceback.
"""

from __future__ import annotations

import os

from .errors import MgcaffeError


def check_output_path(path: str | os.PathLike | None, flag: str,
                      error: type[MgcaffeError] = MgcaffeError) -> None:
    """Raise `error` unless a file `path` can be created or replaced (None: nothing to do).

    The directory must exist and be writable and searchable; an existing `path` must not be
    a directory. Nothing is created.
    """
    if path is None:
        return
    path = os.fspath(path)
    if not path:
        raise error(f"{flag}: empty path")
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise error(f"{flag} {path}: is a directory; give a file name")
    if not os.path.isdir(directory):
        raise error(f"{flag} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise error(f"{flag} {path}: directory {directory} is not writable")

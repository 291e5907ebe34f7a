"""Output paths named by flags, checked before the work that ends in writing them.

A trace, plan or profile is written after the whole training or benchmark; a path that cannot
be written must fail at start, with one line, not after hours with a traceback.
"""

from __future__ import annotations

import os

from ..errors import MgcaffeError


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


def check_output_directory(path: str | os.PathLike | None, flag: str,
                           error: type[MgcaffeError] = MgcaffeError) -> None:
    """Raise `error` unless `path` is a writable directory or one that can be created (its
    nearest existing ancestor is a writable directory). None: nothing to do."""
    if path is None or path == "":
        return
    path = os.path.abspath(os.fspath(path))
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise error(f"{flag} {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise error(f"{flag} {path}: " + ("not writable" if probe == path else
                                          f"cannot be created ({probe} is not writable)"))


def check_log_directory(flag_value: str | None, environ) -> None:
    """The glog directory (`--log_dir`, else GLOG_log_dir, unless GLOG_logtostderr): log
    files are opened at the first line, so a bad directory would otherwise print a logging
    traceback for every line of the run."""
    if environ.get("GLOG_logtostderr", "").strip().lower() in ("1", "true", "yes", "y", "t"):
        return
    flag = "--log_dir" if flag_value else "GLOG_log_dir"
    check_output_directory(flag_value or environ.get("GLOG_log_dir"), flag)

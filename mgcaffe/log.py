"""Logging in Caffe's glog format, so Caffe's log parsers and users' habits keep working.

Line format: `I1129 13:03:19.123456 12345 solver.py:123] message`
(severity letter, month+day, time with microseconds, thread id, source file:line).
In distributed runs rank 0's lines are exactly these; every other rank logs only warnings
and errors, its text prefixed `[rank R] `. A message of several lines (the solver's and
net's parameters, a traceback) is written as several glog lines, each with the same prefix,
so that grepping by severity, time or rank never loses its continuation lines.

glog's environment switches are honoured: GLOG_minloglevel (0 INFO .. 3 FATAL: less severe
messages are dropped), GLOG_v (>= 1 shows the debug messages, glog's VLOG), GLOG_log_dir
(or `--log_dir`: also write log files there, named as glog names them), GLOG_logtostderr
(stderr only, no files) and GLOG_alsologtostderr (accepted; stderr always gets every line,
as Caffe's tools set it). Unlike glog, no files are written unless a log directory is given.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import sys
import time
import types

_LETTERS = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "F"}
# glog's severities, as GLOG_minloglevel numbers them, and the file each one names.
_GLOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_FILE_LEVELS = (("INFO", logging.DEBUG), ("WARNING", logging.WARNING), ("ERROR", logging.ERROR))
PROGRAM = "mgcaffe"


class GlogFormatter(logging.Formatter):
    """Formats records as glog lines; `rank_prefix` (e.g. "[rank 3] ") goes before the text,
    unless the text names its rank first (`rank 3: ...`): the rank is said once."""

    def __init__(self, rank_prefix: str = "", rank: int | None = None):
        super().__init__()
        self.rank_prefix = rank_prefix
        self._named = (f"rank {rank}: ", f"rank {rank} (") if rank is not None else ()

    def format(self, record: logging.LogRecord) -> str:
        t = time.localtime(record.created)
        micros = int((record.created % 1) * 1e6)
        head = (f"{_LETTERS.get(record.levelname, 'I')}{t.tm_mon:02d}{t.tm_mday:02d} "
                f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d} "
                f"{record.thread % 100000:5d} {os.path.basename(record.pathname)}:"
                f"{record.lineno}] ")
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        prefix = head + ("" if text.startswith(self._named) else self.rank_prefix)
        return "\n".join(prefix + line for line in text.rstrip("\n").split("\n"))


def _env_int(environ, name: str, default: int) -> int:
    try:
        return int(environ.get(name, default))
    except ValueError:
        return default


def _env_true(environ, name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "y", "t")


def log_file_name(level: str, when: float | None = None, pid: int | None = None,
                  program: str = PROGRAM) -> str:
    """glog's name for a log file: `<prog>.<host>.<user>.log.<LEVEL>.<yyyymmdd-hhmmss>.<pid>`."""
    t = time.localtime(time.time() if when is None else when)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no USER: glog writes "invalid-user"
        user = "invalid-user"
    return (f"{program}.{socket.gethostname()}.{user}.log.{level}."
            f"{time.strftime('%Y%m%d-%H%M%S', t)}.{os.getpid() if pid is None else pid}")


class _GlogFileHandler(logging.Handler):
    """One glog file of a severity (INFO holds every line, WARNING warnings and up, ...),
    created at its first line, with glog's header and the `<prog>.<LEVEL>` link beside it."""

    def __init__(self, directory: str, level_name: str, level: int, formatter):
        super().__init__(level)
        self.directory = directory
        self.level_name = level_name
        self.setFormatter(formatter)
        self._file = None

    def _open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        now = time.time()
        name = log_file_name(self.level_name, now)
        path = os.path.join(self.directory, name)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open while logging
        self._file.write(f"Log file created at: {time.strftime('%Y/%m/%d %H:%M:%S')}\n"
                         f"Running on machine: {socket.gethostname()}\n"
                         "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
        link = os.path.join(self.directory, f"{PROGRAM}.{self.level_name}")
        try:  # glog's convenience link to the newest file; failing to make it is harmless
            if os.path.islink(link):
                os.unlink(link)
            os.symlink(name, link)
        except OSError:
            pass

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._file is None:
                self._open()
            self._file.write(self.format(record) + "\n")
            self._file.flush()
        except Exception:  # noqa: BLE001 - logging must not end the program
            self.handleError(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


_settings: dict = {"level": "INFO", "log_dir": None}
# The open glog files, kept across calls: a distributed run reconfigures once it knows its
# rank, and glog writes one set of files per process.
_files: dict = {}


def configure(level: str | None = None, rank: int = 0, world_size: int = 1, *,
              log_dir: str | None = None, environ=None) -> None:
    """Send mgcaffe's log to stderr (and to glog-named files with a log directory) in glog
    format. Non-zero ranks log warnings and up, prefixed by their rank. `level` and
    `log_dir` are remembered, so a later call that only says the rank keeps them."""
    env = os.environ if environ is None else environ
    if level is not None:
        _settings["level"] = level
    if log_dir is not None:
        _settings["log_dir"] = log_dir
    logger = logging.getLogger("mgcaffe")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        if not isinstance(handler, _GlogFileHandler):
            handler.close()
    formatter = GlogFormatter(f"[rank {rank}] " if world_size > 1 and rank != 0 else "", rank)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    directory = _settings["log_dir"] or env.get("GLOG_log_dir") or None
    if not directory or _env_true(env, "GLOG_logtostderr"):
        directory = None
    for key in [k for k in _files if k[0] != directory]:
        _files.pop(key).close()
    if directory:
        for name, lvl in _FILE_LEVELS:
            handler = _files.get((directory, name))
            if handler is None:
                handler = _files[(directory, name)] = _GlogFileHandler(directory, name, lvl,
                                                                       formatter)
            handler.setFormatter(formatter)
            logger.addHandler(handler)
    lvl = getattr(logging, str(_settings["level"]).upper(), logging.INFO)
    if _env_int(env, "GLOG_v", 0) > 0:
        lvl = min(lvl, logging.DEBUG)
    if "GLOG_minloglevel" in env:
        lvl = max(lvl, _GLOG_LEVELS[min(max(_env_int(env, "GLOG_minloglevel", 0), 0), 3)])
    logger.setLevel(lvl if rank == 0 else max(lvl, logging.WARNING))
    logger.propagate = False


class _CallableModule(types.ModuleType):
    """This module, callable: `mgcaffe.log(message)` logs message at INFO (pycaffe's
    caffe.log), since the package attribute `log` is this module once it is imported."""

    def __call__(self, message) -> None:
        logging.getLogger("mgcaffe").info("%s", message)


sys.modules[__name__].__class__ = _CallableModule

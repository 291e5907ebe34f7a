"""The `mgcaffe` program: `mgcaffe <command> [options]`, with Caffe's spellings accepted.

Caffe's tool takes single-dash long flags (`caffe train -solver s.prototxt -weights w`); those
are rewritten to `--solver`, `--weights` so that caffe command lines work by renaming the
program. Any MgcaffeError ends the program with a one-line message and exit status 1.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import pkgutil
import re
import sys

from . import __version__, commands
from .errors import MgcaffeError
from .formats.outputs import check_log_directory
from .log import configure

_SINGLE_DASH_LONG = re.compile(r"^-([a-z][a-z0-9_]+)(=.*)?$")
_INVALID_CHOICE = re.compile(r"invalid choice: '?([^']*?)'? \(choose from (.*)\)$")


def did_you_mean(message: str) -> str:
    """argparse's invalid-choice message with the closest valid choice suggested."""
    m = _INVALID_CHOICE.search(message)
    if not m:
        return message
    choices = [c.strip().strip("'") for c in m.group(2).split(",")]
    close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
    return message + (f"; did you mean {close[0]!r}?" if close else "")


class _Parser(argparse.ArgumentParser):
    """argparse with a short usage line (not the whole help) and "did you mean" on errors."""

    def error(self, message: str):
        self.exit(2, f"usage: {self.prog} ... (see `{self.prog} --help`)\n"
                     f"{self.prog}: error: {did_you_mean(message)}\n")


def _command_modules():
    mods = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):  # helpers the commands share, not commands
            continue
        mods.append(importlib.import_module(f"{commands.__name__}.{info.name}"))
    return mods


def normalize_argv(argv: list[str]) -> list[str]:
    """Rewrite Caffe-style `-flag` (two or more letters) to `--flag`; keep everything else."""
    out = []
    for arg in argv:
        m = _SINGLE_DASH_LONG.match(arg)
        out.append(f"-{arg}" if m and len(m.group(1)) > 1 else arg)
    return out


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(
        prog="mgcaffe",
        description="Caffe-style training with merged-gradient communication (MG-WFBP).",
    )
    parser.add_argument("--version", action="version", version=f"mgcaffe {__version__}")
    _add_log_arguments(parser, "INFO", None)
    # The same flags after the sub-command; SUPPRESS keeps the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    _add_log_arguments(common, argparse.SUPPRESS, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="command", parser_class=_Parser)
    runners = {}
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP, parents=[common])
        mod.add_arguments(p)
        runners[mod.NAME] = mod.run
    return parser, runners


def _add_log_arguments(parser: argparse.ArgumentParser, level_default, dir_default) -> None:
    parser.add_argument("--log-level", "--log_level", dest="log_level", default=level_default,
                        help="logging level (DEBUG, INFO, WARNING, ERROR)")
    parser.add_argument("--log_dir", "--log-dir", dest="log_dir", default=dir_default,
                        metavar="DIR", help="also write glog-named log files here "
                                            "(default: $GLOG_log_dir, else none)")


def setup_logging(level: str, log_dir: str | None = None) -> None:
    """glog-like lines, as Caffe prints: `I1129 13:03:19.123456 12345 file.py:12] message`."""

    configure(level, log_dir=log_dir)


def _excerpt(message: str, limit: int = 1000) -> str:
    # A message quoting a huge name or token from an input file stays one readable line.
    if len(message) <= limit:
        return message
    return (f"{message[:limit - 200]} ... [{len(message) - limit + 100} characters left out] "
            f"... {message[-100:]}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    argv = normalize_argv(sys.argv[1:] if argv is None else list(argv))
    parser, runners = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:

        check_log_directory(args.log_dir, os.environ)  # before a line is logged to it
    except MgcaffeError as exc:
        print(f"mgcaffe {args.command}: error: {_excerpt(str(exc))}", file=sys.stderr)
        return 1
    setup_logging(args.log_level, args.log_dir)
    try:
        return int(runners[args.command](args) or 0)
    except MgcaffeError as exc:
        print(f"mgcaffe {args.command}: error: {_excerpt(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mgcaffe {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

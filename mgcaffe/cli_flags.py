"""Caffe's gflags spellings for sub-command flags, on top of argparse.

`mgcaffe.cli` already turns `-flag` and `-flag=value` into `--flag` / `--flag=value`; what is
left is gflags' booleans: `--shuffle`, `--shuffle=true` (or 1/yes/y/t, any case),
`--shuffle=false` (0/no/n/f) and `--noshuffle`, none of which takes a separate value (so
`--shuffle ROOT/` leaves ROOT/ a positional argument, as gflags does).
"""

from __future__ import annotations

import argparse

_TRUE_WORDS = ("true", "t", "yes", "y", "1")
_FALSE_WORDS = ("false", "f", "no", "n", "0")


def _spellings(name: str, words) -> list[str]:
    # argparse looks an argument up whole before splitting it at '=', so each explicit
    # `--name=word` can be an option string of its own (lower, Capitalised and UPPER case).
    forms = {form for word in words for form in (word, word.capitalize(), word.upper())}
    return [f"--{name}={form}" for form in sorted(forms)]


def add_bool_flag(parser: argparse.ArgumentParser, name: str, help: str,  # noqa: A002
                  default: bool = False) -> None:
    """A gflags boolean `--name` (see the module docstring); `args.<name>` is a bool."""
    parser.add_argument(f"--{name}", dest=name, action="store_const", const=True,
                        default=default, help=f"{help} (also --no{name}, --{name}=true|false)")
    parser.add_argument(*_spellings(name, _TRUE_WORDS), dest=name, action="store_const",
                        const=True, help=argparse.SUPPRESS)
    parser.add_argument(f"--no{name}", *_spellings(name, _FALSE_WORDS), dest=name,
                        action="store_const", const=False, help=argparse.SUPPRESS)


def split_list(value: str) -> list[str]:
    """A comma-separated command-line list (Caffe's `a,b`), empty items dropped."""
    return [item for item in value.split(",") if item]

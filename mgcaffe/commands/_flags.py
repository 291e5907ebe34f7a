"""Flags several commands share: --gpu, --level/--stage, and Caffe's gflags spellings.

--gpu (train, test, time, extract_features) and NetState's --level/--stage (train, test,
time) are read the same way everywhere, so each command says the same on the same mistake.
Caffe's gflags spellings for sub-command flags sit on top of argparse:

`mgcaffe.cli` already turns `-flag` and `-flag=value` into `--flag` / `--flag=value`; what is
left is gflags' booleans: `--shuffle`, `--shuffle=true` (or 1/yes/y/t, any case),
`--shuffle=false` (0/no/n/f) and `--noshuffle`, none of which takes a separate value (so
`--shuffle ROOT/` leaves ROOT/ a positional argument, as gflags does).
"""

from __future__ import annotations

import argparse
import logging

from ..backend import Device, gpu_count
from ..comm.backends.launcher import launcher_size
from ..errors import SolverError

log = logging.getLogger("mgcaffe.commands")

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


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """--gpu ID[,ID...]|all (shared with `mgcaffe test`)."""
    parser.add_argument("--gpu", metavar="ID|all",
                        help="run on this GPU (`train`: on each of a list, ID,ID,..., or on "
                             "`all`, one process per GPU; other commands use the first); "
                             "overrides the solver's solver_mode")


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    """--level and --stage (Caffe's NetState flags)."""
    parser.add_argument("--level", type=int, default=0, help="the nets' NetState level")
    parser.add_argument("--stage", action="append", default=[], metavar="STAGE",
                        help="a NetState stage (repeat or comma-separate for several)")


NO_GPU = "no GPU is usable (CuPy missing or no CUDA device); leave out --gpu to use the CPU"


def device_from_flag(flag: str | None) -> Device | None:
    """The Device `--gpu` asks for: None when absent (the solver file decides). Shared by
    train, test and time, so that each says the same when there is no GPU."""
    if flag is None or flag == "":
        return None
    if flag != "all":
        try:
            ids = [int(s) for s in flag.split(",") if s.strip()]
        except ValueError:
            raise SolverError(f"--gpu: expected a device id, a comma-separated list or "
                              f"`all`, found {flag!r}") from None
        if not ids or min(ids) < 0:
            raise SolverError(f"--gpu: expected device ids >= 0, found {flag!r}")
    count = gpu_count()
    if count == 0:
        raise SolverError(f"--gpu {flag}: {NO_GPU}")
    ids = [0] if flag == "all" else ids
    if len(ids) > 1 or (flag == "all" and count > 1):
        log.warning("--gpu %s: this command runs on one GPU (%d); `mgcaffe train --gpu %s` "
                    "trains on each", flag, ids[0], flag)
    return Device("gpu", ids[0])


def stages(args) -> list[str]:
    """--stage values, comma-separated lists split."""
    return [s for value in args.stage for s in value.split(",") if s]


def note_launcher(command: str, environ=None) -> str | None:
    """For `mgcaffe test` and `time`, which run in one process: under a launcher of several
    processes, a warning that each runs the whole job alone (logged here, and returned)."""
    seen = launcher_size(environ)
    if seen is None:
        return None
    size, _, who = seen
    text = (f"{who} started {size} processes: each runs `mgcaffe {command}` alone on the "
            f"whole net (nothing is split between them or averaged"
            + ("; their times share the machine's cores" if command == "time" else "")
            + f"); run `mgcaffe {command}` without a launcher")
    log.warning("%s", text)
    return text

"""gflags spellings of boolean flags (commands._flags) after mgcaffe.cli's `-flag` rewrite."""

from __future__ import annotations

import argparse

import pytest

from mgcaffe.cli import normalize_argv
from mgcaffe.commands._flags import add_bool_flag, split_list


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_bool_flag(parser, "shuffle", "shuffle")
    add_bool_flag(parser, "gray", "grey", default=True)
    parser.add_argument("--resize_width", type=int, default=0)
    parser.add_argument("root")
    return parser.parse_args(normalize_argv(list(argv)))


@pytest.mark.parametrize("argv, shuffle", [
    (["r/"], False),
    (["-shuffle", "r/"], True),
    (["--shuffle", "r/"], True),
    (["-shuffle=true", "r/"], True),
    (["--shuffle=True", "r/"], True),
    (["--shuffle=1", "r/"], True),
    (["-shuffle=false", "r/"], False),
    (["--shuffle=0", "r/"], False),
    (["--noshuffle", "r/"], False),
    (["-shuffle", "-noshuffle", "r/"], False),
])
def test_boolean_spellings(argv, shuffle):
    args = _parse(*argv)
    assert args.shuffle is shuffle and args.root == "r/"


def test_a_boolean_takes_no_separate_value_and_defaults_hold():
    args = _parse("-shuffle", "true")  # gflags: `true` is then the positional argument
    assert args.shuffle is True and args.root == "true" and args.gray is True
    assert _parse("-nogray", "x").gray is False


def test_value_flags_in_every_spelling():
    for argv in (["-resize_width", "7", "r"], ["-resize_width=7", "r"],
                 ["--resize_width=7", "r"], ["--resize_width", "7", "r"]):
        assert _parse(*argv).resize_width == 7


def test_a_bad_boolean_word_is_an_error(capsys):
    with pytest.raises(SystemExit):
        _parse("--shuffle=maybe", "r/")
    assert "shuffle" in capsys.readouterr().err


def test_split_list():
    assert split_list("a,b,,c") == ["a", "b", "c"]

"""Errors of distributed runs name the rank once and the setting once."""

from __future__ import annotations

import logging
import re

from comm_fakes import run_ranks

from mgcaffe import log as mlog
from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.agreement import agree_on_settings
from mgcaffe.comm.training.faults import describe_failure
from mgcaffe.errors import CommError

GLOG_HEAD = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")


def test_a_failure_names_the_rank_once():
    # the message's own "rank 1: " is not repeated, nor is mgcaffe's error type
    assert describe_failure(1, CommError("rank 1: ranks disagree on --comm")) == \
        "rank 1: ranks disagree on --comm"
    assert describe_failure(0, CommError("weights diverged")) == "rank 0: weights diverged"
    # another rank named inside the text is kept; a foreign exception keeps its type
    assert describe_failure(0, CommError("rank 2 has not reached it")) == \
        "rank 0: rank 2 has not reached it"
    assert describe_failure(1, RuntimeError("injected failure")) == \
        "rank 1: RuntimeError: injected failure"


def test_a_line_that_names_its_rank_is_not_prefixed_again(capsys):
    mlog.configure("INFO", rank=1, world_size=2)
    try:
        log = logging.getLogger("mgcaffe.comm")
        log.error("rank 1: ranks disagree on --comm; aborting all 2 ranks")
        log.error("rank 1 (pid 9): ended before the others")
        log.warning("something else")
    finally:
        mlog.configure("INFO", rank=0, world_size=1)
    texts = [GLOG_HEAD.sub("", x) for x in capsys.readouterr().err.splitlines()]
    assert texts == ["rank 1: ranks disagree on --comm; aborting all 2 ranks",
                     "rank 1 (pid 9): ended before the others", "[rank 1] something else"]


def test_ranks_that_disagree_on_comm_are_told_once_which_setting(capsys):
    comms = LocalWorld(2, timeout=10).communicators()

    def rank_main(r):
        agree_on_settings(comms[r], {"--comm": ["mgwfbp", "wfbp"][r]})

    _, errors = run_ranks(2, rank_main)
    text = str(errors[1])
    assert text == ('rank 1: ranks disagree on --comm (rank 0: "mgwfbp"; rank 1: "wfbp"); '
                    "start every rank with the same solver, net and flags")
    line = describe_failure(1, errors[1])
    assert line == text and line.count("--comm") == 1  # not "rank 1: CommError: rank 1: ..."

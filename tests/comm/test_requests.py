"""Stop/snapshot requests agreed by every rank, with the signal that asked for the stop."""

from __future__ import annotations

import signal

import pytest
from comm_fakes import run_ranks

from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.requests import (
    NONE,
    SNAPSHOT,
    SNAPSHOT_AND_STOP,
    STOP,
    agree_on_requests,
)
from mgcaffe.solvers.actions import SolverAction


def agree(votes):
    comms = LocalWorld(len(votes), timeout=10).communicators()
    results, errors = run_ranks(len(votes), lambda r: agree_on_requests(comms[r], *votes[r]))
    assert errors == [None] * len(votes)
    return results


def test_the_values_are_the_solvers():
    assert (NONE, STOP, SNAPSHOT, SNAPSHOT_AND_STOP) == (
        SolverAction.NONE, SolverAction.STOP, SolverAction.SNAPSHOT,
        SolverAction.SNAPSHOT_AND_STOP)


def test_a_sigterm_on_one_rank_snapshots_and_stops_every_rank_naming_the_signal():
    got = agree([(NONE, None), (SNAPSHOT_AND_STOP, signal.SIGTERM), (NONE, None)])
    assert {a.action for a in got} == {SNAPSHOT_AND_STOP}
    assert {a.signal for a in got} == {signal.SIGTERM}
    assert [a.asked_elsewhere for a in got] == [True, False, True]


@pytest.mark.parametrize("votes, action, signum", [
    ([(NONE, None), (NONE, None)], NONE, None),
    ([(SNAPSHOT, None), (NONE, None)], SNAPSHOT, None),
    ([(STOP, signal.SIGINT), (SNAPSHOT, None)], SNAPSHOT_AND_STOP, signal.SIGINT),
    ([(STOP, signal.SIGINT), (SNAPSHOT_AND_STOP, signal.SIGTERM)], SNAPSHOT_AND_STOP,
     signal.SIGTERM),
    ([(STOP, None), (NONE, None)], STOP, None),  # a hook's stop: no signal to name
])
def test_votes_combine(votes, action, signum):
    got = agree(votes)
    assert {a.action for a in got} == {action} and {a.signal for a in got} == {signum}

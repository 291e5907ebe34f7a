"""The run's cost model from its sources: a network file, an emulation, one rank, a plan,
or measured on the ranks (threads standing in for MPI)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest
from comm_fakes import run_ranks

from mgcaffe.comm.backends.local import LocalWorld, SingleCommunicator
from mgcaffe.comm.model.cost import CostModel, cost_for, load_network
from mgcaffe.comm.training.cost_source import run_cost
from mgcaffe.comm.training.options import Options

NETWORK = Path(__file__).resolve().parents[2] / "models" / "paper" / "network-10gbe.json"
guards = []


def guard(what, timeout=None):
    guards.append(what)
    return nullcontext()


class TwoRanks(SingleCommunicator):
    """A host communicator that says it has two ranks (nothing is measured with a file)."""

    def __init__(self):
        super().__init__()
        self.size = 2


def test_a_network_file_gives_its_cost_for_the_world_size():
    cost = run_cost(Options(network=str(NETWORK)), TwoRanks(), 4096, guard)
    expected = cost_for(load_network(str(NETWORK)), 2)
    assert (cost.a, cost.b) == (expected.a, expected.b)


def test_an_emulated_network_is_planned_with_its_own_cost():
    emulated = CostModel(1e-3, 2e-9, nodes=8)
    cost = run_cost(Options(emulate_network="x.json", emulate_nodes=8), TwoRanks(), 4096,
                    guard, emulated_cost=emulated)
    assert cost is emulated


def test_one_rank_costs_nothing_and_a_given_plan_brings_its_own():
    assert run_cost(Options(), SingleCommunicator(), 4096, guard).time(1 << 20) == 0.0
    assert run_cost(Options(plan="p.json"), TwoRanks(), 4096, guard) is None


@pytest.mark.timeout(120)
def test_two_ranks_measure_the_same_cost_under_their_guards():
    comms = LocalWorld(2, timeout=60.0).communicators()
    guards.clear()

    def body(rank):
        return run_cost(Options(timeout=30.0), comms[rank], 64 * 1024, guard)

    (a, b), errors = run_ranks(2, body, timeout=100.0)
    assert errors == [None, None]
    assert (a.a, a.b) == (b.a, b.b) and a.b >= 0  # one fit, shared by the ranks
    assert a.interference and a.interference == b.interference  # the probe ran too
    assert "all-reduce benchmark" in guards
    assert any(g.startswith("interference measurement") for g in guards)


def test_a_bad_network_file_is_named_in_a_one_line_error(tmp_path):
    from mgcaffe.errors import MgcaffeError

    bad = tmp_path / "net.json"
    bad.write_text("{not json")
    with pytest.raises(MgcaffeError, match=str(bad)) as info:
        run_cost(Options(network=str(bad)), TwoRanks(), 4096, guard)
    assert "\n" not in str(info.value)

"""The all-reduce benchmark and `mgcaffe bench-comm`: points, the linear fit, the network JSON."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from comm_fakes import run_mpi, run_ranks

from mgcaffe.comm.backends.emulate import EmulatedCommunicator
from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.model.cost import Network, cost_for, load_network
from mgcaffe.comm.training.benchmark import DEFAULT_SIZES, default_sizes, measure_allreduce
from mgcaffe.comm.training.notices import fit_notices, fit_quality_level, one_host_note
from mgcaffe.commands.bench_comm import parse_size, ring_constants
from mgcaffe.errors import CommError


def test_default_sizes_span_bytes_to_tens_of_megabytes():
    sizes = default_sizes()
    assert sizes[0] == 4 and 10 << 20 <= sizes[-1] <= 64 << 20
    assert all(s % 4 == 0 for s in sizes)


def test_parse_size():
    assert [parse_size(s) for s in ("4", "64K", "16M", "2MB")] == [4, 65536, 16 << 20, 2 << 20]
    with pytest.raises(CommError, match="cannot read '3 parsecs'"):
        parse_size("3 parsecs")


def test_benchmark_recovers_an_emulated_cost():
    """On a world whose all-reduce lasts exactly a + b*M, the fit returns a and b."""
    # a and b*M large against thread wake-ups and sleep overshoot (a few ms on a busy machine)
    a, b = 40e-3, 10e-9
    cost = type("Cost", (), {"a": a, "b": b, "time": lambda self, m: a + b * m})()
    world = LocalWorld(2, timeout=20)
    comms = [EmulatedCommunicator(c, cost, 8) for c in world.communicators()]
    sizes = [4, 1 << 20, 4 << 20, 8 << 20]
    results, errors = run_ranks(2, lambda r: measure_allreduce(comms[r], sizes, iterations=3,
                                                               warmup=0))
    assert errors == [None, None]
    res = results[0]
    assert res.sizes == sizes and len(res.times) == len(sizes)
    assert res.fit.a == pytest.approx(a, rel=0.2) and res.fit.b == pytest.approx(b, rel=0.2)
    assert results[1].times == res.times  # the slowest rank's time, agreed by all
    # the model is the measured curve: every size exactly at its median (they increase)
    assert res.fit.kind == "piecewise" and res.outside_spread() == []
    assert [res.fit.time(m) for m in sizes] == res.times
    doc = res.network_json()
    assert set(doc["fits"]) == {"2"} and doc["measurements"]["2"][0] == [4, res.times[0]]
    assert doc["fits"]["2"]["times"] == [[m, t] for m, t in zip(sizes, res.times)]
    assert cost_for(Network.from_dict(doc), 2).times == res.fit.times
    assert [m for m, _, _ in doc["spreads"]["2"]] == sizes


class SlowAtFirst:
    """One rank alone whose first `slow_calls` all-reduces take 1 s (a link warming up), the
    rest 1 ms; on a fake clock."""

    rank, size = 0, 1

    def __init__(self, slow_calls: int):
        self.calls, self.slow_calls, self.now = 0, slow_calls, 0.0

    def allreduce_sum(self, buf):
        self.calls += 1
        self.now += 1.0 if self.calls <= self.slow_calls else 1e-3

    def barrier(self):
        pass

    def allgather(self, obj):
        return [obj]


def test_the_link_is_warmed_before_the_first_size_is_timed(monkeypatch):
    from mgcaffe.comm.training import benchmark

    comm = SlowAtFirst(slow_calls=12)  # more than the first size's own 2 warm-up calls
    monkeypatch.setattr(benchmark.time, "perf_counter", lambda: comm.now)
    res = measure_allreduce(comm, [4, 64], iterations=5)
    assert res.times == pytest.approx([1e-3, 1e-3])
    assert comm.calls == benchmark.LINK_WARMUP + 2 * (2 + 5)


def test_benchmark_needs_two_sizes():
    world = LocalWorld(1)
    with pytest.raises(CommError, match="at least two distinct sizes"):
        measure_allreduce(world.communicators()[0], [64, 64])
    with pytest.raises(CommError, match="multiples of 4"):
        measure_allreduce(world.communicators()[0], [6, 64])
    with pytest.raises(CommError, match=r"must differ, got 4 B, 16 B more than once in \[4, "):
        measure_allreduce(world.communicators()[0], [4, 16, 64, 4, 16])


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_bench_comm_command_writes_a_network_the_planner_reads(tmp_path):
    out = tmp_path / "net.json"
    # 16 MB: milliseconds even through shared memory, so a scheduling delay of a 4-byte call
    # on a busy machine cannot make it look as slow
    status, log, _ = run_mpi(2, ["-m", "mgcaffe", "bench-comm", "--sizes", "4,4K,256K,16M",
                                 "--iterations", "5", "--out", out], timeout=100)
    assert status == 0, log
    doc = json.loads(out.read_text())
    assert [m for m, _ in doc["measurements"]["2"]] == [4, 4096, 256 << 10, 16 << 20]
    cost = cost_for(load_network(out), 2)
    assert cost.a >= 0 and cost.b > 0
    times = np.array([t for _, t in doc["measurements"]["2"]])
    assert np.all(times > 0) and times[-1] > times[0]  # 16 MB takes longer than 4 bytes
    assert "T(M) piecewise linear through 4 measured sizes" in log
    assert cost.kind == "piecewise" and len(cost.times) == 4
    # usable at another number of nodes: alpha and beta of the fit, by the ring formula
    assert doc["algorithm"] == "ring" and "extrapolated" in doc["extrapolation"]
    assert cost_for(load_network(out), 8).origin == "ring formula"
    two = cost_for(load_network(out), 2, use_formula=True)
    assert two.a == pytest.approx(cost.a) and two.b == pytest.approx(cost.b)
    assert "`plan --nodes M` extrapolates with them" in log


def test_ring_constants_invert_the_ring_formula():
    for n in (2, 3, 8):
        alpha, beta = ring_constants(4e-4, 3e-9, n)
        back = cost_for(Network(alpha, beta), n)
        assert back.a == pytest.approx(4e-4) and back.b == pytest.approx(3e-9)


def test_bench_comm_alone_is_an_error_and_writes_nothing(tmp_path, capsys):
    from mgcaffe.cli import main  # noqa: PLC0415 - the command line, in-process

    out = tmp_path / "net.json"
    assert main(["bench-comm", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "mgcaffe bench-comm: error: one rank has nothing to exchange: start it under a "
        "launcher, e.g. mpiexec -n 2 mgcaffe bench-comm --out network.json (one rank per node "
        "to measure a network)")
    assert not out.exists()


def test_bench_comm_help_says_the_sizes_it_uses(capsys):
    from mgcaffe.cli import main  # noqa: PLC0415

    with pytest.raises(SystemExit):
        main(["bench-comm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert DEFAULT_SIZES[-1] == 16 << 20
    assert f"(default: 4 B to 16 MiB, {len(DEFAULT_SIZES)} sizes)" in text


def test_a_poor_fit_on_one_host_is_information_not_a_warning():
    """One host's all-reduce goes through shared memory: a + b*M never fits it well, and
    nothing is wrong: its detail goes to the verbose level and one INFO line says so. Across
    hosts a poor fit is worth a warning."""
    assert fit_quality_level(poor=True, hosts=1) == logging.DEBUG
    assert fit_quality_level(poor=True, hosts=2) == logging.WARNING
    assert fit_quality_level(poor=False, hosts=4) == logging.INFO
    assert fit_notices(None, 0.05, 1) == []
    assert fit_notices("the fit is poor", 0.57, 3) == [(logging.WARNING, "the fit is poor")]
    (debug, detail), (info, note) = fit_notices("the fit is poor", 0.57, 1)
    assert (debug, detail, info) == (logging.DEBUG, "the fit is poor", logging.INFO)
    assert note == one_host_note(0.57) and note.startswith(
        "the all-reduce fit misses some sizes by up to 57%: expected with every rank on one host")


def test_poor_fit_is_flagged_with_the_worst_point():
    from mgcaffe.comm.model.cost import CostModel  # noqa: PLC0415
    from mgcaffe.comm.training.benchmark import AllreduceBenchmark  # noqa: PLC0415

    sizes, times = [4, 1024, 1 << 20], [5e-6, 6e-6, 1e-3]
    good = AllreduceBenchmark(2, sizes, times, CostModel(5e-6, 1e-9),
                              [(4e-6, 6e-6), (5e-6, 8e-6), (0.9e-3, 1.1e-3)])
    assert not good.poor and good.warning() is None
    assert good.outside_spread() == []
    assert "worst 5.4%" in good.describe_fit() and "a = 5.000 us" in good.describe_fit()
    bad = AllreduceBenchmark(2, sizes, times, CostModel(125e-6, 1e-9),
                             [(4e-6, 6e-6), (5e-6, 8e-6), (0.9e-3, 1.2e-3)])
    assert bad.poor and bad.outside_spread() == [4, 1024]
    assert good.doubt() == "" and bad.doubt() == ("the all-reduce model misses 2 measured "
                                                  "size(s) beyond their spread (at 4 B by 2400%)")
    assert "at 4 B it predicts 125.0 us where 5.0 us" in bad.warning()
    # the measured curve of the same points fits, and says how far the line alone is off
    curve = AllreduceBenchmark(2, sizes, times, CostModel(125e-6, 1e-9, times=tuple(
        zip(sizes, times))), [(4e-6, 6e-6), (5e-6, 8e-6), (0.9e-3, 1.2e-3)])
    assert not curve.poor and curve.warning() is None
    assert "the line alone: worst 2400.1%, rms 0.14 ms, 2 of 3" in curve.describe_fit()

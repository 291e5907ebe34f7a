"""Distributed training of the digits net under mpiexec, every mode: ranks stay bit-identical,
match one process with the combined batch, communicate the planned groups (read back from
the trace); faults and signals on a real training run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from comm_fakes import given_network, run_mpi

from mgcaffe.comm.runtime.trace import load_trace

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "mpi" / "train_digits.py"
ITERS = 8
PROFILE_ITERS = 3
COMBINED_BATCH = 16
MODES = {  # name: flags
    # conv1's backward waits 0.1 s first: room for the first all-reduce to start (check_trace)
    "wfbp": ["--comm", "wfbp", "--slow-first-layer", "0.1"],
    "synceasgd": ["--comm", "synceasgd"],
    "mgwfbp": ["--comm", "mgwfbp"],
    "mgwfbp-paper": ["--comm", "mgwfbp-paper"],
    "threshold": ["--comm", "threshold", "--bucket-mb", "0.05"],
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Digits LMDBs, and a solver writer for a per-rank batch size."""
    root = tmp_path_factory.mktemp("digits")
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_digits.py"), "--out",
                    str(root / "data")], check=True, timeout=120, capture_output=True)
    net_text = (REPO / "models" / "digits" / "train_test.prototxt").read_text()
    net_text = net_text.replace("data/digits/", f"{root}/data/")

    def solver(batch: int, max_iter: int = ITERS, extra: str = "") -> Path:
        net = root / f"net_b{batch}.prototxt"
        net.write_text(net_text.replace("batch_size: 64", f"batch_size: {batch}"))
        path = root / f"solver_b{batch}_i{max_iter}_{len(extra)}.prototxt"
        path.write_text(f'net: "{net}"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n'
                        f'lr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 0\n'
                        f'max_iter: {max_iter}\nrandom_seed: 1701\ntype: "SGD"\n'
                        f'snapshot_prefix: "{root}/snap"\n{extra}')
        return path

    return root, solver


@pytest.fixture(scope="module")
def reference(digits):
    """One process, batch = the ranks' combined batch."""
    root, solver = digits
    out = root / "reference"
    proc = subprocess.run([sys.executable, str(DRIVER), "--solver",
                           str(solver(COMBINED_BATCH)), "--dump-weights", str(out)],
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr
    return load_weights(out, 0)


def load_weights(prefix, rank):
    with np.load(f"{prefix}.rank{rank}.npz") as z:
        return [z[k] for k in sorted(z.files, key=lambda s: int(s.split("_")[1]))]


def iterations(doc, rank):
    """Per solver iteration of `rank`: (gradient-ready times, all-reduce events)."""
    out: dict[int, tuple[list, list]] = {}
    for e in doc["traceEvents"]:
        if e.get("pid") != rank or "args" not in e or "iter" not in e["args"]:
            continue
        grads, ars = out.setdefault(e["args"]["iter"], ([], []))
        if e.get("cat") == "grad":
            grads.append(e["ts"])
        elif e.get("cat") == "allreduce":
            ars.append(e)
    return out


def check_trace(doc, n, mode):
    plan = doc["metadata"]["plan"]
    groups = plan["groups"]
    every_layer = [name for g in groups for name in g]
    for rank in range(n):
        its = iterations(doc, rank)
        assert sorted(its) == list(range(ITERS))
        overlapped = 0
        for it, (grads, ars) in its.items():
            want = [every_layer] if it < PROFILE_ITERS else groups
            # exactly the planned groups, in order, each once per iteration
            assert [e["args"]["layers"] for e in ars] == want, (rank, it)
            backward_end = max(grads)
            if mode == "synceasgd" or it < PROFILE_ITERS:
                assert min(e["ts"] for e in ars) >= backward_end
            if it >= PROFILE_ITERS:
                overlapped += ars[0]["ts"] < backward_end
            if mode == "wfbp":  # the room is there: conv1's gradient comes 0.1 s after conv2's
                assert backward_end - sorted(grads)[-2] >= 0.1e6, (rank, it)  # trace: us
        if mode == "wfbp":
            # The first all-reduce starts while backward runs: conv1's backward waits 0.1 s
            # first (--slow-first-layer in MODES), so even a thread woken late on a loaded
            # machine starts it in time, on most iterations.
            assert overlapped > (ITERS - PROFILE_ITERS) / 2, (rank, overlapped)


def test_replan_after_warm_up_switches_every_rank_at_the_same_iteration(digits):
    root, solver = digits
    profile_iters, replan_after = 2, 3
    replan_at = profile_iters + replan_after + 4 * profile_iters  # 13
    iters = replan_at + 3
    trace = root / "trace_replan.json"
    # a network with interference: the re-plan's window then alternates undisturbed
    # iterations (one message after backward: the profile) with overlapped ones (one message
    # per layer: rho in situ), which the trace shows
    network = root / "network_interference.json"
    network.write_text('{"fits": {"2": {"a": 1e-5, "b": 1e-9, '
                       '"interference": [[1024, 0.5], [1048576, 0.5]]}}}')
    status, log, _ = run_mpi(2, [DRIVER, "--solver", solver(8, iters), "--comm", "wfbp",
                                 "--profile-iters", profile_iters, "--replan-after",
                                 replan_after, "--timeline", trace, "--network", network],
                             timeout=240)
    assert status == 0, log
    assert f"Re-planned at iteration {replan_at}:" in log
    assert log.count("Re-planned at iteration") == 1  # once
    doc = load_trace(trace)
    backward_order = ["ip2", "ip1", "conv2", "conv1"]  # the digits net's learnable layers
    every_layer, per_layer = [backward_order], [[name] for name in backward_order]
    # what each iteration all-reduced, from the trace: the start-up profile and every other
    # iteration of the re-plan's window send one message after backward, the plans (wfbp)
    # and the window's overlapped iterations one per layer
    window = profile_iters + replan_after
    want = {it: every_layer if it < profile_iters or
            (window <= it < replan_at and (it - window) % 2 == 0) else per_layer
            for it in range(iters)}
    for rank in range(2):
        its = iterations(doc, rank)
        got = {it: [e["args"]["layers"] for e in ars] for it, (_, ars) in its.items()}
        assert got == want, rank
    assert "Measured in situ on 2 ranks: backward takes" in log


@pytest.mark.parametrize("n, mode", [(2, m) for m in MODES] + [(4, "mgwfbp")])
def test_every_mode_matches_one_process_with_the_combined_batch(digits, reference, n, mode):
    root, solver = digits
    out = root / f"w_{mode}_{n}"
    trace = root / f"trace_{mode}_{n}.json"
    # with 4 ranks rank 0 also tests (alone) every 3 iterations: the others wait for it
    extra = "test_iter: 2\ntest_interval: 3\n" if n == 4 else ""
    status, log, _ = run_mpi(n, [DRIVER, "--solver", solver(COMBINED_BATCH // n, extra=extra),
                                 *MODES[mode], "--profile-iters", PROFILE_ITERS,
                                 "--dump-weights", out, "--timeline", trace, "--check-sync",
                                 "4"], timeout=240)
    assert status == 0, log
    ranks = [load_weights(out, r) for r in range(n)]
    for r in range(1, n):  # bit-identical on every rank
        assert all(np.array_equal(a, b) for a, b in zip(ranks[0], ranks[r])), f"rank {r}"
    for got, want in zip(ranks[0], reference):
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= 1e-5 * scale
    check_trace(load_trace(trace), n, mode)
    assert "measured" in log and "predicted" in log  # measured vs predicted is logged
    assert re.search(r"Plan [\w-]+ \([0-9a-f]{12}\)", log)
    if n == 4:
        assert log.count("Testing net (#0)") == 3  # iterations 0, 3, 6


@pytest.mark.parametrize("how, rank", [("raise", 1), ("sigkill", 1), ("raise", 0)])
def test_a_failing_rank_ends_every_rank(digits, how, rank):
    root, solver = digits
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", solver(8, 1000), "--comm", "wfbp",
                                       "--profile-iters", 2, "--fail-at", 4, "--fail-rank",
                                       rank, "--fail-how", how, "--comm-timeout", 5],
                                   timeout=120)
    assert status not in (None, 0), log
    assert f"FAULT {how} rank {rank} iteration 4" in log
    assert "DONE" not in log
    assert seconds < 60, log
    if how == "raise":
        assert f"rank {rank}: RuntimeError: injected failure at iteration 4" in log


def test_nan_on_one_rank_stops_every_rank(digits):
    """A non-finite loss on rank 1 makes the all-reduced gradients non-finite on every rank:
    every rank's solver stops at the same iteration, and the job ends non-zero."""
    root, solver = digits
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", solver(8, 1000), "--comm", "wfbp",
                                       "--profile-iters", 2, "--fail-at", 4, "--fail-rank", 1,
                                       "--fail-how", "nan"], timeout=120)
    assert status not in (None, 0), log
    assert "DONE" not in log and seconds < 60
    # (the launcher may interleave the two ranks' lines: look for the pieces)
    assert re.search(r"rank [01]: iteration 4: ", log), log  # the rank once, no type name
    assert "SolverError" not in log and "rank 1: rank 1" not in log, log
    assert "the loss is nan" in log or "non-finite gradient" in log, log


def test_sigint_on_one_rank_stops_every_rank_at_the_same_iteration(digits):
    root, solver = digits
    status, log, _ = run_mpi(2, [DRIVER, "--solver", solver(8, 1000), "--comm", "wfbp",
                                 "--profile-iters", 2, "--fail-at", 4, "--fail-rank", 1,
                                 "--fail-how", "sigint"], timeout=120)
    assert status == 130, log  # 128 + SIGINT on every rank, whichever got the signal
    assert sorted(re.findall(r"DONE rank (\d) iter (\d+) status 130", log)) == \
        [("0", "4"), ("1", "4")], log
    assert "Optimization stopped early" in log
    assert "Stopped by SIGINT at iteration 4" in log, log


def test_mgcaffe_train_under_mpiexec(digits):
    """The real command line: flags over comm_param, plan saved, measured vs predicted."""
    import json  # noqa: PLC0415

    root, solver = digits
    path = solver(8, 6, extra='comm_param { comm: "wfbp" profile_iters: 2 }\n')
    plan = root / "cli_plan.json"
    status, log, _ = run_mpi(2, ["-m", "mgcaffe", "train", "--solver", path, "--comm",
                                 "mgwfbp-paper", "--save-plan", plan], timeout=120)
    assert status == 0, log
    assert "comm=mgwfbp-paper" in log  # the flag beat comm_param's wfbp
    assert json.loads(plan.read_text())["scheme"] == "mgwfbp-paper"
    assert "measured" in log and "predicted" in log and "Optimization Done." in log


@pytest.mark.parametrize("mode", ["wfbp", "mgwfbp"])
def test_in_place_reduction_is_bit_identical_to_packing(digits, mode):
    """The flat gradient buffer reduced in place (the default) and every group packed into
    the executor's buffer (--pack-gradients) train to bit-identical weights."""
    root, solver = digits
    weights = {}
    for how, extra in (("in-place", []), ("packed", ["--pack-gradients"])):
        out = root / f"w_{how}_{mode}"
        status, log, _ = run_mpi(2, [DRIVER, "--solver", solver(COMBINED_BATCH // 2),
                                     *MODES[mode], "--profile-iters", PROFILE_ITERS,
                                     "--dump-weights", out, *extra], timeout=240,
                                 env={"GLOG_v": "1"})  # the buffer's line is verbose detail
        assert status == 0, log
        said = "all-reduced in place" if how == "in-place" else "packed into"
        assert said in log, log
        weights[how] = [load_weights(out, r) for r in range(2)]
    for r in range(2):
        for a, b in zip(weights["in-place"][r], weights["packed"][r]):
            assert np.array_equal(a, b), f"rank {r}"


# ------------------------------------------------------------------ disagreement and liveness
NET_EXTRA_LAYER = ('layer { name: "extra" type: "InnerProduct" bottom: "ip2" top: "extra" '
                   'inner_product_param { num_output: 10 } }\n')


@pytest.mark.parametrize("case", ["base_lr", "batch", "max_iter", "extra_layer"])
def test_ranks_with_different_settings_stop_at_start_naming_the_field(digits, case):
    root, solver = digits
    if case == "base_lr":
        other = solver(8, extra="")
        other.write_text(other.read_text().replace("base_lr: 0.01", "base_lr: 0.02"))
        path, field = root / "other_lr.prototxt", "solver base_lr (rank 0: 0.01; rank 1: 0.02)"
        path.write_text(other.read_text())
        solver(8)  # rewrite the shared file as it was
    elif case == "batch":
        path, field = solver(4), "batch size of layer"
    elif case == "max_iter":
        path, field = solver(8, 9), "solver max_iter (rank 0: 8; rank 1: 9)"
    else:
        net = root / "net_extra.prototxt"
        net.write_text((root / "net_b8.prototxt").read_text() + NET_EXTRA_LAYER)
        path = root / "solver_extra.prototxt"
        path.write_text(solver(8).read_text().replace(str(root / "net_b8.prototxt"), str(net)))
        field = "learnable layers"
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", solver(8), "--solver-rank1", path,
                                       "--comm", "wfbp", "--comm-timeout", 5], timeout=60)
    assert status not in (None, 0), log
    assert "DONE" not in log and "Starting Optimization" not in log
    for rank in (0, 1):  # (lines of the two ranks may interleave: look for each rank's)
        assert re.search(rf"rank {rank}: ranks disagree on {re.escape(field)}", log), log


def rank_map(log):
    m = re.search(r"Ranks: 0 = (\S+) pid (\d+), 1 = (\S+) pid (\d+)", log)
    assert m, log
    return {0: (m[1], int(m[2])), 1: (m[3], int(m[4]))}


@pytest.mark.parametrize("stopped", [1, 0])
def test_a_rank_stopped_while_rank_0_tests_is_named_within_the_timeout(digits, stopped):
    """SIGSTOP on one rank while rank 0 runs a test pass (the others wait for it at a
    barrier): found by the silence of its heartbeats after --comm-timeout, not after an
    hour; the message names the stopped rank with the host and pid of the rank map."""
    root, solver = digits
    path = solver(8, 1000, extra="test_iter: 30\ntest_interval: 4\ntest_initialization: "
                                  "false\n")
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", path, "--comm", "wfbp",
                                       "--profile-iters", 2, "--fail-at", 4, "--fail-rank",
                                       stopped, "--fail-how", "sigstop", "--comm-timeout", 3,
                                       "--network", given_network(root)], timeout=90)
    assert status not in (None, 0), log
    host, pid = rank_map(log)[stopped]
    assert re.search(rf"rank {stopped} \({re.escape(host)}, pid {pid}\) sent no heartbeat "
                     rf"for 3\.\d s", log) or \
        f"rank {stopped} has not reached it (rank {stopped} ({host}, pid {pid})" in log, log
    assert "DONE" not in log and seconds < 45, log


def test_a_slow_snapshot_on_rank_0_is_waited_for(digits):
    """Rank 0's snapshots take longer than --comm-timeout: alive (its heartbeats say it is
    busy), so nobody is aborted."""
    root, solver = digits
    path = solver(8, 4, extra="snapshot: 3\nsnapshot_after_train: false\n")
    status, log, _ = run_mpi(2, [DRIVER, "--solver", path, "--comm", "wfbp",
                                 "--profile-iters", 2, "--fail-at", 1, "--fail-rank", 0,
                                 "--fail-how", "slow-snapshot", "--fail-seconds", 3,
                                 "--comm-timeout", 2, "--network", given_network(root)],
                             timeout=90)
    assert status == 0, log
    assert sorted(re.findall(r"DONE rank (\d) iter (\d+)", log)) == [("0", "4"), ("1", "4")]
    assert "Snapshotting to" in log


def test_a_rank_leaving_early_with_status_0_fails_the_job(digits):
    root, solver = digits
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", solver(8, 1000), "--comm", "wfbp",
                                       "--profile-iters", 2, "--fail-at", 3, "--fail-rank", 1,
                                       "--fail-how", "exit0", "--comm-timeout", 5], timeout=60)
    assert status not in (None, 0), log
    host, pid = rank_map(log)[1]
    # (the hook runs after iteration 2's update, before the agreement)
    assert f"rank 1 (pid {pid}): left before the others: sys.exit(0) at iteration 2 (the " \
           f"update); aborting all 2 ranks" in log, log
    assert f"rank 0: rank 1 ({host}, pid {pid}) is leaving before the others: sys.exit(0) " \
           f"at iteration 2 (the update)" in log, log
    assert "DONE" not in log and seconds < 40


EXIT_LAYER = """
import os
import mgcaffe


class ExitAt(mgcaffe.Layer):
    \"\"\"os._exit(0) in the forward of TRAIN iteration AT on rank RANK ("RANK AT").\"\"\"

    def setup(self, bottom, top):
        self.rank_at, self.at = (int(x) for x in self.param_str.split())
        self.calls = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        if self.phase == mgcaffe.TRAIN:
            if self.rank == self.rank_at and self.calls == self.at:
                print(f"FAULT os._exit(0) rank {self.rank} iteration {self.at}", flush=True)
                os._exit(0)
            self.calls += 1

    def backward(self, top, propagate_down, bottom):
        pass
"""


@pytest.mark.parametrize("n", [2])
def test_a_rank_calling_os_exit_0_in_a_python_layer_fails_the_job(digits, tmp_path, n):
    """`os._exit(0)` in a Python layer of rank 1 at iteration 5 of 1000: no exception, no
    exit handler; MPICH's Hydra used to kill the others at once and return 0. Now the job
    ends non-zero and every rank says which rank left and where."""
    root, solver = digits
    (tmp_path / "exit_layer.py").write_text(EXIT_LAYER)
    path = solver(8, 1000)  # (writes net_b8.prototxt)
    net = tmp_path / "net.prototxt"
    net.write_text((root / "net_b8.prototxt").read_text() + (
        'layer { name: "exit" type: "Python" bottom: "label" include { phase: TRAIN }\n'
        '  python_param { module: "exit_layer" layer: "ExitAt" param_str: "1 5" } }\n'))
    path = tmp_path / "solver.prototxt"
    path.write_text(solver(8, 1000).read_text().replace(str(root / "net_b8.prototxt"),
                                                        str(net)))
    status, log, seconds = run_mpi(n, ["-m", "mgcaffe", "train", "--solver", path, "--comm",
                                       "wfbp", "--comm-timeout", 10], timeout=120,
                                   env={"PYTHONPATH": str(tmp_path)})
    assert "FAULT os._exit(0) rank 1 iteration 5" in log, log
    assert status not in (None, 0), log
    host, pid = rank_map_n(log, n)[1]
    assert f"rank 1 (pid {pid}): left before the others: os._exit(0) at iteration 5 " \
           f"(forward and backward); aborting all {n} ranks" in log, log
    for r in range(n):
        if r != 1:
            assert f"rank {r}: rank 1 ({host}, pid {pid}) is leaving before the others: " \
                   f"os._exit(0) at iteration 5 (forward and backward)" in log, log
    assert "Optimization Done" not in log and seconds < 60, log


def rank_map_n(log, n):
    m = re.search(r"Ranks: (.*)", log)
    assert m, log
    found = re.findall(r"(\d+) = (\S+) pid (\d+)", m[1])
    assert len(found) == n, m[1]
    return [(h, int(p)) for _, h, p in found]


def test_a_rank_stopped_in_steady_training_is_named_with_its_iteration_and_phase(digits):
    """SIGSTOP on rank 1 in the backward of iteration 30 (well after warm-up): the abort line
    says iteration 30 and its phase, not where the rank was at start-up."""
    root, solver = digits
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", solver(8, 1000), "--comm", "wfbp",
                                       "--profile-iters", 2, "--fail-at", 30, "--fail-rank", 1,
                                       "--fail-how", "sigstop-backward", "--fail-seconds", 1.2,
                                       "--comm-timeout", 3, "--network", given_network(root)],
                                   timeout=90)
    assert "FAULT sigstop-backward rank 1 iteration 30" in log, log
    assert status not in (None, 0), log
    host, pid = rank_map(log)[1]
    assert re.search(rf"rank 1 \({re.escape(host)}, pid {pid}\)(, | sent no heartbeat .*last "
                     rf"heard )at iteration 30 \(forward and backward\)", log), log
    assert "start barrier" not in log and "DONE" not in log and seconds < 45, log


def test_a_rank_stopped_before_mpi_init_ends_within_the_startup_deadline(digits):
    root, solver = digits
    status, log, seconds = run_mpi(2, [DRIVER, "--solver", solver(8), "--comm", "wfbp",
                                       "--stop-before-init", 1, "--comm-timeout", 3],
                                   timeout=60)
    assert status not in (None, 0), log
    assert "FAULT stop rank 1 before MPI_Init" in log
    assert re.search(r"mgcaffe: rank 0 \(\S+, pid \d+\): MPI start-up .* did not complete "
                     r"within 3 s", log), log
    assert seconds < 30, log


def test_sigterm_snapshots_every_rank_and_training_resumes_there(digits):
    root, solver = digits
    prefix = root / "term"
    path = solver(8, 1000)
    path.write_text(path.read_text().replace(f'"{root}/snap"', f'"{prefix}"'))
    status, log, _ = run_mpi(2, [DRIVER, "--solver", path, "--comm", "wfbp",
                                 "--profile-iters", 2, "--fail-at", 4, "--fail-rank", 1,
                                 "--fail-how", "sigterm"], timeout=90)
    assert status == 143, log  # not 0: a job chain must not count it as finished
    # one snapshot, at the iteration of the signal, where every rank stops
    assert sorted(re.findall(r"DONE rank (\d) iter (\d+) status 143", log)) == \
        [("0", "4"), ("1", "4")], log
    assert sorted(p.name for p in root.glob("term_iter_*")) == \
        ["term_iter_4.caffemodel", "term_iter_4.solverstate"]
    assert f"Stopped by SIGTERM at iteration 4; resume with --snapshot " \
           f"{root / 'term_iter_4.solverstate'}; exit status 143" in log, log
    path.write_text(path.read_text().replace("max_iter: 1000", "max_iter: 7"))
    status, log, _ = run_mpi(2, [DRIVER, "--solver", path, "--comm", "wfbp",
                                 "--profile-iters", 2, "--snapshot",
                                 root / "term_iter_4.solverstate"], timeout=90)
    assert status == 0, log
    assert "Resuming from" in log
    assert sorted(re.findall(r"DONE rank (\d) iter (\d+)", log)) == [("0", "7"), ("1", "7")]


@pytest.mark.parametrize("delay", [0.8])
def test_ctrl_c_during_the_launch_stops_every_rank_quietly(digits, delay):
    """SIGINT to the whole process group (as a terminal's Ctrl-C) while the ranks import or
    start MPI: one line per rank, or, once start-up is over, every rank stops after an
    iteration; status 130 either way (a stop by signal), never a traceback or a crash."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import time  # noqa: PLC0415

    from comm_fakes import mpiexec  # noqa: PLC0415

    root, solver = digits
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, "-m", "mgcaffe", "train",
                             "--solver", str(solver(8, 1000)), "--comm", "wfbp"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        log, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the job did not stop: " + proc.communicate()[0][-3000:])
    assert proc.returncode == 130, log
    assert "Traceback" not in log and "Segmentation" not in log and "(signal " not in log, log
    assert log.count("mgcaffe: interrupted") == 2 or "Optimization stopped early." in log, log

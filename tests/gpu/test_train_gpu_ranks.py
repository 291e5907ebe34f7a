"""`mgcaffe train --gpu 0,1` outside a launcher: one rank per GPU, started by the command.

On the CuPy double with two devices (`python -m cupy_double --devices 2 -m mgcaffe train
...`, the double in every rank too): each rank on its own GPU, gradients over NCCL, one log
(rank 0's), the worst rank's exit status, SIGTERM and Ctrl-C stopping every rank with one
snapshot that the same command resumes from, SIGHUP a snapshot and training goes on. And
the pieces: which flags start ranks, the command run again, the job's status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cupy_double
import pytest

from mgcaffe.commands import _gpu_ranks as gr
from mgcaffe.errors import SolverError

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the pieces
@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with cupy_double.installed(devices=4) as double:
        yield double


@pytest.mark.parametrize("flag, expected", [
    ("0,1,2,3", [0, 1, 2, 3]), ("all", [0, 1, 2, 3]), ("3,1", [3, 1]),
    ("0", None), ("2", None), (None, None), ("", None)])
def test_which_flags_start_one_rank_per_gpu(four_gpus, flag, expected):
    assert gr.gpus_to_start(flag, {}) == expected
    assert four_gpus.state.counters.contexts == set()  # counting GPUs makes no context


def test_under_a_launcher_the_ranks_are_the_launchers(four_gpus):
    assert gr.gpus_to_start("0,1,2,3", {"PMI_RANK": "0", "PMI_SIZE": "4"}) is None
    assert gr.gpus_to_start("all", {"OMPI_COMM_WORLD_SIZE": "4"}) is None


def test_all_with_one_gpu_visible_is_one_process(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with cupy_double.installed(devices=4):
        assert gr.gpus_to_start("all", {}) is None


def test_without_a_gpu_no_ranks_are_started():
    with cupy_double.installed(devices=0):
        assert gr.gpus_to_start("0,1", {}) is None  # device_from_flag says: no GPU


@pytest.mark.parametrize("flag, message", [
    ("0,0", "a GPU is listed twice"), ("0,5,7", "no GPU 5, 7 here; 4 visible (0..3)")])
def test_bad_lists_are_one_line_errors(four_gpus, flag, message):
    with pytest.raises(SolverError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gr.gpus_to_start(flag, {})


@pytest.mark.parametrize("orig, argv, expected", [
    (["/v/bin/python", "/v/bin/mgcaffe", "train", "--gpu", "0,1"],
     ["/v/bin/mgcaffe", "train", "--gpu", "0,1"], ["/v/bin/mgcaffe"]),
    (["python3", "-m", "mgcaffe", "train", "--gpu", "all"],
     [str(REPO / "mgcaffe" / "__main__.py"), "train", "--gpu", "all"], ["-m", "mgcaffe"]),
    (["python3", "-u", "-m", "cupy_double", "--devices", "2", "-m", "mgcaffe", "train"],
     [str(REPO / "mgcaffe" / "__main__.py"), "train"],
     ["-u", "-m", "cupy_double", "--devices", "2", "-m", "mgcaffe"]),
    (["python3", "-m", "pytest", "tests", "-k", "train"], ["/v/pytest", "tests", "-k", "train"],
     None),  # another program: no command to run again
])
def test_the_command_run_again_is_the_one_that_started_this_process(monkeypatch, orig, argv,
                                                                     expected):
    monkeypatch.setattr(sys, "orig_argv", orig)
    monkeypatch.setattr(sys, "argv", argv)
    got = gr.restart_command(["train", "X"], gr.is_mgcaffe)
    assert got == (None if expected is None else [sys.executable, *expected, "train", "X"])


@pytest.mark.parametrize("statuses, mpiexec, expected", [
    ({0: 0, 1: 0}, 0, 0),
    ({0: 143, 1: 143}, 143, 143),      # stopped by SIGTERM, every rank
    ({0: 0, 1: 1}, 1, 1),              # a failure beats success
    ({0: 143, 1: 1}, 143, 1),          # and a stop by signal (mpiexec's OR: 143)
    ({0: 130, 1: 143}, 143, 143),      # two stops: the higher
    ({0: 0}, 9, 9),                    # rank 1 left no status: mpiexec's (killed by 9)
    ({0: 0}, 0, 1),                    # ... even when mpiexec says 0
    ({0: 2, 1: 137}, 139, 137),        # two failures: the higher
])
def test_the_jobs_status_is_the_worst_ranks(statuses, mpiexec, expected):
    assert gr.job_status(statuses, 2, mpiexec) == expected


def test_a_rank_reports_its_pid_and_status(tmp_path):
    report = gr.RankReport(1, {gr.STATUS_DIR: str(tmp_path)})
    assert (tmp_path / "rank1.pid").read_text() == str(os.getpid())
    assert report.ended(143) == 143
    assert (tmp_path / "rank1.status").read_text() == "143"
    assert gr.RankReport(0, {}).ended(0) == 0  # no folder: nothing written
    assert [gr.exit_status_of(e) for e in (SystemExit(3), SystemExit(None), SystemExit("x"),
                                           KeyboardInterrupt(), SolverError("x"))] == [
        3, 0, 1, 130, 1]


def test_called_from_other_python_code_it_says_how_to_start_ranks(tmp_path, capsys):
    """No command line of mgcaffe's to run again (pytest's here): a one-line error."""
    from mgcaffe.cli import main

    solver = tmp_path / "s.prototxt"
    solver.write_text('net: "n.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\n')
    with cupy_double.installed(devices=2):
        status = main(["train", "--solver", str(solver), "--gpu", "0,1"])
    err = capsys.readouterr().err
    assert status == 1 and "this process was not started as that program" in err
    assert "mpiexec -n 2" in err


# ----------------------------------------------------------------------------- whole jobs
FAIL_LAYER = '''
import os

import mgcaffe


class FailOnRank(mgcaffe.Layer):
    """Passes its bottom through; on rank `param_str`'s 3rd forward fails as asked."""

    def setup(self, bottom, top):
        rank, self.how = self.param_str.split(":")
        self.mine = os.environ.get("PMI_RANK") == rank
        self.calls = 0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        self.calls += 1
        if self.mine and self.calls == 3:
            if self.how == "kill":
                os.kill(os.getpid(), 9)
            raise RuntimeError("planted failure")
        top[0].data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff
'''


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits-ranks")
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_digits.py"), "--out",
                    str(root / "data")], check=True, timeout=120, capture_output=True)
    (root / "fail_layer.py").write_text(FAIL_LAYER)
    text = (REPO / "models" / "digits" / "train_test.prototxt").read_text()

    def solver(tmp: Path, max_iter: int, fail: str = "") -> Path:
        net = text.replace("data/digits/", f"{root}/data/")
        if fail:  # a pass-through layer on the data before conv1, failing on one rank
            check = ('layer { name: "check" type: "Python" bottom: "data" top: "checked" '
                     'python_param { module: "fail_layer" layer: '
                     f'"FailOnRank" param_str: "{fail}" }} }}\nlayer {{\n  name: "conv1"')
            net = net.replace('layer {\n  name: "conv1"', check, 1).replace(
                'bottom: "data"', 'bottom: "checked"', 2).replace(
                'bottom: "checked" top: "checked"', 'bottom: "data" top: "checked"')
        (tmp / "net.prototxt").write_text(net)
        path = tmp / "solver.prototxt"
        path.write_text(f'net: "{tmp}/net.prototxt"\nbase_lr: 0.05\nmomentum: 0.9\n'
                        f'lr_policy: "fixed"\ndisplay: 2\ntest_iter: 2\ntest_interval: 100000\n'
                        f'max_iter: {max_iter}\nrandom_seed: 1701\n'
                        f'snapshot_prefix: "{tmp}/snap"\n')
        return path

    return root, solver


def _command(tmp: Path, solver: Path, *extra) -> list[str]:
    network = tmp / "network.json"
    network.write_text('{"fits": {"2": {"a": 1e-5, "b": 1e-9}}}')
    return [sys.executable, "-m", "cupy_double", "--devices", "2", "--counts",
            str(tmp / "counts_{rank}.json"), "-m", "mgcaffe", "train", "--solver", str(solver),
            "--gpu", "0,1", "--comm", "wfbp", "--network", str(network), *map(str, extra)]


def _env(root: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ["PYTHONPATH"]])}


@pytest.mark.slow
@pytest.mark.mpi
def test_train_gpu_0_1_trains_one_rank_per_gpu(digits, tmp_path):
    root, solver = digits
    proc = subprocess.run(_command(tmp_path, solver(tmp_path, 10)), capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env=_env(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stderr
    assert "Training on GPUs 0, 1: one rank each, started by " in log
    assert "Distributed training: 2 ranks on 1 host" in log
    assert "Gradients all-reduced with NCCL" in log
    # one log: rank 0's
    assert log.count("Optimization Done.") == 1 and log.count("Solving DigitsLeNet") == 1
    for rank in (0, 1):
        counts = json.loads((tmp_path / f"counts_{rank}.json").read_text())
        assert counts["contexts"] == [rank]  # each rank on its own GPU, and only there
        assert any(s.startswith("stream") for s in counts["launches_by_stream"])  # NCCL's
    # the command that started them made no context anywhere
    assert json.loads((tmp_path / "counts_main.json").read_text())["contexts"] == []


def _start(command, tmp: Path, env) -> tuple[subprocess.Popen, Path]:
    log = tmp / "stderr.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, cwd=tmp,
                                env=env)
    return proc, log


def _wait_for(log: Path, text: str, proc, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while text not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {text!r} in the log:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["sigterm", "ctrl-c"])
def test_a_signal_stops_every_rank_with_one_snapshot_the_same_command_resumes(
        digits, tmp_path, signum, status):
    root, solver = digits
    path = solver(tmp_path, 100000)
    proc, log = _start(_command(tmp_path, path), tmp_path, _env(root))
    _wait_for(log, "Iteration 4 ", proc)
    proc.send_signal(signum)
    assert proc.wait(timeout=120) == status, log.read_text()[-3000:]
    text = log.read_text()
    stop = text.split("Stopped by ", 1)[1].split("\n", 1)[0]
    states = sorted(tmp_path.glob("snap_iter_*.solverstate"))
    assert len(states) == 1 and len(list(tmp_path.glob("snap_iter_*.caffemodel"))) == 1
    assert f"resume with --snapshot {states[0]}" in stop and f"exit status {status}" in stop
    stopped_at = int(states[0].name.split("_")[-1].split(".")[0])
    assert stopped_at >= 4
    if signum != signal.SIGTERM:
        return  # the resume is the same after either stop
    # the same command, --snapshot added, trains on from there to the end
    path.write_text(path.read_text().replace("max_iter: 100000", f"max_iter: {stopped_at + 4}"))
    proc = subprocess.run(_command(tmp_path, path, "--snapshot", states[0]),
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=_env(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Resuming from {states[0]}" in proc.stderr
    assert "Iteration 0" not in proc.stderr  # on from the snapshot, not from the start
    assert (tmp_path / f"snap_iter_{stopped_at + 4}.solverstate").exists()


@pytest.mark.slow
@pytest.mark.mpi
def test_sighup_snapshots_and_training_goes_on(digits, tmp_path):
    root, solver = digits
    proc, log = _start(_command(tmp_path, solver(tmp_path, 200)), tmp_path, _env(root))
    _wait_for(log, "Iteration 4 ", proc)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    assert "Optimization Done." in log.read_text()
    taken = sorted(int(p.name.split("_")[-1].split(".")[0])
                   for p in tmp_path.glob("snap_iter_*.solverstate"))
    assert len(taken) == 2 and 4 <= taken[0] < 200 and taken[1] == 200  # mid-training, end


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("how, status, line", [
    ("raise", 1, "rank 1: RuntimeError: planted failure; aborting all 2 ranks"),
    # hydra then kills rank 0 too: neither reports; mpiexec's status is the signal's number
    ("kill", 9, "(GPU 0, 1) ended without an exit status (killed, or the job was aborted); "
                "mpiexec's status 9"),
], ids=["exception", "sigkill"])
def test_a_failing_rank_fails_the_job_naming_it(digits, tmp_path, how, status, line):
    root, solver = digits
    proc = subprocess.run(_command(tmp_path, solver(tmp_path, 40, f"1:{how}")),
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=_env(root))
    assert proc.returncode == status, proc.stderr[-3000:]
    assert line in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

"""mgcaffe.cpu.threads: thread counts from affinity, cgroup quota, node-local ranks, user settings.

Every input is faked: environments are dicts, cgroup trees are tmp dirs, the affinity is
passed in; the expected counts are worked out by hand in each test.
"""

from __future__ import annotations

import logging

import pytest

from mgcaffe.cpu import cores, threads
from mgcaffe.cpu.engine import CpuEngine
from mgcaffe.errors import MgcaffeError


def v2_tree(tmp_path, path="/job/step", **limits):
    """A cgroup v2 mount at tmp/cg with cpu.max files {relative dir: "quota period"}."""
    root = tmp_path / "cg"
    (root / path.strip("/")).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for rel, text in limits.items():
        (root / rel.replace("__", "/")).joinpath("cpu.max").write_text(text + "\n")
    proc = tmp_path / "cgroup"
    proc.write_text(f"0::{path}\n")
    return proc, root


def v1_tree(tmp_path, quota, period, path="/docker/abc"):
    root = tmp_path / "cg1"
    cpu = root / "cpu,cpuacct" / path.strip("/")
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (cpu / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "cgroup1"
    proc.write_text(f"12:memory:{path}\n4:cpu,cpuacct:{path}\n0::/\n")
    return proc, root


def test_cgroup_v2_quota_is_read_and_the_smallest_level_wins(tmp_path):
    proc, root = v2_tree(tmp_path, job="300000 100000", job__step="250000 100000")
    assert cores.cgroup_cpu_limit(proc, root) == pytest.approx(2.5)
    proc, root = v2_tree(tmp_path / "b", job="150000 100000", job__step="max 100000")
    assert cores.cgroup_cpu_limit(proc, root) == pytest.approx(1.5)


def test_cgroup_v2_without_a_quota_and_missing_files(tmp_path):
    proc, root = v2_tree(tmp_path, job__step="max 100000")
    assert cores.cgroup_cpu_limit(proc, root) is None
    assert cores.cgroup_cpu_limit(tmp_path / "absent", tmp_path / "nothing") is None


def test_cgroup_v1_cfs_quota(tmp_path):
    proc, root = v1_tree(tmp_path, 200000, 100000)
    assert cores.cgroup_cpu_limit(proc, root) == pytest.approx(2.0)
    proc, root = v1_tree(tmp_path / "b", -1, 100000)
    assert cores.cgroup_cpu_limit(proc, root) is None


@pytest.mark.parametrize("env, expected", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (4, "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ({"MPI_LOCALNRANKS": "3", "PMI_SIZE": "6"}, (3, "MPI_LOCALNRANKS")),
    ({"MV2_COMM_WORLD_LOCAL_SIZE": "2"}, (2, "MV2_COMM_WORLD_LOCAL_SIZE")),
    ({"SLURM_NTASKS_PER_NODE": "8"}, (8, "SLURM_NTASKS_PER_NODE")),
    # srun without --ntasks-per-node: this node's entry of "3(x2),1" (node 2 holds 1)
    ({"SLURM_PROCID": "6", "SLURM_TASKS_PER_NODE": "3(x2),1", "SLURM_NODEID": "2"},
     (1, "SLURM_TASKS_PER_NODE")),
    ({"SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "3(x2),1", "SLURM_NODEID": "1"},
     (3, "SLURM_TASKS_PER_NODE")),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "junk"}, (1, "one process")),
    ({}, (1, "one process")),
])
def test_node_local_rank_count_from_launcher_variables(env, expected):
    assert cores.local_rank_count(env) == expected


def test_node_local_rank_count_from_the_callers_split_when_no_variable_says():
    calls = []

    def split():
        calls.append(1)
        return 2

    assert cores.local_rank_count({}, split) == (2, "MPI shared-memory split")
    # a launcher variable wins, and the collective is then not run at all
    assert cores.local_rank_count({"MPI_LOCALNRANKS": "3"}, split) == (3, "MPI_LOCALNRANKS")
    assert calls == [1]


def test_cores_are_divided_by_the_ranks_on_the_node(tmp_path):
    none = tmp_path / "none"
    # 16 CPUs, 4 ranks per node: 4 threads each
    choice = cores.choose(environ={"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, affinity=16,
                            proc_cgroup=none, cgroup_root=none)
    assert (choice.threads, choice.reason, choice.usable_cores) == (4, "cores / ranks", 16)
    # more ranks than cores: never below one
    choice = cores.choose(environ={"MPI_LOCALNRANKS": "3"}, affinity=2,
                            proc_cgroup=none, cgroup_root=none)
    assert choice.threads == 1


def test_a_cgroup_quota_caps_the_affinity(tmp_path):
    proc, root = v2_tree(tmp_path, job__step="250000 100000")  # 2.5 CPUs -> 2 usable
    choice = cores.choose(environ={}, affinity=32, proc_cgroup=proc, cgroup_root=root)
    assert (choice.usable_cores, choice.threads) == (2, 2)
    choice = cores.choose(environ={"MPI_LOCALNRANKS": "2"}, affinity=32, proc_cgroup=proc,
                            cgroup_root=root)
    assert choice.threads == 1
    proc, root = v2_tree(tmp_path / "b", job__step="50000 100000")  # half a CPU: still one
    assert cores.choose(environ={}, affinity=8, proc_cgroup=proc,
                          cgroup_root=root).threads == 1


@pytest.mark.parametrize("env, flag, expected", [
    ({"OMP_NUM_THREADS": "3", "MPI_LOCALNRANKS": "2"}, None, (3, "OMP_NUM_THREADS")),
    ({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "4"}, None, (1, "OPENBLAS_NUM_THREADS")),
    ({"MKL_NUM_THREADS": "5", "OMP_NUM_THREADS": "4"}, None, (5, "MKL_NUM_THREADS")),
    ({"OMP_NUM_THREADS": "4"}, 6, (6, "--threads")),
    ({"OMP_NUM_THREADS": "junk"}, None, (4, "cores / ranks")),
])
def test_the_users_setting_wins(tmp_path, env, flag, expected):
    choice = cores.choose(flag, environ=env, affinity=8, proc_cgroup=tmp_path / "x",
                            cgroup_root=tmp_path / "x")
    if expected[1] == "cores / ranks":
        expected = (8, expected[1])
    assert (choice.threads, choice.reason) == expected


def test_a_bad_flag_is_one_clear_error(tmp_path):
    with pytest.raises(MgcaffeError, match="--threads: expected a count >= 1, found 0"):
        cores.choose(0, environ={})


def test_a_library_net_engine_follows_the_choice_when_the_net_is_built(monkeypatch):
    """Library use (no command): each net's engine reads the user's variables when it is
    built, not when mgcaffe was imported; adaptive stays off (repeatable bits)."""
    for name in cores.USER_VARIABLES + cores.LOCAL_SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    engine = CpuEngine.library_default()
    assert (engine.threads, engine.adaptive, engine.layer_way.threads) == (3, False, 1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("MPI_LOCALNRANKS", "64")  # more ranks than any test machine's cores
    assert CpuEngine.library_default().threads == 1


def test_a_commands_engine_is_its_thread_choice(tmp_path):
    where = {"environ": {}, "affinity": 4, "proc_cgroup": tmp_path / "x",
             "cgroup_root": tmp_path / "x"}
    fixed = CpuEngine.from_choice(cores.choose(None, **where))
    adaptive = CpuEngine.from_choice(cores.choose("adaptive", **where))
    assert (fixed.threads, fixed.adaptive, fixed.layer_way.threads) == (4, False, 1)
    assert (adaptive.threads, adaptive.adaptive, adaptive.layer_way.threads) == (4, True, 4)
    assert repr(adaptive) == "CpuEngine(threads=4, adaptive=True)"
    assert fixed.describe() == "4 chunk thread(s), BLAS threads fixed"
    assert adaptive.describe().startswith("4 chunk thread(s), BLAS threads adaptive")


def test_configure_sets_blas_and_chunk_threads_and_logs_one_line(monkeypatch, caplog):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    for name in cores.USER_VARIABLES + cores.LOCAL_SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", "64")
    before = threadpoolctl.threadpool_info()
    try:
        with caplog.at_level(logging.INFO, logger="mgcaffe.cpu.threads"):
            choice = threads.configure()
        assert choice.threads == 1
        assert CpuEngine.from_choice(choice).runner.threads == 1
        blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        assert blas and all(i["num_threads"] == 1 for i in blas)
        lines = [r.getMessage() for r in caplog.records if r.name == "mgcaffe.cpu.threads"]
        assert len(lines) == 1
        assert lines[0].startswith("Threads: 1 for BLAS and chunk work")
        assert "rank(s) on this node (MPI_LOCALNRANKS)" in lines[0]
    finally:  # leave the BLAS as the other tests expect it
        for info in before:
            if info["user_api"] == "blas":
                threadpoolctl.threadpool_limits(info["num_threads"], user_api="blas")


def test_the_commands_take_a_threads_flag():
    import argparse

    from mgcaffe.commands import test as test_cmd
    from mgcaffe.commands import time as time_cmd
    from mgcaffe.commands import train as train_cmd

    for module in (train_cmd, test_cmd, time_cmd):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        args = parser.parse_args(["--threads", "2"] + (
            ["--model", "m"] if module is time_cmd else []))
        assert args.threads == 2


def test_adaptive_blas_only_when_asked(tmp_path):
    """The thread-count switching that can change a GEMM's last bits is opt-in: a default
    run must repeat (and resume) bit for bit."""
    where = {"environ": {}, "affinity": 4, "proc_cgroup": tmp_path / "x",
             "cgroup_root": tmp_path / "x"}
    default = cores.choose(None, **where)
    adaptive = cores.choose("adaptive", **where)
    assert not default.adaptive and default.threads == 4
    assert adaptive.adaptive and adaptive.threads == 4 and adaptive.reason == "cores / ranks"
    # a count the user fixed is used as given, never switched
    assert not cores.choose("adaptive", **{**where, "environ": {"OMP_NUM_THREADS": "2"}}).adaptive


def test_the_threads_flag_takes_a_count_or_adaptive():
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    threads.add_argument(parser)
    assert parser.parse_args(["--threads", "3"]).threads == 3
    assert parser.parse_args(["--threads", "adaptive"]).threads == "adaptive"
    with pytest.raises(SystemExit):
        parser.parse_args(["--threads", "many"])


def test_the_blas_line_names_the_kernel_and_a_pinned_core_type(monkeypatch):
    info = {"internal_api": "openblas", "version": "0.3.31", "threading_layer": "pthreads",
            "num_threads": 2, "architecture": "Haswell"}
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert threads.describe_blas(info) == "openblas 0.3.31 pthreads x2, kernel Haswell"
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert threads.describe_blas(info) == \
        "openblas 0.3.31 pthreads x2, kernel Haswell (OPENBLAS_CORETYPE=Haswell)"
    mkl = {"internal_api": "mkl", "version": None, "threading_layer": "intel", "num_threads": 4}
    assert threads.describe_blas(mkl) == "mkl intel x4"

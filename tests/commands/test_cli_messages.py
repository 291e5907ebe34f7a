"""What the program says to a user who mistypes or asks: --version, "did you mean" with a
short usage line, flags after the sub-command, one wording for "no GPU", stage lists."""

from __future__ import annotations

import argparse

import pytest

import mgcaffe
from mgcaffe.backend import gpu_available
from mgcaffe.cli import main
from mgcaffe.comm.model.schemes import SCHEMES
from mgcaffe.commands import time as time_command
from mgcaffe.commands.bench_comm import fit_warning


def _exit(capsys, *argv):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out = capsys.readouterr()
    return info.value.code, out.out + out.err


def test_version(capsys):
    code, text = _exit(capsys, "--version")
    assert code == 0 and text.strip() == f"mgcaffe {mgcaffe.__version__}"


def test_mistyped_command_suggests_and_is_short(capsys):
    code, text = _exit(capsys, "trian", "--solver", "s.prototxt")
    assert code == 2
    assert "did you mean 'train'?" in text
    assert len(text.splitlines()) == 2  # a usage line and the error, not the whole help


def test_mistyped_comm_value_suggests(capsys):
    code, text = _exit(capsys, "train", "--solver", "s.prototxt", "--comm=mgwfb")
    assert code == 2 and "did you mean 'mgwfbp'?" in text
    assert text.splitlines()[0].startswith("usage: mgcaffe train ")
    assert len(text.splitlines()) == 2


def test_no_suggestion_for_something_unlike_any_choice(capsys):
    code, text = _exit(capsys, "zzzzqqq")
    assert code == 2 and "did you mean" not in text and "invalid choice" in text


def test_log_level_after_the_sub_command(model, cli):
    code, err = cli("train", "--solver", model.solver(), "--log-level", "WARNING")
    assert code == 0 and "Optimization Done." not in err
    code, err = cli("--log-level", "WARNING", "train", "--solver", model.solver())
    assert code == 0 and "Optimization Done." not in err
    code, err = cli("train", "--solver", model.solver())
    assert code == 0 and "Optimization Done." in err


def test_log_dir_flag_writes_glog_files(model, cli, tmp_path):
    logs = tmp_path / "logs"
    code, _ = cli("train", "-solver", model.solver(), "-log_dir", logs)
    assert code == 0
    assert "Optimization Done." in (logs / "mgcaffe.INFO").read_text()
    from mgcaffe.log import configure  # noqa: PLC0415

    configure("INFO", log_dir="")  # later tests write no files


@pytest.mark.skipif(gpu_available(), reason="checks the message of a GPU-less machine")
@pytest.mark.parametrize("command", ["train", "test", "time"])
@pytest.mark.parametrize("flag", ["0", "all"])
def test_one_no_gpu_message_for_every_command(model, cli, command, flag):
    argv = {"train": ["--solver", model.solver()],
            "test": ["--model", model.net_file, "--weights", "w.caffemodel"],
            "time": ["--model", model.net_file, "--iterations", "1"]}[command]
    code, err = cli(command, *argv, "--gpu", flag)
    assert code == 1
    assert f"mgcaffe {command}: error: --gpu {flag}: no GPU is usable (CuPy missing or no " \
           f"CUDA device); leave out --gpu to use the CPU" in err


def test_time_splits_stages_on_commas(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text("""
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "a" type: "Power" bottom: "x" top: "ya" include { stage: "a" } }
layer { name: "b" type: "Power" bottom: "x" top: "yb" include { stage: "b" } }
""")
    parser = argparse.ArgumentParser()
    time_command.add_arguments(parser)
    args = parser.parse_args(["--model", str(net), "--stage", "a,b"])
    names = set(time_command.build_net(args).layer_names)
    assert {"a", "b"} <= names  # both stages given: both layers kept


def test_bench_comm_fit_warning():
    assert fit_warning(a=10e-6, rms=2e-6) is None
    text = fit_warning(a=1e-6, rms=30e-6)
    assert "rms residual (30.000 us) is larger than its intercept a (1.000 us)" in text


def test_comm_param_typo_suggests_and_names_the_solver_field(model, cli):
    # one process, no distributed flag: the typo is still caught, and blamed on the field
    solver = model.solver('comm_param { comm: "mgwbfp" }\n')
    code, err = cli("train", "--solver", solver)
    assert code == 1
    assert err.splitlines()[-1] == (
        f"mgcaffe train: error: {solver}: comm_param.comm: expected one of wfbp, synceasgd, "
        f"mgwfbp, mgwfbp-paper, threshold, overlap, bytescheduler, dear, got 'mgwbfp'; did "
        f"you mean 'mgwfbp'?")


@pytest.mark.parametrize("command", ["train", "plan", "simulate"])
def test_bucket_sizes_are_in_mib_everywhere(capsys, command):
    """--bucket-mb is MiB (2**20 bytes) in every command that takes it, as the docs say."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    described = text.rsplit("--bucket-mb MIB", 1)[1][:80]  # the option's line, not usage
    assert "in MiB" in described and " MB" not in described


def test_train_help_lists_every_scheme_with_what_it_sends(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for scheme in SCHEMES:
        assert f"{scheme}: " in text
    assert "(default mgwfbp)" in text and "deprecated: --merge paper is --comm=mgwfbp-paper" in text


@pytest.mark.parametrize("command", ["test", "time"])
def test_test_and_time_under_a_launcher_say_each_process_runs_alone(model, cli, monkeypatch,
                                                                  command):
    """`mpiexec -n 2 mgcaffe test` ran two full copies without a word."""
    assert cli("train", "--solver", model.solver(), "--iterations", 1)[0] == 0
    monkeypatch.setenv("PMI_SIZE", "2")  # what mpiexec -n 2 sets in each process
    argv = (["test", "--model", model.net_file, "--weights", model.dir / "snap_iter_1.caffemodel",
             "--iterations", 1] if command == "test" else
            ["time", "--model", model.net_file, "--iterations", 1])
    rc, err = cli(*argv)
    assert rc == 0, err
    lines = [line for line in err.splitlines() if "started 2 processes" in line]
    assert len(lines) == 1 and lines[0].startswith("W")
    assert (f"a PMI launcher (MPICH/Hydra mpiexec, Intel MPI) started 2 processes: each runs "
            f"`mgcaffe {command}` alone on the whole net") in lines[0]
    assert lines[0].endswith(f"run `mgcaffe {command}` without a launcher")
    monkeypatch.delenv("PMI_SIZE")
    rc, err = cli(*argv)
    assert rc == 0 and "started 2 processes" not in err

"""Bad inputs to the commands: output paths checked at start, empty or odd net files, zero
dimensions, weights that miss the net's layers. Each gives one line and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest

# one process plans for an emulated cluster: without one there is no all-reduce to plan for
EMULATED = ("--emulate-network", Path(__file__).resolve().parents[2] / "models" / "paper"
            / "network-10gbe.json", "--emulate-nodes", 8)


def _line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flag", ["--timeline", "--save-plan"])
def test_unwritable_output_path_fails_before_training(model, cli, tmp_path, flag):
    out = tmp_path / "no-such-dir" / "out.json"
    rc, err = cli("train", "--solver", model.solver(), flag, out)
    assert rc == 1
    assert f"{flag} {out}: directory {out.parent} does not exist" in _line(err)
    assert "Iteration" not in err  # refused before the first iteration
    assert not list(tmp_path.glob("snap_iter_*"))


def test_output_path_that_is_a_directory(model, cli, tmp_path):
    rc, err = cli("train", "--solver", model.solver(), "--timeline", tmp_path)
    assert rc == 1 and "is a directory" in _line(err)


def test_save_plan_that_no_run_can_make_is_an_error(model, cli, tmp_path):
    # max_iter 3 < profile_iters 5: the profile (hence the plan) is never complete.
    rc, err = cli("train", "--solver", model.solver(), "--iterations", 3, "--save-plan",
                  tmp_path / "plan.json", *EMULATED)
    assert rc == 1
    assert "the plan is made after profiling 5 iterations, but this run trains 3" in _line(err)
    assert not (tmp_path / "plan.json").exists()


def test_one_process_save_plan_without_a_network_is_an_error(model, cli, tmp_path):
    """One process has no all-reduce: the plan would say a = b = 0 and mislead any cluster
    it were used on."""
    plan = tmp_path / "plan.json"
    rc, err = cli("train", "--solver", model.solver(), "--save-plan", plan)
    assert rc == 1 and "Iteration" not in err
    assert (f"--save-plan {plan}: one process has no all-reduce to plan for (the plan would "
            "say a = b = 0); train under mpiexec -n N, add --emulate-network") in _line(err)
    assert not plan.exists()


@pytest.mark.parametrize("text", ["", 'name: "empty"\n',
                                  'layer { name: "r" type: "ReLU" bottom: "x" top: "x" '
                                  'include { phase: TEST } }\n'])
def test_net_without_layers_is_an_error(model, cli, tmp_path, text):
    net = tmp_path / "empty.prototxt"
    net.write_text(text)
    rc, err = cli("train", "--solver", model.solver(net=str(net)))
    assert rc == 1 and "the net has no layers in the TRAIN phase" in _line(err)
    assert "nothing to train" in err
    rc, err = cli("time", "--model", net, "--iterations", 1)
    assert rc == 1 and "has no layers in the TRAIN phase" in _line(err)
    if text.startswith("layer"):
        return  # a TEST net with layers: `test` needs weights for it
    rc, err = cli("test", "--model", net, "--weights", "w.caffemodel", "--iterations", 1)
    assert rc == 1 and "has no layers in the TEST phase" in _line(err)


def test_fifo_as_model_is_refused(cli, tmp_path):
    import os

    fifo = tmp_path / "net.prototxt"
    os.mkfifo(fifo)
    rc, err = cli("time", "--model", fifo)
    assert rc == 1 and "not a regular file" in _line(err)


@pytest.mark.parametrize("dims, shape", [("dim: 0 dim: 3 dim: 8 dim: 8", "[0, 3, 8, 8]"),
                                         ("dim: 2 dim: 0 dim: 8 dim: 8", "[2, 0, 8, 8]")])
def test_zero_input_dimension_is_named(cli, tmp_path, dims, shape):
    net = tmp_path / "net.prototxt"
    net.write_text(f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ '
                   f'{dims} }} }} }}\n'
                   'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                   'convolution_param { num_output: 4 kernel_size: 3 } }\n')
    rc, err = cli("time", "--model", net, "--iterations", 1)
    line = _line(err)
    assert rc == 1 and "Error:" not in line and "Division" not in line
    assert f"layer 'data' (Input): top 'data' has shape {shape}, with a zero dimension" in line


def test_zero_batch_of_a_data_layer_stops_training(model, cli, tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(open(model.net_file).read().replace("dim: 8 dim: 4", "dim: 0 dim: 4"))
    rc, err = cli("train", "--solver", model.solver(net=str(net)))
    assert rc == 1
    assert "layer 'data' (DummyData): top 'data' has shape [0, 4]" in _line(err)


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_profile_without_compute_time_is_refused(cli, tmp_path, command):
    profile = tmp_path / "p.json"
    profile.write_text('{"model": "m", "forward_time": 0, '
                       '"layers": [{"name": "a", "params": 0, "backward_time": 0}]}')
    rc, err = cli(command, "--profile", profile, "--a", 0, "--b", 0, "--nodes", 4)
    assert rc == 1
    assert "forward_time and every backward_time are 0" in _line(err)


TWO_IP = """name: "two"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 }
    data_filler { type: "gaussian" std: 1 } } }
layer { name: "IP1" type: "InnerProduct" bottom: "data" top: "h"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "IP2" type: "InnerProduct" bottom: "h" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def _weights(model, tmp_path, rename, hdf5=False):
    """A .caffemodel[.h5] of the two-layer net with its layers renamed by `rename`."""
    from mgcaffe.net import Net, weights

    text = TWO_IP
    for old, new in rename.items():
        text = text.replace(f'name: "{old}"', f'name: "{new}"')
    net_file = tmp_path / f"src_{len(rename)}.prototxt"
    net_file.write_text(text)
    path = tmp_path / f"w_{'_'.join(rename.values()) or 'same'}.caffemodel{'.h5' * hdf5}"
    weights.write_weights(Net(str(net_file), 0), str(path),
                          weights.HDF5 if hdf5 else weights.BINARYPROTO)
    return path


@pytest.mark.parametrize("command, hdf5", [("train", False), ("test", False), ("train", True)])
def test_weights_matching_no_layer_are_an_error(model, cli, tmp_path, command, hdf5):
    net = tmp_path / "two.prototxt"
    net.write_text(TWO_IP)
    weights = _weights(model, tmp_path, {"IP1": "fc1", "IP2": "fc2"}, hdf5)
    argv = (["train", "--solver", model.solver(net=str(net))] if command == "train" else
            ["test", "--model", net, "--iterations", 1])
    rc, err = cli(*argv, "--weights", weights)
    assert rc == 1
    line = _line(err)
    assert f"weights {weights}: no layer name matches" in line and "(IP1, IP2)" in line


@pytest.mark.parametrize("hdf5", [False, True])
def test_weights_matching_some_layers_warn_with_the_rest(model, cli, tmp_path, hdf5):
    net = tmp_path / "two.prototxt"
    net.write_text(TWO_IP)
    weights = _weights(model, tmp_path, {"IP2": "fc2"}, hdf5)
    rc, err = cli("train", "--solver", model.solver(net=str(net)), "--weights", weights,
                  "--iterations", 1)
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if "left at their fillers" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        f"] weights {weights} initialise 1 of the 2 layers with parameters; left at their "
        "fillers: IP2")
    rc, err = cli("train", "--solver", model.solver(net=str(net)), "--weights",
                  _weights(model, tmp_path, {}), "--iterations", 1)
    assert rc == 0 and "left at their fillers" not in err


@pytest.mark.parametrize("value", [",,", "", "a.caffemodel,,b.caffemodel", " "])
def test_weights_with_an_empty_name_are_an_error(model, cli, value):
    rc, err = cli("train", "--solver", model.solver(), "--weights", value)
    assert rc == 1 and "an empty file name" in _line(err)
    if value.strip():
        rc, err = cli("test", "--model", model.net_file, "--weights", value)
        assert rc == 1 and "an empty file name" in _line(err)


def test_error_quoting_a_huge_name_stays_short(cli, tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text('layer { name: "data" type: "' + "Q" * 200_000 + '" top: "data" }\n')
    rc, err = cli("time", "--model", net)
    line = _line(err)
    assert rc == 1 and len(line) < 1200 and "characters left out" in line
    assert "layer 'data'" in line


def test_save_plan_of_a_run_that_ends_before_profiling_warns(model, cli, tmp_path):
    """Resumed at 10 of 12: two iterations, fewer than profile_iters (5); known only once
    the state is read, so it is a warning at the end, not an error at start."""
    assert cli("train", "--solver", model.solver())[0] == 0
    plan = tmp_path / "plan.json"
    rc, err = cli("train", "--solver", model.solver(), "--iterations", 12, "--snapshot",
                  model.dir / "snap_iter_10.solverstate", "--save-plan", plan, *EMULATED)
    assert rc == 0, err
    assert (f"--save-plan {plan}: no plan was made (training ended at iteration 12, before "
            "profiling finished); nothing written") in err
    assert not plan.exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_log_directory_that_cannot_be_made_fails_at_start(model, cli, tmp_path, monkeypatch,
                                                          how):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "logs"
    if how == "env":
        monkeypatch.setenv("GLOG_log_dir", str(target))
        rc, err = cli("train", "--solver", model.solver())
    else:
        rc, err = cli("train", "--log_dir", target, "--solver", model.solver())
    name = "--log_dir" if how == "flag" else "GLOG_log_dir"
    assert rc == 1 and f"{name} {target}: {blocker} is not a directory" in _line(err)
    assert "Logging error" not in err and not list(tmp_path.glob("snap_iter_*"))


def test_log_directory_check_accepts_one_to_be_created(tmp_path):
    from mgcaffe.formats.outputs import check_output_directory

    check_output_directory(tmp_path / "new" / "logs", "--log_dir")  # made at the first line
    assert not (tmp_path / "new").exists()  # the check creates nothing


def test_a_snapshot_of_another_net_warns_of_the_layers_left_at_their_fillers(model, cli,
                                                                           tmp_path):
    """--snapshot of a net whose IP2 was named fc2: IP1 resumes, IP2 starts from its filler,
    which --weights says and --snapshot said nothing of."""
    other = tmp_path / "other.prototxt"
    other.write_text(TWO_IP.replace('name: "IP2"', 'name: "fc2"'))
    rc, err = cli("train", "--solver", model.solver(net=str(other), name="other_solver.prototxt",
                                                    prefix=str(tmp_path / "other")),
                  "--iterations", 10)
    assert rc == 0, err
    net = tmp_path / "two.prototxt"
    net.write_text(TWO_IP)
    state = tmp_path / "other_iter_10.solverstate"
    rc, err = cli("train", "--solver", model.solver(net=str(net)), "--snapshot", state,
                  "--iterations", 12)
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if "left at their fillers" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        f"] weights {tmp_path / 'other_iter_10.caffemodel'} (of --snapshot {state}) "
        "initialise 1 of the 2 layers with parameters; left at their fillers: IP2")

"""The GPU engine on the CuPy double, in CI: every layer type forward and backward against the
CPU, every solver, snapshots both ways, `train --gpu 0` on the digits net, and two ranks with
the GPU communication path (NCCL replaced by the double's collectives): `mpiexec -n 2 mgcaffe
train --gpu all --comm S` ends with the weights of one process with the combined batch
(every scheme and solver type in-process: test_double_training.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import cupy_double
import numpy as np
import pytest

from mgcaffe.backend import Device, is_device_array

REPO = Path(__file__).resolve().parents[2]
GPU = Device("gpu", 0)


def load_gpu_check():
    name = "gpu_check"
    if name not in sys.modules:  # dataclasses need the module registered while it executes
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


gc = load_gpu_check()


@pytest.fixture
def double():
    with cupy_double.installed() as d:
        yield d


@pytest.mark.parametrize("case", gc.LAYER_CASES, ids=lambda c: c.id)
def test_layer_on_the_double_matches_the_cpu(case, double, tmp_path):
    if case.files is not None:
        case.files(tmp_path)
    double.counters.reset()
    result = gc.compare_layer(case, double.cupy, tmp_path)
    assert result["status"] == "ok", result
    assert double.counters.launches > 0  # the device path really ran


NET = """name: "tiny"
layer {{ name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param {{ batch_size: 4 channels: 2 height: 5 width: 5 }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 3 kernel_size: 3 pad: 1
    weight_filler {{ type: "gaussian" std: 0.3 }}
    bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param {{ pool: MAX kernel_size: 3 stride: 2 }} }}
layer {{ name: "relu" type: "ReLU" bottom: "pool" top: "pool" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""
SOLVERS = {
    "SGD": "momentum: 0.9",
    "Nesterov": "momentum: 0.9",
    "AdaGrad": "",
    "RMSProp": "rms_decay: 0.9",
    "AdaDelta": "momentum: 0.95 delta: 1e-6",
    "Adam": "momentum: 0.9 momentum2: 0.999 delta: 1e-8",
}


def write_solver(folder: Path, kind: str, extra: str = "") -> str:
    net = folder / "net.prototxt"
    net.write_text(NET.format())
    path = folder / f"{kind}.prototxt"
    path.write_text(f'net: "{net}"\ntype: "{kind}"\nbase_lr: 0.05\nlr_policy: "fixed"\n'
                    f'weight_decay: 0.001\nrandom_seed: 5\nsnapshot_prefix: "{folder / kind}"\n'
                    f'{SOLVERS[kind]}\n{extra}\n')
    return str(path)


def feed(net) -> None:
    rng = np.random.default_rng(3)
    net.layers[0].set_input_arrays(rng.standard_normal((8, 2, 5, 5)).astype(np.float32),
                                   (np.arange(8) % 3).astype(np.float32))


def host_params(solver):
    from mgcaffe.backend import to_host

    return [to_host(b.data).copy() for b in solver.net.learnable_params]


@pytest.mark.parametrize("kind", sorted(SOLVERS))
def test_every_solver_on_the_double_follows_the_cpu(kind, double, tmp_path):
    from mgcaffe.solvers import get_solver

    path = write_solver(tmp_path, kind)
    cpu = get_solver(path, device=Device("cpu"))
    gpu = get_solver(path, device=GPU)
    assert is_device_array(gpu.net.learnable_params[0].data)
    for solver in (cpu, gpu):
        feed(solver.net)
        solver.step(4)
    for want, got in zip(host_params(cpu), host_params(gpu)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_snapshots_move_between_the_double_and_the_cpu(double, tmp_path):
    from mgcaffe.solvers import get_solver

    path = write_solver(tmp_path, "Adam")
    gpu = get_solver(path, device=GPU)
    feed(gpu.net)
    gpu.step(3)
    _, state = gpu.snapshot()
    restored = {}
    for name, device in (("cpu", Device("cpu")), ("gpu", GPU)):
        solver = restored[name] = get_solver(path, device=device)
        feed(solver.net)
        solver.restore(state)  # Adam's history too: both continue alike
        assert solver.iter == 3
        for want, got in zip(host_params(gpu), host_params(solver)):
            np.testing.assert_array_equal(got, want)
        solver.step(2)
    for want, got in zip(host_params(restored["cpu"]), host_params(restored["gpu"])):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits-double")
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_digits.py"), "--out",
                    str(root / "data")], check=True, timeout=120, capture_output=True)
    text = (REPO / "models" / "digits" / "train_test.prototxt").read_text()
    net = root / "net.prototxt"
    net.write_text(text.replace("data/digits/", f"{root}/data/"))

    def solver(max_iter: int, extra: str = "") -> Path:
        path = root / f"solver_{max_iter}_{len(extra)}.prototxt"
        path.write_text(f'net: "{net}"\nbase_lr: 0.05\nmomentum: 0.9\nweight_decay: 0.0005\n'
                        f'lr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 20\n'
                        f'test_iter: 6\ntest_interval: {max_iter}\nmax_iter: {max_iter}\n'
                        f'random_seed: 1701\nsnapshot_prefix: "{root}/snap"\n{extra}')
        return path

    return root, solver


def digits_solver(digits, folder: Path, batch: int, max_iter: int) -> Path:
    """The digits net at `batch` per process, snapshotting its weights into `folder`."""
    root, _ = digits
    net = folder / f"net_b{batch}.prototxt"
    text = (REPO / "models" / "digits" / "train_test.prototxt").read_text()
    net.write_text(text.replace("data/digits/", f"{root}/data/")
                   .replace("batch_size: 64", f"batch_size: {batch}"))
    path = folder / f"solver_b{batch}.prototxt"
    path.write_text(f'net: "{net}"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n'
                    f'lr_policy: "inv"\ngamma: 0.0001\npower: 0.75\ndisplay: 0\n'
                    f'max_iter: {max_iter}\nrandom_seed: 1701\ntype: "SGD"\n'
                    f'snapshot_after_train: true\n'
                    f'snapshot_prefix: "{folder}/snap"\n')
    return path


def caffemodel_weights(path: Path) -> list[np.ndarray]:
    from mgcaffe.proto import caffe_pb2

    model = caffe_pb2.NetParameter()
    model.ParseFromString(path.read_bytes())
    return [np.asarray(b.data, np.float32) for layer in model.layer for b in layer.blobs]


def double_command(counts: Path, *args, devices: int = 1) -> list[str]:
    return [sys.executable, "-m", "cupy_double", "--devices", str(devices),
            "--counts", str(counts), "-m", "mgcaffe", *map(str, args)]


@pytest.mark.slow
def test_train_gpu_0_on_the_digits_net_learns(digits, tmp_path):
    root, solver = digits
    counts = tmp_path / "counts.json"
    proc = subprocess.run(double_command(counts, "train", "--solver", solver(80), "--gpu", 0),
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Using GPUs 0" in proc.stderr
    accuracy = float(proc.stderr.rsplit("accuracy = ", 1)[1].split()[0])
    assert accuracy > 0.8, proc.stderr[-2000:]
    c = json.loads(counts.read_text())
    assert c["contexts"] == [0] and c["launches"] > 1000


@pytest.mark.slow
@pytest.mark.mpi
def test_two_ranks_on_the_gpu_path_with_the_nccl_double(digits, tmp_path):
    from comm_fakes import mpiexec

    root, solver = digits
    counts = tmp_path / "counts{rank}.json"
    proc = subprocess.run([mpiexec(), "-n", "2", *double_command(
        counts, "train", "--solver", solver(12), "--gpu", "all", "--comm", "wfbp",
        devices=2)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Optimization Done." in proc.stderr
    # the cost model is measured where the gradients go: NCCL, on device memory
    assert "measured all-reduce among 2 ranks (nccl)" in proc.stderr
    for rank in (0, 1):
        c = json.loads((tmp_path / f"counts{rank}.json").read_text())
        nccl = [s for s in c["launches_by_stream"] if s.startswith("stream")]
        assert nccl, c["launches_by_stream"]  # the all-reduces ran on a stream of their own
        assert c["contexts"] == [rank], c  # each rank touches its own GPU only


@pytest.fixture(scope="module")
def combined_batch(digits, tmp_path_factory):
    """One GPU process on the double, the two ranks' combined batch of 16: its weights."""
    folder = tmp_path_factory.mktemp("combined")
    proc = subprocess.run(double_command(folder / "counts.json", "train", "--solver",
                                         digits_solver(digits, folder, 16, 6), "--gpu", 0),
                          capture_output=True, text=True, timeout=240, cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return caffemodel_weights(folder / "snap_iter_6.caffemodel")


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("scheme", ["overlap", "dear", "mgwfbp"])
def test_mpiexec_train_gpu_all_matches_one_process_with_the_combined_batch(
        digits, combined_batch, tmp_path, scheme):
    """A scheduled scheme on GPUs: parts of the gradients reduced on NCCL's stream, each
    layer updated on the device right before its next forward."""
    from comm_fakes import given_network, mpiexec

    counts = tmp_path / "counts{rank}.json"
    proc = subprocess.run([mpiexec(), "-n", "2", *double_command(
        counts, "train", "--solver", digits_solver(digits, tmp_path, 8, 6), "--gpu", "all",
        "--comm", scheme, "--network", given_network(tmp_path), "--profile-iters", 2,
        devices=2)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"by plan {scheme}" in proc.stderr  # the closing line: the scheme's plan trained
    got = caffemodel_weights(tmp_path / "snap_iter_6.caffemodel")
    for a, b in zip(got, combined_batch, strict=True):
        assert float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(b).max())
    for rank in (0, 1):
        c = json.loads((tmp_path / f"counts{rank}.json").read_text())
        assert c["contexts"] == [rank]  # each rank touches its own GPU only
        assert any(s.startswith("stream") for s in c["launches_by_stream"])


def test_pycaffe_assignment_of_numpy_arrays_into_device_blobs(double, tmp_path):
    """pycaffe code writes `net.blobs[name].data[...] = numpy_array` everywhere; on the GPU
    that is one copy to the device (CuPy itself refuses it)."""
    import mgcaffe
    from mgcaffe.backend import to_host

    path = tmp_path / "deploy.prototxt"
    path.write_text('input: "data" input_shape { dim: 2 dim: 3 }\n'
                    'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                    'inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }\n')
    net = mgcaffe.Net(str(path), mgcaffe.TEST, device=GPU)
    images = np.arange(6, dtype=np.float32).reshape(2, 3)
    double.counters.reset()
    net.blobs["data"].data[...] = images
    assert double.counters.h2d_bytes == images.nbytes
    net.params["ip"][0].data[...] = np.ones((2, 3), np.float32)
    net.params["ip"][1].diff[...] = np.zeros(2, np.float32)
    out = net.forward()["ip"]
    np.testing.assert_allclose(to_host(out), images.sum(axis=1, keepdims=True).repeat(2, 1))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(net.blobs["ip"].data)  # reading still takes an explicit copy, as in CuPy


def test_label_checks_on_the_gpu_are_read_back_with_the_loss(double, tmp_path):
    """The loss layers' label range checks cost no host wait of their own on the GPU: one
    read per iteration brings the loss and the flags; a bad label is still the same error."""
    from mgcaffe.errors import LayerError
    from mgcaffe.solvers import get_solver

    solver = get_solver(write_solver(tmp_path, "SGD"), device=GPU)
    feed(solver.net)
    solver.net.forward()
    double.counters.reset()
    solver.net.forward()
    assert double.counters.syncs == 1, double.counters.sync_sites
    solver.net.layers[0].set_input_arrays(np.zeros((8, 2, 5, 5), np.float32),
                                          np.full(8, 7, np.float32))
    with pytest.raises(LayerError, match="label 7 is out of range for 3 classes"):
        solver.net.forward()


@pytest.mark.slow
@pytest.mark.mpi
def test_bench_comm_times_nccl_on_device_memory(tmp_path):
    from comm_fakes import mpiexec

    counts, out = tmp_path / "counts{rank}.json", tmp_path / "net.json"
    proc = subprocess.run([mpiexec(), "-n", "2", *double_command(
        counts, "bench-comm", "--comm-backend", "nccl", "--sizes", "4,64K,1M",
        "--iterations", 3, "--out", out, devices=2)], capture_output=True, text=True,
        timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "all-reduce among 2 ranks on 1 host (nccl)" in proc.stderr
    assert json.loads(out.read_text())["fits"]["2"]["b"] > 0
    for rank in (0, 1):
        c = json.loads((tmp_path / f"counts{rank}.json").read_text())
        assert c["contexts"] == [rank]
        nccl = sum(n for s, n in c["launches_by_stream"].items() if s.startswith("stream"))
        assert nccl >= 3 * (2 + 3)  # every warm-up and timed all-reduce, on NCCL's stream


@pytest.mark.slow
@pytest.mark.mpi
def test_solver_mode_gpu_under_a_launcher_gives_each_rank_its_gpu(digits, tmp_path):
    """No --gpu: the solver file's solver_mode: GPU places each rank on its node's GPU."""
    from comm_fakes import given_network, mpiexec

    root, solver = digits
    counts = tmp_path / "counts{rank}.json"
    proc = subprocess.run([mpiexec(), "-n", "2", *double_command(
        counts, "train", "--solver", solver(4, "solver_mode: GPU\n"), "--comm", "wfbp",
        "--network", given_network(tmp_path), devices=2)], capture_output=True, text=True,
        timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"counts{rank}.json").read_text())["contexts"] == [rank]


@pytest.mark.slow
@pytest.mark.mpi
def test_one_gpu_per_rank_bound_by_cuda_visible_devices(digits, tmp_path):
    """A launcher that gives each rank its own GPU (CUDA_VISIBLE_DEVICES per rank, as Slurm's
    --gpus-per-task=1 does): every rank sees one GPU, and train --gpu all uses it."""
    import shlex

    from comm_fakes import given_network, mpiexec

    root, solver = digits
    counts = tmp_path / "counts{rank}.json"
    inner = " ".join(shlex.quote(a) for a in double_command(
        counts, "train", "--solver", solver(4), "--gpu", "all", "--comm", "wfbp", "--network",
        given_network(tmp_path), devices=2))
    proc = subprocess.run([mpiexec(), "-n", "2", "sh", "-c",
                           f"CUDA_VISIBLE_DEVICES=$PMI_RANK exec {inner}"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Optimization Done." in proc.stderr
    for rank in (0, 1):  # each rank's one visible GPU is its ordinal 0
        assert json.loads((tmp_path / f"counts{rank}.json").read_text())["contexts"] == [0]


@pytest.mark.slow
@pytest.mark.mpi
def test_a_gpu_asked_for_and_missing_under_a_launcher_is_an_error(digits, tmp_path):
    from comm_fakes import mpiexec

    from mgcaffe.backend import gpu_available

    if gpu_available():
        pytest.skip("checks a machine without a usable GPU")
    root, solver = digits
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mgcaffe", "train",
                           "--solver", solver(4, "solver_mode: GPU\n")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert "solver_mode: GPU, but no GPU is usable" in proc.stderr
    assert "Traceback" not in proc.stderr

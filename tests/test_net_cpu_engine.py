"""A net's CPU engine (chunk runner, per-layer way, adaptive flag) is its own, passed in.

Two nets in one process with different engines must not affect each other: each layer's
context holds its own net's runner and flag, each net's layer calls go through its own
LayerWay, and one net's one-BLAS-thread calls leave the count the other net finds.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from google.protobuf import text_format

from mgcaffe import TEST
from mgcaffe.cpu.engine import CpuEngine
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.net import Net
from mgcaffe.proto import caffe_pb2
from mgcaffe.solvers import get_solver

NET = """
name: "small" force_backward: true
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 4 dim: 3 dim: 10 dim: 10 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 6 kernel_size: 3
                            weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu" type: "ReLU" bottom: "pool" top: "pool" }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
"""


class CountingRunner(ChunkRunner):
    """A ChunkRunner that counts its runs and the threads that ran chunks."""

    def __init__(self, threads):
        super().__init__(threads, chunk_elements=1, serial_below=0, adaptive=False)
        self.runs = 0
        self.thread_names: set[str] = set()

    def run(self, count, body, grain):
        self.runs += 1

        def recorded(start, stop):
            self.thread_names.add(threading.current_thread().name)
            body(start, stop)
        super().run(count, recorded, grain)


def make_net(cpu=None) -> Net:
    return Net(text_format.Parse(NET, caffe_pb2.NetParameter()), TEST, seed=3, cpu=cpu)


def pass_of(net: Net, seed: int = 0) -> dict:
    """Forward and backward on seeded data; every blob's data and diff, and param diffs."""
    net.clear_param_diffs()
    net.blobs["data"].data[...] = np.random.default_rng(seed).standard_normal((4, 3, 10, 10))
    net.forward()
    net.blobs["ip"].diff[...] = 1.0
    net.backward()
    out = {f"{n}/data": b.data.copy() for n, b in net.blobs.items()}
    out.update({f"{n}/diff": b.diff.copy() for n, b in net.blobs.items()})
    out.update({f"{n}/{i}": p.diff.copy() for n, ps in net.params.items()
                for i, p in enumerate(ps)})
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_every_layer_gets_its_nets_runner_and_flag():
    first, second = CpuEngine(runner=CountingRunner(2)), CpuEngine(1, adaptive=True)
    a, b = make_net(first), make_net(second)
    assert a.cpu is first and b.cpu is second
    assert all(layer.ctx.chunk_runner is first.runner for layer in a.layers)
    assert all(layer.ctx.chunk_runner is second.runner for layer in b.layers)
    assert [layer.ctx.adaptive_blas for layer in a.layers] == [False] * len(a.layers)
    assert [layer.ctx.adaptive_blas for layer in b.layers] == [True] * len(b.layers)


def test_two_nets_with_different_runners_run_on_their_own():
    """Net b, built after net a with a one-thread runner, does not change how a runs:
    a's chunk work still runs on a's two threads, b's on its one."""
    runner_a, runner_b = CountingRunner(2), CountingRunner(1)
    a = make_net(CpuEngine(runner=runner_a))
    b = make_net(CpuEngine(runner=runner_b))
    pass_of(a)
    assert runner_a.runs > 0 and runner_b.runs == 0
    assert len(runner_a.thread_names) == 2  # the caller and a's helper
    runs_a = runner_a.runs
    pass_of(b)
    assert runner_b.runs > 0 and runner_a.runs == runs_a
    assert len(runner_b.thread_names) == 1


def test_two_nets_give_the_bits_each_gives_alone_even_at_the_same_time():
    alone_a = pass_of(make_net(CpuEngine(runner=CountingRunner(2))), seed=1)
    alone_b = pass_of(make_net(CpuEngine(1)), seed=2)
    a = make_net(CpuEngine(runner=CountingRunner(2)))
    b = make_net(CpuEngine(1, adaptive=True))
    results, errors = {}, []

    def run(name, net, seed):
        try:
            for _ in range(3):
                results[name] = pass_of(net, seed)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("a", a, 1)),
               threading.Thread(target=run, args=("b", b, 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert_same(results["a"], alone_a)
    assert_same(results["b"], alone_b)


def test_only_the_adaptive_net_times_its_layer_calls():
    plain, adaptive = make_net(CpuEngine(2)), make_net(CpuEngine(2, adaptive=True))
    pass_of(plain)
    pass_of(adaptive)
    assert plain.cpu.layer_way.threads == 1 and plain.cpu.layer_way._sites == {}
    assert adaptive.cpu.layer_way._sites  # its forward and backward calls, timed


def test_a_net_without_an_engine_gets_its_own_library_default(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    a, b = make_net(), make_net()
    assert a.cpu is not b.cpu and a.cpu.runner is not b.cpu.runner
    assert (a.cpu.threads, a.cpu.adaptive) == (3, False)
    assert repr(a.cpu) == "CpuEngine(threads=3, adaptive=False)"


def test_a_solvers_nets_share_its_engine(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET.replace('name: "small"', 'name: "small"\n'))
    (tmp_path / "solver.prototxt").write_text(
        f'net: "{tmp_path / "net.prototxt"}" base_lr: 0.01 lr_policy: "fixed" max_iter: 1 '
        'test_iter: 1 test_interval: 1000 snapshot_after_train: false')
    engine = CpuEngine(runner=CountingRunner(2))
    solver = get_solver(str(tmp_path / "solver.prototxt"), cpu=engine)
    assert solver.cpu is engine and solver.net.cpu is engine
    assert solver.test_nets and all(net.cpu is engine for net in solver.test_nets)
    assert all(layer.ctx.chunk_runner is engine.runner for layer in solver.net.layers)


@pytest.mark.parametrize("flag, adaptive", [("1", False), ("adaptive", True)])
def test_the_time_command_passes_its_choice_to_the_net(flag, adaptive, repo_root, monkeypatch):
    from mgcaffe.cli import main  # noqa: PLC0415
    from mgcaffe.commands import time as time_command  # noqa: PLC0415

    seen = []
    real = time_command.build_net

    def build_net(args, cpu=None):
        net = real(args, cpu)
        seen.append(net)
        return net

    monkeypatch.setattr(time_command, "build_net", build_net)
    rc = main(["time", "--model", str(repo_root / "models/lenet/lenet.prototxt"),
               "--iterations", "1", "--batch-size", "2", "--threads", flag])
    assert rc == 0
    (net,) = seen
    assert net.cpu.adaptive is adaptive
    if flag == "1":
        assert net.cpu.threads == 1
    assert all(layer.ctx.chunk_runner is net.cpu.runner for layer in net.layers)

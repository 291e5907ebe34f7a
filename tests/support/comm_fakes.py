"""Stand-ins for tests of the communication runtime (as chainer.testing is for Chainer).

A fake net of a few float32 parameter blobs whose backward calls the learnable-layer hook (on
the host, or its blobs on a device of the CuPy double), a plan made of plain name lists, the
kinds of schedule over it, and a helper that runs one function per fake rank in threads; for
training tests, a tiny real net and the solver types with their settings. The MPI test
scripts import them too (tests/support is on their PYTHONPATH).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from mgcaffe.comm.backends.launcher import local_mpiexec
from mgcaffe.comm.model.schedule import Schedule, barrier_schedule, edf_order

# name -> parameter blob shapes, input side first
LAYERS = {"conv1": [(4, 1, 3, 3), (4,)], "conv2": [(6, 4, 3, 3), (6,)],
          "fc1": [(10, 24), (10,)], "fc2": [(3, 10)]}


@dataclass
class FakeBlob:
    """A parameter blob: data and diff arrays."""

    data: np.ndarray
    diff: np.ndarray


@dataclass
class FakeLayer:
    """A learnable layer as Net.learnable_layers lists it."""

    index: int
    name: str
    param_ids: list = field(default_factory=list)


class FakeNet:
    """A few float32 parameter blobs grouped into learnable layers; `backward(hook)` fills the
    diffs with rank-dependent values and calls hook(k) for k = L..1, as Net.forward_backward."""

    def __init__(self, rank=0, layers=LAYERS, seed=0):
        self.rank = rank
        self.learnable_params, self.learnable_layers = [], []
        for i, (name, shapes) in enumerate(layers.items(), start=1):
            ids = []
            for shape in shapes:
                ids.append(len(self.learnable_params))
                self.learnable_params.append(FakeBlob(np.zeros(shape, np.float32),
                                                      np.zeros(shape, np.float32)))
            self.learnable_layers.append(FakeLayer(i, name, ids))
        self.rng = np.random.default_rng(seed * 1000 + rank)
        self.names = list(layers)

    def backward(self, hook=None, before_hook=None):
        for layer in reversed(self.learnable_layers):
            if before_hook is not None:
                before_hook(layer.index)
            for p in layer.param_ids:
                blob = self.learnable_params[p]
                blob.diff[...] = self.rng.standard_normal(blob.diff.shape).astype(np.float32)
            if hook is not None:
                hook(layer.index)

    def diffs(self):
        return [b.diff.copy() for b in self.learnable_params]


def flatten(net, order=None):
    """What Net.flatten_param_diffs does, for a FakeNet: the diffs become consecutive views
    of one buffer, their values kept (default order: learnable layers L..1, each layer's
    blobs in order); the buffer."""
    if order is None:
        order = [p for layer in reversed(net.learnable_layers) for p in layer.param_ids]
    blobs = [net.learnable_params[p] for p in order]
    flat = np.zeros(sum(b.diff.size for b in blobs), np.float32)
    offset = 0
    for b in blobs:
        view = flat[offset:offset + b.diff.size].reshape(b.diff.shape)
        view[...] = b.diff
        b.diff = view
        offset += b.diff.size
    return flat


def rank_gradients(rank: int, iterations: int, seed: int) -> list[list[np.ndarray]]:
    """Rank `rank`'s local gradients, per iteration, per parameter blob of LAYERS (input
    side first), drawn from `seed + rank`."""
    rng = np.random.default_rng(seed + rank)
    return [[rng.standard_normal(s).astype(np.float32) for shapes in LAYERS.values()
             for s in shapes] for _ in range(iterations)]


def device_blobs(cupy, flat: bool, layers=LAYERS):
    """The fake net's blobs on the double's current device (params, learnable layers);
    `flat`: the diffs as consecutive views of one buffer in backward order (what
    Net.flatten_param_diffs lays out), else separate arrays."""
    params, learnable = [], []
    for i, (name, shapes) in enumerate(layers.items(), start=1):
        ids = []
        for shape in shapes:
            ids.append(len(params))
            params.append(FakeBlob(cupy.zeros(shape, np.float32), cupy.zeros(shape, np.float32)))
        learnable.append(FakeLayer(i, name, ids))
    if flat:
        order = [p for layer in reversed(learnable) for p in layer.param_ids]
        buffer = cupy.zeros(sum(params[p].diff.size for p in order), np.float32)
        offset = 0
        for p in order:
            n = params[p].diff.size
            params[p].diff = buffer[offset:offset + n].reshape(params[p].diff.shape)
            offset += n
    return params, learnable


#: Two groups of the fake net (conv1 conv2 fc1 fc2), and every kind of schedule over them.
GROUPS = [["fc2", "fc1"], ["conv2", "conv1"]]
_IDS = [[4, 3], [2, 1]]
SCHEDULES = {
    "barrier": barrier_schedule(2),
    "parts, input side first": Schedule((3, 2), ("allreduce",) * 2,
                                        edf_order(_IDS, [3, 2], ["allreduce"] * 2),
                                        "sequence", 0, "per-layer"),
    "batches": Schedule((3, 2), ("allreduce",) * 2,
                        edf_order(_IDS, [3, 2], ["allreduce"] * 2), "sequence", 0,
                        "per-layer", batches=(2, 1, 2)),
    "reduce-scatter, all-gather": Schedule(
        (1, 2), ("rs-ag", "rs-ag"), ((0, 0, "rs"), (1, 0, "rs"), (1, 1, "rs"), (1, 0, "ag"),
                                     (1, 1, "ag"), (0, 0, "ag")), "sequence", 0, "per-layer"),
}

#: Every solver type, with settings that exercise its history.
SOLVER_TYPES = {
    "SGD": "momentum: 0.9",
    "Nesterov": "momentum: 0.9",
    "AdaGrad": "delta: 1e-6",
    "RMSProp": "rms_decay: 0.95 delta: 1e-6",
    "AdaDelta": "momentum: 0.9 delta: 1e-6",
    "Adam": "momentum: 0.9 momentum2: 0.999 delta: 1e-8",
}


def tiny_net(data_layer: str) -> str:
    """A small net behind `data_layer` (tops "data" of 6 values and "label" of 3 classes):
    a learning-rate and a decay multiplier that differ per blob, a layer with two parameter
    blobs and one with one."""
    return data_layer + """
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
  param { lr_mult: 0.5 decay_mult: 3 }
  inner_product_param { num_output: 4 bias_term: false
                        weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "fc3" type: "InnerProduct" bottom: "fc2" top: "fc3"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc3" bottom: "label" top: "loss" }
"""


def plan(*groups):
    """A plan-like object: `.groups` = the given name lists (communication order)."""
    return SimpleNamespace(groups=[list(g) for g in groups])


def run_ranks(n, fn, timeout=30.0):
    """Run fn(rank) in n threads; return the results, re-raising the first failure."""
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the test's thread
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a fake rank hung"
    return results, errors


def given_network(directory: Path, ranks: int = 2) -> Path:
    """A network file (`--network`) of a fixed a + b*M for `ranks` nodes, written into
    `directory`: for runs whose test is not about the cost model, so that start-up skips the
    all-reduce benchmark and the interference probe (its busiest phase, and on the CuPy
    double, where the probe's GEMMs run on the host, its longest)."""
    path = Path(directory) / f"network_given_{ranks}.json"
    path.write_text(f'{{"fits": {{"{ranks}": {{"a": 1e-5, "b": 1e-9}}}}}}')
    return path


def mpiexec() -> str:
    """The mpiexec the tests launch with (`launcher.local_mpiexec`)."""
    return local_mpiexec()


def run_mpi(n, args, timeout=120.0, env=None, cwd=None):
    """Run `mpiexec -n n python ARGS...`; returns (exit status, stdout+stderr, seconds).

    The hard `timeout` kills the whole launcher group; a hang then fails the test (status None)
    instead of stalling CI."""

    cmd = [mpiexec(), "-n", str(n), sys.executable, *map(str, args)]
    full_env = dict(os.environ, **(env or {}))
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = None
    return status, out, time.perf_counter() - t0

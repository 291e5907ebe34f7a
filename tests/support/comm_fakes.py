"""Stand-ins for tests of the communication runtime (as chainer.testing is for Chainer).

A fake net of a few float32 parameter blobs whose backward calls the learnable-layer hook, a
plan made of plain name lists, and a helper that runs one function per fake rank in threads.
The MPI test scripts import them too (tests/support is on their PYTHONPATH).
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

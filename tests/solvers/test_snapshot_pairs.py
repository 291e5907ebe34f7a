"""A snapshot is a whole pair: a child killed (SIGKILL) at each point of the commit leaves
both files or neither once the next start has tidied; one training per snapshot prefix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mgcaffe.errors import ParseError, SolverError
from mgcaffe.formats import protoio
from mgcaffe.solvers import snapshot as snap

SGD = "type: 'SGD'\nbase_lr: 0.1\nlr_policy: 'fixed'\nmax_iter: 5\n"

# The child builds the tiny solver, trains one iteration and snapshots; FAULT kills it.
CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from mgcaffe.solvers import get_solver
    solver = get_solver(sys.argv[1])
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3, 1, 1)
    solver.net.layers[0].set_input_arrays(x, (np.arange(8) % 2).astype(np.float32))
    solver.step(1)
    np.save(sys.argv[2], solver.net.learnable_params[0].data)
    if len(sys.argv) > 3:
        print("ready", flush=True)
        sys.stdin.read()
    else:
        solver.snapshot()
""")


def _child(solver_file, weights_out, fault="", hold=False):
    env = dict(os.environ)
    env.pop(snap.FAULT_ENV, None)
    if fault:
        env[snap.FAULT_ENV] = fault
    args = [sys.executable, "-c", CHILD, solver_file, str(weights_out)] + (["hold"] if hold
                                                                           else [])
    if hold:
        return subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def _files(directory):
    return sorted(os.listdir(directory))


@pytest.mark.slow
@pytest.mark.parametrize("fault, fmt, committed", [
    ("model-partial", "BINARYPROTO", False),
    ("before-marker", "BINARYPROTO", False),
    ("after-marker", "BINARYPROTO", True),
    ("between-renames", "BINARYPROTO", True),
    ("before-unmark", "BINARYPROTO", True),
    ("between-renames", "HDF5", True),
])
def test_kill_during_snapshot_leaves_both_or_neither(tiny, fault, fmt, committed):
    path = tiny.solver_file(SGD + "momentum: 0.9\n"
                            f"snapshot_format: {fmt}", name="run")
    h5 = ".h5" if fmt == "HDF5" else ""
    model = tiny.dir / f"run_iter_1.caffemodel{h5}"
    state = tiny.dir / f"run_iter_1.solverstate{h5}"
    result = _child(path, tiny.dir / "w.npy", fault)
    assert result.returncode == -signal.SIGKILL, result.stderr
    # The kill left work behind: temporaries, and from the marker on a marker.
    left = _files(tiny.dir)
    assert any(n.endswith(".tmp") for n in left) or not committed or fault == "before-unmark"
    assert (tiny.dir / "run_iter_1.snapshot-pending").exists() == committed
    assert not (model.exists() and not state.exists() and not committed)

    # The next training on the prefix tidies: both files or neither, nothing else.
    again = tiny.solver(SGD + "momentum: 0.9\n"
                        f"snapshot_format: {fmt}", name="run")
    left = _files(tiny.dir)
    assert not [n for n in left if n.endswith(".tmp") or n.endswith(".snapshot-pending")], left
    assert model.exists() == committed and state.exists() == committed, left
    if committed:
        again.restore(str(state))
        assert again.iter == 1
        np.testing.assert_array_equal(again.net.learnable_params[0].data,
                                      np.load(tiny.dir / "w.npy"))
    again.close()


@pytest.mark.slow
def test_resume_finishes_an_interrupted_commit(tiny):
    """`--snapshot X.solverstate` of a pair whose state rename a kill prevented: the resume
    (from another prefix) finishes the commit and reads it."""
    path = tiny.solver_file(SGD, name="run")
    assert _child(path, tiny.dir / "w.npy", "between-renames").returncode == -signal.SIGKILL
    state = tiny.dir / "run_iter_1.solverstate"
    assert not state.exists()
    # Another MPI rank does not touch it: it waits for rank 0 (here: nobody) to finish.
    with pytest.raises(SolverError, match="was not finished by rank 0 in 0.2 s"):
        snap.recover_pair(str(state), writer=False, deadline_s=0.2)
    other = tiny.solver(SGD, name="other")
    other.restore(str(state))
    assert other.iter == 1 and state.exists()
    np.testing.assert_array_equal(other.net.learnable_params[0].data,
                                  np.load(tiny.dir / "w.npy"))


@pytest.mark.slow
def test_second_training_on_a_prefix_is_refused_naming_the_first(tiny):
    path = tiny.solver_file(SGD, name="run")
    first = _child(path, tiny.dir / "w.npy", hold=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        with pytest.raises(SolverError, match=rf"in use by another training \(pid {first.pid} "
                                              r"host \S+, lock .*run\.lock\)"):
            tiny.solver(SGD, name="run")
    finally:
        first.kill()
        first.wait(30)
    # Its lock went with it (SIGKILL): the prefix is free again.
    tiny.solver(SGD, name="run").close()
    assert not (tiny.dir / "run.lock").exists()


def test_lock_is_released_on_close_and_shared_within_a_process(tiny):
    a = tiny.solver(SGD, name="run")
    b = tiny.solver(SGD, name="run")
    lock = tiny.dir / "run.lock"
    assert lock.read_text().startswith(f"pid {os.getpid()} host ")
    a.close()
    assert lock.exists()  # b still holds it
    b.close()
    assert not lock.exists()


def test_snapshot_overwriting_an_older_pair_keeps_a_matching_pair(tiny):
    solver = tiny.solver(SGD + "momentum: 0.9", name="s")
    solver.step(1)
    solver.snapshot()
    solver.iter = 1  # a second snapshot of iteration 1 with other weights
    solver.net.learnable_params[0].data[...] += 1
    model, state = solver.snapshot()
    back = snap.read_state(state)
    assert back.learned_net == model
    weights = protoio.read_caffemodel(model)
    ip = [layer for layer in weights.layer if layer.name == "ip"][0]
    np.testing.assert_array_equal(protoio.blobproto_to_array(ip.blobs[0]),
                                  solver.net.learnable_params[0].data)
    assert not [n for n in _files(tiny.dir) if n.endswith((".tmp", ".snapshot-pending"))]


def test_start_reports_an_orphan_model_and_keeps_it(tiny, caplog):
    orphan = tiny.dir / "run_iter_3.caffemodel"
    orphan.write_bytes(b"old")
    (tiny.dir / ".run_iter_4.caffemodel.abc123.tmp").write_bytes(b"partial")
    tiny.solver(SGD, name="run")
    assert orphan.exists()
    assert not (tiny.dir / ".run_iter_4.caffemodel.abc123.tmp").exists()
    assert "weights without their solver state" in caplog.text and str(orphan) in caplog.text


@pytest.mark.parametrize("fmt", ["BINARYPROTO", "HDF5"])
def test_negative_iteration_is_refused(tmp_path, fmt):
    path = str(tmp_path / ("s.solverstate" + (".h5" if fmt == "HDF5" else "")))
    snap.write_state(path, snap.SolverStateData(iter=-3), getattr(snap, fmt))
    with pytest.raises(ParseError, match=r"s\.solverstate(\.h5)?: iter is -3; .* must be >= 0"):
        snap.read_state(path)


MPI_NET = """layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
    data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


@pytest.mark.slow
@pytest.mark.mpi
def test_under_mpi_only_rank_0_locks_and_a_held_prefix_stops_every_rank(tmp_path):
    from comm_fakes import run_mpi

    from mgcaffe.formats import snapshot_lock

    (tmp_path / "net.prototxt").write_text(MPI_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
                      f'max_iter: 2\nrandom_seed: 1\nsnapshot_prefix: "{tmp_path / "p"}"\n')
    argv = ["-m", "mgcaffe", "train", "--solver", solver, "--comm", "synceasgd"]
    # Both ranks build a solver on one prefix: only rank 0 locks, so neither refuses.
    status, out, _ = run_mpi(2, argv, timeout=120)
    assert status == 0, out[-3000:]
    assert (tmp_path / "p_iter_2.caffemodel").exists() and not (tmp_path / "p.lock").exists()
    before = (tmp_path / "p_iter_2.caffemodel").stat().st_mtime_ns
    # A training elsewhere holds the prefix: rank 0 refuses naming it, every rank stops.
    with snapshot_lock.acquire(str(tmp_path / "p")):
        status, out, _ = run_mpi(2, argv, timeout=120)
    assert status not in (0, None), out[-3000:]
    assert f"is in use by another training (pid {os.getpid()} host" in out, out[-3000:]
    assert (tmp_path / "p_iter_2.caffemodel").stat().st_mtime_ns == before  # untouched

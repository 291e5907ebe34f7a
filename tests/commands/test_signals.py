"""SIGINT/SIGHUP/SIGTERM sent to a child `python -m mgcaffe train` act as --sigint_effect,
--sighup_effect and --sigterm_effect say, at an iteration boundary; a training a signal
stopped exits with 128 + the signal's number (--signal_exit_status), saying which signal
and where the snapshot is."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


def start(model, *flags, extra=""):
    solver = model.solver(extra)
    text = open(solver).read().replace("max_iter: 20", "max_iter: 100000000").replace(
        "display: 5", "display: 0").replace("snapshot: 10", "snapshot: 0")
    open(solver, "w").write(text)
    child = subprocess.Popen([sys.executable, "-m", "mgcaffe", "train", "-solver", solver,
                              *flags], stderr=subprocess.PIPE, text=True, cwd=model.dir)
    seen = []
    for line in child.stderr:  # wait until the loop runs (the handlers are in place)
        seen.append(line)
        if "Learning Rate Policy" in line:
            break
    else:
        child.wait()
        pytest.fail("training did not start:\n" + "".join(seen))
    time.sleep(0.3)
    return child


def finish(child, timeout=30):
    try:
        _, rest = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("the child did not stop")
    return child.returncode, rest


def snapshots(model):
    return sorted(int(m.group(1)) for p in model.dir.glob("snap_iter_*.caffemodel")
                  if (m := re.search(r"_iter_(\d+)\.", p.name)))


def test_sigint_stops_with_snapshot(model):
    child = start(model)
    child.send_signal(signal.SIGINT)
    rc, log = finish(child)
    assert rc == 130, log  # a stop by signal is never 0 (Caffe's was)
    assert "Optimization stopped early." in log
    assert len(snapshots(model)) == 1 and snapshots(model)[0] > 0
    it = snapshots(model)[0]
    assert (model.dir / f"snap_iter_{it}.solverstate").exists()
    assert f"Stopped by SIGINT at iteration {it}; resume with --snapshot " \
           f"{model.dir / f'snap_iter_{it}.solverstate'}; exit status 130" in log, log


@pytest.mark.parametrize("flags, status", [([], 143), (["--signal-exit-status", "0"], 0),
                                           (["--signal_exit_status", "75"], 75)])
def test_sigterm_writes_one_snapshot_and_ends_with_143_unless_asked(model, flags, status):
    # snapshot_after_train false: SIGTERM's snapshot is its own, not Caffe's final one
    child = start(model, *flags, extra="snapshot_after_train: false\n")
    child.send_signal(signal.SIGTERM)
    rc, log = finish(child)
    assert rc == status, log
    assert len(snapshots(model)) == 1, (snapshots(model), log)  # one, not two back to back
    it = snapshots(model)[0]
    state = model.dir / f"snap_iter_{it}.solverstate"
    assert state.exists() and log.count("Snapshotting solver state") == 1, log
    assert f"Stopped by SIGTERM at iteration {it}; resume with --snapshot {state}; " \
           f"exit status {status}" in log, log


def test_sigterm_with_caffes_final_snapshot_still_writes_one(model):
    child = start(model)  # snapshot_after_train: true (Caffe's default)
    child.send_signal(signal.SIGTERM)
    rc, log = finish(child)
    assert rc == 143, log
    assert len(snapshots(model)) == 1 and log.count("Snapshotting solver state") == 1, log


def test_sigterm_with_effect_stop_and_no_snapshot_says_so(model):
    child = start(model, "--sigterm_effect", "stop", extra="snapshot_after_train: false\n")
    child.send_signal(signal.SIGTERM)
    rc, log = finish(child)
    assert rc == 143 and not snapshots(model), log
    assert re.search(r"Stopped by SIGTERM at iteration \d+; no snapshot written", log), log


def test_a_bad_exit_status_flag_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "mgcaffe", "train", "--solver", "s.prototxt",
                           "--signal_exit_status", "300"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "expected 128+N (128 + the signal's number) or a status 0..255, found '300'" in \
        proc.stderr, proc.stderr


def test_sighup_snapshots_and_continues_sigint_none_ignored(model):
    child = start(model, "--sigint_effect", "none", "--sighup-effect", "snapshot")
    child.send_signal(signal.SIGHUP)
    deadline = time.time() + 20
    while not snapshots(model) and time.time() < deadline:
        time.sleep(0.05)
    assert snapshots(model), "SIGHUP took no snapshot"
    child.send_signal(signal.SIGINT)  # ignored: --sigint_effect none
    time.sleep(0.5)
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)
    rc, log = finish(child)
    assert rc == 143, log
    assert os.path.exists(model.dir / f"snap_iter_{snapshots(model)[0]}.solverstate")

"""SIGINT/SIGHUP sent to a child `python -m mgcaffe train` act as --sigint_effect and
--sighup_effect say, at an iteration boundary, and training exits cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")


def start(model, *flags):
    solver = model.solver()
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
    assert rc == 0, log
    assert "Optimization stopped early." in log
    assert len(snapshots(model)) == 1 and snapshots(model)[0] > 0
    assert (model.dir / f"snap_iter_{snapshots(model)[0]}.solverstate").exists()


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
    finish(child)
    assert os.path.exists(model.dir / f"snap_iter_{snapshots(model)[0]}.solverstate")

"""`mgcaffe train` across two emulated hosts (tools/netns_cluster.py: real TCP over a shaped
1 Gbit/s link, each host on its own CPUs where there are enough): the trainer measures T(M)
at start-up, re-plans after warm-up, and its closing line puts the measured iteration beside
the prediction. Needs root and network namespaces; skips with the reason otherwise.

Only gross misses fail here (a model of another network, a prediction off by 2x): the
0.9-1.1 target is measured side by side in benchmarks, not asserted in a timed test."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from comm_fakes import mpiexec

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "netns_cluster.py"


def _load():
    spec = importlib.util.spec_from_file_location("netns_cluster", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


netns = _load()
WHY = netns.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.timeout(300),
              pytest.mark.skipif(WHY is not None, reason=f"namespace cluster: {WHY}")]

CLOSING = re.compile(r"measured ([\d.]+) ms \(median of (\d+)\), predicted ([\d.]+) ms by "
                     r"plan (\S+)")


def test_closing_line_on_two_shaped_hosts_after_the_re_plan(tmp_path):
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_digits.py"), "--out",
                    str(tmp_path / "data")], check=True, timeout=120, capture_output=True)
    net = tmp_path / "net.prototxt"
    net.write_text((REPO / "models" / "digits" / "train_test.prototxt").read_text()
                   .replace("data/digits/", f"{tmp_path}/data/")
                   .replace("batch_size: 64", "batch_size: 16"))
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.01\nmomentum: 0.9\nlr_policy: "fixed"\n'
                      f'display: 0\nmax_iter: 40\nrandom_seed: 1701\ntype: "SGD"\n'
                      f'snapshot_prefix: "{tmp_path}/snap"\n')
    # 3 profiled, 3 in warm-up, 12 in the re-plan's profile, 6 checking a changed re-plan:
    # an undone re-plan (the check's call on a loaded machine) restarts the closing line's
    # count at iteration 25, leaving 15 of 40 for it
    with netns.Cluster(2, rate="1gbit") as cluster:
        status, out = cluster.run(mpiexec(), ["-n", "2", sys.executable, "-m", "mgcaffe",
                                              "train", "--solver", str(solver), "--comm",
                                              "mgwfbp", "--profile-iters", "3",
                                              "--replan-after", "3"], timeout=240)
    assert status == 0, out
    assert "All-reduce cost T(M) piecewise linear through" in out  # measured at start-up
    assert "Re-planned at iteration" in out
    # the re-plan checked T against the window's real messages (held, or corrected)
    assert re.search(r"All-reduce cost (checked against \d+ message|corrected from the "
                     r"window's messages)", out), out
    found = CLOSING.search(out)
    assert found, out
    measured, count, predicted, scheme = found.groups()
    assert scheme == "mgwfbp" and int(count) >= 5
    assert 0.5 <= float(measured) / float(predicted) <= 2.0, found.group(0)

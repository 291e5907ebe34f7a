"""benchmarks/bench_distributed.py drives the trainer's handle by hand (switches plans,
reads what the re-plan window measured): a short run on the smallest model keeps it working
as the trainer changes. Its timings are not judged here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.timeout(300)]


def test_a_short_run_measures_and_predicts_every_scheme_asked(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_distributed.py"),
                           "--model", "cifar10_quick", "--iters", "2", "--rounds", "1",
                           "--profile-iters", "2", "--schemes", "wfbp", "mgwfbp",
                           "--out", str(out)], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)  # its solvers' snapshot lock: here, not the caller's
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert sorted(results["schemes"]) == ["mgwfbp", "wfbp"]
    for row in results["schemes"].values():
        assert row["measured"] > 0 and row["predicted"] > 0 and len(row["samples"]) == 1
    assert results["start_iter"] > 2  # the start-up profile and the re-plan came first
    assert "speed-up of mgwfbp over wfbp: measured" in proc.stdout

"""The digits demo in a shorter form: real data, the real command, and it must learn."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def digits_workdir(tmp_path_factory, request):
    """A folder laid out like the repo root: models/digits and converted data/digits."""
    root = request.config.rootpath
    work = tmp_path_factory.mktemp("digits")
    shutil.copytree(root / "models" / "digits", work / "models" / "digits")
    (work / "demo-output").mkdir()
    subprocess.run([sys.executable, str(root / "tools" / "convert_digits.py"),
                    "--out", str(work / "data" / "digits")], check=True, timeout=120,
                   capture_output=True)
    return work


@pytest.mark.slow
def test_digits_training_learns_well_above_chance(digits_workdir):
    result = subprocess.run(
        [sys.executable, "-m", "mgcaffe", "train", "--solver", "models/digits/solver.prototxt",
         "--iterations", "200"],
        cwd=digits_workdir, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stderr
    accuracies = [float(a) for a in
                  re.findall(r"Test net output #\d+: accuracy = ([0-9.]+)", log)]
    iterations = [int(i) for i in re.findall(r"Iteration (\d+), Testing net", log)]
    assert iterations[-1] == 200
    # Ten balanced classes: chance is 0.1. A working engine and solver get far past it.
    assert accuracies[-1] > 0.9, log[-3000:]
    losses = [float(x) for x in re.findall(r"Iteration \d+ \(.*\), loss = ([0-9.e+-]+)", log)]
    assert losses[-1] < losses[0] / 3
    assert (digits_workdir / "demo-output" / "digits_iter_200.caffemodel").exists()

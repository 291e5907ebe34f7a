"""`mgcaffe test`: per-batch outputs, their mean, the loss; bad input."""

from __future__ import annotations

import re

import pytest


@pytest.fixture
def weights(model, cli):
    assert cli("train", "--solver", model.solver(), "--iterations", "2")[0] == 0
    return model.dir / "snap_iter_2.caffemodel"


def test_scores_batches_and_mean(model, cli, weights):
    rc, err = cli("test", "-model", model.net_file, "-weights", weights, "-iterations", "3")
    assert rc == 0, err
    assert "Running for 3 iterations." in err
    batches = [float(v) for v in re.findall(r"\] Batch \d, loss = ([\d.e+-]+)\n", err)]
    assert len(batches) == 3 and len(set(batches)) == 3  # DummyData refills each batch
    mean = sum(batches) / 3
    loss = float(re.search(r"\] Loss: ([\d.e+-]+)\n", err).group(1))
    final = re.search(r"\] loss = ([\d.e+-]+) \(\* 1 = ([\d.e+-]+) loss\)\n", err)
    assert loss == pytest.approx(mean, rel=1e-5)
    assert float(final.group(1)) == pytest.approx(mean, rel=1e-5)


def test_needs_weights(model, cli):
    rc, err = cli("test", "--model", model.net_file)
    assert rc == 1 and "need model weights" in err


def test_missing_weights_file(model, cli, tmp_path):
    rc, err = cli("test", "--model", model.net_file, "--weights", tmp_path / "none.caffemodel")
    assert rc == 1 and "none.caffemodel: weights file not found" in err


def test_mismatched_weights(model, cli, weights):
    rc, err = cli("test", "--model", model.write_net("wide.prototxt", out=3),
                  "--weights", weights)
    assert rc == 1 and "layer 'ip'" in err and len(err.strip().splitlines()) >= 1
    assert err.strip().splitlines()[-1].startswith("mgcaffe test: error:")

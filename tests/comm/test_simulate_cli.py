"""`mgcaffe simulate`: table, JSON, Markdown, plots."""

from __future__ import annotations

import json

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.model.planner import SCHEMES

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def inputs(paper_dir):
    return ["--profile", str(paper_dir / "resnet50-k80.json"),
            "--network", str(paper_dir / "network-10gbe.json")]


def test_table(capsys, inputs):
    assert main(["simulate", *inputs, "--nodes", "4", "8", "64"]) == 0
    out = capsys.readouterr().out
    assert "resnet50: 107 learnable layers" in out
    assert "MG-WFBP/SyncEASGD" in out
    lines = [line.split() for line in out.splitlines()]
    assert [row[0] for row in lines if row and row[0].isdigit()] == ["4", "8", "64"]


def test_json(capsys, inputs):
    assert main(["simulate", *inputs, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["nodes"] == [4, 8, 16, 32, 64]  # the default
    assert d["schemes"] == list(SCHEMES)
    p64 = d["points"][-1]
    assert p64["nodes"] == 64
    assert p64["schemes"]["optimal"]["speedup"] == pytest.approx(51.894445086557944, rel=1e-9)
    assert p64["ratios"]["optimal_over_synceasgd"] == pytest.approx(1.47580753598188, rel=1e-9)
    assert p64["above_optimal"]["mgwfbp"] == pytest.approx(0.4758075359818801, rel=1e-9)


def test_markdown(capsys, inputs):
    assert main(["simulate", *inputs, "--nodes", "8", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| N | a (ms) | b (ns/B) | WFBP |")
    assert out[1].startswith("|---:|")
    assert out[2].startswith("| 8 | 0.830 | 3.337 | 5.39 (67.4%) |")


def test_plots(capsys, inputs, tmp_path):
    plot, gantt = tmp_path / "s.png", tmp_path / "g.png"
    assert main(["simulate", *inputs, "--nodes", "4", "8", "--plot", str(plot),
                 "--gantt", "16", str(gantt)]) == 0
    assert "gantt: N = 16: a = 2360.82 us" in capsys.readouterr().out
    assert plot.read_bytes()[:8] == PNG and gantt.read_bytes()[:8] == PNG


@pytest.mark.parametrize("argv, expect", [
    (["--gantt", "x", "g.png"], "--gantt: N must be an integer"),
    (["--gantt", "0", "g.png"], "--gantt: N must be >= 1"),
    (["--json", "--markdown"], "choose one"),
    (["--nodes", "0"], "nodes: must be >= 1"),
    (["--scheme", "wfbp", "nope"], "unknown scheme 'nope'"),
    (["--bucket-mb", "-1"], "--bucket-mb: must be >= 0"),
])
def test_errors(capsys, inputs, argv, expect):
    assert main(["simulate", *inputs, *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mgcaffe simulate: error: ") and expect in err
    assert err.count("\n") == 1

"""`mgcaffe simulate`: table, JSON, Markdown, plots."""

from __future__ import annotations

import json
import re

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.model.schemes import SCHEMES

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def inputs(paper_dir):
    return ["--profile", str(paper_dir / "resnet50-k80.json"),
            "--network", str(paper_dir / "network-10gbe.json")]


def test_table(capsys, inputs):
    assert main(["simulate", *inputs, "--nodes", "4", "8", "64"]) == 0
    out = capsys.readouterr().out
    assert "resnet50: 107 learnable layers" in out
    lines = [line.split() for line in out.splitlines()]
    # one column per registered scheme, named as --comm names it, then the lower bound
    head = next(row for row in lines if row[:1] == ["N"])
    assert head[-len(SCHEMES) - 2:] == [*SCHEMES, "lower", "bound"]
    rows = [row for row in lines if row and row[0].isdigit()]
    assert [row[0] for row in rows] == ["4", "8", "64"] * 2
    # then how many times each merging scheme is faster than the two extremes, per N
    at = lines.index(["how", "many", "times", "faster", "than", "wfbp", "/", "synceasgd:"])
    merging = ["mgwfbp", "mgwfbp-paper", "threshold", "overlap", "bytescheduler", "dear"]
    assert lines[at + 1] == ["N", *merging]
    assert len(rows[3]) == 1 + 3 * len(merging) and rows[3][2::3] == ["/"] * len(merging)
    # no schedule beats the bound: its speed-up is the largest of each row
    for row in rows[:3]:
        speedups = [float(x) for x in row[3::2]]
        assert speedups[-1] == max(speedups)
    # and the flags that train each one
    for s in SCHEMES:
        assert re.search(rf"^  {re.escape(s)} +--comm={re.escape(s)}\b", out, re.M), s
    assert "--comm=threshold --bucket-mb 25 " in out


def test_json(capsys, inputs):
    assert main(["simulate", *inputs, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["nodes"] == [4, 8, 16, 32, 64]  # the default
    assert d["schemes"] == list(SCHEMES)
    p64 = d["points"][-1]
    assert p64["nodes"] == 64
    assert p64["schemes"]["mgwfbp"]["speedup"] == pytest.approx(51.894445086557944, rel=1e-9)
    assert p64["ratios"]["mgwfbp_over_synceasgd"] == pytest.approx(1.47580753598188, rel=1e-9)
    best = min(s["iteration_time"] for s in p64["schemes"].values())
    assert p64["above_best"]["mgwfbp-paper"] == pytest.approx(
        p64["schemes"]["mgwfbp-paper"]["iteration_time"] / best - 1, rel=1e-9)
    assert 0 < p64["lower_bound"] <= best


def test_markdown(capsys, inputs):
    assert main(["simulate", *inputs, "--nodes", "8", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| N | a (ms) | b (ns/B) | " + " | ".join(SCHEMES) + " | lower bound |"
    assert out[1].startswith("|---:|")
    assert out[2].startswith("| 8 | 0.830 | 3.337 | 5.39 (67.4%) |")
    assert out[3:6] == ["", "How many times faster than wfbp / synceasgd:", ""]
    assert out[6] == "| N | mgwfbp | mgwfbp-paper | threshold | overlap | bytescheduler | dear |"
    assert out[8].startswith("| 8 | 1.")


def test_plots(capsys, inputs, tmp_path):
    plot, gantt = tmp_path / "s.png", tmp_path / "g.png"
    assert main(["simulate", *inputs, "--nodes", "4", "8", "--plot", str(plot),
                 "--gantt", "16", str(gantt)]) == 0
    out = capsys.readouterr().out
    # it says what it wrote, and where
    assert f"wrote the scaling plot to {plot}\n" in out
    assert f"wrote the timelines at N = 16 to {gantt} (N = 16: a = 2360.82 us" in out
    assert plot.read_bytes()[:8] == PNG and gantt.read_bytes()[:8] == PNG
    # with --json the output stays JSON; the note goes to stderr
    assert main(["simulate", *inputs, "--nodes", "4", "--json", "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["nodes"] == [4] and f"wrote the scaling plot to {plot}" in err


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

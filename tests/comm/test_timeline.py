"""`mgcaffe timeline`: a trace drawn as a compute and a communication row per rank."""

from __future__ import annotations

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.runtime.timeline_plot import iteration_window, plot_timeline
from mgcaffe.comm.runtime.trace import COMM, COMPUTE, Tracer, merge_traces, save_trace
from mgcaffe.commands.timeline import measured_vs_predicted
from mgcaffe.errors import CommError


def fake_trace(iters=3, ranks=2):
    per_rank = []
    for r in range(ranks):
        tr = Tracer(rank=r)
        tr.set_origin(0.0)
        for it in range(iters):
            tr.iteration = it
            t = it * 0.1
            tr.span("conv1", "forward", COMPUTE, t, t + 0.02)
            tr.span("conv1", "backward", COMPUTE, t + 0.02, t + 0.06)
            tr.span("allreduce g0", "allreduce", COMM, t + 0.04, t + 0.07, group=0, bytes=8)
            tr.span("wait for gradients", "wait", COMPUTE, t + 0.06, t + 0.07)
            tr.span(f"iteration {it}", "iteration", COMPUTE, t, t + 0.08)
        per_rank.append(tr.snapshot())
    return merge_traces(per_rank, {"scheme": "wfbp", "predicted_iteration_s": 0.075})


def test_window_defaults_to_the_last_iterations():
    doc = fake_trace(iters=5)
    assert iteration_window(doc) == (4, 4)
    assert iteration_window(doc, count=2) == (3, 4)
    assert iteration_window(doc, 1, 2) == (1, 2)
    with pytest.raises(CommError, match="iteration 9 is not in the trace"):
        iteration_window(doc, 9)


def test_plot_writes_an_image(tmp_path):
    out = plot_timeline(fake_trace(), tmp_path / "t.png", count=2)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_measured_beside_predicted():
    lines = measured_vs_predicted(fake_trace(iters=4))
    assert lines[0].startswith("rank 0: iteration 80.00 ms (median of 3), predicted 75.00 ms")
    assert "+6.7%" in lines[0] and lines[1].startswith("rank 1:")


def test_command(tmp_path, caplog):
    save_trace(fake_trace(), tmp_path / "trace.json")
    rc = main(["timeline", str(tmp_path / "trace.json"), "--out", str(tmp_path / "tl.png")])
    assert rc == 0 and (tmp_path / "tl.png").stat().st_size > 5000


def test_command_on_a_file_that_is_not_a_trace(tmp_path, capsys):
    (tmp_path / "x.json").write_text("[1, 2")
    assert main(["timeline", str(tmp_path / "x.json")]) == 1
    assert "not a JSON trace" in capsys.readouterr().err

"""`mgcaffe timeline`: a trace drawn as a compute and a communication row per rank."""

from __future__ import annotations

import pytest

from mgcaffe.cli import main
from mgcaffe.comm.model.cost import CostModel
from mgcaffe.comm.model.profile import LayerProfile, Profile
from mgcaffe.comm.model.schemes import make_plan
from mgcaffe.comm.runtime.timeline_plot import (
    iteration_window,
    plot_timeline,
    scheme_of,
    timeline_figure,
    typical_iteration,
)
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


def planned_trace():
    """Rank 0 and 1: iterations 0-1 profile (one message of every layer), 2-8 run the plan
    (two groups) with durations 50, 90, 60, 70, 80, 200 (the last: end-of-run work) ms."""
    plan = make_plan(Profile("toy", 1, 4, 0.01, (LayerProfile("conv1", 10, 0.01),
                                                  LayerProfile("fc", 20, 0.01))),
                     CostModel(1e-3, 1e-9), "wfbp")
    durations = {0: 0.3, 1: 0.1, 2: 0.05, 3: 0.09, 4: 0.06, 5: 0.07, 6: 0.08, 7: 0.2}
    per_rank = []
    for r in range(2):
        tr = Tracer(rank=r)
        tr.set_origin(0.0)
        t = 0.0
        for it, d in durations.items():
            tr.iteration = it
            tr.span("conv1", "forward", COMPUTE, t, t + 0.01)
            tr.span("conv1", "backward", COMPUTE, t + 0.01, t + 0.02)
            groups = [["fc", "conv1"]] if it < 2 else [["fc"], ["conv1"]]
            for g, layers in enumerate(groups):
                tr.span(f"allreduce g{g}", "allreduce", COMM, t + 0.02, t + 0.03, group=g,
                        layers=layers, bytes=8)
            tr.span(f"iteration {it}", "iteration", COMPUTE, t, t + d)
            t += d
        per_rank.append(tr.snapshot())
    return merge_traces(per_rank, {"scheme": "mgwfbp", "plan": plan.to_dict(),
                                   "predicted_iteration_s": 0.075})


def test_the_default_is_a_typical_iteration_of_the_final_plan():
    """Neither the first (profiling) nor the last (end-of-run work): the median iteration
    among those that all-reduced the plan's groups."""
    doc = planned_trace()
    it, why = typical_iteration(doc)
    assert it == 5 and why == "median of 6 iterations of the final plan, 70.00 ms"
    assert iteration_window(doc) == (5, 5) and iteration_window(doc, count=2) == (5, 6)
    assert iteration_window(doc, 1, 2) == (1, 2)
    # without a plan: every traced iteration but the first
    doc["metadata"].pop("plan")
    assert typical_iteration(doc) == (6, "median of 7 traced iterations, 80.00 ms")
    with pytest.raises(CommError, match=r"iteration 9 is not in the trace \(it holds 0\.\.7\)"):
        iteration_window(doc, 9)


def test_bars_carry_layer_names_and_the_legend_covers_none(tmp_path):
    doc = planned_trace()
    fig, shown = timeline_figure(doc)
    try:
        ax = shown["axes"]
        texts = {t.get_text() for t in ax.texts}
        assert {"fc", "conv1"} <= texts  # the all-reduces and the compute bars, by layer
        assert ax.get_title().startswith("wfbp: iteration 5 (median of 6 iterations")
        fig.canvas.draw()
        legend = shown["legend"].get_window_extent()
        axes = ax.get_window_extent()
        assert legend.y1 <= axes.y0  # below the plot: no bar hidden
        labels = [t.get_text() for t in shown["legend"].get_texts()]
        assert labels[:3] == ["forward (a layer)", "backward (a layer)",
                              "all-reduce (its layers)"] and "end of backward" in labels
    finally:
        fig.clf()


def test_old_traces_name_their_scheme_by_today_s_name():
    doc = planned_trace()
    doc["metadata"]["plan"].update(format="mgcaffe-plan/1", scheme="optimal")
    assert scheme_of(doc) == "mgwfbp"
    assert scheme_of({"metadata": {"scheme": "wfbp"}}) == "wfbp"


def test_plot_writes_an_image(tmp_path):
    out = plot_timeline(fake_trace(), tmp_path / "t.png", count=2)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_measured_beside_predicted():
    lines = measured_vs_predicted(fake_trace(iters=4))
    assert lines[0].startswith("rank 0: iteration 80.00 ms (median of 3), predicted 75.00 ms")
    assert "+6.7%" in lines[0] and lines[1].startswith("rank 1:")


def test_command(tmp_path, capsys):
    save_trace(planned_trace(), tmp_path / "trace.json")
    rc = main(["timeline", str(tmp_path / "trace.json"), "--out", str(tmp_path / "tl.png")])
    assert rc == 0 and (tmp_path / "tl.png").stat().st_size > 5000
    assert (f"Drew iteration 5 of wfbp (median of 6 iterations of the final plan, 70.00 ms) "
            f"to {tmp_path / 'tl.png'}") in capsys.readouterr().err


def test_command_on_a_file_that_is_not_a_trace(tmp_path, capsys):
    (tmp_path / "x.json").write_text("[1, 2")
    assert main(["timeline", str(tmp_path / "x.json")]) == 1
    assert "not a JSON trace" in capsys.readouterr().err

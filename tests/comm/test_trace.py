"""Traces: events, merging, reading back; per-layer timing of a net; the online profile."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from mgcaffe.comm.runtime.timing import NetTimer, OnlineProfile
from mgcaffe.comm.runtime.trace import (
    COMM,
    COMPUTE,
    DEFAULT_LAST,
    Tracer,
    TraceWindow,
    iteration_times,
    load_trace,
    merge_traces,
    save_trace,
)
from mgcaffe.errors import CommError


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_events_are_relative_to_the_origin_in_microseconds():
    clock = Clock()
    tr = Tracer(rank=3, clock=clock)
    tr.set_origin(100.0)
    tr.iteration = 7
    tr.span("conv1", "forward", COMPUTE, 100.5, 100.75, extra=1)
    tr.instant("conv1", "grad", COMPUTE, 101.0)
    tr.span("allreduce g0", "allreduce", COMM, 101.0, 101.002, bytes=64)
    x, i, c = tr.events
    assert (x["ph"], x["pid"], x["tid"], x["ts"], x["dur"]) == ("X", 3, 0, 500000.0, 250000.0)
    assert x["args"] == {"iter": 7, "extra": 1}
    assert (i["ph"], i["ts"]) == ("i", 1e6)
    assert c["tid"] == 1 and c["args"]["bytes"] == 64


def _run(tracer, iterations):
    for it in range(iterations):
        tracer.iteration = it
        tracer.span("fc", "forward", COMPUTE, it, it + 0.1)
        tracer.instant("fc", "grad", COMPUTE, it + 0.2)


def test_a_trace_keeps_the_last_iterations_by_default():
    """A long run's trace stays bounded: the last DEFAULT_LAST iterations (the final plan's),
    each with all its events."""
    tr = Tracer(clock=Clock())
    _run(tr, DEFAULT_LAST + 50)
    assert tr.kept_iterations() == list(range(50, DEFAULT_LAST + 50))
    assert len(tr.events) == 2 * DEFAULT_LAST
    assert tr.events[0]["args"]["iter"] == 50
    assert TraceWindow().describe() == f"the last {DEFAULT_LAST} iterations"


@pytest.mark.parametrize("text, kept, describe", [
    ("10:15", [10, 11, 12, 13, 14], "iterations 10..14"),
    ("0:20:5", [0, 5, 10, 15], "iterations 0..19, every 5th"),
    ("195:", [195, 196, 197, 198, 199], "iterations from 195 on"),
    (":3", [0, 1, 2], "iterations 0..2"),
])
def test_a_window_of_iterations(text, kept, describe):
    window = TraceWindow.parse(text)
    tr = Tracer(clock=Clock(), window=window)
    _run(tr, 200)
    assert tr.kept_iterations() == kept and window.describe() == describe
    assert {e["args"]["iter"] for e in tr.events} == set(kept)


@pytest.mark.parametrize("text, message", [
    ("10-20", "--timeline-iters: expected A:B"),
    ("20:10", "--timeline-iters 20:10: the end (10) must be after the start (20)"),
    ("0:10:0", "--timeline-iters 0:10:0: the step must be >= 1"),
])
def test_a_bad_window_is_one_line(text, message):
    with pytest.raises(CommError, match=re.escape(message)):
        TraceWindow.parse(text)


def test_merge_save_load_and_iteration_times(tmp_path):
    ranks = []
    for r in range(2):
        tr = Tracer(rank=r, clock=Clock())
        tr.set_origin(0.0)
        for it in range(3):
            tr.iteration = it
            tr.span(f"iteration {it}", "iteration", COMPUTE, it, it + 0.25 + 0.01 * r)
        ranks.append(tr.snapshot())
    doc = merge_traces(ranks, {"predicted_iteration_s": 0.2})
    path = tmp_path / "t.json"
    save_trace(doc, path)
    back = load_trace(path)
    assert back["metadata"]["predicted_iteration_s"] == 0.2
    names = [e for e in back["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert {(e["pid"], e["args"]["name"]) for e in names} == \
        {(0, "compute"), (0, "comm"), (1, "compute"), (1, "comm")}
    assert iteration_times(back, 1) == pytest.approx([0.26] * 3)
    assert iteration_times(back, 0, skip=1) == pytest.approx([0.25] * 2)


def test_load_trace_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CommError, match="not a JSON trace"):
        load_trace(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"x": 1}))
    with pytest.raises(CommError, match="no traceEvents list"):
        load_trace(tmp_path / "other.json")
    with pytest.raises(CommError, match="missing.json: cannot read"):
        load_trace(tmp_path / "missing.json")


class TinyNet:
    """forward_step/backward_step called through self, as Net does."""

    layer_names = ["data", "fc", "loss"]

    def __init__(self, clock):
        self.clock = clock

    def forward_step(self, i, end):
        self.clock.t += 0.001 * (i + 1)
        return i, 0.0

    def backward_step(self, i, end):
        self.clock.t += 0.002
        return i

    def forward_backward(self):
        for i in range(3):
            self.forward_step(i, 2)
        for i in reversed(range(3)):
            self.backward_step(i, 0)


def test_net_timer_traces_every_layer_and_can_be_removed():
    clock = Clock()
    net = TinyNet(clock)
    tr = Tracer(clock=clock)
    timer = NetTimer(net, tr, clock=clock).install()
    net.forward_backward()
    fw = [(e["name"], round(e["dur"])) for e in tr.events if e["cat"] == "forward"]
    bw = [e["name"] for e in tr.events if e["cat"] == "backward"]
    assert fw == [("data", 1000), ("fc", 2000), ("loss", 3000)]
    assert bw == ["loss", "fc", "data"]
    assert timer.forward_end - timer.forward_start == pytest.approx(0.006)
    timer.remove()
    assert "forward_step" not in net.__dict__
    net.forward_backward()
    assert len(tr.events) == 6


def test_online_profile_is_the_median_of_the_iterations_after_the_first():
    prof = OnlineProfile("m", ["conv1", "fc"], [10, 20], skip=1)
    prof.add(0.0, 5.0, {2: 6.0, 1: 9.0})  # warm-up: ignored
    for extra in (0.0, 0.1, 0.2):
        # forward 0.1 s; fc ready 0.2 s after forward ends; conv1 another 0.3 s (+ noise)
        prof.add(0.0, 0.1, {2: 0.3, 1: 0.6 + extra})
    p = prof.profile()
    assert len(prof) == 3 and p.names == ["conv1", "fc"]
    assert p.forward_time == pytest.approx(0.1)
    assert [layer.backward_time for layer in p.layers] == pytest.approx([0.4, 0.2])
    assert [layer.params for layer in p.layers] == [10, 20]
    assert p.ideal_time == pytest.approx(0.7)
    assert np.isclose(p.backward_time, 0.6)


def test_slowest_profile_takes_the_latest_ready_time_of_each_layer():
    from mgcaffe.comm.model.profile import LayerProfile, Profile  # noqa: PLC0415
    from mgcaffe.comm.runtime.timing import slowest  # noqa: PLC0415

    def prof(tf, tbs):
        return Profile("m", None, 4, tf, tuple(LayerProfile(f"l{i}", 1, t)
                                              for i, t in enumerate(tbs, start=1)))

    # rank 0: forward slow, backward fast; rank 1 the opposite
    p = slowest([prof(0.3, [0.1, 0.1, 0.1]), prof(0.1, [0.3, 0.2, 0.2])])
    # ready(3) = max(0.4, 0.3) = 0.4; ready(2) = max(0.5, 0.5); ready(1) = max(0.6, 0.8)
    assert p.forward_time == pytest.approx(0.3)
    assert [layer.backward_time for layer in p.layers] == pytest.approx([0.3, 0.1, 0.1])
    assert p.ideal_time == pytest.approx(0.8)

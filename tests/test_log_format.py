"""Caffe's log, exactly: rank 0's lines parse with (our copy of) Caffe's parse_log.py regular
expressions and parse_log.sh's awk fields; net set-up and debug_info lines; glog's file
naming and environment switches; progress lines that Caffe's parsers skip."""

from __future__ import annotations

import getpass
import logging
import math
import os
import re
import socket

import numpy as np
import pytest

from mgcaffe import log as mlog
from mgcaffe.data.convert import write_lmdb
from mgcaffe.data.datum import array_to_datum
from mgcaffe.solvers import progress

# tools/extra/parse_log.py (Caffe 1.0), written out again here
REGEX_ITERATION = re.compile(r"Iteration (\d+)")
REGEX_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
REGEX_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
REGEX_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")
GLOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")

BATCH, CROP = 4, 5


def _net_files(tmp_path, debug=False):
    db = tmp_path / "db"
    rng = np.random.default_rng(3)
    write_lmdb(db, (array_to_datum(rng.integers(0, 256, (1, 6, 6), dtype=np.uint8), i % 3)
                    for i in range(12)))
    data = (f'transform_param {{ crop_size: {CROP} scale: 0.004 }} '
            f'data_param {{ source: "{db}" batch_size: {BATCH} }}')
    net = tmp_path / "net.prototxt"
    net.write_text(f"""
layer {{ name: "data" type: "Data" top: "data" top: "label" {data} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.1 }} }} }}
layer {{ name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
  include {{ phase: TEST }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.1\nlr_policy: "fixed"\ndisplay: 2\n'
                      f'max_iter: 6\ntest_iter: 2\ntest_interval: 3\nrandom_seed: 1\n'
                      f'snapshot_after_train: false\ndebug_info: {str(debug).lower()}\n')
    return solver


def _train(solver_path, close=True):
    import mgcaffe  # noqa: PLC0415

    solver = mgcaffe.get_solver(str(solver_path))
    try:
        solver.solve()
    finally:
        if close:
            solver.close()
    return solver


def _awk(line, n):
    return line.split()[n - 1]


def test_every_line_carries_the_glog_prefix(tmp_path, capsys):
    """The solver's and net's parameter dumps, a traceback and a multi-line warning of rank 1:
    every line is a glog line (no continuation lines lost to grep), with the rank's prefix."""
    mlog.configure("INFO", rank=0, world_size=1)
    _train(_net_files(tmp_path))
    log = logging.getLogger("mgcaffe.test")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("first line\nsecond line")
    lines = capsys.readouterr().err.splitlines()
    assert any("Initializing solver from parameters:" in x for x in lines)
    assert any(x.endswith("] base_lr: 0.1") for x in lines)  # a dump line, prefixed
    assert any(x.endswith("] ValueError: boom") for x in lines)
    assert lines and [x for x in lines if not GLOG_LINE.match(x)] == []
    mlog.configure("INFO", rank=1, world_size=2)
    log.warning("table:\n  a 1\n  b 2\n")
    lines = capsys.readouterr().err.splitlines()
    assert [x[GLOG_LINE.match(x).end():] for x in lines] == [
        "[rank 1] table:", "[rank 1]   a 1", "[rank 1]   b 2"]
    mlog.configure("INFO", rank=0, world_size=1)


def test_rank0_of_two_parses_with_caffe_tools(tmp_path, capsys):
    mlog.configure("INFO", rank=0, world_size=2)
    _train(_net_files(tmp_path))
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(GLOG_LINE.match(x) for x in lines if x[:1] in "IWEF" and x[1:2]
                         .isdigit())
    assert not [x for x in lines if "[rank" in x]
    # parse_log.sh: loss after "=", lr in field 9, test outputs in field 11
    losses = [float(x.split("=")[1]) for x in lines if ", loss = " in x]
    rates = [float(_awk(x, 9)) for x in lines if ", lr = " in x]
    accuracy = [float(_awk(x, 11)) for x in lines if "Test net output #0" in x]
    assert len(losses) == 4 and rates == [0.1, 0.1, 0.1] and len(accuracy) == 3
    assert all(0.0 <= a <= 1.0 for a in accuracy)
    # parse_log.py: every "Iteration N" is a real iteration; outputs carry numbers
    iters = {int(m.group(1)) for x in lines if (m := REGEX_ITERATION.search(x))}
    assert iters == {0, 2, 3, 4, 6}
    for x in lines:
        for regex in (REGEX_TRAIN_OUTPUT, REGEX_TEST_OUTPUT):
            if (m := regex.search(x)):
                float(m.group(3))
        if (m := REGEX_LEARNING_RATE.search(x)):
            assert float(m.group(1)) == 0.1
    # the estimate has its own line, which the parsers pass over
    eta = [x for x in lines if "Estimated time left" in x]
    assert eta and not any(REGEX_ITERATION.search(x) or "loss" in x for x in eta)


def test_net_set_up_lines(tmp_path, capsys):
    mlog.configure("INFO")
    _train(_net_files(tmp_path))
    err = capsys.readouterr().err
    for text in ("Creating Layer data", "Setting up ip", "ip <- data", "ip -> ip",
                 f"Top shape: {BATCH} 1 {CROP} {CROP} ({BATCH * CROP * CROP})",
                 f"Top shape: {BATCH} (4)", "    with loss weight 1",
                 "This network produces output loss", "loss needs backward computation.",
                 "data does not need backward computation.", "Network initialization done."):
        assert text in err, text
    # train net tops: data 4x1x5x5, label 4, ip 4x3, loss 1 element: float32 bytes so far
    total = 4 * (BATCH * CROP * CROP + BATCH + BATCH * 3 + 1)
    assert f"Memory required for data: {total}\n" in err


def test_debug_info_lines(tmp_path, capsys):
    mlog.configure("INFO")
    solver = _train(_net_files(tmp_path, debug=True), close=False)
    lines = capsys.readouterr().err.splitlines()
    fwd = [x for x in lines if "]     [Forward] Layer ip, top blob ip data: " in x]
    bwd = [x for x in lines if "    [Backward] Layer ip, bottom blob" in x]
    pdiff = [x for x in lines if "    [Backward] Layer ip, param blob 0 diff: " in x]
    norms = [x for x in lines if "]     [Backward] All net params (data, diff): L1 norm = (" in x]
    # train: display steps 0, 2, 4 only; test nets: 3 passes of 2 batches; data and label
    # need no backward, so no bottom blob lines
    assert len(fwd) == 3 + 6 and not bwd and len(pdiff) == 3 and len(norms) == 3
    assert all(x.startswith("E") for x in norms)  # Caffe logs this one at ERROR
    # the numbers: mean absolute values, computed here from the blobs
    net = solver.net
    net.debug_info = True
    net.forward_backward()
    lines = capsys.readouterr().err.splitlines()
    w, b = net.params["ip"]

    def g(x):
        return f"{float(np.float32(x)):.6g}"

    expected = [
        f"    [Forward] Layer ip, top blob ip data: {g(np.abs(net.blobs['ip'].data).mean())}",
        f"    [Forward] Layer ip, param blob 0 data: {g(np.abs(w.data).mean())}",
        f"    [Forward] Layer ip, param blob 1 data: {g(np.abs(b.data).mean())}",
        f"    [Backward] Layer ip, param blob 1 diff: {g(np.abs(b.diff).mean())}",
        f"    [Backward] Layer loss, bottom blob ip diff: "
        f"{g(np.abs(net.blobs['ip'].diff).mean())}",
    ]
    for text in expected:
        assert any(x.endswith("] " + text) for x in lines), text
    l1 = sum(np.abs(p.data.astype(np.float64)).sum() for p in (w, b))
    l2d = math.sqrt(sum((p.diff.astype(np.float64) ** 2).sum() for p in (w, b)))
    solver.close()
    assert any(f"L1 norm = ({g(l1)}, " in x and x.endswith(f", {g(l2d)})") for x in lines)


def test_other_ranks_keep_a_prefix_and_only_warnings(capsys):
    mlog.configure("INFO", rank=1, world_size=2)
    logger = logging.getLogger("mgcaffe.test")
    logger.info("hidden")
    logger.warning("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err and "] [rank 1] shown" in err


def test_glog_file_naming_and_link(tmp_path, capsys):
    mlog.configure("INFO", log_dir=str(tmp_path), environ={})
    logger = logging.getLogger("mgcaffe.test")
    logger.info("an info line")
    logger.warning("a warning line")
    for handler in logging.getLogger("mgcaffe").handlers:
        handler.flush()
    host, user, pid = socket.gethostname(), getpass.getuser(), os.getpid()
    pattern = re.compile(rf"^mgcaffe\.{re.escape(host)}\.{re.escape(user)}\.log\."
                         rf"(INFO|WARNING)\.\d{{8}}-\d{{6}}\.{pid}$")
    names = sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink())
    assert len(names) == 2 and all(pattern.match(n) for n in names), names
    link = tmp_path / "mgcaffe.INFO"
    assert link.is_symlink() and os.readlink(link) in names
    info = link.read_text()
    assert info.startswith("Log file created at: ")
    assert "an info line" in info and "a warning line" in info
    warning = (tmp_path / "mgcaffe.WARNING").read_text()
    assert "a warning line" in warning and "an info line" not in warning
    assert "an info line" in capsys.readouterr().err  # stderr still gets every line
    mlog.configure("INFO", log_dir="", environ={})  # close the files


def test_one_set_of_files_when_the_rank_becomes_known(tmp_path):
    mlog.configure("INFO", log_dir=str(tmp_path), environ={})  # the command line
    logging.getLogger("mgcaffe.test").info("before MPI")
    mlog.configure("INFO", rank=0, world_size=2, environ={})   # distributed.world()
    logging.getLogger("mgcaffe.test").info("after MPI")
    files = [p for p in tmp_path.iterdir() if not p.is_symlink()]
    assert len(files) == 1
    text = files[0].read_text()
    assert text.count("Log file created at") == 1
    assert "before MPI" in text and "after MPI" in text
    mlog.configure("INFO", log_dir="", environ={})


@pytest.mark.parametrize("env, shown, hidden", [
    ({"GLOG_minloglevel": "1"}, ["warn-line"], ["info-line", "debug-line"]),
    ({"GLOG_minloglevel": "2"}, [], ["info-line", "warn-line"]),
    ({"GLOG_v": "1"}, ["debug-line", "info-line"], []),
    ({}, ["info-line", "warn-line"], ["debug-line"]),
])
def test_glog_environment_switches(capsys, env, shown, hidden):
    mlog.configure("INFO", environ=env)
    logger = logging.getLogger("mgcaffe.test")
    logger.debug("debug-line")
    logger.info("info-line")
    logger.warning("warn-line")
    err = capsys.readouterr().err
    assert all(s in err for s in shown) and not any(h in err for h in hidden)


def test_logtostderr_writes_no_files(tmp_path):
    mlog.configure("INFO", log_dir=str(tmp_path), environ={"GLOG_logtostderr": "1"})
    logging.getLogger("mgcaffe.test").warning("x")
    assert list(tmp_path.iterdir()) == []
    mlog.configure("INFO", log_dir="", environ={})


def test_glog_log_dir_from_environment(tmp_path):
    mlog.configure("INFO", log_dir="", environ={"GLOG_log_dir": str(tmp_path)})
    logging.getLogger("mgcaffe.test").info("x")
    assert (tmp_path / "mgcaffe.INFO").is_symlink()
    mlog.configure("INFO", log_dir="", environ={})


def test_progress_lines():
    assert progress.time_left(100, 10.0) == "Estimated time left: 0:00:10 (100 iterations to go)"
    assert progress.clock(3 * 86400 + 3661) == "3 days, 1:01:01"
    assert not REGEX_ITERATION.search(progress.time_left(5, 1.0))


def test_test_pass_says_it_runs(caplog):
    ticker = progress.Ticker("Test pass (#0)", 50, every_s=0.0)
    with caplog.at_level(logging.INFO, logger="mgcaffe"):
        logging.getLogger("mgcaffe").propagate = True
        ticker.tick(0)
        ticker.tick(10)
    assert [r.getMessage() for r in caplog.records] == ["Test pass (#0): 10 of 50 batches done"]
    assert "Testing net" not in caplog.text  # parse_log.sh times test passes by that text

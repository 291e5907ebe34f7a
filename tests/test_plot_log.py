"""tools/plot_training_log.py on a synthetic Caffe-format log."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

LOG = """\
I1129 13:03:19.100000 1 solver.cpp:218] Iteration 0, Testing net (#0)
I1129 13:03:19.200000 1 solver.cpp:414]     Test net output #0: accuracy = 0.1
I1129 13:03:19.200001 1 solver.cpp:414]     Test net output #1: loss = 2.30259 (* 1 = 2.30259 loss)
I1129 13:03:19.300000 1 solver.cpp:239] Iteration 0 (0 iter/s, 0.2s/100 iters), loss = 2.31
I1129 13:03:19.300001 1 solver.cpp:258]     Train net output #0: loss = 2.31 (* 1 = 2.31 loss)
I1129 13:03:19.300002 1 sgd_solver.cpp:112] Iteration 0, lr = 0.01
I1129 13:03:20.300000 1 solver.cpp:239] Iteration 100 (100 iter/s, 1s/100 iters), loss = 0.5
I1129 13:03:20.300001 1 solver.cpp:258]     Train net output #0: loss = 0.48 (* 1 = 0.48 loss)
I1129 13:03:20.300002 1 sgd_solver.cpp:112] Iteration 100, lr = 1e-03
I1129 13:03:21.000000 1 solver.cpp:218] Iteration 200, Testing net (#0)
I1129 13:03:21.100000 1 solver.cpp:414]     Test net output #0: accuracy = 0.9
I1129 13:03:21.100001 1 solver.cpp:414]     Test net output #1: loss = 0.35 (* 1 = 0.35 loss)
I1129 13:03:21.100002 1 solver.cpp:218] Iteration 200, Testing net (#1)
I1129 13:03:21.100003 1 solver.cpp:414]     Test net output #0: accuracy = 0.85
I1129 13:03:21.200000 1 solver.cpp:313] Iteration 200, loss = 0.3
"""


@pytest.fixture(scope="module")
def tool():
    path = Path(__file__).resolve().parents[1] / "tools" / "plot_training_log.py"
    spec = importlib.util.spec_from_file_location("plot_training_log", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_parse(tool):
    log = tool.parse_log(LOG)
    assert log.train_loss == [(0, 2.31), (100, 0.5), (200, 0.3)]
    assert log.train_outputs == {"loss": [(0, 2.31), (100, 0.48)]}
    assert log.lr == [(0, 0.01), (100, 1e-3)]
    assert log.test_outputs == {"accuracy": [(0, 0.1), (200, 0.9)],
                                "loss": [(0, 2.30259), (200, 0.35)],
                                "accuracy (test net #1)": [(200, 0.85)]}


def test_writes_png(tool, tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text(LOG)
    assert tool.main([str(log)]) == 0
    png = tmp_path / "train.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_log_without_training_lines(tool, tmp_path, capsys):
    log = tmp_path / "empty.log"
    log.write_text("I1129 13:03:19.100000 1 x.cpp:1] hello\n")
    assert tool.main([str(log), "-o", str(tmp_path / "x.png")]) == 1
    assert "no training lines" in capsys.readouterr().err

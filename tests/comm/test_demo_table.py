"""tools/demo.py's table: read from the trainer's own log lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "demo.py"
spec = importlib.util.spec_from_file_location("demo_tool", TOOL)
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)

LOG = """I1201 x distributed.py:1] [rank 0] Using profile of 4 iteration(s)
plan synceasgd (aaaaaaaaaaaa): 1 all-reduce(s) for 3 learnable layers, a = 1 us, b = 1 ns/B
  group 0: 0.300 MB  ip2, ip1, conv1
I1201 x distributed.py:2] [rank 0] Using median profile
plan optimal (0123456789ab): 2 all-reduce(s) for 3 learnable layers, a = 2800.00 us, b = 1 ns/B
  group 0: 0.200 MB  ip2, ip1
  group 1: 0.100 MB  conv1
predicted iteration 5.00 ms (t_f + t_b = 4.00 ms, not overlapped communication 1.00 ms)
I1201 x distributed.py:9] [rank 0] Re-planned at iteration 75: predicted iteration \
5.00 ms (the start-up profile predicted 9.00 ms); plan 0123456789ab changes the start-up \
plan's groups
I1201 x distributed.py:3] [rank 0] iteration (forward start to reduced gradients): \
measured 5.50 ms (median of 480), predicted 5.00 ms by plan optimal (+10.0%); whole \
iteration with the update 5.9 ms
"""


def test_summary_takes_the_last_plan_and_the_timing(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(LOG, encoding="utf-8")
    row = demo.summarise("mgwfbp", path)
    assert row == {"mode": "mgwfbp", "messages": 2, "groups": ["ip2, ip1", "conv1"],
                   "measured": 5.5, "iterations": 480, "predicted": 5.0, "startup": 9.0}
    wfbp = dict(row, mode="wfbp", messages=3, measured=11.0, predicted=10.0, startup=None)
    text = demo.table([wfbp, row])
    assert "ip2+ip1 | conv1" in text
    # 5.5 / 5.0 = 1.10 beside the start-up profile's 9.00 ms; no re-plan: a dash
    assert "mgwfbp            2     5.50ms     5.00ms      1.10     9.00ms" in text
    assert "wfbp              3    11.00ms    10.00ms      1.10          -" in text
    assert "MG-WFBP over wfbp: measured 2.00x, predicted 2.00x" in text


def test_a_log_without_a_plan_is_a_clear_error(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("nothing here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no plan or no timing summary"):
        demo.summarise("wfbp", path)

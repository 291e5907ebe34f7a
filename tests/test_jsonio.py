"""JSON inputs (--profile, --network, --plan, traces): one line for any bad file, no hang."""

from __future__ import annotations

import json
import os
import threading

import pytest

from mgcaffe.cli import main
from mgcaffe.errors import ParseError, PlanError
from mgcaffe.formats import jsonio

GOOD = {"model": "m", "forward_time": 0.01,
        "layers": [{"name": "a", "params": 10, "backward_time": 0.001}]}


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flag", ["--profile", "--network"])
@pytest.mark.parametrize("content, expect", [
    (bytes(range(256)) * 4, "not a UTF-8 text file (byte 128 is 0x80)"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"{\"model\": " + b"9" * 10_000 + b"x}", "invalid JSON"),
    (b"", "invalid JSON"),
])
def test_bad_json_gives_one_line(tmp_path, capsys, flag, content, expect):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    inputs = {"--profile": str(good), "--network": str(good), flag: str(bad)}
    err = _one_line_error(capsys, ["plan", "--profile", inputs["--profile"], "--network",
                                   inputs["--network"], "--nodes", "2"])
    assert f"{bad}: " in err and expect in err, err
    assert len(err) < 300, err  # a 10,000-digit token is quoted as a short excerpt


def test_plan_file_is_read_through_the_same_loader(tmp_path):
    from mgcaffe.comm.model.plan import load_plan

    bad = tmp_path / "plan.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PlanError, match=r"plan\.json: not a UTF-8 text file"):
        load_plan(bad)


def test_fifo_and_devices_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    result = {}

    def read():
        try:
            jsonio.read_json(fifo)
        except ParseError as exc:
            result["error"] = str(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "reading a FIFO with no writer blocked"
    assert "not a regular file" in result["error"]
    with pytest.raises(ParseError, match=r"/dev/zero: not a regular file"):
        jsonio.read_json("/dev/zero")
    with pytest.raises(ParseError, match="is a directory"):
        jsonio.read_json(tmp_path)


def test_size_cap(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(list(range(1000))))
    monkeypatch.setattr(jsonio, "MAX_JSON_BYTES", 100)
    with pytest.raises(ParseError, match=r"big\.json: \d+ bytes, more than the 100"):
        jsonio.read_json(path)

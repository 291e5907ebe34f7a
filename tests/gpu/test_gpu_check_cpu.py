"""tools/gpu_check.py without a GPU: its layer table covers every registered type and each case
runs (numpy standing in for CuPy), the comparison tolerates what it should, the FLOP count,
the targets, the fast failure without a GPU, and the whole script in --dry-run mode."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mgcaffe.backend import CPU, gpu_available

REPO = Path(__file__).resolve().parents[2]


def load_gpu_check():
    name = "gpu_check"
    if name not in sys.modules:  # dataclasses need the module registered while it executes
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


gc = load_gpu_check()


def test_every_registered_layer_type_has_a_case():
    assert gc.missing_layer_cases() == [], "add LAYER_CASES entries in tools/gpu_check.py"


def test_case_ids_are_unique():
    ids = [case.id for case in gc.LAYER_CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", gc.LAYER_CASES, ids=lambda c: c.id)
def test_each_case_builds_and_compares_on_the_cpu(case, tmp_path):
    if case.files is not None:
        case.files(tmp_path)
    result = gc.compare_layer(case, np, tmp_path)
    assert result["status"] == "ok", result
    assert result["worst"] == 0.0  # numpy against numpy: the same bits


@pytest.mark.parametrize("got, ref, within", [
    (np.array([1.0, 2.0]), np.array([1.0, 2.0]), True),
    (np.array([1.0, 2.0001]), np.array([1.0, 2.0]), True),  # 5e-5 relative
    (np.array([1.0, 2.01]), np.array([1.0, 2.0]), False),
    (np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), True),
    (np.array([np.nan, 1.0]), np.array([0.0, 1.0]), False),
    (np.zeros(3), np.zeros(3), True),
])
def test_error_is_in_units_of_the_tolerance(got, ref, within):
    assert (gc._error(got, ref) <= 1) is within


def test_error_of_a_shape_mismatch_is_infinite():
    assert gc._error(np.zeros(2), np.zeros(3)) == float("inf")


def test_conv_ip_flops_of_the_digits_net():
    from mgcaffe.formats.protoio import read_net_param
    from mgcaffe.layer_types.base import TRAIN
    from mgcaffe.net import Net
    from mgcaffe.net.synthetic_data import synthesize_data_layers

    param, _ = synthesize_data_layers(read_net_param(REPO / "models/digits/train_test.prototxt"),
                                      {"data": (4, 1, 8, 8)}, 4, replace_data=True)
    net = Net(param, TRAIN, device=CPU, seed=1)
    flops = {net.layer_names[i]: (f, b) for i, f, b in gc.conv_ip_flops(net)}
    n = 4
    # conv1 (1 -> 20, 3x3 on 8x8): no bottom gradient into the data.
    assert flops["conv1"] == (2 * n * 20 * 64 * 9, 2 * n * 20 * 64 * 9)
    conv2 = 2 * n * 50 * 16 * (20 * 9)
    assert flops["conv2"] == (conv2, 2 * conv2)
    ip1 = 2 * n * 500 * 200
    assert flops["ip1"] == (ip1, 2 * ip1)
    ip2 = 2 * n * 10 * 500
    assert flops["ip2"] == (ip2, 2 * ip2)


def test_targets_from_section_results():
    sections = {
        "timing-googlenet": {"ms_per_iteration": 150.0, "conv_ip_tflops": 30.0},
        "timing-resnet50": {"ms_per_iteration": 90.0, "conv_ip_tflops": 20.0},
        "torch": {"googlenet": {"ms_per_iteration": 100.0}},
        "gemm": {"tflops": 50.0},
    }
    targets = {t["target"]: t for t in gc.evaluate_targets(sections)}
    google = targets["GoogleNet b64 fwd+bwd within 2x of PyTorch"]
    assert google["value"] == pytest.approx(1.5) and google["met"] is True
    assert targets["ResNet-50 b32 fwd+bwd within 2x of PyTorch"]["met"] is None  # no torch
    assert targets["googlenet conv+ip >= 50% of the GEMM rate"]["met"] is True
    assert targets["resnet50 conv+ip >= 50% of the GEMM rate"]["met"] is False


@pytest.mark.skipif(gpu_available(), reason="checks the failure on a machine without a GPU")
def test_without_a_gpu_it_fails_fast_with_a_clear_message(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert gc.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "gpu-check: no usable GPU" in err and "nothing was checked" in err
    assert json.loads(out.read_text())["status"] == "no-gpu"


def test_unknown_section_is_a_usage_error():
    with pytest.raises(SystemExit):
        gc.parse_args(["--sections", "layers,warp-drive"])


def test_a_failing_section_is_recorded_and_the_rest_still_run(tmp_path, monkeypatch):
    def broken(check):
        raise RuntimeError("planted failure")

    monkeypatch.setitem(gc.SECTION_FUNCTIONS, "gemm", broken)
    out = tmp_path / "results.json"
    status = gc.main(["--dry-run", "--in-process", "--sections", "gemm,layers,kernels",
                      "--out", str(out)])
    results = json.loads(out.read_text())
    assert status == 1 and results["status"] == "failed"
    assert results["sections"]["gemm"]["status"] == "failed"
    assert "planted failure" in results["sections"]["gemm"]["summary"]
    assert results["sections"]["layers"]["status"] == "ok"
    assert results["sections"]["kernels"]["status"] == "skipped"


def test_sections_run_in_child_processes(tmp_path):
    out = tmp_path / "results.json"
    assert gc.main(["--dry-run", "--sections", "gemm,nccl", "--out", str(out)]) == 0
    sections = json.loads(out.read_text())["sections"]
    assert sections["gemm"]["status"] == "ok" and sections["gemm"]["n"] == 256
    assert sections["nccl"]["status"] == "skipped"


@pytest.mark.slow
def test_dry_run_of_every_section(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert gc.main(["--dry-run", "--in-process", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    sections = results["sections"]
    assert list(sections) == gc.SECTIONS
    for name in ("gemm", "timing-googlenet", "timing-resnet50", "layers"):
        assert sections[name]["status"] == "ok", (name, sections[name])
    for model in ("googlenet", "resnet50"):
        timing = sections[f"timing-{model}"]
        assert timing["batch"] == gc.DRY_RUN_BATCH
        assert timing["ms_per_iteration"] > 0 and timing["conv_ip_tflops"] > 0
        assert timing["conv_ip_ms"] <= timing["layer_sum_ms"]
    assert sections["digits"]["status"] in ("ok", "skipped")
    if sections["digits"]["status"] == "ok":
        assert sections["digits"]["accuracy"] >= 0.9
    assert len(results["targets"]) == 4
    table = capsys.readouterr().out
    assert "timing-googlenet" in table and "target: GoogleNet b64" in table

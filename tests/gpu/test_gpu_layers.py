"""Every registered layer, forward and backward on the GPU against the CPU (same inputs, same
weights), through the case table and comparison of tools/gpu_check.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


def load_gpu_check():
    name = "gpu_check"
    if name not in sys.modules:  # dataclasses need the module registered while it executes
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


gc = load_gpu_check()


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("case", gc.LAYER_CASES, ids=lambda c: c.id)
def test_layer_on_the_gpu_matches_the_cpu(case, cupy, tmp_path):
    if case.files is not None:
        case.files(tmp_path)
    result = gc.compare_layer(case, cupy, tmp_path)
    assert result["status"] == "ok", result


def test_layer_blobs_live_on_the_gpu(cupy, tmp_path):
    case = next(c for c in gc.LAYER_CASES if c.type == "Convolution")
    layer, bottom, top = gc.build_layer(case, cupy, tmp_path)
    layer.forward(bottom, top)
    assert all(isinstance(b.data, cupy.ndarray) for b in layer.blobs)
    assert isinstance(top[0].data, cupy.ndarray)

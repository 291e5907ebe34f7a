"""Shared pytest setup: GPU tests skip cleanly where CuPy or a GPU is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from mgcaffe.backend import gpu_available  # noqa: PLC0415 - only when GPU tests exist

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU; none present")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def repo_root() -> Path:
    """The repository root (models/, tools/ and docs/ live there)."""
    return REPO_ROOT

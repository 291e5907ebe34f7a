"""Shared pytest setup: GPU tests skip cleanly where CuPy or a GPU is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# The `mgcaffe` commands that tests run (MPI ranks, CLI runs, in this process too) pool and
# normalise with numpy: importing numba and loading the compiled loops cost each process ~1 s
# of CPU, and the loops give the same bits (tests/layer_types/test_pooling_compiled.py,
# test_lrn_compiled.py: within a few ulps for beta 0.75); nets built here directly keep them.
os.environ.setdefault("MGCAFFE_POOLING_LOOPS", "0")
os.environ.setdefault("MGCAFFE_LRN_LOOPS", "0")

# The tests' support code (tests/support: the CuPy double, the fakes of comm_fakes) is not
# part of the package; the processes tests start (`python -m cupy_double ...`, MPI scripts)
# find it on PYTHONPATH as pytest does.
SUPPORT = str(REPO_ROOT / "tests" / "support")
_OTHERS = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SUPPORT]
os.environ["PYTHONPATH"] = os.pathsep.join([SUPPORT, *_OTHERS])


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
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


@pytest.fixture
def untried(monkeypatch):
    """untried(module) -> results: a module of compiled loops (cpu.compiled.loader) as though
    this process had not loaded it yet, so that its next load() imports numba anew (blocked
    or not by the test); `results` collects what each load() gave."""
    from mgcaffe.cpu import compiled  # noqa: PLC0415

    def reset(module):
        fresh = compiled.loader(module._compile, module.load.__doc__)
        results = []

        def load():
            results.append(fresh())
            return results[-1]

        monkeypatch.setattr(module, "load", load)
        return results

    return reset


@pytest.fixture(autouse=True)
def _restore_mgcaffe_logger():
    """CLI tests point the `mgcaffe` logger at pytest's capture stream; put it back afterwards,
    so a background thread logging later never writes to a closed stream."""
    import logging  # noqa: PLC0415

    logger = logging.getLogger("mgcaffe")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]

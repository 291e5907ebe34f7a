"""Fixtures of the planner/simulator tests: the paper's data and random profiles.

The measured data live in the repository (models/paper/, copied from ../shared/paper/ beside
the repository, which CI also provides); tests use the in-repository copy.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mgcaffe.comm.model.profile import LayerProfile, Profile

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "models" / "paper"
SHARED_PAPER = REPO / ".." / "shared" / "paper"


@pytest.fixture(scope="session")
def paper_dir() -> Path:
    return PAPER


@pytest.fixture(scope="session")
def shared_paper_dir() -> Path:
    if not (SHARED_PAPER / "MODEL.md").exists():
        pytest.skip("../shared/paper is not beside the repository")
    return SHARED_PAPER


def random_profile(rng: random.Random, L: int, *, zero_params: bool = False) -> Profile:
    """A profile with sizes spread log-uniformly over 1e2..5e6 parameters (as CNN layers are,
    the paper's Fig. 5a) and backward times over 0.1..20 ms; t_f = t_b / 2."""
    layers = []
    for i in range(L):
        params = int(10 ** rng.uniform(2, 6.7))
        if zero_params and rng.random() < 0.2:
            params = 0
        layers.append(LayerProfile(f"layer{i + 1}", params, rng.uniform(1e-4, 2e-2)))
    tb = sum(layer.backward_time for layer in layers)
    return Profile("random", 32, 4, tb / 2, tuple(layers))


@pytest.fixture
def make_random_profile():
    return random_profile

"""Seeds derived from the net seed, the same in every process: layer and filler generators,
host generators for the data pipeline, and the stream seed every rank shares."""

from __future__ import annotations

import zlib

import numpy as np


def host_rng(seed: int | None, name: str, *extra: int) -> np.random.Generator:
    """A numpy Generator keyed by (seed, name, *extra); unseeded (fresh entropy) if seed is None.

    `name` is hashed with crc32 because Python's str hash is salted per process and would
    make ranks (separate processes) disagree.
    """
    if seed is None:
        return np.random.default_rng()
    key = [int(seed) % (2**63), zlib.crc32(name.encode()), *(int(e) for e in extra)]
    return np.random.default_rng(np.random.SeedSequence(key))


def stream_seed(seed: int | None, world_size: int) -> int | None:
    """The seed for choices every rank must make identically (shuffles, rand_skip).

    Sharding by record index only partitions the data if all ranks see the same record
    stream, so an unseeded distributed run still needs one shared seed: we use 0.
    """
    if seed is None and world_size > 1:
        return 0
    return seed


def stable_hash(text: str) -> int:
    """A process-independent hash of `text` (Python's hash() of str is salted per process,
    and ranks are separate processes): 64-bit FNV-1a."""
    h = 1469598103934665603
    for byte in text.encode():
        h = ((h ^ byte) * 1099511628211) % (2**64)
    return h

"""Compressed gradients in real distributed training (the digits net under mpiexec, 2
ranks): every scheme takes --compress; ranks stay bit-identical and close to one process
with the combined batch; the plan line names the format."""

from __future__ import annotations

import numpy as np
import pytest
from comm_fakes import given_network, run_mpi

from .test_distributed_mpi import (  # noqa: F401 - the fixtures
    COMBINED_BATCH,
    DRIVER,
    digits,
    load_weights,
    reference,
)

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

# every scheme, each with a compressed format (float16 for most, bfloat16 for some)
CASES = [("wfbp", "fp16"), ("synceasgd", "bf16"), ("mgwfbp", "fp16"), ("mgwfbp", "auto"),
         ("mgwfbp-paper", "bf16"), ("threshold", "fp16"), ("overlap", "fp16"),
         ("bytescheduler", "bf16"), ("dear", "fp16")]
WIRE = {"fp16": "float16", "bf16": "bfloat16"}


@pytest.mark.parametrize("scheme, compress", CASES)
def test_every_scheme_trains_compressed(digits, reference, scheme, compress):  # noqa: F811
    root, solver = digits
    out = root / f"c_{scheme}_{compress}"
    network = given_network(root)
    extra = ["--bucket-mb", "0.05"] if scheme in ("threshold", "dear") else []
    status, log, _ = run_mpi(2, [DRIVER, "--solver", solver(COMBINED_BATCH // 2),
                                 "--comm", scheme, "--compress", compress, *extra,
                                 "--profile-iters", 3, "--network", network,
                                 "--dump-weights", out], timeout=240)
    assert status == 0, log
    ranks = [load_weights(out, r) for r in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*ranks))  # bit-identical ranks
    worst = max(float(np.abs(got - want).max()) / float(np.abs(want).max())
                for got, want in zip(ranks[0], reference))
    assert worst <= 2e-3, worst  # 16-bit gradients: close to float32's, not equal
    assert f"--compress={compress}" in log
    if compress in WIRE:
        assert f"wire {WIRE[compress]}" in log, log


def test_mpi_sums_16_bit_payloads_correctly_rounded():
    status, log, _ = run_mpi(2, [DRIVER.parent / "wire_checks.py"], timeout=120)
    assert status == 0, log
    assert "OK rank 0" in log and "OK rank 1" in log

"""Every CUDA kernel variant mgcaffe registers, compiled by NVIDIA's NVRTC as CuPy would.

No GPU is needed: NVRTC (the pinned `nvidia-cuda-nvrtc-cu12` wheel of the dev extra, called
through `cuda-bindings`) compiles to a cubin anywhere. The options are CuPy 14.2.0's for a
RawKernel (read from cupy/_core/core.pyx and cupy/cuda/compiler.py of that release:
`--std=c++17 -ftz=true -arch=sm_XX --device-as-default-execution-space`, see
tests/support/nvrtc_report.py), plus `--ptxas-options=-v` for ptxas' report. Each variant
must compile for sm_70, sm_80 and sm_90 without an error, without a warning other than
NVRTC's notice that sm_70 is deprecated, and without a register spill; docs/gpu.md's table
must be what the compiler reports. The test skips where the library cannot be loaded (say,
macOS, which has no wheel), except under CI (CI=true), which must have it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nvrtc_report as nr
import pytest

REPO = Path(__file__).resolve().parents[2]
TABLE = re.compile(r"<!-- nvrtc-table -->\n(.*?)\n<!-- /nvrtc-table -->", re.S)


@pytest.fixture(scope="module")
def nvrtc():
    try:
        library, _version = nr.load_nvrtc()
    except (ImportError, OSError, RuntimeError) as exc:
        reason = (f"NVRTC cannot be loaded ({type(exc).__name__}: {exc}); `pip install "
                  f"-e '.[dev]'` brings nvidia-cuda-nvrtc-cu12 and cuda-bindings")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must compile the kernels with NVRTC: {reason}")
        pytest.skip(reason)
    return library


@pytest.fixture(scope="module")
def rows(nvrtc):
    return nr.report_rows(nvrtc, nr.all_variants())


def test_every_kernel_variant_is_registered():
    """15 kernels in float32 and float64, the two MAX-pooling kernels also by winner-tag type
    (int8, int16, int32): 42 variants, each launched with 256 threads per block."""
    variants = nr.all_variants()
    names = {v.name for v in variants}
    assert len(names) == 17 and len(variants) == 15 * 2 + 2 * 2 * 3
    assert {str(v.index_dtype) for v in variants if v.name == "mgcaffe_max_pool_forward"} == {
        "int8", "int16", "int32"}
    assert {v.threads for v in variants} == {256}


def test_every_variant_compiles_without_warnings_or_spills(rows):
    found = [problem for variant, by_arch in rows for compiled in by_arch.values()
             for problem in nr.problems(str(variant), compiled)]
    assert not found, "\n".join(found)
    assert all(c.registers and c.registers <= 255 for _, by in rows for c in by.values())


def test_the_table_in_docs_gpu_md_is_what_the_compiler_reports(rows):
    match = TABLE.search((REPO / "docs" / "gpu.md").read_text())
    assert match, "docs/gpu.md lost its <!-- nvrtc-table --> block"
    assert match.group(1) == nr.report_table(rows), (
        "the kernels' registers changed: regenerate the table with "
        "`PYTHONPATH=tests/support python tests/support/nvrtc_report.py`")


PLAIN = r"""
extern "C" __global__ void k(const float* x, float* y, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)blockDim.x * gridDim.x) {
    BODY
  }
}
"""
# 48 values kept live across a loop: more than the 24 registers allowed hold
HEAVY = "\n".join([f"float a{j} = x[i + {j}];" for j in range(48)]
                  + ["for (int r = 0; r < (int)n; ++r) {"]
                  + [f"  a{j} = a{j} * a{(j + 1) % 48} + x[r];" for j in range(48)] + ["}"]
                  + ["y[i] = " + " + ".join(f"a{j}" for j in range(48)) + ";"])


@pytest.mark.parametrize("body, extra, expect", [
    ("y[i] = 2 * x[i];", (), None),
    ("y[i] = 2 * undefined_name;", (), "does not compile"),
    ("int unused = 3; y[i] = x[i];", (), "declared but never referenced"),
    (HEAVY, ("--maxrregcount=24",), "bytes of register spills"),
], ids=["clean", "error", "warning", "spill"])
def test_the_check_catches_planted_errors_warnings_and_spills(nvrtc, body, extra, expect):
    compiled = nr.compile_variant(nvrtc, PLAIN.replace("BODY", body), "k", 80, extra)
    found = nr.problems("planted", compiled)
    if expect is None:
        assert found == [] and compiled.registers > 0
    else:
        assert found and all(expect in f for f in found), found


def test_only_the_sm_70_deprecation_notice_is_allowed(nvrtc):
    compiled = nr.compile_variant(nvrtc, PLAIN.replace("BODY", "y[i] = x[i];"), "k", 70)
    assert compiled.ok and "deprecated" in compiled.log
    assert nr.problems("k", compiled) == []


@pytest.mark.parametrize("arch, registers, shared, threads, expected", [
    # by hand from CUDA's occupancy rules: 256 threads are 8 warps; a warp's registers are
    # allocated in units of 256, from each of 4 sub-partitions of 16384; 64 warps and 32
    # blocks per SM at most; shared memory per block rounded up to 128 B plus 1 KiB reserved
    (80, 32, 0, 256, 1.0),        # 1024 per warp: 16 warps per sub-partition, 64 in all
    (80, 40, 0, 256, 0.75),       # 1280: 12 per sub-partition = 48 warps = 6 blocks
    (80, 64, 0, 256, 0.5),        # 2048: 8 per sub-partition = 32 warps = 4 blocks
    (90, 255, 0, 256, 0.125),     # 8192: 2 per sub-partition = 8 warps = 1 block
    (80, 32, 48 * 1024, 256, 0.375),  # 164 KiB / 49 KiB = 3 blocks = 24 warps
    (90, 32, 48 * 1024, 256, 0.5),    # 228 KiB / 49 KiB = 4 blocks = 32 warps
    (80, 16, 0, 64, 1.0),         # 2 warps a block: 32 blocks = 64 warps
    (80, 16, 0, 32, 0.5),         # 1 warp a block: the 32-block limit binds
])
def test_occupancy_follows_cudas_rules(arch, registers, shared, threads, expected):
    assert nr.occupancy(arch, registers, shared, threads) == expected

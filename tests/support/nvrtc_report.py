"""mgcaffe's CUDA kernels through NVIDIA's runtime compiler, as CuPy compiles a RawKernel.

    from nvrtc_report import all_variants, compile_variant, load_nvrtc, report_table
    python tests/support/nvrtc_report.py       # the table docs/gpu.md shows, in Markdown

NVRTC comes from the `nvidia-cuda-nvrtc-cu12` wheel (the dev extra pins it) and is called
through NVIDIA's binding `cuda.bindings.nvrtc` (the `cuda-bindings` wheel). No GPU is needed:
NVRTC compiles to a cubin on any machine.

The options are those CuPy 14.2.0 passes to NVRTC for `cupy.RawKernel(code, name)` with no
options of its own (cupy/_core/core.pyx `assemble_cupy_compiler_options`,
cupy/cuda/compiler.py `_compile_with_cache_cuda` and `_compile_using_nvrtc_no_warning`):
`--std=c++17`, `-ftz=true`, `-arch=sm_XX` (a cubin for the device's architecture) and
`--device-as-default-execution-space`. CuPy also adds include paths (its headers, its CCCL
copy, the CUDA runtime's headers) which are left out here: mgcaffe's kernels include nothing.
`--ptxas-options=-v` is added so that ptxas reports registers, spills and shared memory.

Occupancy is computed as CUDA's occupancy calculator does (cuda_occupancy.h) from the
registers, the static shared memory and the threads per block the launch helpers use
(mgcaffe/kernels/cuda/launch.py), with each architecture's limits (CUDA C++ Programming
Guide, "Technical Specifications per Compute Capability"), shared memory at its largest
carve-out.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

__all__ = ["ARCHES", "CUPY_OPTIONS", "Compiled", "all_variants", "compile_variant", "load_nvrtc",
           "occupancy", "problems", "report_rows", "report_table"]

#: Options CuPy 14.2.0 gives NVRTC for a RawKernel (the -arch option is added per target).
CUPY_OPTIONS = ("--std=c++17", "-ftz=true", "--device-as-default-execution-space")
#: Architectures compiled: Volta (V100; deprecated by CUDA 12.9, absent from CUDA 13),
#: Ampere (A100) and Hopper (H100, H200).
ARCHES = (70, 80, 90)
#: The one warning allowed: NVRTC 12.9's notice that sm_70 is deprecated.
DEPRECATION = re.compile(r"nvrtc: warning: Architectures prior to '<compute/sm>_75' are "
                         r"deprecated and may be removed in a future release")

_WARNING = re.compile(r"\bwarning\s*[#:]", re.I)  # "warning #177-D:", "ptxas warning :"
#: Per architecture: (max warps per SM, max blocks per SM, registers per SM, shared memory
#: per SM at the largest carve-out, shared memory the system reserves per block).
_LIMITS = {70: (64, 32, 65536, 98304, 0), 80: (64, 32, 65536, 167936, 1024),
           90: (64, 32, 65536, 233472, 1024)}
_REGISTER_UNIT, _SHARED_UNIT, _SUB_PARTITIONS, _WARP = 256, 128, 4, 32


def load_nvrtc():
    """(NVIDIA's NVRTC binding, the library's (major, minor) version), the library loaded;
    raises ImportError or RuntimeError, with the reason, where it cannot be loaded."""
    from cuda.bindings import nvrtc

    result, major, minor = nvrtc.nvrtcVersion()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {result}")
    return nvrtc, (major, minor)


@dataclass(frozen=True)
class Compiled:
    """What NVRTC and ptxas said of one kernel for one architecture."""

    arch: int
    ok: bool
    log: str
    registers: int | None = None
    spill_bytes: int | None = None  # spill stores + spill loads
    stack_bytes: int | None = None
    shared_bytes: int | None = None

    def warnings(self) -> list[str]:
        """The log's warning lines other than the sm_70 deprecation notice."""
        return [line for line in self.log.splitlines()
                if _WARNING.search(line) and not DEPRECATION.search(line)]


def _check(nvrtc, result, what: str) -> None:
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what}: {result[0]}")


def compile_variant(nvrtc, source: str, name: str, arch: int, extra=()) -> Compiled:
    """Compile `source` for sm_`arch` with CuPy's options (and ptxas' report of `name`);
    `extra`: more options (tests plant failures with them)."""
    options = [*CUPY_OPTIONS, f"-arch=sm_{arch}", "--ptxas-options=-v", *extra]
    result, program = nvrtc.nvrtcCreateProgram(source.encode(), b"kern.cu", 0, [], [])
    _check(nvrtc, (result,), "nvrtcCreateProgram")
    try:
        compiled = nvrtc.nvrtcCompileProgram(program, len(options),
                                             [o.encode() for o in options])
        result, size = nvrtc.nvrtcGetProgramLogSize(program)
        _check(nvrtc, (result,), "nvrtcGetProgramLogSize")
        buffer = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(program, buffer), "nvrtcGetProgramLog")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    log = buffer.rstrip(b"\0 ").decode(errors="replace")
    ok = compiled[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    return Compiled(arch, ok, log, **(_ptxas_facts(log, name) if ok else {}))


def _ptxas_facts(log: str, name: str) -> dict:
    """Registers, spills, stack and shared memory of entry `name` from ptxas' -v report."""
    at = log.find(f"Function properties for {name}")
    if at < 0:
        raise RuntimeError(f"ptxas reported no properties for {name}:\n{log}")
    text = log[at:]
    number = lambda pattern: int(m.group(1)) if (m := re.search(pattern, text)) else 0  # noqa: E731
    registers = re.search(r"Used (\d+) registers", text)
    if registers is None:
        raise RuntimeError(f"ptxas reported no register count for {name}:\n{log}")
    return {"registers": int(registers.group(1)),
            "spill_bytes": number(r"(\d+) bytes spill stores") + number(r"(\d+) bytes spill loads"),
            "stack_bytes": number(r"(\d+) bytes stack frame"),
            "shared_bytes": number(r"(\d+) bytes smem")}


def problems(label: str, compiled: Compiled) -> list[str]:
    """Why `compiled` fails the check: an error, a warning other than the sm_70 deprecation
    notice, a register spill (each a line naming `label` and the architecture)."""
    where = f"{label} for sm_{compiled.arch}"
    if not compiled.ok:
        return [f"{where}: does not compile:\n{compiled.log}"]
    found = [f"{where}: {line.strip()}" for line in compiled.warnings()]
    if compiled.spill_bytes:
        found.append(f"{where}: {compiled.spill_bytes} bytes of register spills")
    return found


def occupancy(arch: int, registers: int, shared_bytes: int, threads: int) -> float:
    """Resident warps / the SM's maximum for blocks of `threads` threads, each thread using
    `registers` and each block `shared_bytes` of static shared memory."""
    max_warps, max_blocks, sm_registers, sm_shared, reserved = _LIMITS[arch]
    warps = math.ceil(threads / _WARP)
    by_warps = max_warps // warps
    per_warp = math.ceil(registers * _WARP / _REGISTER_UNIT) * _REGISTER_UNIT
    warps_by_registers = (sm_registers // _SUB_PARTITIONS // per_warp) * _SUB_PARTITIONS
    by_registers = warps_by_registers // warps
    block_shared = math.ceil((shared_bytes + reserved) / _SHARED_UNIT) * _SHARED_UNIT
    by_shared = sm_shared // block_shared if block_shared else max_blocks
    blocks = min(max_blocks, by_warps, by_registers, by_shared)
    return blocks * warps / max_warps


def report_rows(nvrtc, variants) -> list[tuple]:
    """(variant, {arch: Compiled}) for each variant, every architecture compiled."""
    return [(v, {arch: compile_variant(nvrtc, v.source, v.name, arch) for arch in ARCHES})
            for v in variants]


def report_table(rows) -> str:
    """The Markdown table of `report_rows`: registers, spill bytes, shared memory and
    occupancy at the launch's block size, per architecture."""
    head = ["kernel", "dtype", "tag", "block"] + [f"sm_{a}" for a in ARCHES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, by_arch in sorted(rows, key=lambda row: _order(row[0])):
        cells = [f"`{v.name.removeprefix('mgcaffe_')}`", str(v.dtype),
                 "" if v.index_dtype is None else str(v.index_dtype), str(v.threads)]
        for arch in ARCHES:
            c = by_arch[arch]
            if not c.ok:
                cells.append("error")
                continue
            shared = f", {c.shared_bytes} B shared" if c.shared_bytes else ""
            share = 100 * occupancy(arch, c.registers, c.shared_bytes, v.threads)
            cells.append(f"{c.registers} reg, {c.spill_bytes} B spill{shared}, {share:g}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _order(variant) -> tuple:
    return (variant.name, variant.dtype.itemsize,
            0 if variant.index_dtype is None else variant.index_dtype.itemsize)


def all_variants():
    """Every registered kernel variant, every module of mgcaffe.kernels.cuda imported."""
    import importlib
    import pkgutil

    from mgcaffe.kernels import cuda
    from mgcaffe.kernels.cuda import launch

    for info in pkgutil.iter_modules(cuda.__path__):
        importlib.import_module(f"{cuda.__name__}.{info.name}")
    return launch.variants()


if __name__ == "__main__":
    nvrtc, version = load_nvrtc()
    print(f"NVRTC {version[0]}.{version[1]}", file=sys.stderr)
    print(report_table(report_rows(nvrtc, all_variants())))

"""How many threads this process should compute with on the CPU, and why: a pure choice.

Several ranks on one node, or a container with a CPU quota, must not start one thread per
core of the machine each: the threads then outnumber the cores, and every synchronisation
inside a GEMM or between chunk threads waits for a scheduler slice. So the count is

    usable cores  = CPUs in this process's affinity mask, capped by the cgroup CPU quota
                    (v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, rounded down)
    threads       = max(1, usable cores // ranks on this node)

where the node-local rank count comes from the launcher's variables (Open MPI, MPICH/Hydra,
MVAPICH2, Slurm) or, failing those, from the count the caller measured (a shared-memory split
of the MPI world, which `mgcaffe train` passes in). A count the user gave wins: the `--threads`
flag, else OPENBLAS_NUM_THREADS, MKL_NUM_THREADS or OMP_NUM_THREADS (in that order).
`threads.configure` applies the choice to the BLAS; `engine.CpuEngine` sizes a net's runner by it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MgcaffeError

#: The user's thread settings, first found wins (OpenBLAS reads its own variable before OMP's).
USER_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
#: The `--threads` value that lets layers switch the BLAS to one thread when that pays.
ADAPTIVE = "adaptive"
#: Launcher variables holding the number of ranks on this node.
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                        "MV2_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


@dataclass
class ThreadChoice:
    """The thread count chosen for this process and what it was chosen from."""

    threads: int
    reason: str                       # "--threads", "OMP_NUM_THREADS", or "cores / ranks"
    affinity_cpus: int
    cgroup_limit: float | None        # CPUs the cgroup quota allows; None: no quota
    usable_cores: int
    local_ranks: int
    local_ranks_from: str             # the variable, "MPI shared-memory split" or "one process"
    blas: list[str] = field(default_factory=list)  # filled in by `apply`
    #: `--threads adaptive`: a layer call may run on one BLAS thread when that is faster now
    #: (cpu/layer_way.py). Off by default: a GEMM's last bits can depend on its thread
    #: count, and runs (and resumes) must repeat bit for bit unless the user trades that away.
    adaptive: bool = False

    def describe(self) -> str:
        """The one log line."""
        quota = "none" if self.cgroup_limit is None else f"{self.cgroup_limit:g} CPUs"
        origin = (f"set by {self.reason}" if self.reason != "cores / ranks" else
                  f"{self.usable_cores} usable cores / {self.local_ranks} rank(s) on this node "
                  f"({self.local_ranks_from})")
        blas = ", ".join(self.blas) if self.blas else "no BLAS found by threadpoolctl"
        if self.adaptive:
            origin += "; adaptive: one BLAS thread where a layer runs faster so"
        return (f"Threads: {self.threads} for BLAS and chunk work, {origin}; affinity "
                f"{self.affinity_cpus} CPUs, cgroup quota {quota}; BLAS: {blas}")


def _positive_int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a cpuset also narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_v2(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")  # "max 100000" or "150000 100000"
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max" or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]) / int(parts[1]) if int(parts[1]) > 0 else None


def _quota_v1(directory: Path) -> float | None:
    quota = _read(directory / "cpu.cfs_quota_us")
    period = _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _ancestors(root: Path, cgroup_path: str) -> list[Path]:
    """root/path, root/parent, ..., root: a quota on any level caps this process. A path that
    does not exist below root (a container shows the host's path) leaves root alone."""
    parts = [p for p in cgroup_path.strip("/").split("/") if p]
    dirs = [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()] or [root]


def cgroup_cpu_limit(proc_cgroup: str | Path = "/proc/self/cgroup",
                     root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup CPU quota allows this process (the smallest over its cgroup and the
    cgroups above it), or None without a quota. Reads cgroup v2 and v1 hierarchies."""
    root = Path(root)
    text = _read(Path(proc_cgroup)) or ""
    limits = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2 (unified); in a hybrid layout it is mounted at unified/
            for base in (root, root / "unified"):
                if (base / "cgroup.controllers").exists():
                    limits += [_quota_v2(d) for d in _ancestors(base, path)]
                    break
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / name).is_dir():
                    limits += [_quota_v1(d) for d in _ancestors(root / name, path)]
                    break
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _slurm_tasks_on_this_node(environ) -> int | None:
    """This node's entry of SLURM_TASKS_PER_NODE ("2(x3),1": 2, 2, 2, 1) by SLURM_NODEID."""
    text = environ.get("SLURM_TASKS_PER_NODE", "").strip()
    counts = []
    for item in filter(None, text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = _positive_int(environ.get("SLURM_NODEID", "")) or 0
    return counts[node] if node < len(counts) and counts[node] > 0 else None


def local_rank_count(environ=None, node_ranks: Callable[[], int] | None = None
                     ) -> tuple[int, str]:
    """(ranks on this node, where that came from): a launcher variable, else `node_ranks()`
    when given (the caller's shared-memory split of its MPI world: a collective, so every
    rank must pass one or none), else one."""
    env = os.environ if environ is None else environ
    for name in LOCAL_SIZE_VARIABLES:
        value = _positive_int(env.get(name))
        if value:
            return value, name
    slurm = _slurm_tasks_on_this_node(env)
    if slurm and "SLURM_PROCID" in env:
        return slurm, "SLURM_TASKS_PER_NODE"
    if node_ranks is not None:
        return max(1, int(node_ranks())), "MPI shared-memory split"
    return 1, "one process"


def user_setting(flag: int | None = None, environ=None) -> tuple[int, str] | None:
    """(count, where) when the user chose a thread count: the flag, else a variable."""
    if flag is not None:
        return int(flag), "--threads"
    env = os.environ if environ is None else environ
    for name in USER_VARIABLES:
        value = _positive_int(env.get(name))
        if value:
            return value, name
    return None


def choose(flag: int | str | None = None, node_ranks: Callable[[], int] | None = None,
           environ=None, *,
           affinity: int | None = None, proc_cgroup: str | Path = "/proc/self/cgroup",
           cgroup_root: str | Path = "/sys/fs/cgroup") -> ThreadChoice:
    """The thread count for this process (see the module docstring); changes nothing.
    `flag` is `--threads`: a count, "adaptive" (the default count, and ThreadChoice.adaptive)
    or None."""
    adaptive = flag == ADAPTIVE
    if adaptive:
        flag = None
    if flag is not None and int(flag) < 1:
        raise MgcaffeError(f"--threads: expected a count >= 1, found {flag}")
    cpus = affinity_cpus() if affinity is None else int(affinity)
    limit = cgroup_cpu_limit(proc_cgroup, cgroup_root)
    usable = max(1, min(cpus, math.floor(limit) if limit is not None else cpus))
    ranks, ranks_from = local_rank_count(environ, node_ranks)
    chosen = user_setting(flag, environ)
    threads, reason = chosen if chosen else (max(1, usable // ranks), "cores / ranks")
    return ThreadChoice(threads, reason, cpus, limit, usable, ranks, ranks_from,
                        adaptive=adaptive and reason == "cores / ranks")

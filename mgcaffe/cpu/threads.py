"""How many threads this process computes with on the CPU: the BLAS's and the chunk runner's.

Several ranks on one node, or a container with a CPU quota, must not start one thread per
core of the machine each: the threads then outnumber the cores, and every synchronisation
inside a GEMM or between chunk threads waits for a scheduler slice. So the count is

    usable cores  = CPUs in this process's affinity mask, capped by the cgroup CPU quota
                    (v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, rounded down)
    threads       = max(1, usable cores // ranks on this node)

where the node-local rank count comes from the launcher's variables (Open MPI, MPICH/Hydra,
MVAPICH2, Slurm) or, failing those, from a shared-memory split of the MPI world. A count the
user gave wins: the `--threads` flag, else OPENBLAS_NUM_THREADS, MKL_NUM_THREADS or
OMP_NUM_THREADS (in that order). `configure` applies the count to the BLAS (threadpoolctl) and
to `kernels.parallel`'s default runner and logs one line saying what it chose and why.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("mgcaffe.cpu.threads")

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


def local_rank_count(environ=None, comm=None) -> tuple[int, str]:
    """(ranks on this node, where that came from): a launcher variable, else a shared-memory
    split of `comm`'s world when it has several ranks (a collective: every rank must call),
    else one."""
    env = os.environ if environ is None else environ
    for name in LOCAL_SIZE_VARIABLES:
        value = _positive_int(env.get(name))
        if value:
            return value, name
    slurm = _slurm_tasks_on_this_node(env)
    if slurm and "SLURM_PROCID" in env:
        return slurm, "SLURM_TASKS_PER_NODE"
    if comm is not None and getattr(comm, "size", 1) > 1:
        from ..comm.backends.nccl import node_local_rank  # noqa: PLC0415 - MPI is up when size > 1

        return max(1, node_local_rank(comm)[1]), "MPI shared-memory split"
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


def choose(flag: int | str | None = None, comm=None, environ=None, *,
           affinity: int | None = None, proc_cgroup: str | Path = "/proc/self/cgroup",
           cgroup_root: str | Path = "/sys/fs/cgroup") -> ThreadChoice:
    """The thread count for this process (see the module docstring); changes nothing.
    `flag` is `--threads`: a count, "adaptive" (the default count, and ThreadChoice.adaptive)
    or None."""
    adaptive = flag == ADAPTIVE
    if adaptive:
        flag = None
    if flag is not None and int(flag) < 1:
        from ..errors import MgcaffeError  # noqa: PLC0415

        raise MgcaffeError(f"--threads: expected a count >= 1, found {flag}")
    cpus = affinity_cpus() if affinity is None else int(affinity)
    limit = cgroup_cpu_limit(proc_cgroup, cgroup_root)
    usable = max(1, min(cpus, math.floor(limit) if limit is not None else cpus))
    ranks, ranks_from = local_rank_count(environ, comm)
    chosen = user_setting(flag, environ)
    threads, reason = chosen if chosen else (max(1, usable // ranks), "cores / ranks")
    return ThreadChoice(threads, reason, cpus, limit, usable, ranks, ranks_from,
                        adaptive=adaptive and reason == "cores / ranks")


def describe_blas(info: dict) -> str:
    """One BLAS library as the log line names it: library, version, threading, threads and the
    kernel it runs (OpenBLAS's core type; OPENBLAS_CORETYPE can pin an older one)."""
    text = " ".join(str(part) for part in (info.get("internal_api"), info.get("version"),
                                           info.get("threading_layer")) if part)
    text += f" x{info.get('num_threads')}"
    if info.get("architecture"):
        text += f", kernel {info['architecture']}"
        pinned = os.environ.get("OPENBLAS_CORETYPE")
        if pinned and info.get("internal_api") == "openblas":
            text += f" (OPENBLAS_CORETYPE={pinned})"
    return text


def apply(choice: ThreadChoice) -> ThreadChoice:
    """Set the BLAS libraries' threads (threadpoolctl) and the default chunk runner's."""
    from . import parallel  # noqa: PLC0415 - parallel asks this module for its default

    parallel.set_default_threads(choice.threads,
                                 adaptive_blas=choice.adaptive)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a dependency; without it the BLAS keeps its own
        choice.blas = ["threadpoolctl missing: BLAS threads left as they are"]
        return choice
    threadpool_limits(limits=choice.threads, user_api="blas")
    choice.blas = [describe_blas(i) for i in threadpool_info() if i.get("user_api") == "blas"]
    return choice


def configure(flag: int | str | None = None, comm=None) -> ThreadChoice:
    """Choose, apply and log (one INFO line) this process's thread count; call it once at
    start, after the distributed world exists and before any net is built."""
    import numpy  # noqa: F401, PLC0415 - load the BLAS so that threadpoolctl finds it

    choice = apply(choose(flag, comm))
    log.info("%s", choice.describe())
    return choice


def add_argument(parser) -> None:
    """The `--threads N` flag of train, test and time."""
    parser.add_argument("--threads", type=_threads_flag, default=None, metavar="N|adaptive",
                        help="threads for the BLAS and mgcaffe's own CPU work (default: the "
                             "usable cores divided by the ranks on this node, unless "
                             "OPENBLAS_NUM_THREADS/MKL_NUM_THREADS/OMP_NUM_THREADS is set); "
                             "`adaptive`: that count, but each layer runs on one BLAS thread "
                             "when that is faster (steadier on a busy node; results then may "
                             "differ from run to run in the last bits)")


def _threads_flag(text: str) -> int | str:
    import argparse  # noqa: PLC0415

    if text == ADAPTIVE:
        return ADAPTIVE
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count or `{ADAPTIVE}`, found {text!r}") from None

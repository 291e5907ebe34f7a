"""Which launcher started this process, the check that MPI sees the job it started, and the
mpiexec to start a job with.

A launcher of one MPI (a site Open MPI's `mpirun`) starting a program linked to another
(the MPICH wheel from PyPI) gives every process an MPI world of one rank: N copies would
train alone, each writing the same snapshots. The launcher's own variables still say how
many processes it started, so the mismatch is detectable before any training.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ...errors import CommError

__all__ = ["check_world", "launcher_size", "local_mpiexec"]

# (variable holding the job's size, who sets it), in the order they are trusted.
_SIZE_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMIX_SIZE", "a PMIx launcher"),
    ("PMI_SIZE", "a PMI launcher (MPICH/Hydra mpiexec, Intel MPI)"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun_rsh"),
    ("MPI_LOCALNRANKS", "a Hydra launcher"),
)


def launcher_size(environ=None) -> tuple[int, str, str] | None:
    """(size, variable, launcher) when a launcher's variables say it started more than one
    process; None otherwise. SLURM_NTASKS counts only inside a job step (srun sets
    SLURM_STEP_ID; a batch script itself runs once even when it asks for many tasks)."""
    env = os.environ if environ is None else environ
    candidates = list(_SIZE_VARIABLES)
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        candidates.append(("SLURM_NTASKS", "Slurm's srun"))
    for name, who in candidates:
        try:
            size = int(env.get(name, ""))
        except ValueError:
            continue
        if size > 1:
            return size, name, who
    return None


def check_world(mpi_size: int, library: str, environ=None) -> None:
    """Raise a CommError when the launcher started N > 1 processes but MPI's world has one
    rank: the launcher and the MPI library mpi4py loaded are of different MPIs."""
    seen = launcher_size(environ)
    if seen is None or mpi_size != 1:
        return
    size, name, who = seen
    library = " ".join(library.split())
    raise CommError(
        f"{who} started {size} processes ({name}={size}) but the MPI library mpi4py loaded "
        f"({library}) sees a world of 1: each would train alone. Launch with the mpiexec of "
        f"that library, or use the site's MPI: pip uninstall mpich mpi4py && pip install "
        f"--no-binary mpi4py mpi4py (built with the site's mpicc; docs/cluster.md)")


def local_mpiexec() -> str:
    """The mpiexec beside this Python (the PyPI MPICH installs it into the environment), else
    the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")

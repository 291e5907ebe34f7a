"""A launcher of another MPI must not split a job into N lone trainings: its variables say
N > 1 while MPI's world is 1, and mgcaffe stops with one line naming both and the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mgcaffe.comm.backends.launcher import check_world, launcher_size
from mgcaffe.errors import CommError


@pytest.mark.parametrize("env, size, var", [
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"}, 4, "OMPI_COMM_WORLD_SIZE"),
    ({"PMI_SIZE": "2", "PMI_RANK": "0"}, 2, "PMI_SIZE"),
    ({"PMIX_SIZE": "3"}, 3, "PMIX_SIZE"),
    ({"MV2_COMM_WORLD_SIZE": "8"}, 8, "MV2_COMM_WORLD_SIZE"),
    ({"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, 2, "SLURM_NTASKS"),
])
def test_launcher_sizes(env, size, var):
    seen = launcher_size(env)
    assert seen is not None and seen[:2] == (size, var)


@pytest.mark.parametrize("env", [
    {}, {"PMI_SIZE": "1"}, {"OMPI_COMM_WORLD_SIZE": "x"},
    {"SLURM_NTASKS": "4"},  # a batch script, not a task started by srun
])
def test_no_launcher_of_several(env):
    assert launcher_size(env) is None


def test_split_world_is_refused_with_the_fix():
    env = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    with pytest.raises(CommError) as info:
        check_world(1, "MPICH Version:      4.2.0\nMPICH Release date: x", env)
    text = str(info.value)
    assert "\n" not in text
    assert "Open MPI's mpirun started 2 processes (OMPI_COMM_WORLD_SIZE=2)" in text
    assert "(MPICH Version: 4.2.0 MPICH Release date: x) sees a world of 1" in text
    assert "pip install --no-binary mpi4py mpi4py" in text and "docs/cluster.md" in text
    check_world(2, "MPICH", env)  # the worlds agree: nothing to say
    check_world(1, "MPICH", {})


@pytest.mark.slow
@pytest.mark.mpi
def test_train_under_a_foreign_launcher_stops_at_once(tmp_path):
    """The issue's reproduction: Open MPI's variables, the MPICH wheel's mpi4py."""
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net_param { layer { name: "d" type: "DummyData" top: "x" top: "y" '
                      'dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 } } }'
                      ' layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" '
                      'inner_product_param { num_output: 1 } } layer { name: "l" '
                      'type: "EuclideanLoss" bottom: "ip" bottom: "y" top: "l" } } '
                      'base_lr: 0.1 lr_policy: "fixed" max_iter: 2 snapshot_after_train: false')
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI", "OMPI_", "PMIX", "MV2_", "SLURM", "HYDRA", "MPI_"))}
    env.update(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1")
    proc = subprocess.run([sys.executable, "-m", "mgcaffe", "train", "--solver", str(solver),
                           "--comm=mgwfbp"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    library = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = "
                              "False; from mpi4py import MPI; print(MPI.Get_library_version())"],
                             capture_output=True, text=True, timeout=60).stdout
    if library.startswith("Open MPI"):
        pytest.skip("mpi4py here is Open MPI's: the variables are its own")
    assert proc.returncode == 1, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and "sees a world of 1" in errors[0]
    assert "Optimization" not in proc.stderr and not list(tmp_path.glob("*.caffemodel"))

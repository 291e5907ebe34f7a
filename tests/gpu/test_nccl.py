"""The NCCL communicator on a GPU, one rank: all-reduce, the event/stream gradient path (the
NCCL stream waits for the compute stream without the host), broadcast, errors, the deadline
that aborts a stuck collective, and two ranks under mpiexec where two GPUs are present."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mgcaffe.comm.backends.local import SingleCommunicator
from mgcaffe.errors import CommError

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
from mgcaffe.comm.backends.nccl import NcclCommunicator  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

#: Spins for `cycles` GPU clock cycles, then writes `value` everywhere: a compute-stream
#: kernel that finishes long after the host has queued what follows it.
SLOW_FILL = r"""
extern "C" __global__ void slow_fill(float* x, int n, float value, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) { }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    x[i] = value;
}
"""


@pytest.fixture
def comm():
    c = NcclCommunicator(SingleCommunicator(), timeout=30)
    yield c
    c.close()


def slow_fill(x, value, cycles):
    kernel = cp.RawKernel(SLOW_FILL, "slow_fill")
    kernel((1,), (128,), (x, np.int32(x.size), np.float32(value), np.int64(cycles)))


def test_one_rank_all_reduce_keeps_the_values(comm):
    buf = cp.arange(1000, dtype=cp.float32)
    comm.allreduce_sum(buf)
    cp.testing.assert_array_equal(buf, cp.arange(1000, dtype=cp.float32))
    host = np.ones(4, np.float32)
    comm.allreduce_sum(host)  # host buffers go through the host communicator
    np.testing.assert_array_equal(host, 1)
    assert comm.device_id == 0 and comm.local_rank == 0 and comm.local_size == 1
    assert comm.version.count(".") == 2


def test_the_nccl_stream_waits_for_the_compute_stream_event(comm):
    diff = cp.zeros(4096, cp.float32)
    buffer = cp.zeros(4096, cp.float32)
    slow_fill(diff, 7.0, cycles=200_000_000)  # ~0.1 s on the compute stream
    comm.mark_ready(3)
    comm.wait_ready(3)
    comm.pack([(buffer, diff)])  # queued at once; must run after slow_fill
    comm.allreduce_sum_async(buffer)
    comm.unpack([(buffer, diff)], 2)
    comm.synchronize("the gradient path")
    cp.testing.assert_array_equal(diff, cp.full(4096, 3.5, cp.float32))


def test_broadcast_of_a_device_array_and_of_objects(comm):
    array = cp.arange(6, dtype=cp.float64).reshape(2, 3)
    assert comm.broadcast(array) is array
    cp.testing.assert_array_equal(array, cp.arange(6).reshape(2, 3))
    assert comm.broadcast({"plan": 3}) == {"plan": 3}
    assert comm.allgather(5) == [5]
    comm.barrier()


@pytest.mark.parametrize("buf, message", [
    (lambda: cp.zeros(3, cp.int32), "float32 or float64"),
    (lambda: cp.zeros((4, 4), cp.float32)[:, ::2], "C-contiguous"),
    (lambda: [1.0, 2.0], "must be a CuPy array"),
])
def test_buffer_errors_name_the_rank_and_gpu(comm, buf, message):
    with pytest.raises(CommError, match=f"rank 0 \\(GPU 0\\): .*{message}"):
        comm.allreduce_sum_async(buf())


def test_waiting_for_an_unmarked_layer_is_an_error(comm):
    with pytest.raises(CommError, match="layer 9 was never marked ready"):
        comm.wait_ready(9)


def test_close_is_idempotent_and_final():
    comm = NcclCommunicator(SingleCommunicator(), timeout=30)
    comm.close()
    comm.close()
    with pytest.raises(CommError, match="no longer usable \\(closed\\)"):
        comm.allreduce_sum(cp.zeros(2, cp.float32))


def run_python(code: str, timeout: float = 120, launcher=()):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([*launcher, sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_a_stuck_collective_is_aborted_after_the_deadline():
    # In a child process: the abort leaves queued NCCL work behind, which must not touch
    # the CUDA context the other tests use.
    proc = run_python(f"""
        import os, sys
        import cupy as cp, numpy as np
        from mgcaffe.comm.backends.local import SingleCommunicator
        from mgcaffe.comm.backends.nccl import NcclCommunicator
        from mgcaffe.errors import CommError
        comm = NcclCommunicator(SingleCommunicator(), timeout=30)
        x = cp.zeros(16, cp.float32)
        kernel = cp.RawKernel({SLOW_FILL!r}, "slow_fill")
        kernel((1,), (32,), (x, np.int32(16), np.float32(1), np.int64(6_000_000_000)))
        comm.mark_ready(1)
        comm.wait_ready(1)
        comm.allreduce_sum_async(x)
        try:
            comm.synchronize("all-reduce of group 4", timeout=0.5)
        except CommError as exc:
            print("CAUGHT", exc, flush=True)
            os._exit(0)
        print("NOT CAUGHT", flush=True)
        os._exit(1)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CAUGHT rank 0 (GPU 0): all-reduce of group 4 not done after 0.5 s" in proc.stdout
    assert "NCCL aborted" in proc.stdout


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")
def test_two_ranks_under_mpiexec_on_two_gpus():
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    proc = run_python("""
        import cupy as cp
        from mgcaffe.comm.backends.mpi import MpiCommunicator
        from mgcaffe.comm.backends.nccl import NcclCommunicator
        comm = NcclCommunicator(MpiCommunicator(), timeout=60)
        buf = cp.full(1000, comm.rank + 1, cp.float32)
        comm.allreduce_sum(buf)
        assert float(buf[0]) == 3.0 and comm.device_id == comm.rank, (buf[0], comm.device_id)
        comm.close()
        print("OK", comm.rank, flush=True)
    """, launcher=("mpiexec", "-n", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK") == 2

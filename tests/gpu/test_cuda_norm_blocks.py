"""The per-channel reductions of kernels/cuda_norm.py with many threads per block.

The CuPy double runs a RawKernel as one host thread (blockDim = gridDim = 1), where a block's
shared memory is that thread's and `__syncthreads` is a no-op: the shared-memory tree of
`mgcaffe_block_sum` and the barriers around it never meet a second thread there. Here the
very CUDA source is compiled for the host with a block of CHANNEL_THREADS real threads (one
OS thread each, `threadIdx` thread-local, `__syncthreads` a barrier across them) and fewer
blocks than channels (so the channel loop strides), and the results are compared with numpy
in float64. A missing barrier or a wrong tree step shows as a wrong sum.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading

import numpy as np
import pytest

from mgcaffe.kernels.cuda import im2col_pool as cuda_kernels
from mgcaffe.kernels.cuda import norm as cuda_norm

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="compiling the kernels for the host needs g++")

# Blocks run one after another (a block's __shared__ arrays are function statics); the
# threads of a block run at once and meet at a reusable barrier.
_THREADED_PRELUDE = r"""
#include <cmath>
#include <condition_variable>
#include <mutex>
using std::sqrt;
#define __global__
#define __device__
#define __shared__ static
struct mgcaffe_dim3 { unsigned int x; };
static mgcaffe_dim3 blockIdx = {0}, blockDim = {1}, gridDim = {1};
static thread_local mgcaffe_dim3 threadIdx = {0};
static std::mutex barrier_lock;
static std::condition_variable barrier_open;
static unsigned barrier_arrived = 0, barrier_round = 0;
static void __syncthreads() {
  std::unique_lock<std::mutex> hold(barrier_lock);
  const unsigned round = barrier_round;
  if (++barrier_arrived == blockDim.x) {
    barrier_arrived = 0;
    ++barrier_round;
    barrier_open.notify_all();
  } else {
    barrier_open.wait(hold, [&] { return barrier_round != round; });
  }
}
extern "C" void mgcaffe_grid(unsigned grid, unsigned block, unsigned index) {
  gridDim.x = grid; blockDim.x = block; blockIdx.x = index;
}
extern "C" void mgcaffe_thread(unsigned index) { threadIdx.x = index; }
"""

GRID = 2  # fewer blocks than the channels below: each block takes several channels


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("threaded-kernels")
    built = {}

    def compiled(name):
        if name not in built:
            src, lib = folder / f"{name}.cpp", folder / f"{name}.so"
            src.write_text(_THREADED_PRELUDE + cuda_kernels.kernel_source(name, np.float64))
            subprocess.run(["g++", "-O1", "-std=c++14", "-shared", "-fPIC", "-pthread",
                            "-o", str(lib), str(src)], check=True, capture_output=True)
            built[name] = ctypes.CDLL(str(lib))
        return built[name]
    return compiled


def _argument(value):
    if isinstance(value, np.ndarray):
        assert value.dtype == np.float64 and value.flags.c_contiguous
        return ctypes.c_void_p(value.ctypes.data)
    return {np.dtype(np.int32): ctypes.c_int,
            np.dtype(np.float64): ctypes.c_double}[value.dtype](value.item())


def run_blocks(lib, name, args, threads=cuda_norm.CHANNEL_THREADS):
    """Launch `name` as GRID blocks of `threads` threads, one block after another."""
    kernel = getattr(lib, name)
    arguments = [_argument(a) for a in args]
    failures = []

    def thread(index):
        try:
            lib.mgcaffe_thread(index)
            kernel(*arguments)
        except Exception as error:  # noqa: BLE001 - reported by the test below
            failures.append(error)

    for block in range(GRID):
        lib.mgcaffe_grid(GRID, threads, block)
        workers = [threading.Thread(target=thread, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert not any(w.is_alive() for w in workers), f"{name}: a block never finished"
    assert not failures, failures


# (outer, channels, inner): fewer values per channel than threads, many more, a single one
DIMS = [(3, 7, 50), (4, 5, 300), (1, 3, 1), (2, 8, 129)]


def data(dims, seed):
    return np.random.default_rng(seed).standard_normal(dims) * 3 + 1


@pytest.mark.parametrize("dims", DIMS)
def test_batch_norm_statistics_with_a_block_of_threads(build, dims):
    outer, channels, inner = dims
    x = data(dims, 0)
    mean, std = np.zeros(channels), np.zeros(channels)
    mean_sum, var_sum = np.linspace(-1, 1, channels), np.linspace(0.5, 2, channels)
    factor = np.array([1.5])
    eps, maf, correction = 1e-5, 0.9, 1.25
    want_mean, want_var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    want = (want_mean, np.sqrt(want_var + eps), mean_sum * maf + want_mean,
            var_sum * maf + want_var * correction, factor * maf + 1)
    run_blocks(build("mgcaffe_bn_stats"), "mgcaffe_bn_stats",
               (x, mean, std, mean_sum, var_sum, factor, np.int32(outer), np.int32(channels),
                np.int32(inner), np.float64(eps), np.float64(maf), np.float64(correction)))
    for got, expected in zip((mean, std, mean_sum, var_sum, factor), want):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dims", DIMS)
# each sum added to and written; (0, 0): BatchNorm's backward sums of dy and dy * y
@pytest.mark.parametrize("accumulate", [(1, 0), (0, 1), (0, 0)])
def test_channel_sums_with_a_block_of_threads(build, dims, accumulate):
    outer, dim, inner = dims
    dy, x = data(dims, 3), data(dims, 4)
    bias_diff, scale_diff = np.full(dim, 0.25), np.full(dim, -0.5)
    want_bias = dy.sum(axis=(0, 2)) + (0.25 if accumulate[0] else 0)
    want_scale = (dy * x).sum(axis=(0, 2)) + (-0.5 if accumulate[1] else 0)
    run_blocks(build("mgcaffe_channel_sums"), "mgcaffe_channel_sums",
               (dy, x, bias_diff, scale_diff, np.int32(outer), np.int32(dim), np.int32(inner),
                np.int32(1), np.int32(1), np.int32(accumulate[0]), np.int32(accumulate[1])))
    np.testing.assert_allclose(bias_diff, want_bias, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scale_diff, want_scale, rtol=1e-12, atol=1e-12)

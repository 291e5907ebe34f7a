"""The CuPy test double itself: CuPy's names and no others, CuPy's host/device rules, and
counts that follow from the calls (tests/support/cupy_double)."""

from __future__ import annotations

import importlib.util
import sys
import threading

import cupy_double
import numpy as np
import pytest
from cupy_double.names import LIST, cupy_names


@pytest.fixture
def double():
    with cupy_double.installed(devices=2) as d:
        yield d


def test_import_cupy_gets_the_double_and_uninstall_restores(double):
    import cupy

    assert cupy is double.cupy and sys.modules["cupyx"] is double.modules["cupyx"]
    a = cupy.zeros(3, cupy.float32)
    assert type(a).__module__ == "cupy" and type(a).__name__ == "ndarray"
    assert cupy.float32 is np.float32  # CuPy's scalar types are numpy's


def test_only_names_cupy_has():
    with cupy_double.installed() as d:
        cupy = d.cupy
        with pytest.raises(AttributeError, match="module 'cupy' has no attribute 'nonsense'"):
            cupy.nonsense  # noqa: B018
        assert "msort" in d.names["cupy"] and not hasattr(np, "msort")
        with pytest.raises(AttributeError, match="does not implement cupy.msort"):
            cupy.msort  # noqa: B018
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            cupy.cuda.nope  # noqa: B018
        with pytest.raises(AttributeError):
            cupy.add.nonsense  # noqa: B018
        assert callable(cupy.add.at) and callable(cupy.lib.stride_tricks.as_strided)


def test_checked_in_list_is_cupy_14():
    names = cupy_names()
    assert any(v.startswith("14.") for v in names["version"])
    for name in ("asarray", "matmul", "take_along_axis", "copyto", "RawKernel", "asnumpy"):
        assert name in names["cupy"]
    assert "get" in names["cupy.ndarray"] and "scatter_add" in names["cupy.ndarray"]
    assert LIST.exists()


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None or "cupy" in sys.modules,
                    reason="CuPy is not installed here: the checked-in list stands in for it")
def test_checked_in_list_matches_the_installed_cupy():
    import json

    from cupy_double.names import real_names

    real = real_names()
    listed = json.loads(LIST.read_text())
    missing = {k: sorted(set(v) - set(listed.get(k, ()))) for k, v in real.items()
               if k != "version"}
    assert all(not v for v in missing.values()), missing


def test_no_implicit_conversion_to_numpy(double):
    cupy = double.cupy
    a = cupy.arange(4, dtype=cupy.float32)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(a)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.array([a])
    np.testing.assert_array_equal(a.get(), [0, 1, 2, 3])
    np.testing.assert_array_equal(cupy.asnumpy(a), [0, 1, 2, 3])


def test_host_arrays_are_no_operands(double):
    cupy = double.cupy
    a = cupy.ones((2, 3), cupy.float32)
    host = np.ones((2, 3), np.float32)
    for call in (lambda: a + host, lambda: cupy.add(a, host), lambda: cupy.matmul(a.T, host),
                 lambda: np.add(a, host), lambda: cupy.copyto(a, host)):
        with pytest.raises((TypeError, ValueError)):
            call()
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        a[...] = host
    a[...] = np.float32(2)  # scalars, numpy scalars and 0-d arrays are fine
    a[0] = np.array(3.0)
    assert float(a.sum()) == 15.0
    b = cupy.asarray(host)  # the explicit copy
    b.set(host * 4)
    assert float(b[1, 2]) == 4.0


def test_numpy_functions_on_device_arrays_stay_on_the_device(double):
    cupy = double.cupy
    a = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    for result in (np.maximum(a, 2), np.sum(a, axis=0), np.concatenate([a, a]),
                   np.matmul(a, a.T)):
        assert isinstance(result, cupy.ndarray)
    assert isinstance(a.sum(), cupy.ndarray) and a.sum().shape == ()  # a 0-d device array


def test_arrays_of_another_device_are_refused(double):
    cupy = double.cupy
    with cupy.cuda.Device(1):
        b = cupy.ones(3, cupy.float32)
    assert b.device.id == 1
    a = cupy.ones(3, cupy.float32)
    with pytest.raises(ValueError, match="array device = 1 while current = 0"):
        a + b  # noqa: B018
    assert b.get().sum() == 3.0  # copying to the host switches to its device, as CuPy does


def test_counts_launches_syncs_and_bytes(double):
    cupy, c = double.cupy, double.counters
    c.reset()
    host = np.ones((4, 5), np.float32)
    a = cupy.asarray(host)                      # 80 bytes in, one copy
    b = cupy.empty_like(a)                      # no launch
    v = a.reshape(20)[2:7]                      # views: no launch
    cupy.multiply(a, 2, out=b)                  # 1
    b += a                                      # 1
    s = (b * v.reshape(5)).sum()                # 2
    total = float(s)                            # one sync, 4 bytes out
    assert total == 3 * (2 + 3 + 4 + 5 + 6)  # b = 3a over a (4, 5) array of ones: 3 * 5 cells
    assert c.launches == 1 + 1 + 1 + 2 + 0, dict(c.launches_by_name)
    assert c.h2d_bytes == 80 and c.h2d_pageable_bytes == 80
    assert c.syncs == 1 and c.d2h_bytes == 4
    [(site, n)] = c.sync_sites.items()
    assert site.startswith("tests/gpu/test_cupy_double.py:") and "float()" in site and n == 1


def test_pinned_copies_and_a_non_blocking_get(double):
    cupy, c = double.cupy, double.counters
    pinned = double.modules["cupyx"].empty_pinned((8,), np.float32)
    pinned[...] = 2
    c.reset()
    a = cupy.asarray(pinned)
    assert c.h2d_bytes == 32 and c.h2d_pageable_bytes == 0
    stream = cupy.cuda.Stream(non_blocking=True)
    a.get(out=pinned, stream=stream, blocking=False)
    assert c.syncs == 0 and c.d2h_pageable_bytes == 0
    a.get(out=np.empty(8, np.float32), stream=stream, blocking=False)
    assert c.syncs == 1  # into pageable memory the copy returns only when done


def test_streams_events_and_the_current_stream_per_thread(double):
    cupy, c = double.cupy, double.counters
    c.reset()
    stream = cupy.cuda.Stream(non_blocking=True)
    assert cupy.cuda.get_current_stream().ptr == 0
    with stream:
        cupy.zeros(3)
        assert cupy.cuda.get_current_stream() is stream
        seen = {}
        t = threading.Thread(target=lambda: seen.update(ptr=cupy.cuda.get_current_stream().ptr))
        t.start()
        t.join()
        assert seen["ptr"] == 0  # another thread keeps its own current stream
    cupy.zeros(3)
    assert c.launches_by_stream == {stream.label: 1, "null:0": 1}
    event = stream.record()
    cupy.cuda.get_current_stream().wait_event(event)
    event.synchronize()
    stream.synchronize()
    assert c.syncs == 2


def test_with_device_on_a_fresh_thread_leaves_a_context_on_device_0(double):
    cupy, c = double.cupy, double.counters

    def with_block():
        with cupy.cuda.Device(1):
            cupy.zeros(2)

    def use_once():
        cupy.cuda.Device(1).use()
        cupy.zeros(2)

    for body, contexts in ((use_once, {1}), (with_block, {0, 1})):
        c.contexts.clear()
        t = threading.Thread(target=body)
        t.start()
        t.join()
        assert c.contexts == contexts


def test_cuda_visible_devices_is_honoured(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with cupy_double.installed(devices=4) as d:
        assert d.cupy.cuda.runtime.getDeviceCount() == 1
        with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
            d.cupy.cuda.Device(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7,1")  # stops at the first invalid id
    with cupy_double.installed(devices=4) as d:
        assert d.cupy.cuda.runtime.getDeviceCount() == 1


def test_nccl_double_sums_across_thread_ranks(double):
    cupy, nccl = double.cupy, double.modules["cupy.cuda.nccl"]
    uid = nccl.get_unique_id()
    results = {}

    def rank(r):
        cupy.cuda.Device(r).use()
        comm = nccl.NcclCommunicator(2, uid, r)
        buf = cupy.full(4, r + 1, dtype=cupy.float32)
        comm.allReduce(buf.data.ptr, buf.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                       cupy.cuda.Stream(non_blocking=True).ptr)
        results[r] = buf.get()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    np.testing.assert_array_equal(results[0], [3, 3, 3, 3])
    np.testing.assert_array_equal(results[1], [3, 3, 3, 3])


def test_raw_kernel_runs_the_cuda_source_on_the_host(double):
    cupy = double.cupy
    source = r"""extern "C" __global__ void twice(const float* x, float* y, int n) {
      for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = 2 * x[i];
    }"""
    try:
        kernel = cupy.RawKernel(source, "twice")
        x = cupy.arange(5, dtype=cupy.float32)
        y = cupy.empty_like(x)
        kernel((1,), (32,), (x, y, np.int32(5)))
    except RuntimeError as exc:
        pytest.skip(str(exc))
    np.testing.assert_array_equal(y.get(), [0, 2, 4, 6, 8])
    with pytest.raises(TypeError, match=r"numpy.ndarray of shape \(5,\) as a kernel parameter"):
        kernel((1,), (32,), (np.zeros(5, np.float32), y, np.int32(5)))

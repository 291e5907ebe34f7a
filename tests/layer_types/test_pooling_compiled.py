"""Pooling's compiled loops (kernels/loops/pool.py) against its numpy paths, bit for bit.

The numpy paths are the reference here (tests/layer_types/test_pooling.py checks both
against Caffe's loops written out): MAX's tops, winner tags, mask and bottom diff (the
numpy scatter by winner index adds in Caffe's output order, as the loop does), and AVE
against the offset-by-offset passes (the loop adds in their order).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from google.protobuf import text_format
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.kernels.loops import pool as pool_loops
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.proto import caffe_pb2

pytest.importorskip("numba", reason="the compiled pooling loops need numba")

# kernel / stride / pad text, input height and width
GEOMETRIES = [
    ("kernel_size: 3 stride: 2", 9, 9),               # stride < kernel, ceil: last clipped
    ("kernel_size: 3 stride: 2 pad: 1", 8, 7),        # pads, ceil mode
    ("kernel_size: 3 stride: 1 pad: 1", 6, 7),        # GoogleNet's inception pools
    ("kernel_size: 2 stride: 2", 7, 8),               # stride = kernel (LeNet), odd size
    ("kernel_size: 2 stride: 3", 8, 9),               # stride > kernel: cells never read
    ("kernel_size: 2 stride: 3 pad: 1", 8, 8),        # ... and a window only in the padding
    ("kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2 pad_h: 1 pad_w: 1", 5, 6),
    ("kernel_size: 3 stride: 2 pad: 1 round_mode: FLOOR", 7, 7),
    ("kernel_size: 5 stride: 3", 14, 14),             # GoogleNet's loss branches
    ("kernel_size: 12 stride: 1", 13, 12),            # 145 tags: int16 winner tags
    # Planes enough for several blocks of the loops (kernels/pool_loops.BLOCK_CELLS) in
    # batch 5; a block that reused the buffers of the one before once wrote out of bounds.
    ("kernel_size: 3 stride: 1 pad: 1", 28, 28),
    ("kernel_size: 3 stride: 2", 56, 55),
]


def pooling(text, shape, dtype, compiled, threads, n_top=1, method="MAX"):
    tops = " ".join(f'top: "t{i}"' for i in range(n_top))
    param = text_format.Parse(
        f'name: "pool" type: "Pooling" {tops} pooling_param {{ pool: {method} {text} }}',
        caffe_pb2.LayerParameter())
    runner = ChunkRunner(threads, chunk_elements=4096, serial_below=0, adaptive=False)
    # AVE's reference: the offset passes (the loop's order), not the window GEMM
    rules = changed(pooling={"compiled": compiled, "ave_gemm_below": 0})
    layer = create_layer(param, LayerContext(dtype=dtype, seed=0, chunk_runner=runner,
                                             rules=rules))
    bottom = Blob(shape, dtype=dtype, name="x")
    top = [Blob((), dtype=dtype, name=f"t{i}") for i in range(n_top)]
    return layer, bottom, top


def data(shape, dtype, seed, special):
    rng = np.random.default_rng(seed)
    # Small integers: ties in nearly every window, so the first-maximum rule decides.
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    if special:
        flat = x.reshape(-1)
        flat[rng.random(flat.size) < 0.1] = np.nan
        flat[rng.random(flat.size) < 0.15] = -np.inf
        if x.shape[2] >= 3:
            x[0, 0, :3, :3] = -np.inf  # a window of only -inf: no winner
    return x


def run_both(text, shape, dtype, threads, method, n_top, special, seed=0):
    """(numpy path, compiled path) results: tops, tags, bottom diff."""
    results = []
    x = data(shape, dtype, seed, special)
    for compiled in (False, True):
        layer, bottom, top = pooling(text, shape, dtype, compiled, threads, n_top, method)
        bottom.data[...] = x
        layer.setup([bottom], top)
        assert (layer.choice.path == "compiled-loops") == compiled
        layer.forward([bottom], top)
        top[0].diff[...] = np.random.default_rng(seed + 1).standard_normal(top[0].shape)
        bottom.diff[...] = np.nan  # stale: must be overwritten everywhere
        layer.backward(top, [True], [bottom])
        winner = layer._winner.copy() if method == "MAX" else None
        results.append(([t.data.copy() for t in top], winner, bottom.diff.copy()))
    return results


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text,h,w", GEOMETRIES)
def test_max_compiled_equals_numpy(text, h, w, dtype):
    for n, threads, special in ((1, 1, False), (5, 2, True)):
        (tops_a, win_a, diff_a), (tops_b, win_b, diff_b) = run_both(
            text, (n, 8, h, w), dtype, threads, "MAX", 2, special)
        np.testing.assert_array_equal(tops_b[0], tops_a[0])   # NaN == NaN here
        np.testing.assert_array_equal(tops_b[1], tops_a[1])   # the mask
        assert win_b.dtype == win_a.dtype
        np.testing.assert_array_equal(win_b, win_a)
        np.testing.assert_array_equal(diff_b, diff_a)
        assert not np.isnan(diff_b).any()


# The numpy passes compute junk outputs past a chunk's last plane from cells of the next
# sample, not yet loaded (uninitialised scratch): dropped, but they may warn.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("text,h,w", GEOMETRIES)
def test_ave_compiled_equals_numpy(text, h, w, dtype):
    for n, threads in ((1, 1), (5, 2)):
        (tops_a, _, diff_a), (tops_b, _, diff_b) = run_both(
            text, (n, 8, h, w), dtype, threads, "AVE", 1, special=False)
        np.testing.assert_array_equal(tops_b[0], tops_a[0])
        np.testing.assert_array_equal(diff_b, diff_a)


@pytest.mark.parametrize("text", ["kernel_size: 2 stride: 2", "global_pooling: true"])
def test_max_special_values(text):
    # NaN never wins, -inf never wins over -FLT_MAX; a window of NaN only gives -FLT_MAX
    # (global pooling too: the compiled loops take it).
    x = np.array([[np.nan, 1.0], [np.nan, np.nan]], dtype=np.float32).reshape(1, 1, 2, 2)
    x = np.concatenate([x, np.full_like(x, np.nan), np.full_like(x, -np.inf)], axis=1)
    layer, bottom, top = pooling(text, x.shape, np.float32, True, 1, n_top=2)
    bottom.data[...] = x
    layer.setup([bottom], top)
    layer.forward([bottom], top)
    lowest = np.finfo(np.float32).min
    np.testing.assert_array_equal(top[0].data.reshape(-1), [1.0, lowest, lowest])
    np.testing.assert_array_equal(top[1].data.reshape(-1), [1, -1, -1])
    np.testing.assert_array_equal(layer._winner.reshape(-1), [2, 0, 0])
    top[0].diff[...] = 5.0
    layer.backward(top, [True], [bottom])
    np.testing.assert_array_equal(bottom.diff.reshape(3, 4), [[0, 5, 0, 0], [0] * 4, [0] * 4])


def test_without_numba_the_numpy_path_runs(monkeypatch, untried):
    """numba missing: `load` gives None and the layer keeps its numpy passes."""
    untried(pool_loops)  # load() tries the import anew
    monkeypatch.setitem(sys.modules, "numba", None)    # `import numba` raises ImportError
    assert pool_loops.load() is None
    layer, bottom, top = pooling("kernel_size: 3 stride: 2", (2, 3, 9, 9), np.float64, True, 1)
    bottom.data[...] = data(bottom.shape, np.float64, 3, special=False)
    layer.setup([bottom], top)
    assert layer.choice.path == "offset-passes" and layer.rules.compiled
    layer.forward([bottom], top)
    x = bottom.data
    np.testing.assert_array_equal(top[0].data[:, :, 0, 0], x[:, :, :3, :3].max(axis=(2, 3)))


def test_without_a_writable_cache_directory_the_loops_compile_in_memory():
    """numba's njit(cache=True) raises RuntimeError when no cache directory is writable:
    `_compile` then compiles without the cache (checked with a stand-in for numba)."""
    calls = []

    class FakeNumba:
        NumbaWarning = UserWarning

        @staticmethod
        def njit(**options):
            calls.append(options)
            if options.get("cache"):
                raise RuntimeError("cannot cache function: no locator available")
            return lambda fn: ("compiled", fn.__name__)

    saved = {name: getattr(pool_loops, name) for name in ("_layout", "_columns", "_load",
                                                           "_unload")}
    try:
        loops = pool_loops._compile(FakeNumba)
    finally:
        for name, fn in saved.items():  # _compile rebinds the helpers it compiles
            setattr(pool_loops, name, fn)
    assert loops.max_forward == ("compiled", "_max_forward")
    assert loops.ave_backward == ("compiled", "_ave_backward")
    assert {"nogil": True, "cache": True} in calls and {"nogil": True} in calls

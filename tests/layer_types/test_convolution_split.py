"""Convolution's per-sample GEMMs spread over a chunk runner's threads (kernels.sample_gemm):
forward against a naive loop, float64 central-difference gradients, the same results on any
thread count and unsplit, param-diff accumulation, and the BLAS thread count restored."""

from __future__ import annotations

import numpy as np
import pytest
from conv_layers import threaded_conv
from gradient_check import check_layer_gradients

from mgcaffe.cpu import parallel
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.kernels import sample_gemm
from mgcaffe.layer_types import convolution

# body, bottom shape; every case is made per-sample (kxk) or direct (1x1) by the fixture.
CASES = [
    ("num_output: 4 kernel_size: 3 pad: 1", (3, 2, 5, 4)),
    ("num_output: 4 kernel_size: 3 stride: 2 pad: 1 group: 2 bias_term: false", (4, 4, 6, 5)),
    ("num_output: 3 kernel_size: 2 dilation: 2", (3, 2, 5, 6)),
    ("num_output: 6 kernel_size: 1 group: 3", (3, 6, 3, 4)),
    ("num_output: 4 kernel_size: 1 stride: 2", (5, 3, 5, 6)),
    ("num_output: 5 kernel_size: 1 pad: 1", (3, 2, 3, 3)),  # pointwise but padded: per sample
]


#: Every case takes a per-sample layout (kxk, padded 1x1) or the direct one (1x1).
PER_SAMPLE = {"per_sample_from": 0, "per_sample_from_pointwise": 0, "direct_from": 0}


@pytest.fixture(params=["in GEMM", "scratch and add"])
def weight_diff_way(request):
    """The weight gradient added inside the GEMM (split into column blocks) or not: rules."""
    return {"weight_diff_in_gemm": request.param == "in GEMM", "weight_diff_in_gemm_from": 0}


def build(body, shape, threads=3, split=True, dtype=np.float64, seed=0, rules=None):
    """A layer on a per-sample or direct layout (conv_layers.threaded_conv), its per-sample
    GEMMs split over the runner's threads or not; `rules`: more rules to change."""
    layer, bottom, top = threaded_conv(body, shape, {**PER_SAMPLE, "split_sample_gemms": split,
                                                     **(rules or {})},
                                       threads, dtype, seed)
    assert layer.choice.path in ("direct", "im2col-per-sample")
    return layer, bottom, top


@pytest.mark.parametrize("body,shape", CASES)
def test_forward_matches_naive(body, shape, naive_layer_top):
    layer, bottom, top = build(body, shape)
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, naive_layer_top(layer, bottom[0].data),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("body,shape", CASES)
def test_gradients_match_central_differences(body, shape, weight_diff_way):
    """Every element of the bottom, weight and bias against (f(x+e) - f(x-e)) / 2e of
    sum(top * R) in float64; the diffs start lazily cleared over stale memory."""
    layer, bottom, top = build(body, shape, rules=weight_diff_way)
    # every element, from stale diffs (lazily cleared NaN params, junk bottom diffs)
    check_layer_gradients(layer, bottom, top, eps=1e-6, rtol=1e-6, atol=1e-7,
                          max_checks=10**6)


@pytest.mark.parametrize("body,shape", CASES)
def test_same_results_on_any_thread_count_and_unsplit(body, shape, weight_diff_way,
                                                       conv_passes):
    """float32: bit for bit on 2 and 3 runner threads (each GEMM on one BLAS thread whoever
    runs it); within rounding of the unsplit per-sample GEMMs; the param diffs are the start
    plus twice the gradient."""
    results = []
    for threads, split in ((2, True), (3, True), (2, False)):
        results.append(conv_passes(*build(body, shape, threads, split, dtype=np.float32,
                                          rules=weight_diff_way)))
    for a, b in zip(results[0], results[1]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(results[0], results[2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("body,shape", [
    ("num_output: 4 kernel_size: 3 pad: 1", (32, 2, 6, 5)),
    ("num_output: 6 kernel_size: 1 pad: 1 group: 2", (24, 4, 3, 3)),
])
def test_several_samples_to_a_chunk_give_the_same_bits(body, shape, weight_diff_way,
                                                      conv_passes, monkeypatch):
    """Small per-sample GEMMs go several to a chunk (sample_chunk_flops; at most a quarter
    of the samples per thread): float32 results bit for bit those of one sample per chunk."""
    grains = []

    def recording(xp, count, body, runner=None, grain=1):
        if body.__name__ == "samples":  # not the weight gradient's column blocks
            grains[-1].add(grain)
        sample_gemm.for_each_gemm(xp, count, body, runner, grain)

    monkeypatch.setattr(convolution, "for_each_gemm", recording)
    results = []
    for flops in (0, 1e9):
        grains.append(set())
        results.append(conv_passes(*build(body, shape, threads=2, dtype=np.float32,
                                          rules={**weight_diff_way,
                                                 "sample_chunk_flops": flops})))
    assert grains == [{1}, {shape[0] // 8}]  # the forward's and the backward's GEMMs
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_weight_diff_blocks_cover_a_wide_gradient():
    """A weight gradient wider than one column block (64) is summed block by block: every
    block against einsum by hand."""
    layer, bottom, top = build("num_output: 3 kernel_size: 5 pad: 2 bias_term: false",
                               (3, 8, 4, 4), rules={"weight_diff_in_gemm": True,
                                                    "weight_diff_in_gemm_from": 0})
    assert layer.blobs[0].count // 3 > 64
    layer.forward(bottom, top)
    top[0].diff[...] = np.random.default_rng(2).standard_normal(top[0].shape)
    layer.blobs[0].clear_diff_lazily()
    layer.backward(top, [False], bottom)
    x = np.pad(bottom[0].data, ((0, 0), (0, 0), (2, 2), (2, 2)))
    patches = np.lib.stride_tricks.sliding_window_view(x, (5, 5), axis=(2, 3))
    expected = np.einsum("noyz,ncyzij->ocij", top[0].diff, patches)
    np.testing.assert_allclose(layer.blobs[0].diff, expected, rtol=1e-12, atol=1e-12)


def test_blas_thread_count_is_restored_after_a_call_and_an_error():
    libs = parallel.blas_controllers()
    if not libs:
        pytest.skip("threadpoolctl finds no BLAS library here")
    before = [lib.get_num_threads() for lib in libs]
    seen = []

    def body(start, stop):
        seen.append([lib.get_num_threads() for lib in libs])
        if start == 1:
            raise RuntimeError("chunk failed")

    runner = ChunkRunner(2, adaptive=False)
    with pytest.raises(RuntimeError, match="chunk failed"):
        sample_gemm.for_each_gemm(np, 3, body, runner)
    assert all(counts == [1] * len(libs) for counts in seen)
    assert [lib.get_num_threads() for lib in libs] == before


def test_one_blas_thread_limits_every_library_blas_threads_reads():
    """One list of libraries for both: with another BLAS loaded after the first lookup
    (scipy's, in a longer test run) one_blas_thread once left it at its count, and
    blas_threads, looked up later, read that."""
    if not parallel.blas_controllers():
        pytest.skip("threadpoolctl finds no BLAS library here")
    with sample_gemm.one_blas_thread():
        assert parallel.blas_threads() == 1
        assert all(lib.get_num_threads() == 1 for lib in parallel.blas_controllers())


def test_a_one_thread_runner_calls_the_same_chunks_on_one_blas_thread():
    """A GEMM's last bits can depend on its shape: one thread or two, the same chunks."""
    libs = parallel.blas_controllers()
    for threads in (1, 2):
        calls, blas = [], []

        def body(a, b, calls=calls, blas=blas):
            calls.append((a, b))
            blas.append([lib.get_num_threads() for lib in libs])

        sample_gemm.for_each_gemm(np, 5, body, ChunkRunner(threads, adaptive=False), grain=2)
        assert sorted(calls) == [(0, 2), (2, 4), (4, 5)]
        assert all(counts == [1] * len(libs) for counts in blas)


def test_a_single_chunk_is_one_plain_call():
    calls = []
    sample_gemm.for_each_gemm(np, 2, lambda a, b: calls.append((a, b)), ChunkRunner(2),
                              grain=2)
    assert calls == [(0, 2)]


def test_other_threads_make_one_plain_call():
    """Off the main thread (in-process ranks) the BLAS count is never changed: one call."""
    import threading  # noqa: PLC0415

    calls = []
    worker = threading.Thread(target=sample_gemm.for_each_gemm,
                              args=(np, 4, lambda a, b: calls.append((a, b)),
                                    ChunkRunner(2, adaptive=False)))
    worker.start()
    worker.join()
    assert calls == [(0, 4)]

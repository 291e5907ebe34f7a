"""BatchNorm: batch and global statistics, running-sum updates, pinned param specs, gradients."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from gradient_check import check_layer_gradients
from gradient_check import make_layer as _make_layer

from mgcaffe.blob import Blob
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.errors import LayerError
from mgcaffe.kernels.loops import batch_norm as batch_norm_loops
from mgcaffe.layer_types import TEST, TRAIN, LayerContext, create_layer
from mgcaffe.layer_types.choice import target_for
from mgcaffe.layer_types.choice.normalization import BatchNormRules, choose_batch_norm
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.proto import caffe_pb2

EPS = float(np.float32(1e-5))


#: The rules this test's layers are built with (set by the `way` fixture).
_RULES = [LayerRules()]


@pytest.fixture(autouse=True, params=["loops", "numpy"])
def way(request):
    """Every test on both paths: the compiled row loops and numpy's passes."""
    if request.param == "loops" and batch_norm_loops.load() is None:
        pytest.skip("numba is not importable: the compiled loops cannot run")
    _RULES[0] = rules_for(request.param)
    yield request.param
    _RULES[0] = LayerRules()


def rules_for(way: str) -> LayerRules:
    """The default rules, BatchNorm's compiled loops on for "loops", off for "numpy"."""
    return LayerRules(batch_norm=BatchNormRules(compiled_loops=way == "loops"))


def make_layer(*args, **kwargs):
    """gradient_check.make_layer under this test's rules."""
    return _make_layer(*args, rules=_RULES[0], **kwargs)


def param(text: str = "") -> caffe_pb2.LayerParameter:
    return text_format.Parse(f'name: "bn" type: "BatchNorm" {text}', caffe_pb2.LayerParameter())


def reference_normalize(x, mean, var, eps=EPS):
    """Per-channel (axis 1) normalisation with explicit loops over channels."""
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        y[:, c] = (x[:, c] - mean[c]) / np.sqrt(var[c] + eps)
    return y


def batch_stats(x):
    xs = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)
    mean = np.array([row.sum() / row.size for row in xs])
    var = np.array([((row - m) ** 2).sum() / row.size for row, m in zip(xs, mean)])
    return mean, var, xs.shape[1]


SHAPES = [(4, 3), (2, 3, 4, 5), (3, 2, 1, 1), (2, 4, 6)]


@pytest.mark.parametrize("shape", SHAPES)
def test_train_forward_and_running_sums(shape):
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal(shape) * 2 + 1
    x2 = rng.standard_normal(shape) - 3
    layer, bottom, top = make_layer(param("batch_norm_param { moving_average_fraction: 0.9 }"),
                                    [x1])
    assert [b.shape for b in layer.blobs] == [(shape[1],), (shape[1],), (1,)]
    layer.forward(bottom, top)
    m1, v1, m = batch_stats(x1)
    np.testing.assert_allclose(top[0].data, reference_normalize(x1, m1, v1), rtol=1e-10)
    maf = float(np.float32(0.9))
    correction = m / (m - 1)
    np.testing.assert_allclose(layer.blobs[2].data, [1.0])
    np.testing.assert_allclose(layer.blobs[0].data, m1)
    np.testing.assert_allclose(layer.blobs[1].data, v1 * correction)
    bottom[0].data[...] = x2
    layer.forward(bottom, top)
    m2, v2, _ = batch_stats(x2)
    np.testing.assert_allclose(layer.blobs[2].data, [maf + 1])
    np.testing.assert_allclose(layer.blobs[0].data, m2 + maf * m1)
    np.testing.assert_allclose(layer.blobs[1].data, v2 * correction + maf * v1 * correction)


@pytest.mark.parametrize("shape", SHAPES)
def test_global_stats_divide_by_factor(shape):
    c = shape[1]
    x = np.random.default_rng(1).standard_normal(shape)
    layer, bottom, top = make_layer(param(), [x], phase=TEST)
    assert layer.use_global_stats
    layer.blobs[0].data[...] = np.arange(c) * 2.0
    layer.blobs[1].data[...] = np.arange(c) + 4.0
    layer.blobs[2].data[...] = 2.0
    layer.forward(bottom, top)
    expected = reference_normalize(x, np.arange(c) * 1.0, (np.arange(c) + 4.0) / 2)
    np.testing.assert_allclose(top[0].data, expected, rtol=1e-10)
    # The statistics do not move in global mode.
    np.testing.assert_allclose(layer.blobs[2].data, [2.0])


def test_zero_factor_gives_zero_statistics():
    x = np.random.default_rng(2).standard_normal((2, 3, 2, 2))
    layer, bottom, top = make_layer(param(), [x], phase=TEST)
    layer.blobs[0].data[...] = 5.0
    layer.blobs[1].data[...] = 7.0
    layer.forward(bottom, top)
    np.testing.assert_allclose(top[0].data, x / np.sqrt(EPS))


@pytest.mark.parametrize("phase,flag,expected", [
    (TRAIN, None, False), (TEST, None, True), (TRAIN, True, True), (TEST, False, False)])
def test_use_global_stats_default_and_override(phase, flag, expected):
    text = "" if flag is None else f"batch_norm_param {{ use_global_stats: {str(flag).lower()} }}"
    layer, _, _ = make_layer(param(text), [(2, 3)], phase=phase)
    assert layer.use_global_stats is expected


def test_eps_is_used():
    x = np.random.default_rng(3).standard_normal((5, 2))
    layer, bottom, top = make_layer(param("batch_norm_param { eps: 0.5 }"), [x])
    layer.forward(bottom, top)
    mean, var, _ = batch_stats(x)
    np.testing.assert_allclose(top[0].data, reference_normalize(x, mean, var, eps=0.5))


def test_param_specs_are_pinned_to_zero_lr():
    layer, _, _ = make_layer(param(), [(2, 3)])
    specs = layer.param.param
    assert len(specs) == 3
    assert all(s.lr_mult == 0 and s.decay_mult == 0 for s in specs)
    assert layer.param_propagate_down == [False, False, False]
    layer, _, _ = make_layer(param("param { lr_mult: 0 }"), [(2, 3)])
    assert [s.lr_mult for s in layer.param.param] == [0, 0, 0]


def test_learnable_statistics_are_rejected():
    with pytest.raises(LayerError, match=r"'bn'.*lr_mult"):
        make_layer(param("param { lr_mult: 0 } param { lr_mult: 1 }"), [(2, 3)])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_gradients(shape, phase):
    x = np.random.default_rng(4).standard_normal(shape)
    layer, bottom, top = make_layer(param(), [x], phase=phase)
    if phase == TEST:
        layer.blobs[0].data[...] = np.linspace(-1, 1, shape[1])
        layer.blobs[1].data[...] = np.linspace(0.5, 2, shape[1])
        layer.blobs[2].data[...] = 1.5
    check_layer_gradients(layer, bottom, top, max_checks=40)


@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_in_place_matches_out_of_place(phase):
    shape = (3, 2, 2, 3)
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    results = []
    for in_place in (False, True):
        ctx = LayerContext(phase=phase, dtype=np.float64, rules=_RULES[0])
        layer = create_layer(param(), ctx)
        bottom = Blob(shape, dtype=np.float64)
        bottom.data[...] = x
        top = bottom if in_place else Blob((), dtype=np.float64)
        layer.setup([bottom], [top])
        layer.blobs[2].data[...] = 1.0
        layer.blobs[1].data[...] = 2.0
        layer.forward([bottom], [top])
        y = top.data.copy()
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        results.append((y, bottom.diff.copy()))
    np.testing.assert_allclose(results[1][0], results[0][0])
    np.testing.assert_allclose(results[1][1], results[0][1])


def test_channel_mismatch_on_reshape():
    layer, bottom, top = make_layer(param(), [(2, 3, 2, 2)])
    bottom[0].reshape((2, 4, 2, 2))
    with pytest.raises(LayerError, match="channels"):
        layer.reshape(bottom, top)


def float32_layer(shape, phase=TRAIN, runner=None):
    layer = create_layer(param(), LayerContext(phase=phase, dtype=np.float32, rules=_RULES[0]))
    if runner is not None:
        layer.ctx.chunk_runner = runner
    bottom, top = Blob(shape, dtype=np.float32), Blob((), dtype=np.float32)
    layer.setup([bottom], [top])
    return layer, bottom, top


def test_float32_statistics_of_offset_data_are_float64_exact(way):
    """Values 1000 + N(0, 0.01): the loops' statistics are float64 (the mean and variance
    to float32's rounding of the exact ones); numpy's float32 passes are looser."""
    shape = (4, 3, 9, 11)
    x = (1000 + 0.01 * np.random.default_rng(6).standard_normal(shape)).astype(np.float32)
    layer, bottom, top = float32_layer(shape)
    bottom.data[...] = x
    layer.forward([bottom], [top])
    mean, var, m = batch_stats(x.astype(np.float64))
    np.testing.assert_allclose(layer.blobs[0].data, mean, rtol=1e-7)
    rtol = 1e-6 if way == "loops" else 1e-2
    np.testing.assert_allclose(layer.blobs[1].data, var * m / (m - 1), rtol=rtol)


@pytest.mark.parametrize("shape", [(4, 3, 7, 9), (5, 6)])
def test_float32_forward_and_backward_repeat_on_any_thread_count(shape, way):
    """Each row is summed by one thread: 1 and 3 chunk threads give the same bits, and the
    results match a float64 reference."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    results = []
    for threads in (1, 3):
        runner = ChunkRunner(threads, chunk_elements=8, serial_below=1, adaptive=False)
        layer, bottom, top = float32_layer(shape, runner=runner)
        bottom.data[...] = x
        layer.forward([bottom], [top])
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        results.append((top.data.copy(), bottom.diff.copy(), layer.blobs[1].data.copy()))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    mean, var, m = batch_stats(x.astype(np.float64))
    y = reference_normalize(x.astype(np.float64), mean, var)
    axes = (0,) + tuple(range(2, len(shape)))
    std = np.sqrt(var + EPS).reshape((1, -1) + (1,) * (len(shape) - 2))
    d64 = dy.astype(np.float64)
    dx = (d64 - d64.mean(axis=axes, keepdims=True)
          - (d64 * y).mean(axis=axes, keepdims=True) * y) / std
    np.testing.assert_allclose(results[0][0], y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(results[0][1], dx, rtol=1e-4, atol=1e-4)


def test_the_loops_keep_no_work_buffer(way):
    """numpy's passes allocate an input-sized work buffer on first use; the row loops never
    do, and a layer set up for one path runs the other when switched (the same results)."""
    shape = (2, 3, 4, 4)
    layer, bottom, top = float32_layer(shape)
    x = np.random.default_rng(8).standard_normal(shape)
    results = []
    for _ in range(2):
        bottom.data[...] = x
        layer.forward([bottom], [top])
        top.diff[...] = np.linspace(-1, 1, top.count).reshape(shape)
        layer.backward([top], [True], [bottom])
        results.append((top.data.copy(), bottom.diff.copy()))
        if len(results) == 1:
            assert (layer._scratch is None) == (way == "loops")
            other = rules_for("numpy" if way == "loops" else "loops").batch_norm
            layer.choice = choose_batch_norm("float32", target_for(np), other)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

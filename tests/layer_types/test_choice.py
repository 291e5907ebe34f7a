"""The path choices of Convolution, Deconvolution, Pooling, LRN, BatchNorm, Scale,
InnerProduct and SoftmaxWithLoss as tables: geometry, target and
rules in, a path name out. Rows are the benchmark nets' own layers; each comment says which
rule (choice/convolution.py, choice/pooling.py) decides the row."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mgcaffe.errors import LayerError
from mgcaffe.layer_types.choice import LOOPS, Choice, Target, cpu_with
from mgcaffe.layer_types.choice.convolution import (
    ConvGeometry,
    ConvolutionRules,
    choose_convolution,
    choose_deconvolution,
)
from mgcaffe.layer_types.choice.inner_product import InnerProductRules, choose_inner_product
from mgcaffe.layer_types.choice.normalization import (
    BatchNormRules,
    LRNRules,
    ScaleRules,
    choose_batch_norm,
    choose_lrn,
    choose_scale,
)
from mgcaffe.layer_types.choice.pooling import PoolingGeometry, PoolingRules, choose_pooling
from mgcaffe.layer_types.choice.rules import LayerRules
from mgcaffe.layer_types.choice.softmax_loss import SoftmaxLossRules, choose_softmax_loss

LOADED = cpu_with(*LOOPS)   # numba importable: every compiled loop set loads
BARE = cpu_with()           # no numba, no direct BLAS call
GPU = Target(gpu=True)


def conv(num, channels, outputs, kernel, in_hw, pad=0, stride=1, group=1, dilation=1,
         dtype="float32"):
    """A 2-D (or N-D, by len(in_hw)) convolution's geometry, Caffe's output size."""
    axes = len(in_hw)
    kernel, pad, stride, dilation = ((v,) * axes if isinstance(v, int) else v
                                     for v in (kernel, pad, stride, dilation))
    out = tuple((s + 2 * p - (d * (k - 1) + 1)) // st + 1
                for s, k, p, st, d in zip(in_hw, kernel, pad, stride, dilation))
    return ConvGeometry(num, channels, outputs, group, kernel, pad, stride, dilation,
                        tuple(in_hw), out, dtype)


DEFAULT = ConvolutionRules()
GPU_ARRAYS = replace(DEFAULT, gpu_kernels=False)  # a GPU without the CUDA im2col/col2im
CONVOLUTIONS = [
    # LeNet b64 conv1: 25 column rows (<= 32), 24x24 outputs (>= 256): per sample
    ("lenet conv1", conv(64, 1, 20, 5, (28, 28)), LOADED, DEFAULT, "im2col-per-sample"),
    # LeNet conv2: 8x8 outputs (<= 256): batch last
    ("lenet conv2", conv(64, 20, 50, 5, (12, 12)), LOADED, DEFAULT, "im2col-batch-last"),
    # CIFAR-10 quick b100 conv1: columns 3*25*1024*4 B = 300 KB a sample (<= 4 MB), 30 MB
    # the batch (>= 24 MB): per-sample columns
    ("cifar conv1", conv(100, 3, 32, 5, (32, 32), pad=2), LOADED, DEFAULT, "sample-columns"),
    # ... without the compiled loops: 1024 positions, 75 rows: whole batch
    ("cifar conv1 bare", conv(100, 3, 32, 5, (32, 32), pad=2), BARE, DEFAULT,
     "im2col-whole-batch"),
    ("cifar conv1 rule off", conv(100, 3, 32, 5, (32, 32), pad=2), LOADED,
     replace(DEFAULT, sample_columns=False), "im2col-whole-batch"),
    # CIFAR-10 conv3: 8x8, 6.5 MFLOP a sample (< 16), 20 MB of columns (< 24): batch last
    ("cifar conv3", conv(100, 32, 64, 5, (8, 8), pad=2), LOADED, DEFAULT, "im2col-batch-last"),
    # AlexNet b8 conv1: 55x55 = 3025 positions (>= 2048): per sample
    ("alexnet conv1", conv(8, 3, 96, 11, (227, 227), stride=4), LOADED, DEFAULT,
     "im2col-per-sample"),
    # AlexNet conv2: 27x27 = 729 positions, 5x5 (no Winograd), 48 channels a group
    ("alexnet conv2", conv(8, 96, 256, 5, (27, 27), pad=2, group=2), LOADED, DEFAULT,
     "im2col-whole-batch"),
    # AlexNet conv3: 13x13 = 169 in the compiled rule's [169, 3200), 392 tiles (>= 196), 196
    # computed per 169 kept (<= 1.2); 4x4 tiles would compute 256 (> 1.1): F(2x2)
    ("alexnet conv3", conv(8, 256, 384, 3, (13, 13), pad=1), LOADED, DEFAULT, "winograd-f2"),
    # ... with the numpy transforms the rule starts at 512 positions: batch last
    ("alexnet conv3 bare", conv(8, 256, 384, 3, (13, 13), pad=1), BARE, DEFAULT,
     "im2col-batch-last"),
    ("alexnet conv3 rule off", conv(8, 256, 384, 3, (13, 13), pad=1), LOADED,
     replace(DEFAULT, winograd=False), "im2col-batch-last"),
    # GoogleNet b8 conv2/3x3: 56x56, whole 4x4 tiles (waste 1.0): F(4x4)
    ("googlenet conv2/3x3", conv(8, 64, 192, 3, (56, 56), pad=1), LOADED, DEFAULT,
     "winograd-f4"),
    # inception_3a/3x3 without loops: 784 positions in the numpy rule's [512, 2048): F(2x2)
    ("inception_3a/3x3 bare", conv(8, 96, 128, 3, (28, 28), pad=1), BARE, DEFAULT,
     "winograd-f2"),
    # inception_3a/5x5: 16 channels, 20 MFLOP a sample (>= 16): per-sample columns
    ("inception_3a/5x5", conv(8, 16, 32, 5, (28, 28), pad=2), LOADED, DEFAULT,
     "sample-columns"),
    # inception_4a/5x5: 14x14, 7.5 MFLOP (< 16), 2.5 MB of columns (< 24): batch last
    ("inception_4a/5x5", conv(8, 16, 48, 5, (14, 14), pad=2), LOADED, DEFAULT,
     "im2col-batch-last"),
    # 1x1 with 56x56 or 28x28 outputs (>= 196): direct, strided or not
    ("conv2/3x3_reduce", conv(8, 64, 64, 1, (56, 56)), LOADED, DEFAULT, "direct"),
    ("res3a_branch1 1x1/2", conv(4, 256, 512, 1, (56, 56), stride=2), LOADED, DEFAULT,
     "direct"),
    # 1x1 with 7x7 or 4x4 outputs (< 196): batch last
    ("res5a_branch1 1x1/2", conv(4, 1024, 2048, 1, (14, 14), stride=2), LOADED, DEFAULT,
     "im2col-batch-last"),
    ("loss1/conv", conv(8, 512, 128, 1, (4, 4)), LOADED, DEFAULT, "im2col-batch-last"),
    # ResNet-50 res5a_branch2b: 7x7 (< 169): no Winograd
    ("res5a_branch2b", conv(4, 512, 512, 3, (7, 7), pad=1), LOADED, DEFAULT,
     "im2col-batch-last"),
    # The shifted GEMMs are off by default; by their rule: a 28x28 plane, 32 channels, full
    # output 8*30*30 = 7200 (>= 6000), waste 1.15 (Winograd yields to the opted-in rule)
    ("shift rule", conv(8, 32, 4, 3, (28, 28), pad=1), LOADED,
     replace(DEFAULT, shift_gemm=None), "shift"),
    ("shift default", conv(8, 32, 4, 3, (28, 28), pad=1), LOADED, DEFAULT, "winograd-f4"),
    ("shift forced strided", conv(1, 2, 2, 3, (7, 7), stride=2), LOADED,
     replace(DEFAULT, shift_gemm=True), "im2col-batch-last"),
    # Other counts of spatial axes
    ("3-D", conv(2, 3, 4, 3, (6, 7, 5), pad=1), LOADED, DEFAULT, "nd"),
    ("1-D", conv(2, 3, 4, 3, (9,)), LOADED, DEFAULT, "nd"),
    # The GPU: CUDA im2col/col2im and one GEMM per group, any 1x1 kernel direct ...
    ("gpu 1x1", conv(8, 64, 64, 1, (56, 56)), GPU, DEFAULT, "gpu-direct"),
    ("gpu 1x1 small plane", conv(64, 832, 384, 1, (7, 7)), GPU, DEFAULT, "gpu-direct"),
    ("gpu alexnet conv1", conv(8, 3, 96, 11, (227, 227), stride=4), GPU, DEFAULT,
     "gpu-im2col-cuda"),
    ("gpu cifar conv1", conv(100, 3, 32, 5, (32, 32), pad=2), GPU,
     replace(DEFAULT, sample_columns=True, winograd=True), "gpu-im2col-cuda"),
    ("gpu float16", conv(8, 96, 256, 5, (27, 27), pad=2, group=2, dtype="float16"), GPU,
     DEFAULT, "gpu-im2col-whole-batch"),
    # ... and with the kernels off, the CPU's size rules under the GPU's names
    ("gpu arrays 1x1 small plane", conv(64, 832, 384, 1, (7, 7)), GPU, GPU_ARRAYS,
     "gpu-im2col-batch-last"),
    ("gpu arrays alexnet conv1", conv(8, 3, 96, 11, (227, 227), stride=4), GPU, GPU_ARRAYS,
     "gpu-im2col-per-sample"),
    ("gpu arrays alexnet conv2", conv(8, 96, 256, 5, (27, 27), pad=2, group=2), GPU,
     GPU_ARRAYS, "gpu-im2col-whole-batch"),
    ("gpu arrays alexnet conv3", conv(8, 256, 384, 3, (13, 13), pad=1), GPU, GPU_ARRAYS,
     "gpu-im2col-batch-last"),
    ("gpu 3-D", conv(2, 3, 4, 3, (6, 7, 5), pad=1), GPU, DEFAULT, "gpu-nd"),
]


@pytest.mark.parametrize("name, geometry, target, rules, path", CONVOLUTIONS,
                         ids=[row[0] for row in CONVOLUTIONS])
def test_convolution_table(name, geometry, target, rules, path):
    choice = choose_convolution(geometry, target, rules)
    assert choice.path == path, str(choice)
    assert choice.reason


def test_the_winograd_tile_is_an_option_and_forcing_f4_needs_its_loops():
    g = conv(8, 64, 192, 3, (56, 56), pad=1)
    assert choose_convolution(g, LOADED, DEFAULT).option("tile") == 4
    forced = replace(DEFAULT, winograd_tile=2)
    assert choose_convolution(g, LOADED, forced).path == "winograd-f2"
    only_f2 = cpu_with("winograd-f2")
    assert choose_convolution(g, only_f2, DEFAULT).path == "winograd-f2"
    with pytest.raises(LayerError, match="winograd_tile 4 needs the compiled"):
        choose_convolution(g, only_f2, replace(DEFAULT, winograd_tile=4))


@pytest.mark.parametrize("outputs, channels, kernel, rules, expected", [
    (8, 4, 1, DEFAULT, True),        # 8 x 4: at least as many rows as columns
    (4, 8, 1, DEFAULT, False),       # 4 x 8, 32 elements (< 2^18)
    (512, 512, 3, DEFAULT, True),    # 512 x 4608 = 2.4M elements (>= 2^18)
    (8, 4, 1, replace(DEFAULT, weight_diff_in_gemm=False), False),
])
def test_the_weight_gradient_in_the_gemm_is_an_option(outputs, channels, kernel, rules,
                                                      expected):
    g = conv(2, channels, outputs, kernel, (9, 9))
    assert choose_convolution(g, LOADED, rules).option("weight_diff_in_gemm") is expected
    assert choose_convolution(g, GPU, rules).option("weight_diff_in_gemm") is False


def test_deconvolution_paths():
    g = conv(2, 4, 3, 3, (5, 5))
    assert choose_deconvolution(g, LOADED, DEFAULT).path == "col2im"
    assert choose_deconvolution(g, GPU, DEFAULT).path == "gpu-col2im"
    assert choose_deconvolution(g, GPU, DEFAULT).option("cuda_kernels") is True
    assert choose_deconvolution(g, GPU, GPU_ARRAYS).option("cuda_kernels") is None
    assert choose_deconvolution(g, LOADED, DEFAULT).option("cuda_kernels") is None
    assert choose_deconvolution(conv(2, 4, 3, 3, (5, 5, 5)), LOADED, DEFAULT).path == "nd"


def test_loop_sets_are_asked_only_where_a_rule_needs_them():
    """Asking may import numba: a 1x1 or a few-channel 3x3 never asks for Winograd's."""
    asked = []
    target = Target(loops=lambda name: asked.append(name) or False)
    choose_convolution(conv(8, 64, 64, 1, (56, 56)), target, DEFAULT)
    assert asked == []
    choose_convolution(conv(8, 16, 16, 3, (28, 28), pad=1), target, DEFAULT)
    assert asked == ["sample-columns"]
    assert Target(gpu=True, loops=lambda name: pytest.fail(name)).has("pooling") is False


def test_a_choice_prints_its_path_reason_and_options():
    choice = choose_convolution(conv(8, 64, 192, 3, (56, 56), pad=1), LOADED, DEFAULT)
    assert str(choice).startswith("winograd-f4 (64 channels/group, 3136 positions")
    assert str(choice).endswith(", tile=4)")
    assert str(Choice("x", "why")) == "x (why)"
    with pytest.raises(ValueError, match="unknown loop sets"):
        cpu_with("no-such-loops")


def pool(method, in_hw, kernel, stride=1, pad=0, out=None):
    if out is None:
        out = tuple(-(-(s + 2 * pad - kernel) // stride) + 1 for s in in_hw)
    return PoolingGeometry(method, tuple(in_hw), tuple(out), (kernel, kernel), (pad, pad))


POOL_DEFAULT = PoolingRules()
POOLINGS = [
    # LeNet pool1: MAX 2/2 on 24x24: the compiled loops where they load
    ("lenet pool1", pool("MAX", (24, 24), 2, 2), LOADED, POOL_DEFAULT, "compiled-loops"),
    ("lenet pool1 bare", pool("MAX", (24, 24), 2, 2), BARE, POOL_DEFAULT, "offset-passes"),
    ("lenet pool1 loops off", pool("MAX", (24, 24), 2, 2), LOADED,
     replace(POOL_DEFAULT, compiled=False), "offset-passes"),
    # CIFAR-10 pool3: AVE 3/2 on 8x8: 64 x 16 cells (<= 65536): one GEMM
    ("cifar pool3", pool("AVE", (8, 8), 3, 2), LOADED, POOL_DEFAULT, "window-gemm"),
    ("cifar pool3 gemm off", pool("AVE", (8, 8), 3, 2), BARE,
     replace(POOL_DEFAULT, ave_gemm_below=0), "offset-passes"),
    # AVE on 56x56: 3136 x 784 cells: loops or passes
    ("ave 56x56", pool("AVE", (56, 56), 3, 2), LOADED, POOL_DEFAULT, "compiled-loops"),
    # GoogleNet pool5: AVE over the whole 7x7 plane: a reduction; MAX leaves it to the loops
    ("googlenet pool5", pool("AVE", (7, 7), 7), LOADED, POOL_DEFAULT, "whole-plane"),
    ("global max", pool("MAX", (7, 7), 7), LOADED, POOL_DEFAULT, "compiled-loops"),
    ("global max bare", pool("MAX", (7, 7), 7), BARE, POOL_DEFAULT, "whole-plane"),
    ("stochastic", pool("STOCHASTIC", (8, 8), 3, 2), LOADED, POOL_DEFAULT, "stochastic"),
    # The GPU: its own names; no window GEMM, no loops; MAX and AVE as CUDA kernels
    ("gpu cifar pool3", pool("AVE", (8, 8), 3, 2), GPU, POOL_DEFAULT, "gpu-cuda-kernels"),
    ("gpu lenet pool1", pool("MAX", (24, 24), 2, 2), GPU, POOL_DEFAULT, "gpu-cuda-kernels"),
    ("gpu kernels off", pool("MAX", (24, 24), 2, 2), GPU,
     replace(POOL_DEFAULT, gpu_kernels=False), "gpu-offset-passes"),
    ("gpu float16", replace(pool("AVE", (8, 8), 3, 2), dtype="float16"), GPU, POOL_DEFAULT,
     "gpu-offset-passes"),
    ("gpu global max", pool("MAX", (7, 7), 7), GPU, POOL_DEFAULT, "gpu-whole-plane"),
    ("gpu stochastic", pool("STOCHASTIC", (8, 8), 3, 2), GPU, POOL_DEFAULT, "gpu-stochastic"),
]


@pytest.mark.parametrize("name, geometry, target, rules, path", POOLINGS,
                         ids=[row[0] for row in POOLINGS])
def test_pooling_table(name, geometry, target, rules, path):
    assert choose_pooling(geometry, target, rules).path == path


def test_max_backward_by_index_is_an_option_of_the_offset_passes():
    g = pool("MAX", (24, 24), 2, 2)
    assert choose_pooling(g, BARE, POOL_DEFAULT).option("max_backward") == "index-scatter"
    gather = replace(POOL_DEFAULT, max_backward_by_index=False)
    assert choose_pooling(g, BARE, gather).option("max_backward") == "gather"


def test_the_environment_switches_turn_the_pooling_loops_off():
    assert LayerRules.from_environment({}) == LayerRules()
    off = LayerRules.from_environment({"MGCAFFE_POOLING_LOOPS": "0"})
    assert off.pooling.compiled is False and off.convolution == ConvolutionRules()
    assert LayerRules.from_environment({"MGCAFFE_POOLING_LOOPS": "1"}).pooling.compiled


def test_gpu_kernel_choices_cover_exactly_the_types_the_kernels_compile_for():
    # the choice module cannot import the kernels' dtype table (no array backend there):
    # this holds the two lists equal, so a new kernel type is chosen as soon as it compiles
    from mgcaffe.kernels.cuda import im2col_pool as cuda_kernels
    from mgcaffe.layer_types.choice import CUDA_KERNEL_TYPES

    compiled = sorted(str(d) for d in cuda_kernels.REAL_TYPES)
    assert sorted(CUDA_KERNEL_TYPES) == compiled
    assert [choose_softmax_loss(1, False, t, GPU, SoftmaxLossRules()).path
            for t in ("float32", "float64", "float16")] == \
        ["gpu-cuda-kernels", "gpu-cuda-kernels", "gpu-array-code"]


# LRN, BatchNorm, Scale, InnerProduct, SoftmaxWithLoss: each row's expected path is what the
# layers' conditions said before these choices existed (compiled loops where they load and
# the rule allows them, numpy passes otherwise, the device's own name on a GPU).

LRN_OFF = LRNRules(compiled=False)

LRNS = [
    ("AlexNet norm1 across", True, "float32", LOADED, LRNRules(), "compiled-loops"),
    ("across, no numba", True, "float32", BARE, LRNRules(), "passes"),
    ("across, MGCAFFE_LRN_LOOPS=0", True, "float32", LOADED, LRN_OFF, "passes"),
    ("within channel", False, "float32", LOADED, LRNRules(), "passes"),
    ("across on a GPU", True, "float32", GPU, LRNRules(), "gpu-cuda-kernels"),
    ("across on a GPU, float64", True, "float64", GPU, LRN_OFF, "gpu-cuda-kernels"),
    ("across on a GPU, float16: no kernel", True, "float16", GPU, LRNRules(), "gpu-passes"),
    ("within channel on a GPU", False, "float32", GPU, LRNRules(), "gpu-passes"),
]


@pytest.mark.parametrize("name, across, dtype, target, rules, path", LRNS,
                         ids=[r[0] for r in LRNS])
def test_lrn_table(name, across, dtype, target, rules, path):
    assert choose_lrn(across, dtype, target, rules).path == path


BATCH_NORMS = [
    ("ResNet bn float32", "float32", LOADED, BatchNormRules(), "compiled-rows"),
    ("float64", "float64", LOADED, BatchNormRules(), "compiled-rows"),
    ("float16: the loops take float32/64", "float16", LOADED, BatchNormRules(), "passes"),
    ("Scale's loops missing", "float32", cpu_with("batch-norm"), BatchNormRules(), "passes"),
    ("no numba", "float32", BARE, BatchNormRules(), "passes"),
    ("loops off", "float32", LOADED, BatchNormRules(compiled_loops=False), "passes"),
    ("GPU", "float32", GPU, BatchNormRules(), "gpu-cuda-kernels"),
    ("GPU float64", "float64", GPU, BatchNormRules(), "gpu-cuda-kernels"),
    ("GPU float16: no kernel", "float16", GPU, BatchNormRules(), "gpu-passes"),
]


@pytest.mark.parametrize("name, dtype, target, rules, path", BATCH_NORMS,
                         ids=[r[0] for r in BATCH_NORMS])
def test_batch_norm_table(name, dtype, target, rules, path):
    assert choose_batch_norm(dtype, target, rules).path == path


SCALES = [
    ("ResNet res2 56x56, loops", 56 * 56, "float32", LOADED, ScaleRules(), "compiled-rows"),
    ("ResNet res5 7x7, loops", 7 * 7, "float64", LOADED, ScaleRules(), "compiled-rows"),
    ("56x56 without numba", 56 * 56, "float32", BARE, ScaleRules(), "row-blocks"),
    ("rows of exactly 1024", 1024, "float32", BARE, ScaleRules(), "row-blocks"),
    ("rows of 1023", 1023, "float32", BARE, ScaleRules(), "row-blocks-backward"),
    ("7x7 without numba", 49, "float32", BARE, ScaleRules(), "row-blocks-backward"),
    ("float16: blocks, no loops", 56 * 56, "float16", LOADED, ScaleRules(), "row-blocks"),
    ("loops off", 56 * 56, "float32", LOADED, ScaleRules(compiled_loops=False), "row-blocks"),
    ("int32 blobs", 56 * 56, "int32", LOADED, ScaleRules(), "whole-array"),
    ("row blocks off", 56 * 56, "float32", LOADED, ScaleRules(fused_rows=False),
     "whole-array"),
    ("GPU", 56 * 56, "float32", GPU, ScaleRules(), "gpu-cuda-kernels"),
    ("GPU float64", 49, "float64", GPU, ScaleRules(), "gpu-cuda-kernels"),
    ("GPU float16: no kernel", 56 * 56, "float16", GPU, ScaleRules(), "gpu-whole-array"),
]


@pytest.mark.parametrize("name, inner, dtype, target, rules, path", SCALES,
                         ids=[r[0] for r in SCALES])
def test_scale_table(name, inner, dtype, target, rules, path):
    assert choose_scale(inner, dtype, target, rules).path == path


IP = InnerProductRules()
INNER_PRODUCTS = [
    # (name, rows, outputs, transpose, target, rules, path, forward, weight_grad, input_grad)
    ("AlexNet fc6 b8", 8, 4096, False, LOADED, IP, "small-batch", "weight-major", "blocks",
     "row-blocks"),
    ("fc8 stored transposed b8", 8, 1000, True, BARE, IP, "small-batch", "batch-major",
     "blocks", "one-call"),
    ("16 rows into 63 (< 4x)", 16, 63, False, LOADED, IP, "small-batch", "batch-major",
     "blocks", "one-call"),
    ("16 rows into 64 (4x)", 16, 64, False, LOADED, IP, "small-batch", "weight-major",
     "blocks", "one-call"),
    ("2 rows into 65", 2, 65, False, LOADED, IP, "small-batch", "weight-major", "blocks",
     "row-blocks"),
    ("LeNet ip1 b64", 64, 500, False, LOADED, IP, "gemm", None, None, None),
    ("17 rows", 17, 4096, False, LOADED, IP, "gemm", None, None, None),
    ("small batches off", 8, 4096, False, LOADED, InnerProductRules(weight_major_upto=0),
     "gemm", None, None, None),
    ("weight blocks off", 8, 4096, False, LOADED,
     InnerProductRules(overwrite_block_elements=0, dx_block_rows=0), "small-batch",
     "weight-major", "one-call", "one-call"),
    ("GPU", 8, 4096, False, GPU, IP, "gpu-gemm", None, None, None),
]


@pytest.mark.parametrize("name, rows, outputs, transpose, target, rules, path, forward, "
                         "weight_grad, input_grad", INNER_PRODUCTS,
                         ids=[r[0] for r in INNER_PRODUCTS])
def test_inner_product_table(name, rows, outputs, transpose, target, rules, path, forward,
                             weight_grad, input_grad):
    choice = choose_inner_product(rows, outputs, transpose, target, rules)
    assert choice.path == path
    assert (choice.option("forward"), choice.option("weight_grad"),
            choice.option("input_grad")) == (forward, weight_grad, input_grad)


SOFTMAX_LOSSES = [
    ("LeNet loss", 1, False, "float32", LOADED, SoftmaxLossRules(), "plain"),
    ("ignore_label", 1, True, "float32", LOADED, SoftmaxLossRules(), "general"),
    ("FCN: 4 predictions a sample", 4, False, "float32", LOADED, SoftmaxLossRules(), "general"),
    ("plain path off", 1, False, "float32", LOADED, SoftmaxLossRules(plain_path=False),
     "general"),
    ("float16 on the CPU", 1, False, "float16", LOADED, SoftmaxLossRules(), "plain"),
    ("GPU float32", 1, True, "float32", GPU, SoftmaxLossRules(), "gpu-cuda-kernels"),
    ("GPU float16: no kernel", 4, False, "float16", GPU, SoftmaxLossRules(),
     "gpu-array-code"),
]


@pytest.mark.parametrize("name, inner, ignore, dtype, target, rules, path", SOFTMAX_LOSSES,
                         ids=[r[0] for r in SOFTMAX_LOSSES])
def test_softmax_loss_table(name, inner, ignore, dtype, target, rules, path):
    assert choose_softmax_loss(inner, ignore, dtype, target, rules).path == path


def test_the_environment_switches_turn_the_lrn_loops_off():
    off = LayerRules.from_environment({"MGCAFFE_LRN_LOOPS": "0"})
    assert off.lrn == LRN_OFF and off.pooling == PoolingRules()
    assert LayerRules.from_environment({}).lrn.compiled


def test_the_layers_keep_and_print_their_choice():
    """The choice a layer makes in setup/reshape is the table's, and shows in its repr."""
    from google.protobuf import text_format
    from gradient_check import make_layer

    from mgcaffe.proto import caffe_pb2

    def layer(text, shapes, rules=None, top_count=None):
        param = text_format.Parse(f'name: "l" {text}', caffe_pb2.LayerParameter())
        return make_layer(param, shapes, dtype=np.float32, rules=rules,
                          top_count=top_count)[0]

    lrn = layer('type: "LRN" lrn_param { local_size: 5 }', [(2, 8, 4, 4)],
                LayerRules(lrn=LRN_OFF))
    assert lrn.choice.path == "passes" and "path=passes" in repr(lrn)
    ip = layer('type: "InnerProduct" inner_product_param { num_output: 40 }', [(8, 12)])
    assert ip.choice == choose_inner_product(8, 40, False, Target(), IP)
    assert "path=small-batch" in repr(ip)
    scale = layer('type: "Scale"', [(2, 3, 4, 4)], LayerRules(scale=ScaleRules(
        compiled_loops=False)))
    assert scale.choice.path == "row-blocks-backward"
    bn = layer('type: "BatchNorm"', [(2, 3, 4, 4)],
               LayerRules(batch_norm=BatchNormRules(compiled_loops=False)))
    assert bn.choice.path == "passes" and bn.loops() is None
    loss = layer('type: "SoftmaxWithLoss"', [(4, 3), np.zeros(4, np.float32)], top_count=1)
    assert loss.choice.path == "plain"

"""`make gpu-check`: everything issue 6 asks to verify on a GPU, in one run of under 8 minutes.

    python tools/gpu_check.py --out gpu-check-results.json [--gpu 0] [--budget 450]
                              [--sections layers,kernels,...] [--dry-run] [--in-process]

Sections (each in its own child process with its own time limit, so a failure, a hang or a
sticky CUDA error in one is recorded and the others still run):

  gemm              a large float32 cuBLAS GEMM (8192^3): the achievable TFLOP/s
  timing-googlenet  mgcaffe GoogleNet (batch 64) fwd+bwd ms/iteration, and the TFLOP/s its
                    Convolution + InnerProduct layers achieve (CUDA-event layer timing)
  timing-resnet50   the same for ResNet-50 (batch 32)
  torch             PyTorch's fwd+bwd ms/iteration for torchvision's googlenet and resnet50
                    on the same GPU (skipped when torch/torchvision are not importable)
  layers            every registered layer type, forward and backward on the GPU against
                    the CPU with the same inputs and weights (LAYER_CASES below)
  kernels           the CUDA twins (mgcaffe.kernels.cuda) against the generic
                    kernels / the Pooling layer, with their speed-up
  nccl              the NCCL communicator with one rank: all-reduce, the event/stream path,
                    broadcast
  digits            the digits demo (tools/convert_digits.py, models/digits) trained on the GPU

float32 everywhere and TF32 off on both sides: CUPY_TF32=0 (CuPy's switch, read when CuPy is
imported), NVIDIA_TF32_OVERRIDE=0 (every NVIDIA library), and torch's allow_tf32 flags.

Results: a JSON file (--out) with every section's status and numbers, the targets of issue 6
(GoogleNet and ResNet-50 within 2x of PyTorch; conv+ip at >= 50% of the GEMM rate), and a
table on stdout. Exit status: 0 when every section passed or was skipped, 1 when one failed
(missed performance targets are reported, not failed, unless --strict-targets), 2 when no GPU
is usable (nothing is run; the JSON says why).

--dry-run runs the same code on the CPU with tiny sizes (numpy stands in for CuPy; the
CUDA-only sections are skipped): the CPU tests use it so that this script is known to work
before a GPU session spends its time on it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

#: Every section, in the order they run; the first ones carry the issue's targets.
SECTIONS = ["gemm", "timing-googlenet", "timing-resnet50", "torch", "layers", "kernels",
            "nccl", "digits"]
#: Seconds each section may take on the H200 (its child is killed after that). They sum to
#: more than the default budget only because the slow ones rarely need their whole limit.
SECTION_LIMITS = {"gemm": 30, "timing-googlenet": 100, "timing-resnet50": 100, "torch": 70,
                  "layers": 100, "kernels": 45, "nccl": 30, "digits": 60}
DEFAULT_BUDGET_S = 450.0  # 7.5 minutes: inside the 8 the issue allows, with start-up slack
TF32_ENVIRONMENT = {"CUPY_TF32": "0", "NVIDIA_TF32_OVERRIDE": "0"}
#: Layer comparisons: |gpu - cpu| <= ATOL + RTOL * max|cpu| for every compared array.
RTOL, ATOL = 2e-4, 1e-6
MODELS = {  # name: (train_val prototxt, batch on the GPU, torchvision constructor)
    "googlenet": ("models/googlenet/train_val.prototxt", 64, "googlenet"),
    "resnet50": ("models/resnet50/train_val.prototxt", 32, "resnet50"),
}
DRY_RUN_BATCH = 2
#: Training iterations of the digits demo with --small (the solver's max_iter otherwise):
#: enough to pass the accuracy bar, few enough for the CPU.
SMALL_DIGITS_ITERATIONS = 100
#: The protobuf runtime mgcaffe/proto/caffe_pb2.py was generated for (it checks on import).
PROTOBUF_NEEDED = "7.35.1"


# ============================================================================ the run context
@dataclass
class Check:
    """Where a section runs: the array module (cupy, or numpy in a dry run) and its device;
    `small`: tiny sizes (a dry run, or the CuPy double's run), which exercise every line but
    time nothing worth reading."""

    xp: object
    device: object  # mgcaffe.backend.Device
    dry_run: bool
    deadline: float  # time.monotonic() value by which the section must have finished
    small: bool = False

    @property
    def on_gpu(self) -> bool:
        return self.xp is not np

    def sync(self) -> None:
        if self.on_gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def clock(self) -> Clock:
        return Clock(self.xp)


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU (no host synchronisation between
    marks), host time on the CPU. `seconds(a, b)` is valid after `finish()`."""

    def __init__(self, xp):
        self.xp = xp
        self._last = None

    def mark(self):
        if self.xp is np:
            return time.perf_counter()
        event = self.xp.cuda.Event()
        event.record()
        self._last = event
        return event

    def finish(self) -> None:
        if self._last is not None:
            self._last.synchronize()

    def seconds(self, a, b) -> float:
        if self.xp is np:
            return b - a
        return self.xp.cuda.get_elapsed_time(a, b) / 1e3


def make_check(gpu: int, dry_run: bool, limit: float, small: bool = False) -> Check:
    from mgcaffe.backend import CPU, Device

    device = CPU if dry_run else Device("gpu", gpu)
    return Check(device.xp, device, dry_run, time.monotonic() + limit, small or dry_run)


# ============================================================================ layer cases
@dataclass(frozen=True)
class LayerCase:
    """One layer to build on both devices: `text` is the LayerParameter body after name and
    type ("$TMP" stands for a scratch folder that `files` fills); `bottoms` holds shapes
    (standard normal values) or arrays; `random`: outputs depend on the device's random
    stream, so only shapes and finiteness are compared."""

    type: str
    text: str = ""
    bottoms: tuple = ()
    n_top: int = 1
    phase: str = "TRAIN"
    label: str = ""
    random: bool = False
    files: Callable[[Path], None] | None = None
    feed: Callable[[object], None] | None = None

    @property
    def id(self) -> str:
        return f"{self.type}/{self.label}" if self.label else self.type


X = (2, 3, 4, 5)
LABELS = np.array([0.0, 2.0])
GAUSS = 'weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.1 }'


def _lmdb_files(folder: Path) -> None:
    from mgcaffe.data.convert import write_lmdb
    from mgcaffe.data.datum import array_to_datum

    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, size=(4, 3, 6, 5), dtype=np.uint8)
    write_lmdb(folder / "lmdb", (array_to_datum(x, i) for i, x in enumerate(images)))


def _image_files(folder: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(6)
    lines = []
    for i in range(3):
        path = folder / f"image{i}.png"
        Image.fromarray(rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)).save(path)
        lines.append(f"{path.name} {i}")
    (folder / "images.txt").write_text("\n".join(lines) + "\n")


def _hdf5_files(folder: Path) -> None:
    import h5py

    rng = np.random.default_rng(7)
    with h5py.File(folder / "data.h5", "w") as f:
        f["data"] = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
        f["label"] = np.arange(4, dtype=np.float32)
    (folder / "hdf5.txt").write_text(f"{folder / 'data.h5'}\n")


def _window_files(folder: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(9)
    Image.fromarray(rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)).save(folder / "w.png")
    (folder / "windows.txt").write_text("# 0\nw.png\n3 8 8\n2\n1 0.9 1 1 6 5\n"
                                        "1 0.1 0 0 3 3\n")


_PYTHON_LAYER = """
import mgcaffe


class ChannelScale(mgcaffe.Layer):
    # top = w[c] * bottom, written with self.xp so that one body runs on numpy and CuPy.
    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].data.shape[1])
        self.blobs[0].data[...] = self.xp.arange(1, bottom[0].data.shape[1] + 1)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data.reshape(1, -1, 1, 1) * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(axis=(0, 2, 3))
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data.reshape(1, -1, 1, 1) * top[0].diff
"""


def _python_layer_files(folder: Path) -> None:
    (folder / "gpu_check_pylayer.py").write_text(_PYTHON_LAYER)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _memory_feed(layer) -> None:
    rng = np.random.default_rng(8)
    layer.set_input_arrays(rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
                           np.arange(4, dtype=np.float32))


LAYER_CASES: list[LayerCase] = [
    # neurons
    *[LayerCase(t, bottoms=(X,)) for t in
      ("ReLU", "PReLU", "ELU", "Sigmoid", "TanH", "AbsVal", "Exp", "BNLL", "Threshold",
       "Swish")],
    LayerCase("ReLU", "relu_param { negative_slope: 0.1 }", (X,), label="leaky"),
    LayerCase("Power", "power_param { power: 2 scale: 0.5 shift: 1 }", (X,)),
    LayerCase("Log", "log_param { shift: 10 }", (X,)),
    LayerCase("Clip", "clip_param { min: -1 max: 1 }", (X,)),
    LayerCase("Dropout", "", (X,), phase="TEST", label="test"),
    LayerCase("Dropout", "", (X,), label="train", random=True),
    # normalisation, scaling, element-wise
    LayerCase("BatchNorm", "", (X,)),
    LayerCase("BatchNorm", "batch_norm_param { use_global_stats: true }", (X,), label="global"),
    LayerCase("LRN", "lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }", ((2, 7, 4, 5),),
              label="across"),
    LayerCase("LRN", "lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 norm_region: "
              "WITHIN_CHANNEL }", (X,), label="within"),
    LayerCase("Scale", "scale_param { bias_term: true }", (X,)),
    LayerCase("Bias", "", (X, (3,))),
    LayerCase("Eltwise", "", (X, X, X)),
    LayerCase("Eltwise", "eltwise_param { operation: PROD }", (X, X), label="prod"),
    LayerCase("Eltwise", "eltwise_param { operation: MAX }", (X, X), label="max"),
    # convolution, pooling, inner product
    LayerCase("Convolution", f"convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 "
              f"stride: 2 {GAUSS} }}", ((2, 3, 9, 8),)),
    LayerCase("Convolution", 'convolution_param { num_output: 4 kernel_size: 3 group: 2 '
              'dilation: 2 pad: 2 weight_filler { type: "xavier" } }', ((2, 4, 9, 9),),
              label="group-dilation"),
    LayerCase("Convolution", f"convolution_param {{ num_output: 8 kernel_size: 1 {GAUSS} }}",
              ((2, 6, 5, 5),), label="1x1"),
    LayerCase("Deconvolution", f"convolution_param {{ num_output: 3 kernel_size: 3 stride: 2 "
              f"pad: 1 {GAUSS} }}", ((2, 4, 5, 5),)),
    LayerCase("Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 }",
              ((2, 3, 9, 9),), label="max"),
    LayerCase("Pooling", "pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }",
              ((2, 3, 8, 7),), n_top=2, label="max-mask-pad"),
    LayerCase("Pooling", "pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }",
              ((2, 3, 8, 7),), label="ave"),
    LayerCase("Pooling", "pooling_param { pool: MAX global_pooling: true }", (X,),
              label="global-max"),
    LayerCase("InnerProduct", f"inner_product_param {{ num_output: 6 {GAUSS} }}", (X,)),
    LayerCase("InnerProduct", f"inner_product_param {{ num_output: 6 transpose: true "
              f"{GAUSS} }}", (X,), label="transpose"),
    # shapes
    LayerCase("Concat", "", (X, (2, 1, 4, 5))),
    LayerCase("Slice", "slice_param { slice_point: 1 }", (X,), n_top=2),
    LayerCase("Split", "", (X,), n_top=3),
    LayerCase("Flatten", "", (X,)),
    LayerCase("Reshape", "reshape_param { shape { dim: 0 dim: -1 dim: 5 } }", (X,)),
    LayerCase("Silence", "", (X, (2,)), n_top=0),
    LayerCase("Crop", "", (X, (2, 3, 2, 2))),
    LayerCase("Tile", "tile_param { tiles: 2 }", (X,)),
    LayerCase("Reduction", "reduction_param { axis: 1 }", (X,)),
    LayerCase("Reduction", "reduction_param { operation: SUMSQ axis: 2 }", (X,),
              label="sumsq"),
    # softmax, losses, accuracy
    LayerCase("Softmax", "", (X,)),
    LayerCase("SoftmaxWithLoss", "", ((2, 3), LABELS), n_top=2),
    LayerCase("EuclideanLoss", "", ((2, 3), (2, 3))),
    LayerCase("SigmoidCrossEntropyLoss", "", ((2, 3), (2, 3))),
    LayerCase("MultinomialLogisticLoss", "", (np.full((2, 3), 1 / 3), LABELS)),
    LayerCase("HingeLoss", "", ((2, 3), LABELS)),
    LayerCase("ContrastiveLoss", "", ((2, 3), (2, 3), np.array([1.0, 0.0]))),
    LayerCase("Accuracy", "", ((2, 3), LABELS), n_top=2),
    LayerCase("ArgMax", "", ((2, 3),)),
    # inputs and data
    LayerCase("Input", "input_param { shape { dim: 2 dim: 3 } }", n_top=2),
    LayerCase("DummyData", "dummy_data_param { shape { dim: 2 dim: 3 } data_filler { type: "
              "\"constant\" value: 0.5 } }"),
    LayerCase("DummyData", "dummy_data_param { shape { dim: 2 dim: 3 } data_filler { type: "
              "\"gaussian\" } }", label="gaussian", random=True),
    LayerCase("Parameter", "parameter_param { shape { dim: 4 } }"),
    LayerCase("Data", 'transform_param { scale: 0.5 } data_param { source: "$TMP/lmdb" '
              'batch_size: 2 backend: LMDB }', n_top=2, phase="TEST", files=_lmdb_files),
    LayerCase("ImageData", 'image_data_param { source: "$TMP/images.txt" root_folder: '
              '"$TMP/" batch_size: 2 }', n_top=2, phase="TEST", files=_image_files),
    LayerCase("HDF5Data", 'top: "data" top: "label" hdf5_data_param { source: '
              '"$TMP/hdf5.txt" batch_size: 2 }', n_top=2, phase="TEST", files=_hdf5_files),
    LayerCase("MemoryData", "memory_data_param { batch_size: 2 channels: 2 height: 3 "
              "width: 3 }", n_top=2, phase="TEST", feed=_memory_feed),
    LayerCase("WindowData", 'window_data_param { source: "$TMP/windows.txt" root_folder: '
              '"$TMP/" batch_size: 4 context_pad: 1 } transform_param { crop_size: 5 '
              'mirror: true }', n_top=2, files=_window_files),
    LayerCase("HDF5Output", 'hdf5_output_param { file_name: "$TMP/out.h5" }',
              ((2, 3), (2, 1)), n_top=0),
    # recurrent and sequence layers
    LayerCase("Embed", f"embed_param {{ num_output: 4 input_dim: 5 {GAUSS} }}",
              (np.array([[0.0, 4.0, 2.0], [2.0, 1.0, 0.0]]),)),
    LayerCase("LSTM", f"recurrent_param {{ num_output: 4 {GAUSS} }}",
              ((3, 2, 5), np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]]), (2, 3))),
    LayerCase("RNN", f"recurrent_param {{ num_output: 4 expose_hidden: true {GAUSS} }}",
              ((3, 2, 5), np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]), (1, 2, 4)),
              n_top=2),
    LayerCase("LSTMUnit", "", ((1, 2, 3), (1, 2, 12), np.array([[1.0, 0.0]])), n_top=2),
    # the remaining BVLC types
    LayerCase("Convolution", f"convolution_param {{ num_output: 3 kernel_size: 2 pad: 1 "
              f"{GAUSS} }}", ((2, 2, 3, 4, 5),), label="3d"),
    LayerCase("Deconvolution", f"convolution_param {{ num_output: 2 kernel_size: 3 stride: 2 "
              f"{GAUSS} }}", ((2, 3, 6),), label="1d"),
    LayerCase("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }",
              (np.abs(np.random.default_rng(3).standard_normal((2, 3, 7, 7))),),
              label="stochastic", random=True),
    LayerCase("Pooling", "pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 2 }",
              (np.abs(np.random.default_rng(3).standard_normal((2, 3, 7, 7))),),
              phase="TEST", label="stochastic-test"),
    LayerCase("SPP", "spp_param { pyramid_height: 3 }", ((2, 3, 8, 7),)),
    LayerCase("Im2col", "convolution_param { kernel_size: 3 pad: 1 stride: 2 }", (X,)),
    LayerCase("MVN", "", (X,)),
    LayerCase("BatchReindex", "", (X, np.array([1.0, 0.0, 1.0]))),
    LayerCase("Filter", "", (X, np.array([[1.0], [0.0]]))),
    LayerCase("InfogainLoss", "", ((2, 3), LABELS, np.eye(3) + 0.5)),
    # user layers
    LayerCase("Python", 'python_param { module: "gpu_check_pylayer" layer: "ChannelScale" }',
              (X,), files=_python_layer_files),
]


def missing_layer_cases() -> list[str]:
    """Layer types mgcaffe ships without a case (the table must grow with the registry).

    Types registered from elsewhere (tests register throw-away layers) are not counted.
    """
    from mgcaffe.layer_types import layer_class, layer_types

    shipped = {t for t in layer_types() if layer_class(t).__module__.startswith("mgcaffe.")}
    return sorted(shipped - {c.type for c in LAYER_CASES})


#: Layer types whose case needs an optional module to write or read its files.
CASE_MODULES = {"Data": "lmdb", "ImageData": "PIL", "WindowData": "PIL", "HDF5Data": "h5py",
                "HDF5Output": "h5py"}


def _missing_module(case: LayerCase) -> str | None:
    """The optional module `case` needs and this Python lacks (None when none is missing):
    such a case is skipped, not failed, on a GPU machine without it."""
    import importlib.util

    module = CASE_MODULES.get(case.type)
    return module if module and importlib.util.find_spec(module) is None else None


def _bottom_arrays(case: LayerCase) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for item in case.bottoms:
        if isinstance(item, np.ndarray):
            out.append(item.astype(np.float32))
        else:
            out.append(rng.standard_normal(item).astype(np.float32))
    return out


def build_layer(case: LayerCase, xp, folder: Path):
    """(layer, bottom blobs, top blobs) of `case` on array module `xp`, set up."""
    from google.protobuf import text_format

    from mgcaffe.backend import to_device
    from mgcaffe.blob import Blob
    from mgcaffe.layer_types import TEST, TRAIN, LayerContext, create_layer
    from mgcaffe.proto import caffe_pb2

    text = case.text.replace("$TMP", str(folder))
    param = text_format.Parse(f'name: "{case.id}" type: "{case.type}" {text}',
                              caffe_pb2.LayerParameter())
    phase = TRAIN if case.phase == "TRAIN" else TEST
    layer = create_layer(param, LayerContext(phase=phase, xp=xp, dtype=np.float32, seed=1))
    bottom = []
    for i, array in enumerate(_bottom_arrays(case)):
        blob = Blob(array.shape, xp=xp, dtype=np.float32, name=f"bottom{i}")
        blob.data[...] = to_device(array, xp)
        bottom.append(blob)
    top = [Blob((), xp=xp, dtype=np.float32, name=f"top{i}") for i in range(case.n_top)]
    layer.setup(bottom, top)
    if case.feed is not None:
        case.feed(layer)
    return layer, bottom, top


def _error(got, ref) -> float:
    """|got - ref| in units of the tolerance (<= 1 passes); inf on a shape mismatch."""
    from mgcaffe.backend import to_host

    got, ref = to_host(got).astype(np.float64), to_host(ref).astype(np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    both_nan = np.isnan(got) & np.isnan(ref)
    diff = np.where(both_nan, 0.0, np.abs(got - ref))
    scale = ATOL + RTOL * float(np.nanmax(np.abs(ref))) if np.isfinite(ref).any() else ATOL
    worst = float(np.max(diff)) / scale
    return worst if np.isfinite(worst) else float("inf")


def compare_layer(case: LayerCase, xp, folder: Path) -> dict:
    """Build `case` on numpy and on `xp` with the same inputs and weights, run forward and
    backward, and compare tops, parameter blobs, bottom diffs and parameter diffs."""
    from mgcaffe.backend import to_device, to_host

    ref = build_layer(case, np, folder)
    dev = build_layer(case, xp, folder)
    errors: dict[str, float] = {}
    try:
        for r, d in zip(ref[0].blobs, dev[0].blobs):  # the CPU's weights on both
            d.data[...] = to_device(r.data, xp)
        rng = np.random.default_rng(1)
        for layer, bottom, top in (ref, dev):
            layer.forward(bottom, top)
        for i, (rt, dt) in enumerate(zip(ref[2], dev[2])):
            if case.random:
                ok = rt.shape == dt.shape and bool(np.all(np.isfinite(to_host(dt.data))))
                errors[f"top{i}"] = 0.0 if ok else float("inf")
            else:
                errors[f"top{i}"] = _error(dt.data, rt.data)
        for j, (rb, db) in enumerate(zip(ref[0].blobs, dev[0].blobs)):
            errors[f"blob{j} after forward"] = _error(db.data, rb.data)
        if case.random:
            return _verdict(case, errors)
        for i, weight in enumerate(ref[0].loss_weights):
            if weight == 0:  # a loss top's diff is its weight, set up by the layer
                diff = rng.standard_normal(ref[2][i].shape).astype(np.float32)
                ref[2][i].diff[...] = diff
                dev[2][i].diff[...] = to_device(diff, xp)
        down = [ref[0].allow_force_backward(j) for j in range(len(ref[1]))]
        for layer, bottom, top in (ref, dev):
            for blob in layer.blobs:
                blob.diff[...] = 0
            layer.backward(top, down, bottom)
        for j, (rb, db, flag) in enumerate(zip(ref[1], dev[1], down)):
            if flag:
                errors[f"bottom{j} diff"] = _error(db.diff, rb.diff)
        for j, (rb, db, flag) in enumerate(zip(ref[0].blobs, dev[0].blobs,
                                               ref[0].param_propagate_down)):
            if flag:
                errors[f"blob{j} diff"] = _error(db.diff, rb.diff)
        return _verdict(case, errors)
    finally:
        for layer, _, _ in (ref, dev):
            if hasattr(layer, "close"):
                layer.close()


def _verdict(case: LayerCase, errors: dict[str, float]) -> dict:
    where, worst = max(errors.items(), key=lambda kv: kv[1], default=("-", 0.0))
    return {"case": case.id, "type": case.type, "status": "ok" if worst <= 1 else "mismatch",
            "worst": worst if np.isfinite(worst) else "inf", "where": where}


def section_layers(check: Check) -> dict:
    missing = missing_layer_cases()
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-layers-") as tmp:
        for case in LAYER_CASES:
            if check.left() < 5:
                results.append({"case": case.id, "type": case.type, "status": "skipped",
                                 "message": "out of time"})
                continue
            folder = Path(tmp) / case.id.replace("/", "-")
            folder.mkdir()
            missing_module = _missing_module(case)
            if missing_module is not None:
                results.append({"case": case.id, "type": case.type, "status": "skipped",
                                "message": f"needs {missing_module} (not installed)"})
                continue
            try:
                if case.files is not None:
                    case.files(folder)
                results.append(compare_layer(case, check.xp, folder))
            except Exception as exc:  # noqa: BLE001 - recorded per case, the rest still run
                results.append({"case": case.id, "type": case.type, "status": "error",
                                "message": f"{type(exc).__name__}: {exc}"})
    bad = [r for r in results if r["status"] not in ("ok", "skipped")]
    worst = max((r for r in results if r["status"] == "ok"),
                key=lambda r: r["worst"], default=None)
    summary = f"{len(results) - len(bad)}/{len(results)} cases match the CPU"
    if worst is not None:
        summary += f" (worst {worst['worst']:.2g} tol: {worst['case']} {worst['where']})"
    if missing:
        summary += f"; no case for {', '.join(missing)}"
    if bad:
        summary += "; failing: " + ", ".join(r["case"] for r in bad)
    return {"status": "failed" if bad or missing else "ok", "summary": summary,
            "tolerance": {"rtol": RTOL, "atol": ATOL}, "missing_types": missing,
            "cases": results}


# ============================================================================ kernels
KERNEL_GEOMETRIES = [
    # name, input shape, kernel, pad, stride, dilation (the first two are GoogleNet's)
    ("googlenet conv2/3x3", (64, 64, 56, 56), (3, 3), (1, 1), (1, 1), (1, 1)),
    ("googlenet conv1/7x7_s2", (64, 3, 224, 224), (7, 7), (3, 3), (2, 2), (1, 1)),
    ("dilated 3x3", (4, 8, 17, 19), (3, 3), (2, 2), (1, 1), (2, 2)),
    ("odd 5x4", (3, 5, 13, 11), (5, 4), (1, 3), (3, 2), (1, 1)),
]
POOL_GEOMETRIES = [
    # name, input shape, pooling_param
    ("googlenet pool2/3x3_s2", (64, 192, 56, 56), "pool: MAX kernel_size: 3 stride: 2"),
    ("resnet pool1", (32, 64, 112, 112), "pool: MAX kernel_size: 3 stride: 2 pad: 1"),
    ("small 2x2", (3, 4, 9, 8), "pool: MAX kernel_size: 2 stride: 2"),
]


def _time_call(check: Check, fn, repeats: int = 5) -> float:
    """Median seconds of `fn()` on the device (after one warm-up call)."""
    fn()
    clock = check.clock()
    times = []
    for _ in range(repeats):
        a = clock.mark()
        fn()
        b = clock.mark()
        clock.finish()
        times.append(clock.seconds(a, b))
    return float(np.median(times))


def _small_shape(shape: tuple) -> tuple:
    """A geometry's input with one image of at most 4 channels (--small)."""
    return (1, min(shape[1], 4), *shape[2:])


def section_kernels(check: Check) -> dict:
    if not check.on_gpu:
        return {"status": "skipped", "summary": "CUDA kernels need a GPU"}
    from mgcaffe.kernels.cuda import im2col_pool as ck

    rng = np.random.default_rng(0)
    rows = []
    size = _small_shape if check.small else tuple
    for name, shape, *geometry in KERNEL_GEOMETRIES:
        rows.extend(_im2col_rows(check, ck, name, size(shape), tuple(geometry), rng))
    for name, shape, text in POOL_GEOMETRIES:
        rows.extend(_pool_rows(check, ck, name, size(shape), text, rng))
    for row in rows:
        row["speedup"] = row["generic_ms"] / row["cuda_ms"] if row["cuda_ms"] > 0 else None
    bad = [f"{r['kernel']} {r['case']}" for r in rows if not r["equal"]]
    speedups = ", ".join(f"{r['kernel']} {r['case']} x{r['speedup']:.1f}" for r in rows
                         if r["speedup"])
    return {"status": "failed" if bad else "ok",
            "summary": ("all twins equal the generic results; speed-ups: " if not bad else
                        f"differ: {', '.join(bad)}; speed-ups: ") + speedups,
            "rows": rows}


def _im2col_rows(check: Check, ck, name, shape, geometry, rng) -> list[dict]:
    """im2col and col2im: the twin against the generic function, values and time."""
    from mgcaffe.kernels import im2col as generic  # the module: generic.im2col, .col2im

    xp = check.xp
    pad = geometry[1]
    x = xp.asarray(rng.standard_normal(shape, dtype=np.float32))
    # The generic im2col pads into a scratch image the layer keeps between calls.
    padded = xp.zeros(shape[:2] + (shape[2] + 2 * pad[0], shape[3] + 2 * pad[1]), np.float32)
    col_ref = generic.im2col(x, *geometry)
    col = ck.im2col(x, *geometry)
    image_ref = generic.col2im(col_ref, shape, *geometry)
    image = ck.col2im(col_ref, shape, *geometry)
    return [
        {"kernel": "im2col", "case": name, "equal": bool(xp.array_equal(col, col_ref)),
         "generic_ms": 1e3 * _time_call(check, lambda: generic.im2col(
             x, *geometry, out=col_ref, padded=padded)),
         "cuda_ms": 1e3 * _time_call(check, lambda: ck.im2col(x, *geometry, out=col))},
        {"kernel": "col2im", "case": name, "equal": bool(xp.array_equal(image, image_ref)),
         "generic_ms": 1e3 * _time_call(check, lambda: generic.col2im(
             col_ref, shape, *geometry, out=image_ref)),
         "cuda_ms": 1e3 * _time_call(check, lambda: ck.col2im(col_ref, shape, *geometry,
                                                              out=image))},
    ]


def _pool_rows(check: Check, ck, name, shape, text, rng) -> list[dict]:
    """MAX pooling twin vs the Pooling layer: values on the CPU layer, time on the GPU."""
    from google.protobuf import text_format

    from mgcaffe.backend import to_host
    from mgcaffe.blob import Blob
    from mgcaffe.layer_types import LayerContext, create_layer
    from mgcaffe.layer_types.choice.pooling import PoolingRules
    from mgcaffe.layer_types.choice.rules import LayerRules
    from mgcaffe.proto import caffe_pb2

    xp = check.xp
    param = text_format.Parse(f'name: "pool" type: "Pooling" pooling_param {{ {text} }}',
                              caffe_pb2.LayerParameter())
    host_x = rng.integers(-8, 8, size=shape).astype(np.float32)  # ties: first max must win
    built = {}
    # The twin gathers offset by offset, as the layer's generic path does; the CPU's
    # default scatter by winner index (and its compiled loops) add overlapping windows in
    # another order, so their bits may differ (1,297 of 200,704 cells for GoogleNet's
    # pool2): the reference is the generic path.
    generic = LayerRules(pooling=PoolingRules(max_backward_by_index=False, compiled=False))
    # On the GPU the layer's generic path (the offset passes) is timed against the twin.
    passes = LayerRules(pooling=PoolingRules(gpu_kernels=False))
    for where, module in (("cpu", np), ("gpu", xp)):
        rules = generic if where == "cpu" else passes
        layer = create_layer(param, LayerContext(xp=module, dtype=np.float32, seed=0,
                                                 rules=rules))
        bottom = Blob(shape, xp=module, dtype=np.float32, name="x")
        bottom.data[...] = module.asarray(host_x)
        top = [Blob((), xp=module, dtype=np.float32, name=f"t{i}") for i in range(2)]
        layer.setup([bottom], top)
        built[where] = (layer, bottom, top)
    layer, bottom, top = built["cpu"]
    layer.forward([bottom], top)
    top_diff = rng.standard_normal(top[0].shape).astype(np.float32)
    top[0].diff[...] = top_diff
    layer.backward(top, [True], [bottom])
    g_layer, g_bottom, g_top = built["gpu"]
    x = g_bottom.data
    out = xp.empty(top[0].shape, np.float32)
    mask = xp.empty(top[0].shape, np.float32)
    winner = xp.empty(top[0].shape, layer._winner.dtype)
    geometry = (layer.kernel_now, layer.pad, layer.stride)
    ck.max_pool_forward(x, *geometry, layer.out_hw, out, winner, mask)
    grad = xp.empty(shape, np.float32)
    diff = xp.asarray(top_diff)
    ck.max_pool_backward(diff, winner, *geometry, grad)
    equal_fwd = (np.array_equal(to_host(out), top[0].data)
                 and np.array_equal(to_host(mask), top[1].data))
    equal_bwd = np.array_equal(to_host(grad), bottom.diff)
    g_top[0].diff[...] = diff

    def layer_forward():
        g_layer.forward([g_bottom], g_top)

    def layer_backward():
        g_layer.backward(g_top, [True], [g_bottom])

    return [
        {"kernel": "max_pool_forward", "case": name, "equal": bool(equal_fwd),
         "generic_ms": 1e3 * _time_call(check, layer_forward),
         "cuda_ms": 1e3 * _time_call(check, lambda: ck.max_pool_forward(
             x, *geometry, layer.out_hw, out, winner, mask))},
        {"kernel": "max_pool_backward", "case": name, "equal": bool(equal_bwd),
         "generic_ms": 1e3 * _time_call(check, layer_backward),
         "cuda_ms": 1e3 * _time_call(check, lambda: ck.max_pool_backward(
             diff, winner, *geometry, grad))},
    ]


# ============================================================================ NCCL
def section_nccl(check: Check) -> dict:
    if not check.on_gpu:
        return {"status": "skipped", "summary": "NCCL needs a GPU"}
    from mgcaffe.comm.backends.local import SingleCommunicator
    from mgcaffe.comm.backends.nccl import NcclCommunicator

    xp = check.xp
    comm = NcclCommunicator(SingleCommunicator(), timeout=20)
    facts = {"nccl_version": comm.version, "device": comm.device_id}
    try:
        n = 25 * 2**20  # 100 MB of float32
        buf = xp.arange(n, dtype=xp.float32)
        expected = buf.copy()
        comm.allreduce_sum(buf)
        facts["allreduce_equal"] = bool(xp.array_equal(buf, expected))
        t0 = time.perf_counter()  # host time: the work runs on the NCCL stream
        for _ in range(10):
            comm.allreduce_sum_async(buf)
        comm.synchronize("10 timed all-reduces")
        facts["allreduce_100MB_ms"] = 1e3 * (time.perf_counter() - t0) / 10
        # The gradient path: compute writes diffs, the NCCL stream waits on its event,
        # packs, reduces and unpacks (divided by 2 to see the unpack happen).
        diffs = [xp.full(1000, 3.0, xp.float32), xp.full((10, 10), 5.0, xp.float32)]
        group = xp.zeros(1100, xp.float32)
        views = [group[:1000], group[1000:].reshape(10, 10)]
        diffs[0] *= 2  # queued on the compute stream just before the event
        comm.mark_ready(1)
        comm.wait_ready(1)
        comm.pack(zip(views, diffs))
        comm.allreduce_sum_async(group)
        comm.unpack(zip(views, diffs), 2)
        comm.synchronize("the gradient path")
        facts["gradient_path_ok"] = bool(xp.all(diffs[0] == 3.0) and xp.all(diffs[1] == 2.5))
        array = xp.arange(10, dtype=xp.float32)
        facts["broadcast_ok"] = bool(xp.array_equal(comm.broadcast(array), xp.arange(10)))
        host = np.ones(3, np.float32)
        comm.allreduce_sum(host)
        facts["host_allreduce_ok"] = bool(np.all(host == 1))
    finally:
        comm.close()
    ok = all(v for k, v in facts.items() if k.endswith(("_ok", "_equal")))
    return {"status": "ok" if ok else "failed",
            "summary": (f"NCCL {facts['nccl_version']}, one rank: all-reduce, event/stream "
                        f"path, broadcast {'ok' if ok else 'WRONG'}; 100 MB all-reduce "
                        f"{facts['allreduce_100MB_ms']:.2f} ms"),
            **facts}


# ============================================================================ GEMM
def section_gemm(check: Check) -> dict:
    xp = check.xp
    n = 256 if check.small else 8192
    rng = np.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = xp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    c = xp.empty((n, n), dtype=np.float32)
    seconds = _time_call(check, lambda: xp.matmul(a, b, out=c), repeats=10)
    tflops = 2 * n**3 / seconds / 1e12
    return {"status": "ok", "summary": f"{n}^3 float32 GEMM: {tflops:.3g} TFLOP/s",
            "n": n, "seconds": seconds, "tflops": tflops}


# ============================================================================ model timing
def build_model_net(check: Check, model: str):
    """The train_val net of `model` with synthetic data at its batch size, on the device."""
    from mgcaffe.formats.protoio import read_net_param
    from mgcaffe.layer_types.base import TRAIN
    from mgcaffe.net import Net
    from mgcaffe.net.synthetic_data import fill_labels, synthesize_data_layers

    path, batch, _ = MODELS[model]
    batch = DRY_RUN_BATCH if check.small else batch
    param, labels = synthesize_data_layers(read_net_param(REPO / path), {}, batch,
                                           replace_data=True)
    net = Net(param, TRAIN, device=check.device, seed=1)
    fill_labels(net, labels, 1000, seed=1)
    return net, batch


def conv_ip_flops(net) -> list[tuple[int, float, float]]:
    """Per Convolution/InnerProduct layer: (layer index, forward FLOPs, backward FLOPs).

    Forward: 2 * top elements * K (K = weight elements / num_output, the GEMM's inner size,
    whatever the group); backward: the same for the weight gradient (when it is learned) and
    for the bottom gradient (when it is needed)."""
    out = []
    for i, layer in enumerate(net.layers):
        if layer.type not in ("Convolution", "InnerProduct"):
            continue
        p = (layer.param.convolution_param if layer.type == "Convolution"
             else layer.param.inner_product_param)
        k = layer.blobs[0].count / int(p.num_output)
        tops = [net.blobs[name] for name in net.top_names[net.layer_names[i]]]
        forward = sum(2.0 * t.count * k for t in tops)
        backward = forward if layer.param_propagate_down[0] else 0.0
        if net.layer_need_backward[i]:
            need = net.bottom_need_backward[i]
            backward += sum(2.0 * t.count * k for t, flag in zip(tops, need) if flag)
        out.append((i, forward, backward))
    return out


def layer_times(check: Check, net, passes: int) -> tuple[list[float], list[float]]:
    """Average forward and backward seconds per layer, from device-timeline marks (CUDA
    events on a GPU: no host synchronisation between layers)."""
    n = len(net.layers)
    forward, backward = [0.0] * n, [0.0] * n
    for _ in range(passes):
        net.clear_param_diffs_for_pass()
        clock = check.clock()
        marks = [clock.mark()]
        for i in range(n):
            net.forward_layer(i)
            marks.append(clock.mark())
        back = [marks[-1]]
        for i in range(n - 1, -1, -1):
            if net.layer_need_backward[i]:
                net.backward_layer(i)
            back.append(clock.mark())
        clock.finish()
        for i in range(n):
            forward[i] += clock.seconds(marks[i], marks[i + 1]) / passes
        for step, i in enumerate(range(n - 1, -1, -1)):
            backward[i] += clock.seconds(back[step], back[step + 1]) / passes
    return forward, backward


def time_model(check: Check, model: str) -> dict:
    """mgcaffe's fwd+bwd time per iteration of `model`, and its conv+ip TFLOP/s."""
    t0 = time.monotonic()
    net, batch = build_model_net(check, model)
    build_s = time.monotonic() - t0

    def iteration():
        net.clear_param_diffs_for_pass()
        net.forward_backward()

    t0 = time.monotonic()
    for _ in range(1 if check.small else 2):  # warm-up: kernel compilation, memory pool
        iteration()
    check.sync()
    warmup_s = time.monotonic() - t0
    t0 = time.perf_counter()  # one more, to size the timed run to the time left
    iteration()
    check.sync()
    estimate = max(time.perf_counter() - t0, 1e-3)
    iterations = 1 if check.small else max(3, min(20, int(check.left() * 0.4 / estimate)))
    t0 = time.perf_counter()
    for _ in range(iterations):
        iteration()
    check.sync()
    seconds = (time.perf_counter() - t0) / iterations
    forward, backward = layer_times(check, net, passes=1 if check.small else 3)
    flops = conv_ip_flops(net)
    total_flops = sum(f + b for _, f, b in flops)
    conv_ip_s = sum(forward[i] + backward[i] for i, _, _ in flops)
    layers_s = sum(forward) + sum(backward)
    return {"batch": batch, "iterations": iterations, "ms_per_iteration": 1e3 * seconds,
            "build_s": build_s, "warmup_s": warmup_s,
            "layer_sum_ms": 1e3 * layers_s, "conv_ip_ms": 1e3 * conv_ip_s,
            "conv_ip_gflop": total_flops / 1e9,
            "conv_ip_tflops": total_flops / conv_ip_s / 1e12 if conv_ip_s > 0 else None,
            "slowest_layers": _slowest(net, forward, backward)}


def _slowest(net, forward, backward, count: int = 8) -> list[dict]:
    rows = [{"layer": net.layer_names[i], "type": net.layers[i].type,
             "forward_ms": 1e3 * forward[i], "backward_ms": 1e3 * backward[i]}
            for i in range(len(net.layers))]
    rows.sort(key=lambda r: -(r["forward_ms"] + r["backward_ms"]))
    return rows[:count]


def _timing_section(model: str) -> Callable[[Check], dict]:
    def section(check: Check) -> dict:
        result = time_model(check, model)
        return {"status": "ok", "summary": (
            f"{model} batch {result['batch']}: {result['ms_per_iteration']:.1f} ms/iteration "
            f"fwd+bwd; conv+ip {result['conv_ip_tflops'] or 0:.1f} TFLOP/s over "
            f"{result['conv_ip_ms']:.1f} ms"), **result}

    section.__name__ = f"section_timing_{model}"
    return section


# ============================================================================ PyTorch
def section_torch(check: Check) -> dict:
    try:
        import torch
        import torchvision
    except ImportError as exc:
        return {"status": "skipped", "summary": f"PyTorch not importable ({exc})"}
    if not check.dry_run and not torch.cuda.is_available():
        return {"status": "skipped", "summary": f"PyTorch {torch.__version__} sees no CUDA "
                                                f"device (a CPU-only build?)"}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device = torch.device("cpu" if check.dry_run else f"cuda:{check.device.index}")
    results = {"torch_version": torch.__version__, "torchvision_version": torchvision.__version__,
               "cudnn_version": torch.backends.cudnn.version() if not check.dry_run else None,
               "allow_tf32": False, "cudnn_benchmark": True}
    for model, (_, batch, constructor) in MODELS.items():
        batch = DRY_RUN_BATCH if check.small else batch
        results[model] = _time_torch_model(torch, torchvision, constructor, batch, device,
                                           check)
    summary = "; ".join(f"{m} {results[m]['ms_per_iteration']:.1f} ms/iteration"
                        for m in MODELS)
    return {"status": "ok", "summary": f"PyTorch {torch.__version__}: {summary}", **results}


def _time_torch_model(torch, torchvision, constructor, batch, device, check: Check) -> dict:
    if constructor == "googlenet":
        # Caffe's GoogleNet trains with both auxiliary classifiers (loss weight 0.3).
        model = torchvision.models.googlenet(weights=None, aux_logits=True, init_weights=False)
    else:
        model = getattr(torchvision.models, constructor)(weights=None)
    model = model.to(device).train()
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def iteration():
        model.zero_grad(set_to_none=False)
        out = model(x)
        if isinstance(out, tuple):  # GoogLeNetOutputs(logits, aux_logits2, aux_logits1)
            loss = loss_fn(out[0], y) + 0.3 * (loss_fn(out[1], y) + loss_fn(out[2], y))
        else:
            loss = loss_fn(out, y)
        loss.backward()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(1 if check.small else 5):
        iteration()
    sync()
    iterations = 1 if check.small else 20
    t0 = time.perf_counter()
    for _ in range(iterations):
        iteration()
    sync()
    seconds = (time.perf_counter() - t0) / iterations
    return {"batch": batch, "iterations": iterations, "ms_per_iteration": 1e3 * seconds}


# ============================================================================ digits demo
def section_digits(check: Check) -> dict:
    import importlib.util

    if importlib.util.find_spec("sklearn") is None:
        return {"status": "skipped", "summary": "scikit-learn (the digits data) not installed"}
    from mgcaffe.backend import to_host
    from mgcaffe.formats.protoio import read_net_param, read_solver_param
    from mgcaffe.solvers import get_solver

    spec = importlib.util.spec_from_file_location("convert_digits",
                                                  REPO / "tools" / "convert_digits.py")
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    with tempfile.TemporaryDirectory(prefix="gpu-check-digits-") as tmp:
        data = Path(tmp) / "digits"
        convert.convert(data)
        solver_param = read_solver_param(REPO / "models" / "digits" / "solver.prototxt")
        net_param = read_net_param(REPO / solver_param.net)
        for layer in net_param.layer:
            if layer.type == "Data":
                name = Path(layer.data_param.source).name
                layer.data_param.source = str(data / name)
        solver_param.ClearField("net")
        solver_param.net_param.CopyFrom(net_param)
        solver_param.snapshot = 0
        solver_param.snapshot_after_train = False
        solver_param.snapshot_prefix = str(Path(tmp) / "snap")
        solver_param.test_interval = 10**9  # tested once, below
        solver_param.display = 0
        iterations = SMALL_DIGITS_ITERATIONS if check.small else int(solver_param.max_iter)
        solver = get_solver(solver_param, device=check.device)
        t0 = time.perf_counter()
        solver.step(iterations)
        check.sync()
        train_s = time.perf_counter() - t0
        net = solver.test_nets[0]
        net.share_weights(solver.net)
        correct = 0.0
        for _ in range(solver_param.test_iter[0]):
            correct += float(to_host(net.forward()["accuracy"]))
        accuracy = correct / solver_param.test_iter[0]
        for n in [solver.net, *solver.test_nets]:
            for layer in n.layers:
                if hasattr(layer, "close"):
                    layer.close()
    ok = accuracy >= 0.9
    return {"status": "ok" if ok else "failed",
            "summary": (f"{iterations} iterations in {train_s:.1f} s "
                        f"({1e3 * train_s / iterations:.1f} ms each); test accuracy "
                        f"{accuracy:.3f} (needs >= 0.9)"),
            "iterations": iterations, "train_s": train_s, "accuracy": accuracy}


SECTION_FUNCTIONS: dict[str, Callable[[Check], dict]] = {
    "gemm": section_gemm,
    "timing-googlenet": _timing_section("googlenet"),
    "timing-resnet50": _timing_section("resnet50"),
    "torch": section_torch,
    "layers": section_layers,
    "kernels": section_kernels,
    "nccl": section_nccl,
    "digits": section_digits,
}


# ============================================================================ orchestration
def run_section_here(name: str, gpu: int, dry_run: bool, limit: float,
                     small: bool = False) -> dict:
    """Run one section in this process; any exception becomes a failed result."""
    t0 = time.monotonic()
    try:
        check = make_check(gpu, dry_run, limit, small)
        result = SECTION_FUNCTIONS[name](check)
    except Exception as exc:  # noqa: BLE001 - a section's failure is a result, not a crash
        result = {"status": "failed", "summary": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=8)}
    result["seconds"] = time.monotonic() - t0
    return result


def run_section_child(name: str, args, limit: float) -> dict:
    """Run one section in a child process killed after `limit` seconds."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = Path(tmp) / "section.json"
        command = child_command(["--run-section", name, "--section-out", str(out),
                                 "--gpu", str(args.gpu), "--limit", str(limit)]
                                + ["--dry-run"] * args.dry_run + ["--small"] * args.small)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=limit + 15,
                                  env={**os.environ, **tf32_environment(args)})
        except subprocess.TimeoutExpired as exc:
            return {"status": "timeout", "seconds": time.monotonic() - t0,
                    "summary": f"killed after {limit:g} s",
                    "stderr_tail": _tail(exc.stderr)}
        if out.exists():
            result = json.loads(out.read_text())
            if proc.returncode != 0:
                result.setdefault("stderr_tail", _tail(proc.stderr))
            return result
        return {"status": "failed", "seconds": time.monotonic() - t0,
                "summary": f"child exited with status {proc.returncode} and no result",
                "stderr_tail": _tail(proc.stderr)}


def child_command(arguments: list[str]) -> list[str]:
    """This script again with `arguments`, started as this process was (`python -m
    cupy_double tools/gpu_check.py ...` gives children on the double too)."""
    from mgcaffe.commands._gpu_ranks import restart_command

    script = Path(__file__).resolve()
    return (restart_command(arguments, lambda path: Path(path).resolve() == script)
            or [sys.executable, str(script), *arguments])


def _tail(text, size: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-size:]


def tf32_environment(args) -> dict:
    return {} if args.allow_tf32 else dict(TF32_ENVIRONMENT)


def environment_facts(args) -> dict:
    facts = {"python": platform.python_version(), "numpy": np.__version__,
             "host": platform.node(), "dry_run": args.dry_run, "small": args.small,
             "tf32_environment": tf32_environment(args)}
    if args.dry_run:
        return facts
    try:
        from mgcaffe.backend import Device

        cupy = Device("gpu", args.gpu).xp
        props = cupy.cuda.runtime.getDeviceProperties(args.gpu)
        name = props.get("name", b"")
        facts.update({
            "gpu": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
            "gpu_memory_gib": props.get("totalGlobalMem", 0) / 2**30,
            "compute_capability": f"{props.get('major')}.{props.get('minor')}",
            "cupy": cupy.__version__,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cuda_driver": cupy.cuda.runtime.driverGetVersion()})
    except Exception as exc:  # noqa: BLE001 - facts are best effort
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts


def evaluate_targets(sections: dict) -> list[dict]:
    """Issue 6's targets from the section results (None where a number is missing)."""
    targets = []
    torch_result = sections.get("torch", {})
    for model, label in (("googlenet", "GoogleNet b64"), ("resnet50", "ResNet-50 b32")):
        ours = sections.get(f"timing-{model}", {}).get("ms_per_iteration")
        theirs = (torch_result.get(model) or {}).get("ms_per_iteration")
        ratio = ours / theirs if ours and theirs else None
        targets.append({"target": f"{label} fwd+bwd within 2x of PyTorch", "mgcaffe_ms": ours,
                        "pytorch_ms": theirs, "value": ratio, "limit": 2.0,
                        "met": None if ratio is None else ratio <= 2.0})
    gemm = sections.get("gemm", {}).get("tflops")
    for model in MODELS:
        achieved = sections.get(f"timing-{model}", {}).get("conv_ip_tflops")
        share = achieved / gemm if achieved and gemm else None
        targets.append({"target": f"{model} conv+ip >= 50% of the GEMM rate",
                        "conv_ip_tflops": achieved, "gemm_tflops": gemm, "value": share,
                        "limit": 0.5, "met": None if share is None else share >= 0.5})
    return targets


def print_table(results: dict) -> None:
    rows = [(name, r.get("status", "?"), f"{r.get('seconds', 0):.1f}", r.get("summary", ""))
            for name, r in results["sections"].items()]
    widths = [max(len(row[i]) for row in rows + [("section", "status", "seconds", "")])
              for i in range(3)]
    print(f"{'section':<{widths[0]}}  {'status':<{widths[1]}}  {'seconds':>{widths[2]}}  "
          f"summary")
    for name, status, seconds, summary in rows:
        print(f"{name:<{widths[0]}}  {status:<{widths[1]}}  {seconds:>{widths[2]}}  {summary}")
    print()
    for t in results["targets"]:
        verdict = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
        value = "n/a" if t["value"] is None else (
            f"{t['value']:.2f}x" if t["limit"] == 2.0 else f"{100 * t['value']:.0f}%")
        print(f"target: {t['target']}: {value} -> {verdict}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu-check-results.json", help="results JSON path")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU to check (default 0)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds for the whole run (default %(default)s)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated subset of: " + ", ".join(SECTIONS))
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU with tiny sizes (tests the script itself)")
    parser.add_argument("--small", action="store_true",
                        help="tiny sizes on the device (exercises every line, times nothing "
                             "worth reading: `make gpu-check-double`)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the sections in this process instead of one child each")
    parser.add_argument("--strict-targets", action="store_true",
                        help="exit 1 when a performance target is missed")
    parser.add_argument("--allow-tf32", action="store_true",
                        help="leave TF32 to the libraries' defaults (the targets assume off)")
    parser.add_argument("--run-section", help=argparse.SUPPRESS)
    parser.add_argument("--section-out", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(SECTIONS)}")
    args.section_names = names
    return args


def preflight() -> str | None:
    """Why mgcaffe cannot run with this interpreter (None when it can)."""
    try:
        import mgcaffe.layer_types  # noqa: F401 - pulls in every dependency the layers need
        import mgcaffe.solvers  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - reported, with the interpreter's path
        return (f"gpu-check: mgcaffe does not import with {sys.executable}: "
                f"{type(exc).__name__}: {exc}; it needs numpy and protobuf >= "
                f"{PROTOBUF_NEEDED} there (`make gpu-wheels` downloads protobuf ahead for a "
                f"machine without network: docs/gpu.md)")
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.run_section:  # a child: one section, result to --section-out
        os.environ.update(tf32_environment(args))
        result = run_section_here(args.run_section, args.gpu, args.dry_run, args.limit,
                                  args.small)
        Path(args.section_out).write_text(json.dumps(result, default=str))
        return 0
    os.environ.update(tf32_environment(args))  # before anything imports CuPy
    out = Path(args.out)
    problem = preflight()
    if problem is not None:
        print(problem, file=sys.stderr)
        out.write_text(json.dumps({"status": "cannot-run", "message": problem}, indent=1) + "\n")
        return 2
    started = time.monotonic()
    results = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:],
               "environment": environment_facts(args), "sections": {}, "targets": []}
    if not args.dry_run:
        from mgcaffe.backend import gpu_available

        if not gpu_available():
            message = ("gpu-check: no usable GPU: CuPy is not installed (`pip install "
                       "mgcaffe[gpu]`) or it sees no CUDA device; nothing was checked "
                       "(--dry-run exercises this script on the CPU)")
            print(message, file=sys.stderr)
            results.update(status="no-gpu", message=message)
            out.write_text(json.dumps(results, indent=1, default=str) + "\n")
            return 2
    for name in args.section_names:
        left = args.budget - (time.monotonic() - started)
        limit = min(SECTION_LIMITS[name], left)
        if limit < 5:
            results["sections"][name] = {"status": "skipped", "seconds": 0,
                                         "summary": "the run's time budget is spent"}
            continue
        print(f"gpu-check: {name} (up to {limit:.0f} s) ...", file=sys.stderr, flush=True)
        if args.in_process:
            results["sections"][name] = run_section_here(name, args.gpu, args.dry_run, limit,
                                                         args.small)
        else:
            results["sections"][name] = run_section_child(name, args, limit)
        done = results["sections"][name]
        print(f"gpu-check: {name}: {done.get('status')} in {done.get('seconds', 0):.0f} s: "
              f"{done.get('summary', '')}", file=sys.stderr, flush=True)
        out.write_text(json.dumps(results, indent=1, default=str) + "\n")  # partial results
    results["targets"] = evaluate_targets(results["sections"])
    results["seconds"] = time.monotonic() - started
    failed = [n for n, r in results["sections"].items()
              if r.get("status") not in ("ok", "skipped")]
    missed = [t["target"] for t in results["targets"] if t["met"] is False]
    results["status"] = "failed" if failed or (args.strict_targets and missed) else "ok"
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print_table(results)
    print(f"\ngpu-check: {results['status']} in {results['seconds']:.0f} s; results in {out}")
    return 0 if results["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())

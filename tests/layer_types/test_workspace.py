"""Workspace: layers that share one keep nothing in it between calls.

Each layer runs with a private scratch and with a net-wide Workspace that is filled with NaN
bit patterns between every two calls (what the other layers of a net would leave there);
tops, masks and diffs must come out the same, on one thread and on three.
"""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from layer_rules import changed

from mgcaffe.blob import Blob
from mgcaffe.cpu.parallel import ChunkRunner
from mgcaffe.layer_types import LayerContext, create_layer
from mgcaffe.layer_types.base import Workspace
from mgcaffe.proto import caffe_pb2

SLOTS = 4


def poison(workspace):
    """Overwrite every slot's memory with 0xFF bytes (a NaN in float32 and float64)."""
    for slot in range(SLOTS):
        workspace.array(slot, (1 << 16,), np.uint8)[...] = 0xFF


def run_layer(text, shape, workspace, runner, n_top=1, rules=None):
    param = text_format.Parse(text, caffe_pb2.LayerParameter())
    ctx = LayerContext(dtype=np.float32, seed=0, chunk_runner=runner, workspace=workspace,
                       rules=rules or changed())
    layer = create_layer(param, ctx)
    rng = np.random.default_rng(0)
    bottom = [Blob(shape, name="x")]
    top = [Blob((), name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    for _ in range(2):
        bottom[0].data[...] = rng.integers(-3, 4, size=shape)
        if workspace is not None:
            poison(workspace)
        layer.forward(bottom, top)
        outputs = [t.data.copy() for t in top]
        top[0].diff[...] = rng.standard_normal(top[0].shape)
        if workspace is not None:
            poison(workspace)
        layer.backward(top, [True], bottom)
    return outputs + [bottom[0].diff.copy()] + [p.diff.copy() for p in layer.blobs]


LAYERS = [
    ('name: "p" type: "Pooling" top: "a" top: "b" pooling_param { pool: MAX kernel_size: 3 '
     'stride: 2 pad: 1 }', (3, 2, 7, 8), 2, None),
    ('name: "p" type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 1 pad: 1 }',
     (3, 2, 5, 6), 1, None),
    ('name: "n" type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 }', (3, 5, 3, 3), 1,
     None),
    ('name: "n" type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 '
     'norm_region: WITHIN_CHANNEL }', (3, 2, 4, 3), 1, None),
    ('name: "f" type: "InnerProduct" inner_product_param { num_output: 3 '
     'weight_filler { type: "gaussian" std: 1 } }', (3, 2, 2, 2), 1, None),
    ('name: "d" type: "Deconvolution" convolution_param { num_output: 4 kernel_size: 3 pad: 1 '
     'stride: 2 weight_filler { type: "gaussian" std: 1 } }', (3, 2, 5, 4), 1, None),
] + [('name: "c" type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 pad: 1 '
      'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" } }',
      (3, 2, 5, 4), 1, layout) for layout in ("whole batch", "per sample", "batch last")]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("text, shape, n_top, layout", LAYERS)
def test_a_poisoned_workspace_changes_nothing(text, shape, n_top, layout, threads):
    per_sample = 1 if layout == "per sample" else 10**9
    rules = changed(convolution={"per_sample_from": per_sample,
                                 "per_sample_from_pointwise": per_sample,
                                 "batch_last_upto": 10**9 if layout == "batch last" else 0})
    runner = ChunkRunner(threads, chunk_elements=5, serial_below=0)
    private = run_layer(text, shape, None, runner, n_top, rules)
    shared = run_layer(text, shape, Workspace(np), runner, n_top, rules)
    for expected, got in zip(private, shared):
        np.testing.assert_array_equal(got, expected)


def test_workspace_slots_grow_and_reuse_memory():
    workspace = Workspace(np)
    small = workspace.array(0, (2, 3), np.float32)
    again = workspace.array(0, (3, 2), np.float64)  # 48 bytes: grows the slot
    assert small.shape == (2, 3) and again.shape == (3, 2) and again.dtype == np.float64
    reused = workspace.array(0, (4,), np.int8)
    assert np.shares_memory(reused, again)
    other = workspace.array(1, (4,), np.int8)
    assert not np.shares_memory(other, again)
    assert workspace.nbytes == 48 + 4


def test_layers_sharing_a_workspace_hold_less_scratch_than_their_own(monkeypatch):
    # Pooling's and LRN's numpy passes (their compiled loops keep no scratch between calls).
    rules = changed(pooling={"compiled": False}, lrn={"compiled": False})
    shape = (4, 8, 12, 12)
    texts = ['name: "p" type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 1 '
             'pad: 1 }', 'name: "n" type: "LRN" lrn_param { local_size: 5 }']

    def scratch_bytes(workspace):
        total = 0
        for text in texts * 2:  # two layers of each kind
            layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()),
                                 LayerContext(dtype=np.float32, workspace=workspace,
                                              rules=rules))
            bottom, top = [Blob(shape, name="x")], [Blob((), name="y")]
            layer.setup(bottom, top)
            layer.forward(bottom, top)
            layer.backward(top, [True], bottom)
            if workspace is None:
                total += sum(a.nbytes for a in layer._scratch.values())
        return total if workspace is None else workspace.nbytes

    own = scratch_bytes(None)
    assert 0 < scratch_bytes(Workspace(np)) <= own / 2

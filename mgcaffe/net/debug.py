"""Caffe's `debug_info: true` lines: each layer's mean absolute data (forward) and diff
(backward) of its blobs, and the L1/L2 norms of every learnable parameter after backward.

The text is Caffe 1.0's (Net::ForwardDebugInfo, BackwardDebugInfo, Backward), numbers as
its float streams print them, so tools that read these lines keep working.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ..backend import to_host

log = logging.getLogger("mgcaffe.net")


def _num(x: float) -> str:
    return f"{float(np.float32(x)):.6g}"


def _mean_abs(array) -> float:
    host = to_host(array)
    return float(np.abs(host, dtype=np.float64).sum() / host.size) if host.size else 0.0


def _param_display_name(layer, param_id: int) -> str:
    """Caffe's param_display_names_: the ParamSpec's name, else the index in the layer."""
    specs = layer.param.param
    return specs[param_id].name if param_id < len(specs) and specs[param_id].name \
        else str(param_id)


def forward(net, i: int) -> None:
    """After layer i's forward: its tops' and parameters' mean absolute data."""
    name, layer, g = net.layer_names[i], net.layers[i], net.graph
    for blob_id, blob in zip(g.top_ids[i], net._top_vecs[i]):
        log.info("    [Forward] Layer %s, top blob %s data: %s", name, g.blob_names[blob_id],
                 _num(_mean_abs(blob.data)))
    for p, blob in enumerate(layer.blobs):
        log.info("    [Forward] Layer %s, param blob %s data: %s", name,
                 _param_display_name(layer, p), _num(_mean_abs(blob.data)))


def backward(net, i: int) -> None:
    """After layer i's backward: the diffs of the bottoms and parameters it wrote."""
    name, layer, g = net.layer_names[i], net.layers[i], net.graph
    for blob_id, blob, need in zip(g.bottom_ids[i], net._bottom_vecs[i],
                                   net.bottom_need_backward[i]):
        if need:
            log.info("    [Backward] Layer %s, bottom blob %s diff: %s", name,
                     g.blob_names[blob_id], _num(_mean_abs(blob.diff)))
    propagate = getattr(layer, "param_propagate_down", [])
    for p, blob in enumerate(layer.blobs):
        if p < len(propagate) and propagate[p]:
            log.info("    [Backward] Layer %s, param blob %d diff: %s", name, p,
                     _num(_mean_abs(blob.diff)))


def all_params(net) -> None:
    """After a whole backward: L1 and L2 norms of all learnable data and diffs (Caffe logs
    this line at ERROR severity)."""
    sums = np.zeros(4)
    for blob in net.learnable_params:
        data = to_host(blob.data).astype(np.float64)
        diff = to_host(blob.diff).astype(np.float64)
        sums += (np.abs(data).sum(), np.abs(diff).sum(), (data * data).sum(), (diff * diff).sum())
    log.error("    [Backward] All net params (data, diff): L1 norm = (%s, %s); L2 norm = "
              "(%s, %s)", _num(sums[0]), _num(sums[1]), _num(math.sqrt(sums[2])),
              _num(math.sqrt(sums[3])))

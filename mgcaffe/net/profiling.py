"""Per-layer timing of a Net (Caffe's `caffe time`) and the profile the planner reads.

`profile_net(net, iterations)` runs `iterations` forward+backward passes layer by layer, as
`caffe time` does, and returns average times in seconds plus `profile`, a dict in the format
of `mgcaffe.comm.model.profile` (learnable layers from the input side):

    {"model", "batch_size", "dtype_bytes", "forward_time",
     "layers": [{"name", "params", "backward_time", "path"}, ...]}

(`path`: the implementation a layer with several took, e.g. "im2col-per-sample"; only for
such layers, and ignored by the planner.)

A learnable layer's `backward_time` is measured end to end, as the planner needs it: the time
from the previous gradient becoming ready (learnable layer k+1's, or the start of backward)
to this layer's, i.e. its own backward plus that of the non-learnable layers (ReLU, pooling,
the loss...) that run between; the input-side layers below layer 1 are added to layer 1,
so the layers' times sum to the whole backward pass.

Which bottoms get diffs: the net's own rules when it has a loss; on a net without one (a
deploy net) every bottom that a learnable layer feeds, the data input excepted, as
`caffe time` ends up computing (parameter gradients and bottom diffs are what training costs).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def synchronize(xp) -> None:
    """Wait for the device's queued work (CuPy runs kernels asynchronously)."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def timing_propagate_down(net) -> list[list[bool]]:
    """Per layer, which bottoms get a diff in a timed backward (see the module docstring)."""
    if any(weight != 0 for weight in net.blob_loss_weights.values()):
        return [list(flags) for flags in net.bottom_need_backward]
    return [[need and layer.allow_force_backward(j) for j, need in enumerate(flags)]
            for layer, flags in zip(net.layers, net.bottom_need_backward_unpruned)]


def batch_size_of(net) -> int | None:
    """The batch size: first dimension of the first input (or of the first layer's top)."""
    names = net.inputs or (net.top_names[net.layer_names[0]] if net.layers else [])
    for name in names:
        shape = net.blobs[name].shape
        if shape:
            return int(shape[0])
    return None


def end_to_end_backward_times(net, backward: list[float]) -> list[float]:
    """Per learnable layer (input side first), the backward time attributed to it."""
    learnable = net.learnable_layers
    times = []
    for k, ll in enumerate(learnable):
        upper = learnable[k + 1].layer_id if k + 1 < len(learnable) else len(net.layers)
        lower = 0 if k == 0 else ll.layer_id
        times.append(float(sum(backward[lower:upper])))
    return times


def _with_path(entry: dict, layer) -> dict:
    """A profile entry, with the layer's chosen path where it has one."""
    choice = getattr(layer, "choice", None)
    if choice is not None:
        entry["path"] = choice.path
    return entry


def profile_net(net, iterations: int = 50, *, model: str | None = None, warmup: int = 1,
                on_iteration: Callable[[int, float], None] | None = None) -> dict:
    """Time `iterations` forward+backward passes of `net`, layer by layer.

    Returns {"layer_names", "paths" (each layer's `choice`, None for a layer with one way),
    "forward" and "backward" (average seconds per layer),
    "forward_time", "backward_time", "forward_backward_time" (average seconds per pass),
    "total_time", "iterations", "profile"}. `on_iteration(j, seconds)` is called after each
    timed iteration (j from 1). Parameter diffs are cleared before each pass (untimed).
    """
    if iterations < 1:
        raise ValueError(f"profile_net: iterations must be >= 1, got {iterations}")
    xp = net.xp
    n = len(net.layers)
    propagate = timing_propagate_down(net)
    forward = [0.0] * n
    backward = [0.0] * n

    def one_pass(record: bool) -> tuple[float, float]:
        net.clear_param_diffs_for_pass()
        synchronize(xp)
        start = time.perf_counter()
        i = 0
        while i < n:
            t0 = time.perf_counter()
            last, _ = net.forward_step(i, n - 1)  # a norm chain's time is its first layer's
            synchronize(xp)
            if record:
                forward[i] += time.perf_counter() - t0
            i = last + 1
        middle = time.perf_counter()
        i = n - 1
        while i >= 0:
            t0 = time.perf_counter()
            first = net.backward_step(i, 0, propagate)  # ... in backward, its last layer's
            synchronize(xp)
            if record:
                backward[i] += time.perf_counter() - t0
            i = first - 1
        return middle - start, time.perf_counter() - middle

    for _ in range(warmup):
        one_pass(False)
    forward_total = backward_total = 0.0
    begin = time.perf_counter()
    for j in range(iterations):
        f, b = one_pass(True)
        forward_total += f
        backward_total += b
        if on_iteration is not None:
            on_iteration(j + 1, f + b)
    total = time.perf_counter() - begin
    net.settle_param_diffs()  # (the passes ran layer by layer: no backward settled them)
    forward = [t / iterations for t in forward]
    backward = [t / iterations for t in backward]
    forward_time = forward_total / iterations
    layer_backward = end_to_end_backward_times(net, backward)
    profile = {
        "model": model or net.name,
        "batch_size": batch_size_of(net),
        "dtype_bytes": int(np.dtype(net.dtype).itemsize),
        "forward_time": forward_time,
        "layers": [_with_path({"name": ll.name, "params": ll.count, "backward_time": t},
                              net.layers[ll.layer_id])
                   for ll, t in zip(net.learnable_layers, layer_backward)],
    }
    return {
        "layer_names": list(net.layer_names),
        "paths": [getattr(layer, "choice", None) for layer in net.layers],
        "forward": forward,
        "backward": backward,
        "forward_time": forward_time,
        "backward_time": backward_total / iterations,
        "forward_backward_time": total / iterations,
        "total_time": total,
        "iterations": iterations,
        "profile": profile,
    }

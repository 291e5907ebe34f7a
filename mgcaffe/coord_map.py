"""Spatial coordinate maps between NetSpec tops, and the Crop layer that aligns two tops
(pycaffe's caffe.coord_map, the helper FCN uses to crop upsampled scores to the input).

A map is (axis, a, b): a coordinate x of the lower top is a * x + b in the upper one, for
the spatial axes from `axis` on (None: any axis, for layers that keep coordinates).
Convolution and Pooling (stride s, kernel k, pad p) map x to (x + p - (k - 1) / 2) / s in
the output's terms; Deconvolution inverts that; Crop shifts by its offset; element-wise
layers keep coordinates. `coord_map_from_to(top_from, top_to)` composes the maps along the
layers joining two tops; `crop(top_from, top_to)` makes the Crop layer that cuts
`top_from` to `top_to`'s coordinates.
"""

from __future__ import annotations

import numpy as np

from .net_spec import layers as L

#: Layers whose tops keep their bottoms' spatial coordinates.
PASS_THROUGH_LAYERS = ["AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU",
                       "Log", "LRN", "Exp", "MVN", "Power", "ReLU", "PReLU", "Scale",
                       "Sigmoid", "Split", "TanH", "Threshold"]


class UndefinedMapException(Exception):
    """The layer has no spatial coordinate map (InnerProduct, ...)."""


class AxisMismatchException(Exception):
    """Two maps being composed act on different axes."""


def _vector(value) -> np.ndarray:
    return np.array(value, ndmin=1)


def conv_params(fn):
    """(axis, stride, effective kernel extent, pad) of a Convolution/Pooling/Deconvolution."""
    params = fn.params.get("convolution_param", fn.params)
    separate = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(params)
    if separate:
        raise AssertionError(f"coord_map: give kernel_size/stride/pad, not {sorted(separate)}")
    kernel = _vector(params["kernel_size"])
    dilation = _vector(params.get("dilation", 1))
    return (params.get("axis", 1), _vector(params.get("stride", 1)),
            (kernel - 1) * dilation + 1, _vector(params.get("pad", 0)))


def crop_params(fn):
    """(axis, offset) of a Crop layer."""
    params = fn.params.get("crop_param", fn.params)
    return params.get("axis", 2), _vector(params.get("offset", 0))


def coord_map(fn):
    """The (axis, a, b) map from fn's bottom to its top coordinates."""
    if fn.type_name in ("Convolution", "Pooling", "Im2col"):
        axis, stride, extent, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, extent, pad = conv_params(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0
    if fn.type_name == "Crop":
        axis, offset = crop_params(fn)
        return axis - 1, 1, -offset  # the map's axis is the last one before the cropped
    raise UndefinedMapException(fn.type_name)


def compose(base, further):
    """base after further: x -> a1 * (a2 * x + b2) + b1 (the scales multiply, the further
    shift is scaled by the base scale)."""
    ax1, a1, b1 = base
    ax2, a2, b2 = further
    if ax1 is None:
        ax1 = ax2
    elif ax2 is not None and ax1 != ax2:
        raise AxisMismatchException(f"maps on axes {ax1} and {ax2}")
    return ax1, a1 * a2, a1 * b2 + b1


def inverse(cmap):
    """The map undoing `cmap`."""
    ax, a, b = cmap
    return ax, 1 / a, -b / a


def _spatial_bottoms(top):
    # A Crop layer's second bottom only gives the size: coordinates come from the first.
    inputs = top.fn.inputs
    return inputs[:1] if top.fn.type_name == "Crop" else inputs


def _maps_down(start):
    """Every top reachable below `start` through mapped layers -> map from it to start."""
    maps = {start: (None, 1, 0)}
    frontier = [start]
    while frontier:
        top = frontier.pop()
        try:
            step = coord_map(top.fn)
        except UndefinedMapException:
            continue
        for bottom in _spatial_bottoms(top):
            maps[bottom] = compose(maps[top], step)
            frontier.append(bottom)
    return maps


def coord_map_from_to(top_from, top_to):
    """The (axis, a, b) map between the coordinates of two tops, composed through the
    layers below them down to a top they share (`crop` cuts top_from by -b when a is 1);
    RuntimeError when no path of spatial layers joins them."""
    from_maps = _maps_down(top_from)
    to_maps = {top_to: (None, 1, 0)}
    frontier = [top_to]
    while frontier:
        top = frontier.pop()
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
        try:
            step = coord_map(top.fn)
        except UndefinedMapException:
            continue
        for bottom in _spatial_bottoms(top):
            to_maps[bottom] = compose(to_maps[top], step)
            frontier.append(bottom)
    raise RuntimeError("Could not compute map between tops; are they connected by spatial "
                       "layers?")


def crop(top_from, top_to):
    """A Crop layer cutting `top_from` to the coordinates of `top_to` (NetSpec top)."""
    ax, a, b = coord_map_from_to(top_from, top_to)
    assert (a == 1).all(), f"scale mismatch on crop (a = {a})"
    assert (b <= 0).all(), f"cannot crop negative offset (b = {b})"
    assert (np.round(b) == b).all(), f"cannot crop noninteger offset (b = {b})"
    return L.Crop(top_from, top_to,
                  crop_param=dict(axis=ax + 1, offset=[int(v) for v in -np.round(b)]))

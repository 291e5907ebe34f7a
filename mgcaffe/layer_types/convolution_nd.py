"""Convolution and Deconvolution over 1, 3 or more spatial axes (Caffe's N-D path).

The `nd` paths (conv_paths.py) call these when the bottom has other than 2 spatial axes
after the channel axis; the 2-D paths are the fast ones. Same blobs as the 2-D layers: weight
(num_output, channels/group, *kernel) for Convolution, (channels, num_output/group, *kernel)
for Deconvolution, bias (num_output,). One batched matmul per call over
(N, group, rows, positions) operands built by kernels.im2col_nd. Each function handles one
bottom/top pair; `top_diff` is the top's diff as (N, num_output, positions).
"""

from __future__ import annotations

from ..kernels.im2col_nd import col2im_nd, im2col_nd


def _geometry(layer):
    return layer.kernel, layer.pad, layer.stride, layer.dilation


def _grouped_weight(layer, array):
    """weight as (group, first axis / group, rest): Convolution (g, O/g, C/g*K) or
    Deconvolution (g, C/g, O/g*K)."""
    first = array.shape[0]
    return array.reshape(layer.group, first // layer.group, -1)


def bias_diff(layer, top_diff):
    """bias.diff += top_diff summed over samples and positions."""
    layer.blobs[1].add_to_diff(top_diff.sum(axis=(0, 2)))


def conv_forward(layer, b, t):
    """t = weight * b (+ bias)."""
    xp, g, n = layer.xp, layer.group, layer.num
    w = _grouped_weight(layer, layer.blobs[0].data)
    cols = im2col_nd(b.data.reshape(layer.image_in), *_geometry(layer))
    cols = cols.reshape(n, g, w.shape[2], -1)
    out = xp.matmul(w[None], cols)                       # (N, g, O/g, P)
    out = out.reshape(n, layer.num_output, -1)
    if layer.bias_term:
        out = out + layer.blobs[1].data[None, :, None]
    t.data[...] = out.reshape(t.shape)


def conv_backward(layer, top_diff, b, want_w, down):
    """The weight gradient added, b's gradient overwritten, where wanted."""
    xp, g, n = layer.xp, layer.group, layer.num
    weight = layer.blobs[0]
    w = _grouped_weight(layer, weight.data)
    dy4 = top_diff.reshape(n, g, layer.num_output // g, -1)
    if want_w:
        cols = im2col_nd(b.data.reshape(layer.image_in), *_geometry(layer))
        cols = cols.reshape(n, g, w.shape[2], -1)
        grad = xp.matmul(dy4, cols.transpose(0, 1, 3, 2)).sum(axis=0)
        weight.add_to_diff(grad.reshape(weight.shape))
    if down:
        col_diff = xp.matmul(w.transpose(0, 2, 1)[None], dy4)   # (N, g, C/g*K, P)
        col_diff = col_diff.reshape((n, layer.channels) + layer.kernel + layer.out_hw)
        image = col2im_nd(col_diff, layer.in_hw, *_geometry(layer))
        b.diff[...] = image.reshape(b.shape)


def deconv_forward(layer, b, t):
    """The transpose of conv_forward: columns = weight^T x, folded into the output by col2im."""
    xp, g, n = layer.xp, layer.group, layer.num
    w = _grouped_weight(layer, layer.blobs[0].data)          # (g, C/g, O/g*K)
    x = b.data.reshape(n, g, layer.channels // g, -1)
    cols = xp.matmul(w.transpose(0, 2, 1)[None], x)      # (N, g, O/g*K, P_in)
    cols = cols.reshape((n, layer.num_output) + layer.kernel + layer.in_hw)
    image = col2im_nd(cols, layer.out_hw, *_geometry(layer))
    if layer.bias_term:
        image = image + layer.blobs[1].data.reshape((1, -1) + (1,) * len(layer.out_hw))
    t.data[...] = image.reshape(t.shape)


def deconv_backward(layer, top_diff, b, want_w, down):
    """Gradients of deconv_forward: the top diff's im2col feeds both products."""
    xp, g, n = layer.xp, layer.group, layer.num
    weight = layer.blobs[0]
    w = _grouped_weight(layer, weight.data)
    dy = top_diff.reshape((n, layer.num_output) + layer.out_hw)
    cols = im2col_nd(dy, *_geometry(layer)).reshape(n, g, w.shape[2], -1)
    if want_w:
        x = b.data.reshape(n, g, layer.channels // g, -1)
        grad = xp.matmul(x, cols.transpose(0, 1, 3, 2)).sum(axis=0)
        weight.add_to_diff(grad.reshape(weight.shape))
    if down:
        b.diff[...] = xp.matmul(w[None], cols).reshape(b.shape)

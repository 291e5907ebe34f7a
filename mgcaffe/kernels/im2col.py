"""im2col / col2im for N-batched 2-D input, with pad, stride and dilation.

Layout (what the convolution layers' GEMMs expect): for input x of shape (N, C, H, W) and a
kh x kw kernel, the column matrix has shape (C*kh*kw, N*H_out*W_out); row (c, i, j) holds,
for every output position (n, oh, ow), the input value x[n, c, oh*sh - ph + i*dh,
ow*sw - pw + j*dw], or 0 where that position falls in the padding. Rows are ordered c, i, j
(Caffe's order, so a weight of shape (O, C, kh, kw) reshapes to the (O, C*kh*kw) operand).

im2col copies one strided view of the (zero-padded) input; col2im loops over the kh*kw kernel
offsets adding one strided slice of the whole minibatch per offset (the output positions whose
input falls in the padding form a border strip that is skipped). Only slicing and
`xp.lib.stride_tricks.as_strided` are used, so the code runs unchanged on numpy and CuPy.
"""

from __future__ import annotations

from ..backend import get_array_module
from ..cpu.parallel import for_each_chunk


def conv_output_size(size: int, kernel: int, pad: int, stride: int, dilation: int) -> int:
    """Caffe's convolution output length: (size + 2*pad - extent) // stride + 1."""
    extent = dilation * (kernel - 1) + 1
    return (size + 2 * pad - extent) // stride + 1


def valid_range(size: int, out_size: int, pad: int, stride: int, offset: int):
    """Output indices [o0, o1) whose input index o*stride - pad + offset lies in [0, size).

    Returns (o0, o1, first input index); o1 <= o0 means no output position reads the input
    at this kernel offset.
    """
    o0 = max(0, -((offset - pad) // stride))  # ceil((pad - offset) / stride)
    o1 = min(out_size, (size - 1 + pad - offset) // stride + 1)
    return o0, o1, o0 * stride - pad + offset


def _offset_slices(in_shape, out_hw, kernel, pad, stride, dilation):
    """Yield, per kernel offset (i, j): its index, the output slices and the input slices."""
    _, _, height, width = in_shape
    out_h, out_w = out_hw
    for i in range(kernel[0]):
        h0, h1, hin = valid_range(height, out_h, pad[0], stride[0], i * dilation[0])
        for j in range(kernel[1]):
            w0, w1, win = valid_range(width, out_w, pad[1], stride[1], j * dilation[1])
            if h1 <= h0 or w1 <= w0:
                yield i, j, None, None
                continue
            out_sl = (slice(h0, h1), slice(w0, w1))
            in_sl = (slice(hin, hin + (h1 - h0 - 1) * stride[0] + 1, stride[0]),
                     slice(win, win + (w1 - w0 - 1) * stride[1] + 1, stride[1]))
            yield i, j, out_sl, in_sl


def _pairs(kernel, pad, stride, dilation):
    return tuple((int(v[0]), int(v[1])) for v in (kernel, pad, stride, dilation))


def col_geometry(what, col, shape, kernel, pad, stride, dilation, batch_last=False):
    """Check a column matrix against an (N, C, H, W) image shape; shared by the col2im forms.

    Returns ((kernel, pad, stride, dilation) as int pairs, (n, c, height, width),
    (out_h, out_w)). The columns are (C*kh*kw, N*H_out*W_out), or (C*kh*kw, H_out*W_out*N)
    when `batch_last`; any other shape is a ValueError naming `what`.
    """
    kernel, pad, stride, dilation = _pairs(kernel, pad, stride, dilation)
    n, c, height, width = (int(d) for d in shape)
    out_h = conv_output_size(height, kernel[0], pad[0], stride[0], dilation[0])
    out_w = conv_output_size(width, kernel[1], pad[1], stride[1], dilation[1])
    expected = (c * kernel[0] * kernel[1], n * out_h * out_w)
    if tuple(col.shape) != expected:
        layout = " (batch-last)" if batch_last else ""
        raise ValueError(f"{what}: col has shape {tuple(col.shape)}, expected {expected}"
                         f"{layout} for image shape {tuple(shape)}")
    return (kernel, pad, stride, dilation), (n, c, height, width), (out_h, out_w)


def im2col(x, kernel, pad=(0, 0), stride=(1, 1), dilation=(1, 1), out=None, padded=None,
           runner=None):
    """Column matrix (C*kh*kw, N*H_out*W_out) of x (N, C, H, W); see the module docstring.

    kernel, pad, stride, dilation: (h, w) pairs. `out`, when given, is a C-contiguous array
    of that shape and dtype to write into (every element is written). `padded`, when given
    and pad is non-zero, is a C-contiguous scratch array of shape (N, C, H + 2*ph, W + 2*pw)
    reused between calls (its border is re-zeroed here, its interior overwritten).
    On the CPU the samples are split over `runner`'s threads (`kernels.parallel`; None: the
    default runner): a copy that runs on one core otherwise.
    """
    xp = get_array_module(x)
    kernel, pad, stride, dilation = _pairs(kernel, pad, stride, dilation)
    n, c, height, width = x.shape
    out_h = conv_output_size(height, kernel[0], pad[0], stride[0], dilation[0])
    out_w = conv_output_size(width, kernel[1], pad[1], stride[1], dilation[1])
    rows, cols = c * kernel[0] * kernel[1], n * out_h * out_w
    if out is None:
        out = xp.empty((rows, cols), dtype=x.dtype)
    elif out.shape != (rows, cols):
        raise ValueError(f"im2col: out has shape {out.shape}, expected {(rows, cols)}")
    if pad != (0, 0):
        shape = (n, c, height + 2 * pad[0], width + 2 * pad[1])
        if padded is None:
            padded = xp.zeros(shape, dtype=x.dtype)
        elif padded.shape != shape:
            raise ValueError(f"im2col: padded has shape {padded.shape}, expected {shape}")
    else:
        x = xp.ascontiguousarray(x)
    out6 = out.reshape(c, kernel[0], kernel[1], n, out_h, out_w)

    def samples(start, stop):
        source = x[start:stop] if pad == (0, 0) else padded_copy(x, pad, padded, start, stop)
        # One strided view (C, kh, kw, N, H_out, W_out) of the padded input and one copy: the
        # copy runs along the destination's layout, so the writes are sequential.
        s_n, s_c, s_h, s_w = source.strides
        view = xp.lib.stride_tricks.as_strided(
            source,
            shape=(c, kernel[0], kernel[1], stop - start, out_h, out_w),
            strides=(s_c, s_h * dilation[0], s_w * dilation[1], s_n, s_h * stride[0],
                     s_w * stride[1]))
        out6[:, :, :, start:stop] = view

    for_each_chunk(xp, n, samples, item_elements=rows * out_h * out_w, cache_sized=False,
                   runner=runner)
    return out


def padded_copy(x, pad, padded, start, stop):
    """Samples [start, stop) of x zero-padded by pad=(ph, pw) on each side, in `padded`."""
    height, width = x.shape[2:]
    target = padded[start:stop]
    target[:, :, :pad[0]] = 0
    target[:, :, pad[0] + height:] = 0
    target[:, :, :, :pad[1]] = 0
    target[:, :, :, pad[1] + width:] = 0
    target[:, :, pad[0]:pad[0] + height, pad[1]:pad[1] + width] = x[start:stop]
    return target


def col2im(col, shape, kernel, pad=(0, 0), stride=(1, 1), dilation=(1, 1), out=None,
           runner=None):
    """Sum a column matrix back onto an image of `shape` (N, C, H, W): im2col's adjoint.

    Every column entry is added to the input cell it was read from; entries that came from
    padding are dropped. `out`, when given, is overwritten (not accumulated into). Each
    cell's sum runs over the kernel offsets in increasing order (the CUDA twin's order). On
    the CPU the samples are split over `runner`'s threads, as in im2col.
    """
    xp = get_array_module(col)
    (kernel, pad, stride, dilation), (n, c, height, width), (out_h, out_w) = col_geometry(
        "col2im", col, shape, kernel, pad, stride, dilation)
    if out is None:
        out = xp.empty((n, c, height, width), dtype=col.dtype)
    col6 = col.reshape(c, kernel[0], kernel[1], n, out_h, out_w)
    offsets = list(_offset_slices((n, c, height, width), (out_h, out_w), kernel, pad, stride,
                                  dilation))

    def samples(start, stop):
        out_cn = out[start:stop].transpose(1, 0, 2, 3)
        out_cn[...] = 0
        for i, j, out_sl, in_sl in offsets:
            if out_sl is None:
                continue
            out_cn[:, :, in_sl[0], in_sl[1]] += col6[:, i, j, start:stop, out_sl[0], out_sl[1]]

    for_each_chunk(xp, n, samples, item_elements=col.shape[0] * out_h * out_w,
                   cache_sized=False, runner=runner)
    return out


# -- batch-last layout ---------------------------------------------------------------------
# Columns ordered (H_out, W_out, N) instead of (N, H_out, W_out), from an image laid out
# (C, H, W, N). On small planes the NCHW copies above run one inner loop per W_out-long row
# (8 to 16 elements on LeNet/CIFAR planes); with the batch innermost each inner loop is
# W_out*N long. Measured on one core, transposes in and out included: CIFAR-10 conv2 (N 100,
# 32 channels, 16x16, 5x5) im2col 13.5 -> 8.3 ms, col2im 22.2 -> 13.3 ms.

def batch_last_image_shape(shape, pad):
    """The (C, H + 2*ph, W + 2*pw, N) scratch image of an (N, C, H, W) shape."""
    n, c, height, width = (int(d) for d in shape)
    return c, height + 2 * pad[0], width + 2 * pad[1], n


def im2col_batch_last(x, kernel, pad=(0, 0), stride=(1, 1), dilation=(1, 1), out=None,
                      image=None, runner=None):
    """Column matrix (C*kh*kw, H_out*W_out*N) of x (N, C, H, W): row (c, i, j) holds, at
    column (oh, ow, n), what im2col puts at column (n, oh, ow).

    `image`: a (C, H + 2*ph, W + 2*pw, N) scratch array (`batch_last_image_shape`) that x is
    copied into, zero-padded (every element is written). Channels are split over `runner`.
    """
    xp = get_array_module(x)
    kernel, pad, stride, dilation = _pairs(kernel, pad, stride, dilation)
    n, c, height, width = x.shape
    out_h = conv_output_size(height, kernel[0], pad[0], stride[0], dilation[0])
    out_w = conv_output_size(width, kernel[1], pad[1], stride[1], dilation[1])
    rows, cols = c * kernel[0] * kernel[1], out_h * out_w * n
    if out is None:
        out = xp.empty((rows, cols), dtype=x.dtype)
    if out.shape != (rows, cols):
        raise ValueError(f"im2col_batch_last: out has shape {out.shape}, expected "
                         f"{(rows, cols)}")
    image_shape = batch_last_image_shape(x.shape, pad)
    if image is None:
        image = xp.empty(image_shape, dtype=x.dtype)
    if image.shape != image_shape:
        raise ValueError(f"im2col_batch_last: image has shape {image.shape}, expected "
                         f"{image_shape}")
    out6 = out.reshape(c, kernel[0], kernel[1], out_h, out_w, n)

    def channels(start, stop):
        part = image[start:stop]
        _zero_border(part, pad, height, width)
        part[:, pad[0]:pad[0] + height, pad[1]:pad[1] + width] = (
            x[:, start:stop].transpose(1, 2, 3, 0))
        s_c, s_h, s_w, s_n = part.strides
        view = xp.lib.stride_tricks.as_strided(
            part, shape=(stop - start, kernel[0], kernel[1], out_h, out_w, n),
            strides=(s_c, s_h * dilation[0], s_w * dilation[1], s_h * stride[0],
                     s_w * stride[1], s_n))
        out6[start:stop] = view

    for_each_chunk(xp, c, channels, item_elements=rows // c * cols, cache_sized=False,
                   runner=runner)
    return out


def _zero_border(image, pad, height, width):
    """Zero the padding frame of a (C, H + 2*ph, W + 2*pw, N) image."""
    image[:, :pad[0]] = 0
    image[:, pad[0] + height:] = 0
    image[:, :, :pad[1]] = 0
    image[:, :, pad[1] + width:] = 0


def col2im_batch_last(col, shape, kernel, pad=(0, 0), stride=(1, 1), dilation=(1, 1),
                      out=None, image=None, runner=None):
    """col2im of batch-last columns (C*kh*kw, H_out*W_out*N) onto an (N, C, H, W) image.

    Sums into `image` (C, H + 2*ph, W + 2*pw, N) scratch, overwritten, each cell over the
    kernel offsets in increasing order (col2im's order), then writes its interior into `out`
    (overwritten). Channels are split over `runner`.
    """
    xp = get_array_module(col)
    (kernel, pad, stride, dilation), (n, c, height, width), (out_h, out_w) = col_geometry(
        "col2im_batch_last", col, shape, kernel, pad, stride, dilation, batch_last=True)
    if out is None:
        out = xp.empty((n, c, height, width), dtype=col.dtype)
    image_shape = batch_last_image_shape(shape, pad)
    if image is None:
        image = xp.empty(image_shape, dtype=col.dtype)
    if image.shape != image_shape:
        raise ValueError(f"col2im_batch_last: image has shape {image.shape}, expected "
                         f"{image_shape}")
    col6 = col.reshape(c, kernel[0], kernel[1], out_h, out_w, n)

    def channels(start, stop):
        part = image[start:stop]
        part[...] = 0
        for i in range(kernel[0]):
            rows = slice(i * dilation[0], i * dilation[0] + (out_h - 1) * stride[0] + 1,
                         stride[0])
            for j in range(kernel[1]):
                cols = slice(j * dilation[1], j * dilation[1] + (out_w - 1) * stride[1] + 1,
                             stride[1])
                part[:, rows, cols] += col6[start:stop, i, j]
        out[:, start:stop] = part[:, pad[0]:pad[0] + height,
                                  pad[1]:pad[1] + width].transpose(3, 0, 1, 2)

    for_each_chunk(xp, c, channels, item_elements=col.shape[0] // c * col.shape[1],
                   cache_sized=False, runner=runner)
    return out

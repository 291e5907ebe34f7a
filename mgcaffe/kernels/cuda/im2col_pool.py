"""CUDA twins of the generic kernels: im2col, col2im, MAX and AVE pooling forward/backward.

Each function takes and returns CuPy arrays and computes exactly what its generic twin does:
- `im2col`, `col2im`: the functions of `mgcaffe.kernels.im2col` (same signatures, layout and
  summation order, so the results are bit-identical);
- `max_pool_forward`, `max_pool_backward`: the strided-slice loops of
  `mgcaffe.layer_types.pooling.Pooling` (`_forward_max`, the MAX branch of `backward`): the same
  winner (first maximum in window scan order, never a padded cell), the same winner tag
  (1 + the kernel offset i*kw + j; 0 when the window reads no input), the same mask values
  (the flat index h*W + w of the winner, as a float; -1 for none) and the same order of
  gradient accumulation;
- `ave_pool_forward`, `ave_pool_backward`: the AVE offset passes of the Pooling layer (the
  window summed in offset order, times 1 / Caffe's clipped area; each input cell's gradient
  gathered in increasing kernel offset).

Why hand-written kernels here (STYLE.md: only where no cheap array expression exists): the
generic im2col first copies the input into a zero-padded image, then gathers through a 6-D
strided view; col2im and pooling loop over the kh*kw kernel offsets on the host, each offset
launching a few kernels over strided slices. One thread per output (or input) cell does the
whole loop in registers, in one launch, without scratch arrays. gpu_check measures both
versions and records the speed-up.

The kernels are registered with `launch.py` (which compiles and launches them) at import.
Nothing in this module imports CuPy: the arrays passed in bring their module, so importing
it on a machine without CuPy is fine.
"""

from __future__ import annotations

import numpy as np

from ..im2col import _pairs, col_geometry, conv_output_size
from .launch import REAL_TYPES, cupy_of, kernel_source, launch, register, use_cuda_kernels

__all__ = ["REAL_TYPES", "ave_pool_backward", "ave_pool_forward", "col2im", "im2col",
           "kernel_source", "max_pool_backward", "max_pool_forward", "use_cuda_kernels"]

_IM2COL_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_im2col(
    const real* x, real* col, long long total, int num, int channels, int height, int width,
    int kernel_h, int kernel_w, int pad_h, int pad_w, int stride_h, int stride_w,
    int dilation_h, int dilation_w, int out_h, int out_w) {
  // One thread per (channel, image, output row, output column); it writes the kh*kw column
  // entries of that position, one per row (c, i, j) of the column matrix.
  const long long cols = (long long)num * out_h * out_w;
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int ox = (int)(index % out_w);
    long long rest = index / out_w;
    const int oy = (int)(rest % out_h);
    rest /= out_h;
    const int n = (int)(rest % num);
    const int c = (int)(rest / num);
    const real* image = x + ((long long)n * channels + c) * height * width;
    real* out = col + (long long)c * kernel_h * kernel_w * cols
                + ((long long)n * out_h + oy) * out_w + ox;
    const int y0 = oy * stride_h - pad_h;
    const int x0 = ox * stride_w - pad_w;
    for (int i = 0; i < kernel_h; ++i) {
      const int y = y0 + i * dilation_h;
      for (int j = 0; j < kernel_w; ++j) {
        const int xx = x0 + j * dilation_w;
        *out = (y >= 0 && y < height && xx >= 0 && xx < width) ? image[y * width + xx]
                                                               : (real)0;
        out += cols;
      }
    }
  }
}
"""

_COL2IM_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_col2im(
    const real* col, real* image, long long total, int num, int channels, int height,
    int width, int kernel_h, int kernel_w, int pad_h, int pad_w, int stride_h, int stride_w,
    int dilation_h, int dilation_w, int out_h, int out_w) {
  // One thread per image cell: it gathers every column entry read from that cell, so no
  // two threads write one address (no atomics, deterministic). The output rows and columns
  // are walked downwards so that the kernel offsets (i, j) come in increasing order: the
  // order in which the generic col2im adds them, hence the same float sum.
  const long long cols = (long long)num * out_h * out_w;
  const int extent_h = (kernel_h - 1) * dilation_h + 1;
  const int extent_w = (kernel_w - 1) * dilation_w + 1;
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int xx = (int)(index % width) + pad_w;
    long long rest = index / width;
    const int y = (int)(rest % height) + pad_h;
    rest /= height;
    const int c = (int)(rest % channels);
    const int n = (int)(rest / channels);
    const int oy_start = (y < extent_h) ? 0 : (y - extent_h) / stride_h + 1;
    const int oy_end = min(y / stride_h + 1, out_h);
    const int ox_start = (xx < extent_w) ? 0 : (xx - extent_w) / stride_w + 1;
    const int ox_end = min(xx / stride_w + 1, out_w);
    real sum = 0;
    for (int oy = oy_end - 1; oy >= oy_start; --oy) {
      int i = y - oy * stride_h;
      if (i % dilation_h != 0) continue;
      i /= dilation_h;
      for (int ox = ox_end - 1; ox >= ox_start; --ox) {
        int j = xx - ox * stride_w;
        if (j % dilation_w != 0) continue;
        j /= dilation_w;
        sum += col[((long long)(c * kernel_h + i) * kernel_w + j) * cols
                   + ((long long)n * out_h + oy) * out_w + ox];
      }
    }
    image[index] = sum;
  }
}
"""

_MAX_POOL_FORWARD_SOURCE = r"""
typedef REAL real;
typedef INDEX index_t;
extern "C" __global__ void mgcaffe_max_pool_forward(
    const real* x, real* top, index_t* winner, real* mask, int has_mask, long long total,
    int height, int width, int out_h, int out_w, int kernel_h, int kernel_w, int pad_h,
    int pad_w, int stride_h, int stride_w, real lowest) {
  // One thread per output cell; the window is scanned row by row and a later cell must be
  // strictly greater to win (Caffe's rule, and the generic twin's offset order). The winner
  // is tagged 1 + its kernel offset, 0 when the window reads no input cell.
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int ox = (int)(index % out_w);
    long long rest = index / out_w;
    const int oy = (int)(rest % out_h);
    const long long plane = rest / out_h;
    const int y0 = oy * stride_h - pad_h;
    const int x0 = ox * stride_w - pad_w;
    const real* image = x + plane * height * width;
    real best = lowest;
    int won = -1;
    for (int i = 0; i < kernel_h; ++i) {
      const int y = y0 + i;
      if (y < 0 || y >= height) continue;
      for (int j = 0; j < kernel_w; ++j) {
        const int xx = x0 + j;
        if (xx < 0 || xx >= width) continue;
        const real value = image[y * width + xx];
        if (value > best) {
          best = value;
          won = i * kernel_w + j;
        }
      }
    }
    top[index] = best;
    winner[index] = (index_t)(won + 1);
    if (has_mask) {
      mask[index] = won < 0 ? (real)-1
                             : (real)((y0 + won / kernel_w) * width + x0 + won % kernel_w);
    }
  }
}
"""

_MAX_POOL_BACKWARD_SOURCE = r"""
typedef REAL real;
typedef INDEX index_t;
extern "C" __global__ void mgcaffe_max_pool_backward(
    const real* top_diff, const index_t* winner, real* bottom_diff, long long total,
    int height, int width, int out_h, int out_w, int kernel_h, int kernel_w, int pad_h,
    int pad_w, int stride_h, int stride_w) {
  // One thread per input cell: it sums the gradients of the windows this cell won. Windows
  // are visited so that their kernel offset for this cell increases, the generic twin's
  // order of accumulation.
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int xx = (int)(index % width) + pad_w;
    long long rest = index / width;
    const int y = (int)(rest % height) + pad_h;
    const long long plane = rest / height;
    const int oy_start = (y < kernel_h) ? 0 : (y - kernel_h) / stride_h + 1;
    const int oy_end = min(y / stride_h + 1, out_h);
    const int ox_start = (xx < kernel_w) ? 0 : (xx - kernel_w) / stride_w + 1;
    const int ox_end = min(xx / stride_w + 1, out_w);
    const long long base = plane * out_h * out_w;
    real sum = 0;
    for (int oy = oy_end - 1; oy >= oy_start; --oy) {
      const int i = y - oy * stride_h;
      for (int ox = ox_end - 1; ox >= ox_start; --ox) {
        const int offset = i * kernel_w + (xx - ox * stride_w);
        const long long o = base + (long long)oy * out_w + ox;
        if ((int)winner[o] == offset + 1) sum += top_diff[o];
      }
    }
    bottom_diff[index] = sum;
  }
}
"""

_AVE_POOL_FORWARD_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_ave_pool_forward(
    const real* x, real* top, long long total, int height, int width, int out_h, int out_w,
    int kernel_h, int kernel_w, int pad_h, int pad_w, int stride_h, int stride_w) {
  // One thread per output cell: the window's input cells summed row by row (the generic
  // path's offset order; padded cells add nothing), times 1 / the window's area clipped to
  // the padded input (Caffe's divisor; 0 for a window that starts past it).
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int ox = (int)(index % out_w);
    long long rest = index / out_w;
    const int oy = (int)(rest % out_h);
    const long long plane = rest / out_h;
    const int y0 = oy * stride_h - pad_h;
    const int x0 = ox * stride_w - pad_w;
    const int area = (min(y0 + kernel_h, height + pad_h) - y0)
                     * (min(x0 + kernel_w, width + pad_w) - x0);
    const real* image = x + plane * height * width;
    real sum = 0;
    for (int i = 0; i < kernel_h; ++i) {
      const int y = y0 + i;
      if (y < 0 || y >= height) continue;
      for (int j = 0; j < kernel_w; ++j) {
        const int xx = x0 + j;
        if (xx < 0 || xx >= width) continue;
        sum += image[y * width + xx];
      }
    }
    const real inverse = area > 0 ? (real)1 / (real)area : (real)0;
    top[index] = sum * inverse;
  }
}
"""

_AVE_POOL_BACKWARD_SOURCE = r"""
typedef REAL real;
extern "C" __global__ void mgcaffe_ave_pool_backward(
    const real* top_diff, real* bottom_diff, long long total, int height, int width,
    int out_h, int out_w, int kernel_h, int kernel_w, int pad_h, int pad_w, int stride_h,
    int stride_w) {
  // One thread per input cell: it sums top_diff / area of every window that reads it, the
  // windows visited so that their kernel offset for this cell increases (the generic
  // path's order of accumulation).
  for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < total;
       index += (long long)blockDim.x * gridDim.x) {
    const int xx = (int)(index % width) + pad_w;
    long long rest = index / width;
    const int y = (int)(rest % height) + pad_h;
    const long long plane = rest / height;
    const int oy_start = (y < kernel_h) ? 0 : (y - kernel_h) / stride_h + 1;
    const int oy_end = min(y / stride_h + 1, out_h);
    const int ox_start = (xx < kernel_w) ? 0 : (xx - kernel_w) / stride_w + 1;
    const int ox_end = min(xx / stride_w + 1, out_w);
    const long long base = plane * out_h * out_w;
    real sum = 0;
    for (int oy = oy_end - 1; oy >= oy_start; --oy) {
      const int y0 = oy * stride_h - pad_h;
      const int area_h = min(y0 + kernel_h, height + pad_h) - y0;
      for (int ox = ox_end - 1; ox >= ox_start; --ox) {
        const int x0 = ox * stride_w - pad_w;
        const int area = area_h * (min(x0 + kernel_w, width + pad_w) - x0);
        const real inverse = area > 0 ? (real)1 / (real)area : (real)0;
        const real sent = top_diff[base + (long long)oy * out_w + ox] * inverse;
        sum += sent;
      }
    }
    bottom_diff[index] = sum;
  }
}
"""

register({
    "mgcaffe_im2col": _IM2COL_SOURCE,
    "mgcaffe_col2im": _COL2IM_SOURCE,
    "mgcaffe_max_pool_forward": _MAX_POOL_FORWARD_SOURCE,
    "mgcaffe_max_pool_backward": _MAX_POOL_BACKWARD_SOURCE,
    "mgcaffe_ave_pool_forward": _AVE_POOL_FORWARD_SOURCE,
    "mgcaffe_ave_pool_backward": _AVE_POOL_BACKWARD_SOURCE,
})


def _i32(*values):
    return tuple(np.int32(v) for v in values)


def im2col(x, kernel, pad=(0, 0), stride=(1, 1), dilation=(1, 1), out=None, padded=None):
    """CUDA twin of `mgcaffe.kernels.im2col.im2col` (same arguments, same result).

    `padded` is accepted for signature compatibility and ignored: the kernel reads the
    padding as zeros without materialising it.
    """
    del padded  # the kernel needs no padded scratch image
    xp = cupy_of(x, "im2col")
    kernel, pad, stride, dilation = _pairs(kernel, pad, stride, dilation)
    n, c, height, width = (int(d) for d in x.shape)
    out_h = conv_output_size(height, kernel[0], pad[0], stride[0], dilation[0])
    out_w = conv_output_size(width, kernel[1], pad[1], stride[1], dilation[1])
    shape = (c * kernel[0] * kernel[1], n * out_h * out_w)
    if out is None:
        out = xp.empty(shape, dtype=x.dtype)
    elif out.shape != shape:
        raise ValueError(f"im2col: out has shape {out.shape}, expected {shape}")
    if out.dtype != x.dtype:
        raise ValueError(f"im2col: out has dtype {out.dtype}, input {x.dtype}")
    target = out if out.flags.c_contiguous else xp.empty(shape, dtype=x.dtype)
    x = xp.ascontiguousarray(x)
    total = c * n * out_h * out_w
    launch(xp, "mgcaffe_im2col", x.dtype, total,
           (x, target, np.int64(total))
            + _i32(n, c, height, width, *kernel, *pad, *stride, *dilation, out_h, out_w))
    if target is not out:
        out[...] = target
    return out


def col2im(col, shape, kernel, pad=(0, 0), stride=(1, 1), dilation=(1, 1), out=None):
    """CUDA twin of `mgcaffe.kernels.im2col.col2im`: `out` (N, C, H, W) is overwritten."""
    xp = cupy_of(col, "col2im")
    (kernel, pad, stride, dilation), (n, c, height, width), (out_h, out_w) = col_geometry(
        "col2im", col, shape, kernel, pad, stride, dilation)
    image_shape = (n, c, height, width)
    if out is None:
        out = xp.empty(image_shape, dtype=col.dtype)
    elif tuple(out.shape) != image_shape or out.dtype != col.dtype:
        raise ValueError(f"col2im: out is {tuple(out.shape)} {out.dtype}, expected "
                         f"{image_shape} {col.dtype}")
    target = out if out.flags.c_contiguous else xp.empty(image_shape, dtype=col.dtype)
    col = xp.ascontiguousarray(col)
    total = n * c * height * width
    launch(xp, "mgcaffe_col2im", col.dtype, total,
           (col, target, np.int64(total))
            + _i32(n, c, height, width, *kernel, *pad, *stride, *dilation, out_h, out_w))
    if target is not out:
        out[...] = target
    return out


def _check_pool(what, x_shape, out_hw, arrays):
    n, c = int(x_shape[0]), int(x_shape[1])
    top_shape = (n, c, int(out_hw[0]), int(out_hw[1]))
    for name, array in arrays.items():
        if array is not None and tuple(array.shape) != top_shape:
            raise ValueError(f"{what}: {name} has shape {tuple(array.shape)}, expected "
                             f"{top_shape}")
    return top_shape


def max_pool_forward(x, kernel, pad, stride, out_hw, out, winner, mask=None):
    """CUDA twin of Pooling's MAX forward over x (N, C, H, W).

    Writes `out` (N, C, out_h, out_w) with each window's maximum (-FLT_MAX for a window that
    reads no input cell), `winner` (int8, int16 or int32, same shape) with 1 + the winning
    kernel offset i*kw + j (0 for none) and, when given, `mask` with the winner's flat index
    h*W + w within its channel plane (-1 for none). `out_hw` is the layer's pooled size (Caffe's
    rounding and clipping are the layer's business). All outputs must be C-contiguous.
    """
    xp = cupy_of(x, "max_pool_forward")
    kernel, pad, stride = (tuple(int(v) for v in p) for p in (kernel, pad, stride))
    _check_pool("max_pool_forward", x.shape, out_hw,
                {"out": out, "winner": winner, "mask": mask})
    for name, array in (("out", out), ("winner", winner), ("mask", mask)):
        if array is not None and not array.flags.c_contiguous:
            raise ValueError(f"max_pool_forward: {name} must be C-contiguous")
    x = xp.ascontiguousarray(x)
    height, width = int(x.shape[2]), int(x.shape[3])
    total = int(out.size)
    lowest = x.dtype.type(np.finfo(np.float32).min)  # Caffe's -FLT_MAX, for double too
    launch(xp, "mgcaffe_max_pool_forward", x.dtype, total,
           (x, out, winner, out if mask is None else mask, np.int32(mask is not None),
            np.int64(total))
           + _i32(height, width, *out_hw, *kernel, *pad, *stride) + (lowest,), winner.dtype)
    return out


def max_pool_backward(top_diff, winner, kernel, pad, stride, bottom_diff):
    """CUDA twin of Pooling's MAX backward: `bottom_diff` (N, C, H, W) is overwritten with
    the sum, over the windows each input cell won (per `winner` from the forward), of their
    top gradient."""
    xp = cupy_of(top_diff, "max_pool_backward")
    kernel, pad, stride = (tuple(int(v) for v in p) for p in (kernel, pad, stride))
    out_hw = tuple(int(d) for d in top_diff.shape[2:])
    _check_pool("max_pool_backward", bottom_diff.shape, out_hw,
                {"top_diff": top_diff, "winner": winner})
    if not bottom_diff.flags.c_contiguous or not winner.flags.c_contiguous:
        raise ValueError("max_pool_backward: bottom_diff and winner must be C-contiguous")
    top_diff = xp.ascontiguousarray(top_diff)
    height, width = int(bottom_diff.shape[2]), int(bottom_diff.shape[3])
    total = int(bottom_diff.size)
    launch(xp, "mgcaffe_max_pool_backward", top_diff.dtype, total,
           (top_diff, winner, bottom_diff, np.int64(total))
           + _i32(height, width, *out_hw, *kernel, *pad, *stride), winner.dtype)
    return bottom_diff


def ave_pool_forward(x, kernel, pad, stride, out_hw, out):
    """CUDA twin of Pooling's AVE forward over x (N, C, H, W): `out` (N, C, out_h, out_w),
    C-contiguous, gets each window's sum over input cells times 1 / its area clipped to the
    padded input (Caffe's divisor). `out_hw` is the layer's pooled size."""
    xp = cupy_of(x, "ave_pool_forward")
    kernel, pad, stride = (tuple(int(v) for v in p) for p in (kernel, pad, stride))
    _check_pool("ave_pool_forward", x.shape, out_hw, {"out": out})
    if not out.flags.c_contiguous:
        raise ValueError("ave_pool_forward: out must be C-contiguous")
    x = xp.ascontiguousarray(x)
    height, width = int(x.shape[2]), int(x.shape[3])
    total = int(out.size)
    launch(xp, "mgcaffe_ave_pool_forward", x.dtype, total,
           (x, out, np.int64(total)) + _i32(height, width, *out_hw, *kernel, *pad, *stride))
    return out


def ave_pool_backward(top_diff, kernel, pad, stride, bottom_diff):
    """CUDA twin of Pooling's AVE backward: `bottom_diff` (N, C, H, W) is overwritten with
    the sum, over the windows that read each input cell, of their top gradient / area."""
    xp = cupy_of(top_diff, "ave_pool_backward")
    kernel, pad, stride = (tuple(int(v) for v in p) for p in (kernel, pad, stride))
    out_hw = tuple(int(d) for d in top_diff.shape[2:])
    _check_pool("ave_pool_backward", bottom_diff.shape, out_hw, {"top_diff": top_diff})
    if not bottom_diff.flags.c_contiguous:
        raise ValueError("ave_pool_backward: bottom_diff must be C-contiguous")
    top_diff = xp.ascontiguousarray(top_diff)
    height, width = int(bottom_diff.shape[2]), int(bottom_diff.shape[3])
    total = int(bottom_diff.size)
    launch(xp, "mgcaffe_ave_pool_backward", top_diff.dtype, total,
           (top_diff, bottom_diff, np.int64(total))
           + _i32(height, width, *out_hw, *kernel, *pad, *stride))
    return bottom_diff

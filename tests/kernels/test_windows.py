"""ShiftedWindows: every kernel offset's slice reads the padded input cell it should."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mgcaffe.kernels.windows import ShiftedWindows

CONFIGS = [
    # shape, kernel, stride, pad, out_hw
    ((2, 3, 7, 6), (3, 3), (2, 2), (1, 1), (4, 3)),
    ((1, 2, 8, 8), (3, 3), (2, 2), (0, 0), (4, 4)),  # last window overhangs (ceil mode)
    ((2, 1, 5, 7), (2, 3), (1, 2), (1, 0), (6, 3)),
    ((1, 2, 9, 9), (2, 2), (3, 3), (0, 0), (3, 3)),  # stride > kernel: cells never read
    ((1, 1, 4, 4), (3, 3), (1, 1), (1, 1), (4, 4)),
]


@pytest.mark.parametrize("shape,kernel,stride,pad,out_hw", CONFIGS)
def test_windows_read_the_padded_input(shape, kernel, stride, pad, out_hw):
    fill = -7.0
    x = np.random.default_rng(0).standard_normal(shape)
    windows = ShiftedWindows(np, np.float64, shape, kernel, stride, pad, out_hw, fill)
    windows.load(x)
    n, c, h, w = shape
    seen = set()
    for tag, index, shift in windows.offsets:
        i, j = divmod(tag, kernel[1])
        got = windows.valid(windows.window(windows.phases, index, shift))
        for ni, ci, y, z in itertools.product(range(n), range(c), range(out_hw[0]),
                                              range(out_hw[1])):
            hh, ww = y * stride[0] - pad[0] + i, z * stride[1] - pad[1] + j
            inside = 0 <= hh < h and 0 <= ww < w
            assert got[ni, ci, y, z] == (x[ni, ci, hh, ww] if inside else fill)
            if inside:
                seen.add((hh, ww))
    # unload is load's inverse on the cells some window reads, and zero elsewhere.
    back = np.full(shape, 99.0)
    windows.unload(windows.phases, back)
    read = np.zeros((h, w), dtype=bool)
    for hh, ww in seen:
        read[hh, ww] = True
    np.testing.assert_array_equal(back[:, :, read], x[:, :, read])
    np.testing.assert_array_equal(back[:, :, ~read], 0.0)

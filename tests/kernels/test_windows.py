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
    phases = np.full(windows.phases_shape, np.nan)  # load writes every cell
    windows.load(x, phases)
    n, c, h, w = shape
    seen = set()
    for tag, index, shift in windows.offsets:
        i, j = divmod(tag, kernel[1])
        got = windows.valid(windows.window(phases, index, shift))
        for ni, ci, y, z in itertools.product(range(n), range(c), range(out_hw[0]),
                                              range(out_hw[1])):
            hh, ww = y * stride[0] - pad[0] + i, z * stride[1] - pad[1] + j
            inside = 0 <= hh < h and 0 <= ww < w
            assert got[ni, ci, y, z] == (x[ni, ci, hh, ww] if inside else fill)
            if inside:
                seen.add((hh, ww))
    # unload is load's inverse on the cells some window reads, and zero elsewhere.
    back = np.full(shape, 99.0)
    windows.unload(phases, back)
    read = np.zeros((h, w), dtype=bool)
    for hh, ww in seen:
        read[hh, ww] = True
    np.testing.assert_array_equal(back[:, :, read], x[:, :, read])
    np.testing.assert_array_equal(back[:, :, ~read], 0.0)


@pytest.mark.parametrize("shape,kernel,stride,pad,out_hw", CONFIGS)
def test_sample_ranges_and_blocks(shape, kernel, stride, pad, out_hw):
    x = np.random.default_rng(1).standard_normal(shape)
    whole = ShiftedWindows(np, np.float64, shape, kernel, stride, pad, out_hw, -7.0)
    whole_phases = whole.new_phases()
    whole.load(x, whole_phases)
    split = ShiftedWindows(np, np.float64, shape, kernel, stride, pad, out_hw, -7.0)
    split_phases = np.full(split.phases_shape, np.nan)
    for start in range(shape[0]):  # one sample at a time: the same phases
        split.load(x, split_phases, start, start + 1)
    read = sorted({index for _, index, _ in split.offsets})  # unread phases stay unwritten
    np.testing.assert_array_equal(split_phases[read], whole_phases[read])
    # Blocks cover exactly the cells of a sample range, in order.
    lo, hi = split.cells(1, shape[0]) if shape[0] > 1 else split.cells(0, 1)
    blocks = split.blocks(1, shape[0], 5) if shape[0] > 1 else split.blocks(0, 1, 5)
    assert blocks[0][0] == lo and blocks[-1][1] == hi
    assert all(b - a <= 5 and a == previous for (a, b), previous in
               zip(blocks, [lo] + [b for _, b in blocks[:-1]]))
    # unload of a sample range writes only those samples.
    back = np.full(shape, 99.0)
    split.unload(split_phases, back, 0, 1)
    np.testing.assert_array_equal(back[1:], 99.0)
    reference = np.full(shape, 99.0)
    whole.unload(whole_phases, reference)
    np.testing.assert_array_equal(back[:1], reference[:1])


def test_margin_slice_reads_the_cells_an_offset_sends_to_a_phase_range():
    windows = ShiftedWindows(np, np.float64, (2, 1, 5, 5), (3, 3), (1, 1), (1, 1), (5, 5), 0.0)
    # Grid cell g holds g + 1; the margin before it holds zeros.
    grid = np.concatenate([np.zeros(windows.margin), np.arange(windows.length) + 1.0])
    for _, _, shift in windows.offsets:
        got = windows.margin_slice(grid, shift, 3, 9)
        # Phase cell q receives grid cell q - shift; none before the first grid cell.
        expected = [q - shift + 1.0 if q >= shift else 0.0 for q in range(3, 9)]
        np.testing.assert_array_equal(got, expected)

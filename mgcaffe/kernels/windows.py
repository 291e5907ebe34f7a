"""Sliding 2-D windows as shifted, contiguous 1-D slices (pooling's kernel, numpy and CuPy).

A ufunc over a sliced 4-D view runs its inner loop once per row; on a CNN's small planes
(7 to 56 wide) that per-row overhead dominates. Here the padded input is split into its
stride phases, each stored flat and contiguous, so that every kernel offset reads one
contiguous 1-D slice of one phase and a whole minibatch is reduced by a few long 1-D calls.

Layout. With output size (Ph, Pw), windows span Hn = (Ph-1)*sh + kh padded rows (from -pad),
rounded up to Hq = ceil(Hn / sh) rows per phase (Wq likewise). Phase (a, b) holds padded cell
(u*sh + a, v*sw + b), i.e. input cell (u*sh + a - ph, v*sw + b - pw), at (n, c, u, v) of a
(N, C, Hq, Wq) grid. Output (oh, ow) at kernel offset (i, j) reads phase (i % sh, j % sw) at
grid cell (oh + i // sh, ow + j // sw): the output's own flat grid index plus a shift of
(i // sh) * Wq + j // sw. Grid cells past (Ph, Pw) are junk outputs, computed and dropped;
each phase has `max_shift` spare tail cells so every slice stays in bounds.

Ranges. Every method takes a range of samples [start, stop) or of grid cells [lo, hi), so
that threads can work on disjoint samples (`kernels.parallel`) and a cell range can be cut
into cache-sized blocks. The windows of a valid output never leave its channel plane; only
junk outputs read cells of the next sample. A scatter into shifted slices would write into
a neighbour's range, so gradients are gathered instead: phase cell q receives, at each
offset, grid cell q - shift, read from a grid array with `margin` (= max_shift) leading
cells that hold zeros (`margin_slice`).
"""

from __future__ import annotations

from .im2col import valid_range


class ShiftedWindows:
    """The phase layout of one input shape, kernel, stride, pad and output size.

    A phases array (`phases_shape`: S = sh*sw rows of length L + max_shift, L = N*C*Hq*Wq,
    supplied by the caller) holds the padded input after `load`; cells that are not input
    cells hold `fill`. `offsets` lists (tag, phase, shift) per kernel offset in scan order,
    tag = i*kw + j. Arrays of length L are "grid" arrays: `valid(a)` views their (N, C, Ph,
    Pw) output part.
    """

    def __init__(self, xp, dtype, shape, kernel, stride, pad, out_hw, fill):
        n, c, height, width = shape
        (kh, kw), (sh, sw) = kernel, stride
        self.xp, self.out_hw = xp, tuple(out_hw)
        hq = -(-((out_hw[0] - 1) * sh + kh) // sh)
        wq = -(-((out_hw[1] - 1) * sw + kw) // sw)
        self.grid_shape = (n, c, hq, wq)
        self.sample_length = c * hq * wq
        self.length = n * self.sample_length
        self.offsets = [(i * kw + j, (i % sh) * sw + j % sw, (i // sh) * wq + j // sw)
                        for i in range(kh) for j in range(kw)]
        self.max_shift = self.margin = max(shift for _, _, shift in self.offsets)
        self.phases_shape = (sh * sw, self.length + self.max_shift)
        self.fill, self.dtype = fill, dtype
        # Per phase: the grid block that holds input cells and the input slices they come from.
        rows = [valid_range(height, hq, pad[0], sh, a) for a in range(sh)]
        cols = [valid_range(width, wq, pad[1], sw, b) for b in range(sw)]
        used = {index for _, index, _ in self.offsets}  # stride > kernel leaves phases unread
        self._copies = []
        # Per read phase: the grid cells outside its input block (the padding): `fill`.
        self._frames = []
        everything = (slice(None),) * 4
        for a, (u0, u1, h_first) in enumerate(rows):
            for b, (v0, v1, w_first) in enumerate(cols):
                if a * sw + b not in used:
                    continue
                if u1 <= u0 or v1 <= v0:
                    self._frames.append((a * sw + b, [everything]))
                    continue
                grid_block = (slice(None), slice(None), slice(u0, u1), slice(v0, v1))
                source = (slice(None), slice(None),
                          slice(h_first, h_first + (u1 - u0 - 1) * sh + 1, sh),
                          slice(w_first, w_first + (v1 - v0 - 1) * sw + 1, sw))
                self._copies.append((a * sw + b, grid_block, source))
                inside = slice(u0, u1)
                self._frames.append((a * sw + b, [
                    everything[:2] + (slice(0, u0), slice(None)),
                    everything[:2] + (slice(u1, None), slice(None)),
                    everything[:2] + (inside, slice(0, v0)),
                    everything[:2] + (inside, slice(v1, None))]))
        # Input cells past the last window, or in an unread phase, get a zero gradient.
        self.covers_input = (len(used) == sh * sw
                             and sum(max(0, u1 - u0) for u0, u1, _ in rows) == height
                             and sum(max(0, v1 - v0) for v0, v1, _ in cols) == width)

    def grid(self, flat):
        """A length-L array as its (N, C, Hq, Wq) grid."""
        return flat.reshape(self.grid_shape)

    def phase_grid(self, phases, index):
        """Phase `index` of a phases-shaped array as its (N, C, Hq, Wq) grid."""
        return phases[index, :self.length].reshape(self.grid_shape)

    def valid(self, flat):
        """The (N, C, Ph, Pw) output part of a grid array (a strided view)."""
        return self.grid(flat)[:, :, :self.out_hw[0], :self.out_hw[1]]

    def cells(self, start, stop):
        """The grid cell range [lo, hi) of samples [start, stop)."""
        return start * self.sample_length, stop * self.sample_length

    def blocks(self, start, stop, size):
        """Cell ranges of at most `size` cells covering samples [start, stop)."""
        lo, hi = self.cells(start, stop)
        return [(b, min(hi, b + size)) for b in range(lo, hi, max(1, size))]

    def new_phases(self):
        """A phases array of this layout (uninitialised: `load` writes it)."""
        return self.xp.empty(self.phases_shape, dtype=self.dtype)

    def load(self, x, phases, start=0, stop=None):
        """Write the cells of samples [start, stop) that the windows read: x's (N, C, H, W)
        cells, and `fill` in the padding around them (and in the spare tail, with the last
        sample). Phases no window reads are left alone."""
        stop = self.grid_shape[0] if stop is None else stop
        for index, frame in self._frames:
            grid = self.phase_grid(phases, index)[start:stop]
            for cells in frame:
                grid[cells] = self.fill
        if stop == self.grid_shape[0]:
            phases[:, self.length:] = self.fill
        for index, grid_block, source in self._copies:
            self.phase_grid(phases, index)[start:stop][grid_block] = x[start:stop][source]

    def window(self, phases, index, shift, lo=0, hi=None):
        """The contiguous slice of a phases-shaped array that one kernel offset reads for grid
        cells [lo, hi) (all cells by default)."""
        hi = self.length if hi is None else hi
        return phases[index, lo + shift:hi + shift]

    def margin_slice(self, grid, shift, lo, hi):
        """Cells [lo - shift, hi - shift) of a grid array stored after `margin` leading zero
        cells: the outputs that phase cells [lo, hi) feed at an offset with this shift."""
        return grid[self.margin + lo - shift:self.margin + hi - shift]

    def unload(self, phases, out, start=0, stop=None):
        """Write samples [start, stop) of a phases-shaped array's input cells into out (N, C,
        H, W); cells no window reads get 0."""
        stop = self.grid_shape[0] if stop is None else stop
        out = out[start:stop]
        if not self.covers_input:
            out[...] = 0
        for index, grid_block, source in self._copies:
            out[source] = self.phase_grid(phases, index)[start:stop][grid_block]

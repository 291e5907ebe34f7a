"""A net's parameter diffs: one flat buffer (Caffe's multi-GPU layout) and the two clears.

pycaffe hands out each diff as a view of the blob's memory (`diff = net.params["conv"][0].
diff`), and user code keeps such arrays: manual gradient accumulation, surgery on diffs,
callbacks reading them. A held array must read what a fresh `blob.diff` reads at every point
user code can look. So there are two clears:

- `clear()` (pycaffe's `net.clear_param_diffs()`): writes the zeros at once.
- `clear_for_pass(user_code)` (the solver, once per iteration, right before the forward and
  backward): marks the diffs zero (`Blob.clear_diff_lazily`) so that the first backward
  writer overwrites instead of a fill and a read, unless code of the user's may run before
  the backward has written them (a Python layer, a per-layer callback, pycaffe's on_start):
  then it writes the zeros at once too. `settle()` fills what the backward did not write (a
  frozen or skipped layer): the net calls it at the end of every backward, so nothing user
  code can see stays marked.

Which of the two a pass uses is `clear_way(...)`, a value to print.
"""

from __future__ import annotations

from typing import Any

from ..errors import NetError

LAZY = "lazy"
EAGER = "eager"


def clear_way(lazy_allowed: bool, user_code: bool) -> str:
    """How the per-iteration clear writes the zeros: LAZY (the first backward writer
    overwrites) only where allowed and no user code can look at the diffs before the
    backward has written them; else EAGER (one fill)."""
    return LAZY if lazy_allowed and not user_code else EAGER


class ParamDiffs:
    """The parameter diffs of one net (its `learnable_params`): their layout and clearing.

    `flatten(ids)` lays the diffs of `ids` out as one buffer; `buffer` is it, zeros filled;
    `clear()` / `clear_for_pass(user_code)` / `settle()` as the module docstring says."""

    def __init__(self, params: list, owners: list[int], blobs: list, xp: Any, dtype: Any):
        self.params = params  # the net's learnable_params (owned blobs)
        self._owners = owners  # param_owners: -1 for an owner, else the owner's index
        self._blobs = blobs  # every parameter blob, owners and sharers
        self.xp, self.dtype = xp, dtype
        self._buffer = None
        self.flat_ids: tuple[int, ...] = ()
        self._loose_ids = tuple(range(len(params)))
        self.marked = False  # diffs cleared lazily that may be unwritten still
        self.last_way: str | None = None

    def flatten(self, ids: list[int], where: str = "flatten_param_diffs"):
        """Make the diffs of `ids` (learnable_params indices, in buffer order) consecutive
        views of one new buffer, values kept; sharers follow their owners. Returns it.
        Ids out of range or repeated are a NetError that begins with `where`."""
        count = len(self.params)
        bad = [p for p in ids if not 0 <= p < count]
        if bad:
            raise NetError(f"{where}: parameter ids {bad} are not in 0..{count - 1}")
        if len(set(ids)) != len(ids):
            raise NetError(f"{where}: the order repeats a parameter id: {ids}")
        blobs = [self.params[p] for p in ids]
        flat = self.xp.zeros(sum(b.count for b in blobs), dtype=self.dtype)
        offset = 0
        for blob in blobs:
            blob.use_diff_storage(flat[offset:offset + blob.count].reshape(blob.shape))
            offset += blob.count
        # Sharers aliased the owners' old diffs: point them at the new ones.
        for i, owner in enumerate(self._owners):
            if owner >= 0:
                self._blobs[i].share_diff(self._blobs[owner])
        self._buffer = flat
        self.flat_ids = tuple(ids)
        self._loose_ids = tuple(sorted(set(range(len(self.params))) - set(ids)))
        return flat

    @property
    def buffer(self):
        """The flat buffer (None before `flatten`), its lazily cleared diffs zeroed first:
        code reading the buffer directly sees what `blob.diff` would."""
        if self._buffer is not None:
            for i in self.flat_ids:
                self.params[i].diff  # noqa: B018 - the property fills lazy zeros
        return self._buffer

    def settle_layer(self, param_ids) -> None:
        """Fill these diffs where still cleared lazily (a layer whose backward was skipped):
        the gradient sync then reduces the buffer's memory directly."""
        for i in param_ids:
            self.params[i].diff  # noqa: B018 - the property fills lazy zeros

    def settle(self) -> None:
        """Fill every diff still cleared lazily; nothing is marked afterwards."""
        if self.marked:
            self.settle_layer(range(len(self.params)))
            self.marked = False

    def clear(self) -> None:
        """Zero every owned diff now: one fill of the flat buffer, one per other diff."""
        if self._buffer is not None:
            for i in self.flat_ids:  # no lazy marks left under the fill
                self.params[i].diff_for_write()
            self._buffer.fill(0)
        for i in self._loose_ids:
            self.params[i].diff_for_write()[0].fill(0)
        self.marked = False

    def clear_some(self, ids, lazy_allowed: bool, user_code: bool) -> str:
        """Clear the diffs of `ids` (learnable_params indices) as `clear_way` says; a lazy
        clear is marked, so `settle()` fills what no backward wrote. Returns the way."""
        way = clear_way(lazy_allowed, user_code)
        for i in ids:
            if way == LAZY:
                self.params[i].clear_diff_lazily()
            else:
                self.params[i].diff_for_write()[0].fill(0)
        if way == LAZY:
            self.marked = True
        return way

    def clear_for_pass(self, lazy_allowed: bool, user_code: bool) -> str:
        """The solver's clear before a forward and backward, as `clear_way` says; the way."""
        way = clear_way(lazy_allowed, user_code)
        if way == LAZY:
            for blob in self.params:
                blob.clear_diff_lazily()
            self.marked = True
        else:
            self.clear()
        self.last_way = way
        return way

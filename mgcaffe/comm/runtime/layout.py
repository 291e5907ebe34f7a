"""Where each learnable layer's gradient lives, and what each message of a plan covers.

`GradientLayout` checks the net's learnable layers once (indices 1..L, each parameter blob
owned by one layer, float32 diffs, numpy or CuPy) and gives each layer its fixed place in the
packing layout: the layers in backward order, each layer's blobs in order (the order
`Net.flatten_param_diffs` lays the net's own gradient buffer out in, as Caffe's multi-GPU
code does).

`compile_plan` turns a plan into a `Program`, what the communication thread runs: a merge
plan (groups only) is the barrier schedule of its groups; a plan with a `schedule`
(comm/model/schedule.py) adds parts, order, reduce-scatter/all-gather halves, batches and
per-layer completion. Each message is a slice of one buffer:
- in place (zero copy) where the group's diffs are consecutive views of one contiguous
  buffer in backward order (`contiguous_span`): the slice of the net's own buffer;
- packed otherwise (a net not flattened, device diffs staged through host memory, or asked
  for): the slice of the packing buffer, allocated once by the data path, into which each
  layer's diffs are copied as they arrive and from which the result is copied back.
A run of the sequence that the schedule batches is one collective over the concatenation of
its messages: one slice when they lie side by side, else gathered into a scratch buffer.

Each group travels in the plan's format for it (`plan.formats`, float32 without one); a run
the schedule batches across formats is sent as one run per format. A compressed message's
16-bit payload has its place in a wire buffer of the packing layout's size (`wire_at`), so
that an all-gather finds what its reduce-scatter left there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...backend import is_device_array
from ...errors import CommError
from ..model.schedule import Schedule, barrier_schedule, part_bounds, part_layers

__all__ = ["GradientLayout", "Message", "Program", "Run", "address", "check_plan_layers",
           "compile_plan", "contiguous_span", "plan_groups"]

KIND_NAMES = {"ar": "all-reduce", "rs": "reduce-scatter", "ag": "all-gather"}


def plan_groups(plan: Any) -> list[list[str]]:
    """The plan's groups (communication order, each in backward order) as lists of names."""
    groups = getattr(plan, "groups", plan)
    return [list(g) for g in groups]


def check_plan_layers(groups: list[list[str]], names: Sequence[str], rank: int) -> None:
    """The plan must cover the net's learnable layers exactly, in backward order."""
    planned = [n for g in groups for n in g]
    expected = list(reversed(list(names)))
    if planned == expected:
        return
    if any(not g for g in groups):
        raise CommError(f"rank {rank}: plan has an empty group")
    for i, (p, e) in enumerate(zip(planned, expected)):
        if p != e:
            raise CommError(f"rank {rank}: plan does not match the net: position {i} in "
                            f"backward order is layer {p!r} in the plan but {e!r} in the net")
    longer, which = (planned, "plan") if len(planned) > len(expected) else (expected, "net")
    raise CommError(f"rank {rank}: plan does not match the net: the plan has {len(planned)} "
                    f"learnable layers, the net {len(expected)} (the {which} also has "
                    f"{longer[min(len(planned), len(expected))]!r})")


def address(array: Any) -> int:
    """Where an array's first element lives (numpy or CuPy)."""
    pointer = getattr(array.data, "ptr", None)  # a CuPy MemoryPointer
    return int(pointer) if pointer is not None else int(array.ctypes.data)


def contiguous_span(arrays: Sequence[Any]) -> Any | None:
    """The 1-D slice of one buffer that `arrays` tile, in this order, without gaps: each is a
    C-contiguous view of the same 1-D float32 base and starts where the previous one ends
    (the layout of Net.flatten_param_diffs). None when they do not."""
    found = _span(arrays)
    return None if found is None else found[0][found[1]:found[2]]


def _span(arrays: Sequence[Any]) -> tuple[Any, int, int] | None:
    """(base, start, stop) of `contiguous_span`, in elements of the base; None."""
    if not arrays:
        return None
    base = arrays[0].base
    if base is None or base.ndim != 1 or base.dtype != np.float32 or \
            not base.flags.c_contiguous:
        return None
    first, item = address(base), base.itemsize
    start, gap = divmod(address(arrays[0]) - first, item)
    position = start
    for a in arrays:
        if a.base is not base or a.dtype != base.dtype or not a.flags.c_contiguous or gap or \
                address(a) - first != position * item:
            return None
        position += a.size
    return base, start, position


@dataclass
class Segment:
    """One parameter blob's place in the packing buffer: `view` has the blob's shape."""

    blob: Any
    view: Any


class GradientLayout:
    """The learnable layers' gradients (module docstring). `layers`: objects with `index`
    (1..L), `name`, `param_ids`; `params`: the blobs `param_ids` index."""

    def __init__(self, layers: Sequence[Any], params: Sequence[Any], rank: int):
        self.rank = rank
        self.layers = {int(layer.index): layer for layer in layers}
        self.L = len(self.layers)
        if sorted(self.layers) != list(range(1, self.L + 1)):
            raise CommError(f"rank {rank}: learnable layer indices must be 1..{self.L}, got "
                            f"{sorted(self.layers)}")
        self.names = [self.layers[k].name for k in range(1, self.L + 1)]
        self.params = params
        self.on_device = self._check_diffs()
        # Each layer's diff arrays now: the in-place path reduces exactly these memories.
        self.diffs = {k: [params[p].diff for p in layer.param_ids]
                      for k, layer in self.layers.items()}
        self.sizes = {k: sum(int(d.size) for d in ds) for k, ds in self.diffs.items()}
        self.offsets: dict[int, int] = {}  # the packing layout: backward order
        offset = 0
        for k in range(self.L, 0, -1):
            self.offsets[k] = offset
            offset += self.sizes[k]
        self.total = offset
        self._segments: dict[int, list[Segment]] = {}  # per layer, in `_packing`
        self._packing: Any = None

    def _check_diffs(self) -> bool:
        """Float32 numpy or CuPy diffs, each blob owned by one layer; whether on a device."""
        seen: dict[int, str] = {}
        on_device = False
        for _, layer in sorted(self.layers.items()):
            for p in layer.param_ids:
                if p in seen:
                    raise CommError(f"rank {self.rank}: parameter {p} is owned by both "
                                    f"{seen[p]!r} and {layer.name!r}")
                seen[p] = layer.name
                diff = self.params[p].diff
                device = not isinstance(diff, np.ndarray)
                if getattr(diff, "dtype", None) != np.float32 or (
                        device and not is_device_array(diff)):
                    raise CommError(f"rank {self.rank}: layer {layer.name!r} parameter {p}: "
                                    f"gradient sync needs float32 numpy or CuPy diffs, got "
                                    f"{type(diff).__name__} {getattr(diff, 'dtype', '')}")
                on_device |= device
        return on_device

    def name(self, k: int) -> str:
        return self.layers[k].name if k in self.layers else f"#{k}"

    def segments(self, k: int, buffer: Any) -> list[Segment]:
        """Layer k's blobs and their places in `buffer` (the packing layout); made once per
        buffer."""
        if buffer is not self._packing:
            self._packing, self._segments = buffer, {}
        found = self._segments.get(k)
        if found is None:
            found = self._segments[k] = self._segments_in(k, buffer)
        return found

    def _segments_in(self, k: int, buffer: Any) -> list[Segment]:
        out, offset = [], self.offsets[k]
        for p in self.layers[k].param_ids:
            blob = self.params[p]
            n = blob.diff.size
            out.append(Segment(blob, buffer[offset:offset + n].reshape(blob.diff.shape)))
            offset += n
        return out

    def check_shapes(self, k: int, segments: list[Segment]) -> None:
        for seg in segments:
            if seg.blob.diff.shape != seg.view.shape:
                raise CommError(f"rank {self.rank}: layer {self.name(k)!r}: a gradient changed "
                                f"shape from {seg.view.shape} to {seg.blob.diff.shape}")

    def check_in_place(self, k: int) -> None:
        """Layer k's diffs must still be the arrays its slice covers: a diff replaced by
        another array (rather than written in place) would silently not be reduced."""
        layer = self.layers[k]
        for p, diff in zip(layer.param_ids, self.diffs[k]):
            if self.params[p].diff is not diff:
                raise CommError(f"rank {self.rank}: layer {layer.name!r} parameter {p}: its "
                                f"diff is no longer the slice of the gradient buffer the "
                                f"all-reduce works on (replaced instead of written in place, "
                                f"or the net was flattened again)")


@dataclass
class Message:
    """One message of the schedule: part `part` of group `group`, of `kind` "ar", "rs" or
    "ag", over `piece` (a slice of the net's buffer, or of the packing buffer: `packed`)."""

    index: int  # position in the schedule's order
    group: int
    part: int
    kind: str
    piece: Any
    packed: bool
    home: Any  # the 1-D buffer `piece` is a slice of ...
    start: int  # ... starting at this element
    layers: tuple[int, ...]  # the learnable layers whose elements it holds
    names: tuple[str, ...]  # ... by name
    ready_layer: int  # the input-most of them: its arrival makes the message ready
    whole: bool  # the group's only part
    wire: str = "float32"  # the format it travels in (model.cost.WIRE_FORMATS)
    wire_at: int = 0  # where its payload lives in a wire buffer (the packing layout)

    @property
    def nbytes(self) -> int:
        return int(self.piece.nbytes)

    @property
    def label(self) -> str:
        """'allreduce g3' for a whole group's all-reduce, else 'all-gather g3.1'."""
        if self.whole and self.kind == "ar":
            return f"allreduce g{self.group}"
        return f"{KIND_NAMES[self.kind]} g{self.group}.{self.part}"


@dataclass
class Run:
    """Consecutive messages of the order sent as one collective: `joined` is their
    concatenation as one slice when they lie side by side (None: gathered into scratch)."""

    messages: list[Message]
    joined: Any

    @property
    def kind(self) -> str:
        return self.messages[0].kind

    @property
    def wire(self) -> str:
        """The format the run travels in (one per run: `compile_plan` splits by format)."""
        return self.messages[0].wire

    @property
    def elements(self) -> int:
        return sum(int(m.piece.size) for m in self.messages)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.messages)

    def describe(self) -> str:
        """'all-reduce of group 0 (fc2, fc1; 4096 bytes)', 'all-gather of group 2 part 1
        and 1 more part(s) (4096 bytes)'."""
        m = self.messages[0]
        if m.whole and len(self.messages) == 1:
            return (f"{KIND_NAMES[m.kind]} of group {m.group} ({', '.join(m.names)}; "
                    f"{self.nbytes} bytes)")
        more = f" and {len(self.messages) - 1} more part(s)" if len(self.messages) > 1 else ""
        return (f"{KIND_NAMES[m.kind]} of group {m.group} part {m.part}{more} "
                f"({self.nbytes} bytes)")


@dataclass
class Program:
    """A plan compiled for a layout: what the communication thread runs each iteration."""

    plan: Any
    schedule: Schedule
    groups: list[list[int]]  # learnable indices per group, backward order
    names: list[list[str]]
    in_place: list[bool]  # per group: reduced in the net's own buffer
    messages: list[Message]
    runs: list[Run]
    opens: dict[int, list[int]]  # layer -> the messages its arrival makes ready
    holders: list[int]  # per layer: how many messages complete it ("ar" and "ag")
    ag_of: dict[int, int]  # an "rs" message -> its "ag"
    scratch: int  # elements of the widest run gathered into scratch
    group_of: dict[int, int] = field(default_factory=dict)
    formats: list[str] = field(default_factory=list)  # per group: its wire format

    def averaged(self, k: int) -> bool:
        """Whether layer k's messages arrive averaged (compressed: divided before the cast),
        so that unpacking copies instead of dividing."""
        return bool(self.formats) and self.formats[self.group_of[k]] != "float32"

    @property
    def wires(self) -> set[str]:
        """The compressed formats the program sends."""
        return {f for f in self.formats if f != "float32"}

    @property
    def per_layer(self) -> bool:
        """Whether each layer's update waits only for its own messages (and the next
        forward overlaps the rest)."""
        return self.schedule.update == "per-layer"

    def packed(self, k: int) -> bool:
        return not self.in_place[self.group_of[k]]

    @property
    def in_place_groups(self) -> int:
        return sum(self.in_place)


def compile_plan(plan: Any, layout: GradientLayout, packing: Callable[[], Any],
                 in_place: bool) -> Program:
    """The plan's messages over `layout` (module docstring). `packing()` returns the packing
    buffer (allocated on first use); `in_place` False packs every group."""
    rank = layout.rank
    names = plan_groups(plan)
    check_plan_layers(names, layout.names, rank)
    by_name = {layout.layers[k].name: k for k in layout.layers}
    groups = [[by_name[n] for n in g] for g in names]
    schedule: Schedule = getattr(plan, "schedule", None) or barrier_schedule(len(groups))
    elements = [sum(layout.sizes[k] for k in g) for g in groups]
    schedule.check(elements, f"rank {rank}: plan schedule")
    if schedule.policy != "sequence":
        raise CommError(f"rank {rank}: a plan to train sends a fixed sequence (every rank the "
                        f"same collectives in the same order); this one has policy "
                        f"{schedule.policy!r}: make it with the planner, which freezes "
                        f"priorities into their predicted sequence")
    formats = list(getattr(plan, "formats", ()) or ()) or ["float32"] * len(groups)
    if len(formats) != len(groups):
        raise CommError(f"rank {rank}: the plan lists {len(formats)} wire formats for "
                        f"{len(groups)} groups")
    homes, flags = [], []  # per group: (its buffer, where the group starts in it)
    for g in groups:
        span = _span([d for k in g for d in layout.diffs[k]]) if in_place else None
        flags.append(span is not None)
        homes.append(span[:2] if span is not None else (packing(), layout.offsets[g[0]]))
    position = {m: i for i, m in enumerate(schedule.order)}
    messages = []
    for i, (gi, p, kind) in enumerate(schedule.order):
        g = groups[gi]
        s, e = part_bounds(elements[gi], schedule.parts[gi])[p]
        held = tuple(g[j] for j in part_layers([layout.sizes[k] for k in g],
                                               schedule.parts[gi])[p]) or (min(g),)
        home, start = homes[gi]
        messages.append(Message(i, gi, p, kind, home[start + s:start + e], not flags[gi],
                                home, start + s, held, tuple(layout.name(k) for k in held),
                                min(held), schedule.parts[gi] == 1, formats[gi],
                                layout.offsets[g[0]] + s))
    opens: dict[int, list[int]] = {}
    holders = [0] * (layout.L + 1)
    for m in messages:
        if m.kind != "ag":
            opens.setdefault(m.ready_layer, []).append(m.index)
        if m.kind != "rs":
            for k in m.layers:
                holders[k] += 1
    ag_of = {position[(m.group, m.part, "rs")]: m.index for m in messages if m.kind == "ag"}
    runs = [Run(messages[a:b], _joined(messages[a:b]))
            for a0, b0 in schedule.runs() for a, b in _by_format(messages, a0, b0)]
    scratch = max((r.elements for r in runs if r.joined is None), default=0)
    return Program(plan, schedule, groups, names, flags, messages, runs, opens, holders,
                   ag_of, scratch, {k: gi for gi, g in enumerate(groups) for k in g},
                   formats)


def _by_format(messages: list[Message], a: int, b: int) -> list[tuple[int, int]]:
    """messages[a:b] cut where the format changes (one collective per format)."""
    cuts = [a] + [i for i in range(a + 1, b) if messages[i].wire != messages[i - 1].wire]
    return list(zip(cuts, cuts[1:] + [b]))


def _joined(messages: list[Message]) -> Any | None:
    """The messages' pieces as one slice of their buffer when they lie side by side."""
    if len(messages) == 1:
        return messages[0].piece
    for a, b in zip(messages, messages[1:]):
        if b.home is not a.home or b.start != a.start + int(a.piece.size):
            return None
    first = messages[0]
    return first.home[first.start:first.start + sum(int(m.piece.size) for m in messages)]

"""Algorithm 2 of MG-WFBP: a communication thread that all-reduces the planned groups.

The backward pass (main thread) calls `on_learnable_done(k)` right after learnable layer k's
backward: a queue put, nothing more. The communication thread takes ids in backward order
(L, L-1, ..., 1) and, when a group's last layer has arrived, all-reduces the group; the group
is then divided by the world size. `wait()` (main thread, before the update) returns when
every group of the iteration is done and re-raises, with the rank, whatever went wrong on the
thread. On the host path the divisions are wait()'s work: the main thread is idle there, while
during backward the communication thread's CPU is taken from backward on busy cores (both
threads share the divisions left after the iteration's last all-reduce). On the device paths
the thread queues the division right after the all-reduce.

Where a group's bytes live, chosen per group when the plan is set:
- in place (zero copy): the group's diffs are consecutive views of one contiguous buffer, in
  backward order (what `Net.flatten_param_diffs()` lays out, as Caffe's multi-GPU code
  does): the all-reduce and the division work on that slice of the net's own buffer;
- packed: otherwise (a net not flattened, or GPU diffs staged through host memory), each
  layer's diffs are copied into their fixed place in one contiguous float32 buffer of the
  executor's (allocated once: the groups are consecutive slices of it, so nothing is
  allocated per iteration) as they arrive, and the reduced slice, divided, is copied back.

Three data paths, chosen from the diffs and the communicator:
- "host": numpy diffs; all-reduce (and pack/unpack when packed) on the host (MPI, the local
  world).
- "staged": device (CuPy) diffs over a host communicator (MPI): each layer's diffs are copied
  to a pinned host buffer on a copy stream of their own as they arrive, and the averaged
  result is copied back (staging.py).
- "stream": device diffs over a communicator with `device_streams` (nccl.py): the main
  thread records an event per layer (`mark_ready`), the thread queues wait-for-event, pack,
  all-reduce and unpack (in place: the division alone) on the communicator's stream without
  host synchronisation, and synchronises once per iteration, after the last group.

No wait is unbounded: the thread's queue gets have a timeout while an iteration is under way
(backward stalled: CommError naming the rank and the layer and group awaited), `wait()` gives
up after `timeout` seconds without progress (naming the group being reduced), and an optional
`Watchdog` aborts the job if one all-reduce outlives the timeout (a peer lost mid-collective).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...backend import get_array_module, is_device_array
from ...errors import CommError
from ..backends.communicator import Communicator
from .staging import DeviceStaging
from .trace import COMM, COMPUTE

__all__ = ["GradientExecutor", "plan_groups"]

log = logging.getLogger("mgcaffe.comm")

_STOP = -1
_POLL_S = 0.5  # how often an idle thread looks at the stop flag between iterations


def set_thread_nice(native_id: int, nice: int) -> bool:
    """Give one thread (by its native id) the nice value `nice`; False where the OS does not
    allow it (an unprivileged process may not lower it) or has no per-thread nice (only Linux
    takes a thread id there)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, native_id, nice)
    except OSError:
        return False
    return True


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


def _address(array: Any) -> int:
    """Where an array's first element lives (numpy or CuPy)."""
    pointer = getattr(array.data, "ptr", None)  # a CuPy MemoryPointer
    return int(pointer) if pointer is not None else int(array.ctypes.data)


def contiguous_span(arrays: Sequence[Any]) -> Any | None:
    """The 1-D slice of one buffer that `arrays` tile, in this order, without gaps: each is a
    C-contiguous view of the same 1-D float32 base and starts where the previous one ends
    (the layout of Net.flatten_param_diffs). None when they do not."""
    if not arrays:
        return None
    base = arrays[0].base
    if base is None or base.ndim != 1 or base.dtype != np.float32 or \
            not base.flags.c_contiguous:
        return None
    first, item = _address(base), base.itemsize
    start, gap = divmod(_address(arrays[0]) - first, item)
    position = start
    for a in arrays:
        if a.base is not base or a.dtype != base.dtype or not a.flags.c_contiguous or gap or \
                _address(a) - first != position * item:
            return None
        position += a.size
    return base[start:position]


@dataclass
class _Segment:
    """One parameter blob's place in the packing buffer: `view` has the blob's shape."""

    blob: Any
    view: np.ndarray


@dataclass
class _Group:
    index: int
    names: list[str]
    layers: list[int]  # learnable indices, backward order
    last: int  # learnable index whose arrival completes the group (the input-most layer)
    start: int
    stop: int  # the group's slice of the packing buffer, in elements
    flat: Any = None  # the group's diffs as one slice of the net's buffer: reduced in place

    @property
    def nbytes(self) -> int:
        return (self.stop - self.start) * 4


class GradientExecutor:
    """The solver's `gradient_sync`: sums every learnable layer's parameter diffs across ranks
    and divides by the world size, group by group as the plan says, overlapping backward.

    `layers`: the net's learnable layers (objects with `index` 1..L, `name`, `param_ids`),
    input side first; `params`: the blobs `param_ids` index (each with a float32 `.diff`);
    `plan`: anything with `.groups` (lists of layer names, communication order); `comm`: a
    Communicator. Optional: `timeout` (seconds without progress before giving up), `tracer`
    (trace.Tracer), `watchdog` (faults.Watchdog guarding each all-reduce), `data_path`
    (force "host", "staged" or "stream" instead of choosing from the diffs), `in_place`
    (False: pack every group even where its diffs are one slice of a buffer), `thread_nice`
    (a nice value for the thread, e.g. -10: see `favoured`).

    `packed_bytes` counts the bytes copied into the packing buffer (0 when every group is
    reduced in place); `in_place_groups` says how many groups of the plan are. `favoured`
    is true when the thread runs at `thread_nice`: when the cores are busy computing, a
    thread of default priority waking from a short sleep (an MPI poll, the emulated wire
    time, the next layer's id) can wait for the running thread's time slice (measured on
    the 2-core CI machine with 2 busy processes: 1.5% of 0.3 ms sleeps ended over 1 ms late,
    p99 3.7 ms; at nice -10: 0.2%, p99 0.13 ms); lowering it needs root, CAP_SYS_NICE or
    RLIMIT_NICE (Linux)."""

    def __init__(self, layers: Sequence[Any], params: Sequence[Any], plan: Any,
                 comm: Communicator, *, timeout: float = 120.0, tracer: Any = None,
                 watchdog: Any = None, data_path: str | None = None,
                 in_place: bool = True, thread_nice: int | None = None):
        self.comm = comm
        self.rank = comm.rank
        self.timeout = float(timeout)
        self.tracer = tracer
        self.watchdog = watchdog
        self._layers = {int(layer.index): layer for layer in layers}
        self._names = [layer.name for layer in sorted(layers, key=lambda x: x.index)]
        if sorted(self._layers) != list(range(1, len(layers) + 1)):
            raise CommError(f"rank {self.rank}: learnable layer indices must be 1..{len(layers)},"
                            f" got {sorted(self._layers)}")
        self._params = params
        self.mode = self._data_path()
        if data_path is not None:  # tests drive the stream path with host arrays
            if data_path not in ("host", "staged", "stream"):
                raise CommError(f"rank {self.rank}: data_path must be host, staged or stream, "
                                f"got {data_path!r}")
            self.mode = data_path
        # Each layer's diff arrays now: the in-place path reduces exactly these memories.
        self._diffs = {k: [params[p].diff for p in layer.param_ids]
                       for k, layer in self._layers.items()}
        self._offsets = self._layer_offsets()
        # Staged diffs live on the device, the reduction on the host: they are always packed.
        self._in_place = in_place and self.mode in ("host", "stream")
        self.buffer: Any = None  # the packing buffer, allocated when a group needs it
        self._staging: DeviceStaging | None = None  # the staged path's copies (staging.py)
        self._segments: dict[int, list[_Segment]] = {}
        self.packed_bytes = 0
        self.set_plan(plan)

        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._done = 0  # groups reduced in the current iteration
        self._averaged = 0  # groups of the current iteration reduced and divided by N
        # Host groups reduced but not yet divided: wait() divides them on the main thread,
        # idle there, rather than the communication thread taking the CPU from backward;
        # after the iteration's last group both threads share what is left.
        self._pending: deque[tuple[_Group, Any]] = deque()
        self._defer = self.mode == "host"
        self._reducing: _Group | None = None
        self._last_progress = time.monotonic()
        self._error: BaseException | None = None
        self._closed = False
        self.iterations = 0
        self.allreduce_seconds = 0.0  # wall time inside all-reduces
        self.cpu_seconds = 0.0  # CPU time of the communication thread's work
        # a list: every all-reduce appends (start, end, bytes) (perf_counter seconds), for
        # the in-situ interference measurement; None: nothing recorded
        self.intervals: list[tuple[float, float, int]] | None = None
        self._thread = threading.Thread(target=self._run, name=f"mgcaffe-comm-{self.rank}",
                                        daemon=True)
        self._thread.start()
        self.favoured = (thread_nice is not None and
                         set_thread_nice(self._thread.native_id, thread_nice))

    @classmethod
    def from_net(cls, net: Any, plan: Any, comm: Communicator, **options: Any):
        """An executor for a Net (its `learnable_layers` and `learnable_params`)."""
        return cls(net.learnable_layers, net.learnable_params, plan, comm, **options)

    # ------------------------------------------------------------------ set-up
    def _data_path(self) -> str:
        """"host", "staged" or "stream" (module docstring); float32 diffs, each blob owned
        by one layer."""
        seen: dict[int, str] = {}
        on_device = False
        for _, layer in sorted(self._layers.items()):
            for p in layer.param_ids:
                if p in seen:
                    raise CommError(f"rank {self.rank}: parameter {p} is owned by both "
                                    f"{seen[p]!r} and {layer.name!r}")
                seen[p] = layer.name
                diff = self._params[p].diff
                device = not isinstance(diff, np.ndarray)
                if getattr(diff, "dtype", None) != np.float32 or (
                        device and not is_device_array(diff)):
                    raise CommError(f"rank {self.rank}: layer {layer.name!r} parameter {p}: "
                                    f"gradient sync needs float32 numpy or CuPy diffs, got "
                                    f"{type(diff).__name__} {getattr(diff, 'dtype', '')}")
                on_device |= device
        if not on_device:
            return "host"
        return "stream" if getattr(self.comm, "device_streams", False) else "staged"

    def _layer_offsets(self) -> dict[int, tuple[int, int]]:
        """Each layer's (start, stop) in the packing buffer, in elements (backward order)."""
        out, offset = {}, 0
        for k in range(len(self._layers), 0, -1):
            n = sum(int(d.size) for d in self._diffs[k])
            out[k] = (offset, offset + n)
            offset += n
        return out

    def _allocate_packing(self) -> None:
        """The packing buffer (on the device for the stream path, else on the host), and
        every parameter blob's fixed place in it, in backward order; once."""
        if self.buffer is not None:
            return
        total = self._offsets[1][1] if self._layers else 0
        xp = (get_array_module(self._params[0].diff) if self.mode == "stream" and self._params
              else np)
        if self.mode == "staged" and self._params:
            self._staging = DeviceStaging(self._params[0].diff.device.id, total)
            self.buffer = self._staging.buffer
        else:
            self.buffer = xp.zeros(total, dtype=np.float32)
        for k, (offset, _) in self._offsets.items():
            segs = []
            for p in self._layers[k].param_ids:
                blob = self._params[p]
                n = blob.diff.size
                segs.append(_Segment(blob, self.buffer[offset:offset + n].reshape(blob.diff.shape)))
                offset += n
            self._segments[k] = segs

    def set_plan(self, plan: Any) -> None:
        """Use `plan` from the next iteration on (between iterations only: after wait())."""
        if getattr(self, "_pos", 0):
            raise CommError(f"rank {self.rank}: plan changed in the middle of an iteration")
        groups = plan_groups(plan)
        check_plan_layers(groups, self._names, self.rank)
        by_name = {layer.name: k for k, layer in self._layers.items()}
        self.plan = plan
        self.groups: list[_Group] = []
        self._group_of: dict[int, _Group] = {}
        for gi, names in enumerate(groups):
            ks = [by_name[n] for n in names]
            # backward order: the group's first name is its output-most layer
            flat = (contiguous_span([d for k in ks for d in self._diffs[k]])
                    if self._in_place else None)
            g = _Group(gi, names, ks, last=ks[-1], start=self._offsets[ks[0]][0],
                       stop=self._offsets[ks[-1]][1], flat=flat)
            self.groups.append(g)
            for k in ks:
                self._group_of[k] = g
        self.in_place_groups = sum(g.flat is not None for g in self.groups)
        if self.in_place_groups < len(self.groups):
            self._allocate_packing()
        self._order = list(range(len(self._layers), 0, -1))
        self._pos = 0

    # ------------------------------------------------------------------ main thread
    def on_learnable_done(self, k: int) -> None:
        """Learnable layer k's gradients are complete (called by the backward hook)."""
        if self._error is not None:
            self._raise()
        if self.tracer is not None:
            self.tracer.instant(self._layers[k].name if k in self._layers else str(k), "grad",
                                COMPUTE, self.tracer.now(), layer=k)
        if self.mode == "stream":
            self.comm.mark_ready(k)  # an event on the compute stream: k's diffs are queued
        elif self._staging is not None:
            self._staging.mark_ready(k)
        self._queue.put(k)

    def wait(self) -> None:
        """Block until every group of this iteration is reduced and averaged (dividing the
        reduced host groups meanwhile); re-raise thread failures."""
        t0, since = time.perf_counter(), time.monotonic()
        while not self._wait_for_work(since):
            self._average_pending(COMPUTE)
        if self._error is not None:
            self._raise()
        self.iterations += 1
        if self.tracer is not None:
            self.tracer.span("wait for gradients", "wait", COMPUTE, t0, time.perf_counter())

    def _wait_for_work(self, since: float) -> bool:
        """Wait until a reduced group waits to be divided (False) or every group of the
        iteration is done, or the thread failed (True). No progress for `timeout` seconds
        counts from the last progress or from `since`, whichever is later (between
        iterations the thread is idle for as long as it takes)."""
        with self._cond:
            while not self._pending and self._averaged < len(self.groups):
                if self._error is not None:
                    return True
                if self._closed:
                    raise CommError(f"rank {self.rank}: gradient sync used after close()")
                left = max(self._last_progress, since) + self.timeout - time.monotonic()
                if left <= 0 and self._reducing is not None and \
                        getattr(self.watchdog, "liveness", None) is not None:
                    # An all-reduce in flight under a watchdog that judges it by the peers'
                    # progress (a peer busy snapshotting is waited for): the watchdog decides.
                    left = _POLL_S
                elif left <= 0:
                    raise CommError(self._stall_message())
                self._cond.wait(min(left, _POLL_S))
            if self._pending:
                return False
            self._done = self._averaged = 0
            return True

    def _stall_message(self) -> str:
        g = self._reducing
        if g is not None:
            return (f"rank {self.rank}: all-reduce of group {g.index} ({', '.join(g.names)}; "
                    f"{g.nbytes} bytes) not done after {self.timeout:g} s: a peer rank died "
                    f"or is stuck")
        k = self._order[self._pos] if self._pos < len(self._order) else None
        if k is None or self._pos == 0 and self._done == 0:
            return (f"rank {self.rank}: no gradient arrived within {self.timeout:g} s "
                    f"(wait() called before backward?)")
        return (f"rank {self.rank}: waited {self.timeout:g} s for the gradient of layer "
                f"{self._layers[k].name!r} (group {self._group_of[k].index})")

    def _raise(self) -> None:
        exc = self._error
        if isinstance(exc, CommError):
            raise CommError(str(exc)) from exc
        raise CommError(f"rank {self.rank}: communication thread failed: "
                        f"{type(exc).__name__}: {exc}") from exc

    def close(self, join: bool = True) -> None:
        """Stop the thread (after the current iteration's work); idempotent. `join=False`
        (the failure path) does not wait: the thread may be stuck in a collective."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        if join:
            self._thread.join(timeout=min(self.timeout, 10.0))
        with self._cond:
            self._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ------------------------------------------------------------------ communication thread
    def _run(self) -> None:
        try:
            while True:
                k = self._next_id()
                if k == _STOP:
                    return
                cpu = time.thread_time()
                self._take(k)
                # CPU this thread takes from the cores backward runs on (copies, MPI)
                self.cpu_seconds += time.thread_time() - cpu
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait()
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            log.error("rank %d: communication thread: %s: %s", self.rank, type(exc).__name__,
                      exc)

    def _next_id(self) -> int:
        """The next layer id; between iterations wait indefinitely (but wake to see close()),
        within an iteration for at most `timeout` seconds."""
        deadline = time.monotonic() + self.timeout
        while True:
            within = self._pos > 0
            wait = min(_POLL_S, deadline - time.monotonic()) if within else _POLL_S
            try:
                return self._queue.get(timeout=max(wait, 0.0))
            except queue.Empty:
                if self._closed:
                    return _STOP
                if within and time.monotonic() >= deadline:
                    k = self._order[self._pos]
                    raise CommError(f"rank {self.rank}: waited {self.timeout:g} s for the "
                                    f"gradient of layer {self._layers[k].name!r} (group "
                                    f"{self._group_of[k].index}): backward stalled") from None

    def _take(self, k: int) -> None:
        expected = self._order[self._pos]
        if k != expected:
            got = self._layers[k].name if k in self._layers else f"#{k}"
            raise CommError(f"rank {self.rank}: backward reported layer {got!r} but layer "
                            f"{self._layers[expected].name!r} comes next in backward order")
        group = self._group_of[k]
        if group.flat is not None:
            self._check_in_place(k)
            if self.mode == "stream":
                self.comm.wait_ready(k)
        else:
            self._pack(k)
        self._pos += 1
        self._last_progress = time.monotonic()
        if k == group.last:
            self._reduce(group)
        if self._pos == len(self._order):
            self._pos = 0

    def _check_in_place(self, k: int) -> None:
        """Layer k's diffs must still be the arrays the group's slice covers: a diff replaced
        by another array (rather than written in place) would silently not be reduced."""
        layer = self._layers[k]
        for p, diff in zip(layer.param_ids, self._diffs[k]):
            if self._params[p].diff is not diff:
                raise CommError(f"rank {self.rank}: layer {layer.name!r} parameter {p}: its "
                                f"diff is no longer the slice of the gradient buffer the "
                                f"all-reduce works on (replaced instead of written in place, "
                                f"or the net was flattened again)")

    def _pack(self, k: int) -> None:
        """Copy layer k's diffs into their place in the packing buffer."""
        segs = self._segments[k]
        for seg in segs:
            diff = seg.blob.diff
            if diff.shape != seg.view.shape:
                raise CommError(f"rank {self.rank}: layer {self._layers[k].name!r}: a gradient "
                                f"changed shape from {seg.view.shape} to {diff.shape}")
        if self.mode == "host":
            for seg in segs:
                np.copyto(seg.view, seg.blob.diff)
        elif self.mode == "staged":
            self._staging.to_host(k, [(seg.view, seg.blob.diff) for seg in segs])
        else:
            self.comm.wait_ready(k)
            self.comm.pack([(seg.view, seg.blob.diff) for seg in segs])
        self.packed_bytes += sum(seg.view.nbytes for seg in segs)

    def _reduce(self, g: _Group) -> None:
        piece = g.flat if g.flat is not None else self.buffer[g.start:g.stop]
        self._reducing = g
        if self._staging is not None:
            self._staging.wait()  # the group's bytes are on the host
        t0 = time.perf_counter()
        reduce = (self.comm.allreduce_sum_async if self.mode == "stream"
                  else self.comm.allreduce_sum)
        if self.watchdog is not None:
            with self.watchdog.guard(f"all-reduce of group {g.index} ({g.nbytes} bytes)"):
                reduce(piece)
        else:
            reduce(piece)
        t1 = time.perf_counter()
        if self.intervals is not None:
            self.intervals.append((t0, t1, g.nbytes))
        if self._defer:
            self._hand_over(g, piece, t0, t1)
            return
        self._average(g, piece)
        if self.mode == "stream" and g.index == len(self.groups) - 1:
            # The one host wait of the iteration: everything queued on the stream is done
            # before wait() lets the update run.
            self.comm.synchronize(f"the gradients of iteration {self.iterations}")
        t2 = time.perf_counter()
        self.allreduce_seconds += t1 - t0
        if self.tracer is not None:
            self.tracer.span(f"allreduce g{g.index}", "allreduce", COMM, t0, t1, group=g.index,
                             layers=g.names, bytes=g.nbytes)
            self.tracer.span(f"{'average' if g.flat is not None else 'unpack'} g{g.index}",
                             "unpack", COMM, t1, t2, group=g.index)
        with self._cond:
            self._reducing = None
            self._done += 1
            self._averaged += 1
            self._last_progress = time.monotonic()
            self._cond.notify_all()

    def _hand_over(self, g: _Group, piece: Any, t0: float, t1: float) -> None:
        """Group g is reduced: queue its division for wait(); after the iteration's last
        group, divide what is still queued alongside the main thread."""
        self.allreduce_seconds += t1 - t0
        if self.tracer is not None:
            self.tracer.span(f"allreduce g{g.index}", "allreduce", COMM, t0, t1, group=g.index,
                             layers=g.names, bytes=g.nbytes)
        with self._cond:
            self._reducing = None
            self._pending.append((g, piece))
            self._done += 1
            self._last_progress = time.monotonic()
            self._cond.notify_all()
        if g.index == len(self.groups) - 1:
            self._average_pending(COMM)

    def _average_pending(self, row: str) -> None:
        """Divide queued reduced groups until none is left (either thread; each group once)."""
        while True:
            with self._cond:
                if not self._pending:
                    return
                g, piece = self._pending.popleft()
            t0 = time.perf_counter()
            self._average(g, piece)
            if self.tracer is not None:
                self.tracer.span(f"{'average' if g.flat is not None else 'unpack'} "
                                 f"g{g.index}", "unpack", row, t0, time.perf_counter(),
                                 group=g.index)
            with self._cond:
                self._averaged += 1
                self._cond.notify_all()

    def _average(self, g: _Group, piece: Any) -> None:
        """Divide the reduced group by the world size: in place, or while copying it back
        from the packing buffer into the diffs."""
        size = self.comm.size
        if g.flat is not None:
            if self.mode == "stream":
                self.comm.unpack([(piece, piece)], size)  # queued on the stream, in place
            elif size != 1:  # x / 1 == x exactly: nothing to do for one rank
                np.divide(piece, size, out=piece)
            return
        segs = [seg for k in g.layers for seg in self._segments[k]]
        if self.mode == "host":
            for seg in segs:
                np.divide(seg.view, size, out=seg.blob.diff)
        elif self.mode == "staged":
            np.divide(piece, size, out=piece)
            self._staging.to_device([(seg.view, seg.blob.diff) for seg in segs])
            if g.index == len(self.groups) - 1:
                self._staging.wait()  # the update (main thread) must see the diffs
        else:
            self.comm.unpack([(seg.view, seg.blob.diff) for seg in segs], size)

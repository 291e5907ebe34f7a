"""The solver's gradient sync: one communication thread that runs any plan over any
communicator (Algorithm 2 of MG-WFBP, and the schedules that extend it).

    executor = GradientExecutor.from_net(net, plan, comm)   # starts the thread
    net.forward_backward(on_learnable_done=executor.on_learnable_done)
    executor.wait()            # a barrier plan: every gradient reduced and averaged
    executor.wait_layer(k)     # a per-layer plan: layer k's (the next forward's gate)
    executor.set_plan(plan)    # between iterations
    executor.close()

The pieces, by role: layout.py (where each layer's gradient lives; a plan compiled into
messages: a merge plan is the barrier schedule of its groups, a schedule adds parts, order,
batches, reduce-scatter/all-gather and per-layer completion), paths.py (the data paths:
where a message's bytes are packed, reduced and unpacked: "host" numpy over MPI, local
threads or the network emulation; "staged" device diffs through pinned host memory over a
host communicator; "stream" device diffs on NCCL's own stream), loop.py (the thread).

The backward hook is a queue put (and, on a device, an event recorded on the compute stream).
Every sum over the ranks is divided by the world size. `wait()` returns when every message of
the iteration is done and re-raises, with the rank, whatever went wrong on the thread.
`wait_layer(k)` returns when layer k's gradient is final; on a device the compute stream then
waits for it on the device (an event), not the host. A plan that updates per layer lets the
thread's work of one iteration run on while the main thread starts the next forward: its
collectives must then not share an ordering with the main thread's (the trainer's
agreements): pass a communicator of its own (`Communicator.duplicate()`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ...errors import CommError
from ..backends.communicator import Communicator
from .layout import GradientLayout, Program, check_plan_layers, compile_plan, plan_groups
from .loop import CommThread
from .paths import data_path as choose_path
from .trace import COMPUTE

__all__ = ["GradientExecutor", "check_plan_layers", "plan_groups", "set_thread_nice"]


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


class GradientExecutor:
    """The solver's `gradient_sync` (module docstring): sums every learnable layer's
    parameter diffs across ranks and divides by the world size, message by message as the
    plan says, overlapping backward (and, per layer, the next forward).

    `layers`: the net's learnable layers (objects with `index` 1..L, `name`, `param_ids`),
    input side first; `params`: the blobs `param_ids` index (each with a float32 `.diff`,
    numpy or CuPy); `plan`: anything with `.groups` (lists of layer names, communication
    order) and optionally `.schedule`, or the list of groups itself; `comm`: a Communicator.
    Optional: `timeout` (seconds without progress before giving up), `tracer`
    (trace.Tracer), `watchdog` (faults.Watchdog guarding each collective), `data_path`
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
        self.tracer = tracer
        self.layout = GradientLayout(layers, params, comm.rank)
        self.path = choose_path(comm, self.layout, data_path)
        # Staged diffs live on the device, the reduction on the host: they are always packed.
        self._in_place = in_place and self.path.name != "staged"
        self.program = self._compile(plan)
        self.thread = CommThread(self.layout, self.path, self.program, timeout=timeout,
                                 tracer=tracer, watchdog=watchdog)
        self._handed = 0  # ids handed over in all (a multiple of L between iterations)
        self._issued = 0  # iterations whose backward has begun handing over
        self._waited = 0  # the iteration the last wait() waited for
        self.iterations = 0
        self.thread.start()
        self.favoured = (thread_nice is not None and
                         set_thread_nice(self.thread.thread.native_id, thread_nice))

    @classmethod
    def from_net(cls, net: Any, plan: Any, comm: Communicator, **options: Any):
        """An executor for a Net (its `learnable_layers` and `learnable_params`)."""
        return cls(net.learnable_layers, net.learnable_params, plan, comm, **options)

    # ------------------------------------------------------------------ the plan
    def _compile(self, plan: Any) -> Program:
        program = compile_plan(plan, self.layout, self.path.packing, self._in_place)
        # buffers are made here, on the main thread: its device is the rank's
        self.path.scratch(program.scratch)
        for fmt in sorted(program.wires):
            self.path.wire_buffer(fmt)
        return program

    def set_plan(self, plan: Any) -> None:
        """Use `plan` from the next iteration on (between iterations only: after wait(), or
        after every wait_layer of a per-layer plan; the thread's last messages are waited
        for)."""
        if self._handed % max(self.layout.L, 1):
            raise CommError(f"rank {self.rank}: plan changed in the middle of an iteration")
        program = self._compile(plan)
        issued = self._issued
        self.thread.wait_for(lambda: self.thread.complete >= issued,
                             "the last iteration's messages before the plan changes")
        self.program = program
        self.thread.use(program)

    @property
    def per_layer(self) -> bool:
        """Whether the running plan lets each layer's update wait for its own gradient."""
        return self.program.per_layer

    @property
    def groups(self) -> list[list[str]]:
        """The running plan's groups (communication order) by name."""
        return self.program.names

    @property
    def messages(self) -> list:
        return self.program.messages

    @property
    def in_place_groups(self) -> int:
        return self.program.in_place_groups

    @property
    def in_flight(self) -> bool:
        """Whether a collective is under way right now."""
        return self.thread.sending is not None

    @property
    def mode(self) -> str:
        """The data path: "host", "staged" or "stream"."""
        return self.path.name

    @property
    def buffer(self) -> Any:
        """The packing buffer (None while every group is reduced in place)."""
        return self.path.buffer

    @property
    def packed_bytes(self) -> int:
        return self.thread.stats.packed_bytes

    @property
    def fallbacks(self) -> int:
        """Compressed messages sent again in float32 so far (their sum overflowed)."""
        return self.path.fallbacks

    @property
    def formats(self) -> list[str]:
        """The running plan's wire format per group."""
        return list(self.program.formats)

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the communication thread's work."""
        return self.thread.stats.cpu_seconds

    @property
    def intervals(self) -> list[tuple[float, float, int]] | None:
        """A list: every collective appends (start, end, bytes) (perf_counter seconds), for
        the in-situ interference measurement; None: nothing recorded."""
        return self.thread.stats.intervals

    @intervals.setter
    def intervals(self, value: list | None) -> None:
        self.thread.stats.intervals = value

    # ------------------------------------------------------------------ main thread
    def on_learnable_done(self, k: int) -> None:
        """Learnable layer k's gradients are complete (called by the backward hook)."""
        thread = self.thread
        if thread.error is not None:
            thread.raise_error()
        if self.tracer is not None:
            self.tracer.instant(self.layout.name(k), "grad", COMPUTE, self.tracer.now(),
                                layer=k)
        if self._handed % max(self.layout.L, 1) == 0:
            self._issued += 1
        self._handed += 1
        self.path.mark_ready(k)
        thread.queue.put(k)

    def wait(self) -> None:
        """Block until every message of this iteration is done (dividing reduced host
        groups meanwhile); re-raise thread failures."""
        t0 = time.perf_counter()
        target = max(self._issued, self._waited + 1)
        self.thread.wait_for(lambda: self.thread.complete >= target, "every layer", work=True)
        self._waited = target
        self.iterations += 1
        if self.tracer is not None:
            self.tracer.span("wait for gradients", "wait", COMPUTE, t0, time.perf_counter())

    def wait_layer(self, k: int) -> None:
        """Block until layer k's gradient of the latest iteration is reduced and averaged;
        on a device, what the compute stream runs next waits for it there."""
        issued = self._issued
        self.thread.wait_for(lambda: self.thread.done[k] >= issued,
                             f"layer {self.layout.name(k)!r}")
        self.path.gate(k)

    def close(self, join: bool = True) -> None:
        """Stop the thread (after the current iteration's work); idempotent. `join=False`
        (the failure path) does not wait: the thread may be stuck in a collective."""
        self.thread.close(join)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self) -> str:
        s = self.program.schedule
        return (f"<GradientExecutor rank {self.rank}: {len(self.program.groups)} groups, "
                f"{len(self.program.messages)} messages, {self.mode} path, {s.update}>")

"""Requests to stop or snapshot training from outside the loop (signals, other ranks).

As in Caffe's SignalHandler, a signal handler only records that the signal arrived; the
solver asks `requested_action()` at the end of each iteration (and between test batches)
and acts there, so a signal never interrupts an update half-way.
"""

from __future__ import annotations

import signal
import threading

from .. import _launch


class SolverAction:
    """What the solver is asked to do after the current iteration."""

    NONE = "none"
    STOP = "stop"
    SNAPSHOT = "snapshot"
    CHOICES = (STOP, SNAPSHOT, NONE)


class SignalHandler:
    """Installs SIGINT/SIGHUP/SIGTERM handlers that set flags; `requested_action` maps them to
    actions.

    `sigint_effect`/`sighup_effect`/`sigterm_effect` are SolverAction values ("stop",
    "snapshot", "none"). SIGTERM (what batch schedulers send before SIGKILL) always ends
    training unless its effect is "none": with "snapshot" (the default) a snapshot is taken
    at the end of the current iteration and training stops at the end of the next one (with
    Caffe's final snapshot), so a pre-empted job resumes where it stopped; with "stop" it
    stops as SIGINT does. Caffe leaves SIGTERM alone (the process dies without a snapshot).
    Use as a context manager (or call `install`/`restore`) so that the previous handlers
    come back when training ends.
    """

    def __init__(self, sigint_effect: str = SolverAction.STOP,
                 sighup_effect: str = SolverAction.SNAPSHOT,
                 sigterm_effect: str = SolverAction.SNAPSHOT):
        for name, effect in (("sigint_effect", sigint_effect),
                             ("sighup_effect", sighup_effect),
                             ("sigterm_effect", sigterm_effect)):
            if effect not in SolverAction.CHOICES:
                raise ValueError(f"{name}: expected one of {', '.join(SolverAction.CHOICES)}, "
                                 f"found {effect!r}")
        # Caffe's CheckForSignals looks at SIGHUP before SIGINT.
        self.effects = {}
        if hasattr(signal, "SIGHUP"):
            self.effects[signal.SIGHUP] = sighup_effect
        self.effects[signal.SIGTERM] = sigterm_effect
        self.effects[signal.SIGINT] = sigint_effect
        self._got: dict[int, bool] = {s: False for s in self.effects}
        self._then_stop = False  # SIGTERM's snapshot is followed by a stop
        self._previous: dict[int, object] = {}
        self._lock = threading.Lock()

    def _handle(self, signum, frame) -> None:
        self._got[signum] = True

    def install(self) -> SignalHandler:
        """Replace the current handlers (main thread only, as Python requires). A Ctrl-C
        recorded while the program started (mgcaffe._launch) counts as a SIGINT."""
        for signum in self.effects:
            self._previous[signum] = signal.signal(signum, self._handle)
        if _launch.take_pending():
            self._got[signal.SIGINT] = True
        return self

    def restore(self) -> None:
        """Put back the handlers that were there before `install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def requested_action(self) -> str:
        """The action of the first pending signal (SIGHUP first), clearing it; else NONE.
        After SIGTERM's snapshot, the next call says STOP."""
        with self._lock:
            for signum, effect in self.effects.items():
                if self._got[signum]:
                    self._got[signum] = False
                    if signum == signal.SIGTERM and effect == SolverAction.SNAPSHOT:
                        self._then_stop = True
                    return effect
            if self._then_stop:
                self._then_stop = False
                return SolverAction.STOP
        return SolverAction.NONE

    def __enter__(self) -> SignalHandler:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

"""Requests to stop or snapshot training from outside the loop (signals, other ranks).

As in Caffe's SignalHandler, a signal handler only records that the signal arrived; the
solver asks `requested_action()` at the end of each iteration (and between test batches)
and acts there, so a signal never interrupts an update half-way. A training a signal
stopped ends with a non-zero status (`exit_status`): 128 + the signal's number, as a shell
reports a process the signal ended (130 SIGINT, 129 SIGHUP, 143 SIGTERM), so that batch
systems and job chains do not count it as finished; `--signal_exit_status` picks another.
"""

from __future__ import annotations

import signal
import threading

from .. import _launch


class SolverAction:
    """What the solver is asked to do after the current iteration. CHOICES are the effects a
    signal may be given; SNAPSHOT_AND_STOP is SIGTERM's "snapshot": one snapshot, then stop
    (at the same iteration)."""

    NONE = "none"
    STOP = "stop"
    SNAPSHOT = "snapshot"
    SNAPSHOT_AND_STOP = "snapshot_and_stop"
    CHOICES = (STOP, SNAPSHOT, NONE)
    STOPS = (STOP, SNAPSHOT_AND_STOP)
    SNAPSHOTS = (SNAPSHOT, SNAPSHOT_AND_STOP)


#: The default of --signal_exit_status: 128 + the number of the signal that stopped training.
SHELL_STATUS = "128+N"


def parse_exit_status(text: str) -> str | int:
    """--signal_exit_status: SHELL_STATUS or a status 0..255 (ValueError otherwise)."""
    if str(text).strip().upper() == SHELL_STATUS:
        return SHELL_STATUS
    try:
        status = int(text)
    except ValueError:
        status = -1
    if not 0 <= status <= 255:
        raise ValueError(f"--signal_exit_status: expected {SHELL_STATUS} (128 + the signal's "
                         f"number) or a status 0..255, found {text!r}")
    return status


def exit_status(signum: int | None, chosen: str | int = SHELL_STATUS) -> int:
    """The exit status of a training that ended normally (0) or was stopped by `signum`."""
    if signum is None:
        return 0
    return 128 + int(signum) if chosen == SHELL_STATUS else int(chosen)


def signal_name(signum: int) -> str:
    """SIGTERM for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class SignalHandler:
    """Installs SIGINT/SIGHUP/SIGTERM handlers that set flags; `requested_action` maps them to
    actions.

    `sigint_effect`/`sighup_effect`/`sigterm_effect` are SolverAction values ("stop",
    "snapshot", "none"). SIGTERM (what batch schedulers send before SIGKILL) always ends
    training unless its effect is "none": with "snapshot" (the default) one snapshot is
    taken at the end of the current iteration and training stops there
    (SNAPSHOT_AND_STOP), so a pre-empted job resumes where it stopped; with "stop" it
    stops as SIGINT does. Caffe leaves SIGTERM alone (the process dies without a snapshot).
    `stop_signal` is the signal whose request stopped training (None until one did). Use as
    a context manager (or call `install`/`restore`) so that the previous handlers come back
    when training ends.
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
        self.stop_signal: int | None = None
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
        SIGTERM's "snapshot" is SNAPSHOT_AND_STOP."""
        with self._lock:
            for signum, effect in self.effects.items():
                if self._got[signum]:
                    self._got[signum] = False
                    if signum == signal.SIGTERM and effect == SolverAction.SNAPSHOT:
                        effect = SolverAction.SNAPSHOT_AND_STOP
                    if effect in SolverAction.STOPS and self.stop_signal is None:
                        self.stop_signal = signum
                    return effect
        return SolverAction.NONE

    def __enter__(self) -> SignalHandler:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

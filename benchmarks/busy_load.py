"""A competing CPU load for the benchmarks: K single-threaded busy-loop processes.

Each loop checks every few milliseconds that the benchmark that started it is still its
parent and ends when it is not, so a benchmark killed by a signal leaves no loop spinning
on the node; a SIGTERM to the benchmark itself ends it through its normal clean-up.
"""

from __future__ import annotations

import signal
import subprocess
import sys

# Spins in slices of ~100k iterations (a few ms), leaving when the parent is gone.
_LOOP = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
         "    for _ in range(100000):\n        pass\n")


class BusyLoad:
    """`with BusyLoad(k):` runs k busy-loop processes for the block's duration."""

    def __init__(self, processes: int):
        self.processes = int(processes)
        self.children: list[subprocess.Popen] = []
        self._old_handler = None

    def __enter__(self) -> BusyLoad:
        if self.processes > 0:
            self._old_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        self.children = [subprocess.Popen([sys.executable, "-c", _LOOP])
                         for _ in range(self.processes)]
        return self

    def __exit__(self, *exc) -> None:
        for child in self.children:
            child.kill()
        for child in self.children:
            child.wait()
        self.children = []
        if self._old_handler is not None:
            signal.signal(signal.SIGTERM, self._old_handler)
            self._old_handler = None


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


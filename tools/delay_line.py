#!/usr/bin/env python3
"""A user-space delay line between pairs of TAP devices: latency where the kernel has no netem.

    delay_line.py --delay-ms D A1:B1 [A2:B2 ...]

creates, in the network namespace it runs in, the TAP devices A1 and B1 (and each further
pair), prints `ready` on stdout, then forwards every Ethernet frame read from one device of
a pair to the other after D milliseconds, both ways, in order (a constant delay keeps a FIFO
in order). The devices are made with IFF_VNET_HDR and TUNSETOFFLOAD (checksum and TSO
offloads), so the kernel hands over segmentation-offload frames of up to the devices'
gso_max_size (tens of KB) with their virtio-net header, and the header goes out again with
the frame: the per-frame cost of this process is paid per tens of KB, not per 1.5 KB.

The devices are not persistent: they vanish when this process ends (however it ends), so
nothing is left behind. The caller moves one device of each pair elsewhere (another
namespace, a bridge) once `ready` is printed; the file descriptors stay attached. On exit
(SIGTERM, SIGINT) it prints one line: frames and bytes forwarded and its CPU seconds.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import fcntl
import os
import resource
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
IDLE_CHECK = 0.2  # seconds
FRAME = 1 << 17  # a read returns one frame: 64 KB of GSO payload, headers, vnet header


def open_tap(name: str) -> int:
    """A new TAP device `name` in this namespace, with vnet headers and TSO offloads."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(),
                                           IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    return fd


def relay(pairs: list[tuple[int, int]], delay: float) -> tuple[int, int]:
    """Forward frames both ways between each pair after `delay` seconds, until a signal
    ends it; returns (frames, bytes) forwarded."""
    peer = {}
    for a, b in pairs:
        peer[a], peer[b] = b, a
    queues = {fd: collections.deque() for fd in peer}  # frames read from fd: (due, frame)
    fds = list(peer)
    frames = nbytes = 0
    clock = time.monotonic
    while not stopping:
        now = clock()
        due = min((q[0][0] for q in queues.values() if q), default=None)
        # bounded: a signal's handler runs, then select resumes (PEP 475); `stopping` is
        # looked at again within IDLE_CHECK seconds
        timeout = IDLE_CHECK if due is None else min(IDLE_CHECK, max(0.0, due - now))
        try:  # select: microsecond timeouts (epoll's are whole milliseconds)
            readable = select.select(fds, [], [], timeout)[0]
        except InterruptedError:
            continue
        now = clock()
        for fd in readable:
            q, until = queues[fd], now + delay
            while True:
                try:
                    frame = os.read(fd, FRAME)
                except BlockingIOError:
                    break
                q.append((until, frame))
        now = clock()
        for fd, q in queues.items():
            out = peer[fd]
            while q and q[0][0] <= now:
                frame = q.popleft()[1]
                try:
                    os.write(out, frame)
                except OSError:  # the device is down or being moved: the frame is lost
                    continue
                frames += 1
                nbytes += len(frame)
    return frames, nbytes


stopping = False
PR_SET_TIMERSLACK = 29


def _tight_timers() -> None:
    """Ask the kernel for 1 us timer slack (default 50 us): the delay's sleeps end on time.
    Best effort: without it, each link adds up to ~50 us more."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stop(signum, frame):
    global stopping
    stopping = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("pairs", nargs="+", help="A:B, the names of two TAP devices to join")
    a = p.parse_args(argv)
    if a.delay_ms < 0:
        p.error("--delay-ms: must be >= 0")
    _tight_timers()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    pairs = []
    try:
        for pair in a.pairs:
            left, sep, right = pair.partition(":")
            if not sep or not left or not right:
                p.error(f"expected A:B, got {pair!r}")
            pairs.append((open_tap(left), open_tap(right)))
    except OSError as exc:
        print(f"delay_line: cannot create a TAP device: {exc}", file=sys.stderr)
        return 2
    print("ready", flush=True)
    frames, nbytes = relay(pairs, a.delay_ms / 1e3)
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(f"delay_line: forwarded {frames} frame(s), {nbytes} bytes; CPU "
          f"{use.ru_utime + use.ru_stime:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

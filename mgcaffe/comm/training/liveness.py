"""Which rank is alive, and how far each has got, known without a collective.

Every rank runs a heartbeat thread that sends, every `interval` seconds, a small UDP
datagram to every other rank: its progress counter (advanced at each guarded collective,
each iteration and each test batch), the number of the guarded collective it is in or last
entered, what that collective is, the iteration and the phase of it the rank is in (set by
the trainer: forward and backward, waiting for the gradients, the update, ...), and whether
it is busy in a long single-rank phase (rank 0's test pass or snapshot). The thread also
receives the others' datagrams, so at any time a rank knows, for each peer:

- when it last heard from it: a peer silent for `timeout` seconds is stopped (SIGSTOP),
  killed or gone, and `Liveness` ends the job naming it (rank, host, pid), whatever the
  others are doing at the time (even rank 0 testing alone);
- whether it has reached a given collective, and when it last made progress: the watchdog
  (faults.Watchdog) ends a collective only after `timeout` seconds in which none of the
  ranks that have not reached it made progress, and names those ranks. A busy peer (testing
  or snapshotting) counts as making progress while its heartbeats come, for at most
  `busy_limit` seconds without its counter moving;
- that it is leaving before the others (`leave`: a user's os._exit or sys.exit caught by
  faults.LeaveGuard): each peer logs which rank left and where, and answers, before the
  leaving rank ends the job.

The iteration and phase a peer is said to be in are those of its last heartbeat, at most an
interval old; every message also gives this rank's own iteration, which the peer cannot
have passed (ranks meet at every iteration's collectives).

UDP needs no MPI progress on the peer (a stopped peer cannot answer one-sided MPI either),
works across nodes wherever the MPI library's own TCP traffic does, and costs a datagram per
peer per interval. Peers on the same host are reached at 127.0.0.1, others at the address
their host routes from. When no socket can be opened, `start_liveness` returns None and the
watchdog keeps its fixed deadlines.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..backends.communicator import Communicator
from .faults import ABORT_TIMEOUT

__all__ = ["Liveness", "PeerState", "describe_rank_map", "rank_map", "start_liveness", "where"]

log = logging.getLogger("mgcaffe.comm")

MAX_DATAGRAM = 1024


def _primary_address() -> str:
    """The address this host sends from towards other hosts (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def rank_map(comm: Communicator) -> list[tuple[str, int]]:
    """(host, pid) of every rank, by rank (a collective)."""
    return [tuple(x) for x in comm.allgather((socket.gethostname(), os.getpid()))]


def describe_rank_map(ranks: list[tuple[str, int]]) -> str:
    """One line: `rank -> host/pid` for every rank."""
    return "Ranks: " + ", ".join(f"{r} = {h} pid {p}" for r, (h, p) in enumerate(ranks))


@dataclass
class PeerState:
    """What this rank knows of one peer from its heartbeats (times: time.monotonic)."""

    host: str
    pid: int
    address: tuple[str, int]
    last_seen: float
    progress: int = -1
    reached: int = 0
    what: str = ""
    busy: bool = False
    changed_at: float = 0.0  # when `progress` last changed, as seen here
    done: bool = False  # said goodbye after the end of training
    heard: bool = False  # a heartbeat of it has arrived (the path works)
    iteration: int = -1  # the iteration it is in (-1: before the first)
    phase: str = ""  # and the phase of it
    left: str = ""  # it said it is leaving before the others: how and where
    acked: bool = False  # it answered this rank's own leaving notice

    def name(self, rank: int) -> str:
        return f"rank {rank} ({self.host}, pid {self.pid})"

    def where(self) -> str:
        """`at iteration 61 (forward and backward)`, or `in start-up`."""
        return where(self.iteration, self.phase)


def where(iteration: int, phase: str) -> str:
    """Where a rank is: `at iteration I (phase)`, or `in PHASE` before the first iteration."""
    if iteration < 0:
        return f"in {phase or 'start-up'}"
    return f"at iteration {iteration} ({phase})" if phase else f"at iteration {iteration}"


class Liveness:
    """The heartbeat thread and the peers' states; build it with `start_liveness`.

    `enter(what)` (the watchdog calls it for each guard) and `tick()` advance this rank's
    progress; `busy(flag)` marks a long single-rank phase. `lagging(seq)` lists the peers
    that have not reached collective `seq`; `last_progress(ranks)` is when any of them last
    progressed. A peer silent for `timeout` seconds calls `on_dead(message)` (default: log
    and abort every rank). `close()` says goodbye so that the others stop watching."""

    def __init__(self, comm: Communicator, sock: socket.socket, token: str,
                 peers: dict[int, PeerState], timeout: float, *,
                 interval: float | None = None, busy_limit: float = 3600.0,
                 on_dead: Callable[[str], None] | None = None):
        self.comm = comm
        self.rank = comm.rank
        self.timeout = float(timeout)
        self.interval = interval if interval is not None else min(1.0, self.timeout / 6)
        self.busy_limit = float(busy_limit)
        self.peers = peers
        self._sock = sock
        self._token = token
        self._lock = threading.Lock()
        self.progress = 0
        self.reached = 0
        self.what = ""
        self.iteration = -1
        self.phase = "start-up"
        self._leaving: str | None = None
        self._busy = False
        self._closed = False
        self.dead: str | None = None  # the message, once a peer was found dead
        self.error: BaseException | None = None
        self._on_dead = on_dead or self._abort
        self._thread = threading.Thread(target=self._run, name="mgcaffe-heartbeat",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ this rank
    def enter(self, what: str) -> int:
        """This rank enters a guarded collective: its number (the same on every rank)."""
        with self._lock:
            self.reached += 1
            self.progress += 1
            self.what = what[:80]
            return self.reached

    def tick(self) -> None:
        """This rank made progress outside a collective (an iteration, a test batch)."""
        self.progress += 1

    def at(self, iteration: int, phase: str) -> None:
        """The iteration and the phase of it this rank is in now (the next heartbeat says
        so; no datagram of its own: two attribute writes)."""
        self.iteration, self.phase = iteration, phase

    def here(self) -> str:
        """Where this rank is, as `where` says it."""
        return where(self.iteration, self.phase)

    def leave(self, text: str, wait: float) -> list[int]:
        """Tell every peer this rank is leaving before the others (`text`: how and where;
        each peer logs it with its own rank and answers), and wait until all have answered,
        at most `wait` seconds. Returns the peers that did not answer."""
        self._leaving = text[:400]
        deadline = time.monotonic() + wait
        while True:
            self._send()  # (a lost datagram is sent again)
            with self._lock:
                silent = sorted(r for r, p in self.peers.items() if not p.acked and not p.done)
            if not silent or time.monotonic() >= deadline:
                return silent
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def busy(self, flag: bool) -> None:
        """Whether this rank is in a long phase of its own (a test pass, a snapshot)."""
        # The next heartbeat carries it (within an interval, well inside the timeout): no
        # datagram of its own, so an iteration costs no system call here.
        if flag != self._busy:
            self._busy = flag
            self.progress += 1

    # ------------------------------------------------------------------ the peers
    def describe(self, rank: int) -> str:
        peer = self.peers.get(rank)
        return peer.name(rank) if peer is not None else f"rank {rank}"

    def lagging(self, seq: int) -> list[int]:
        """The peers (still training) that have not reached collective `seq`."""
        with self._lock:
            return sorted(r for r, p in self.peers.items() if not p.done and p.reached < seq)

    def last_progress(self, ranks: list[int], now: float | None = None) -> float:
        """When any of `ranks` last made progress (-inf if none did since it was seen)."""
        now = time.monotonic() if now is None else now
        latest = float("-inf")
        with self._lock:
            for r in ranks:
                p = self.peers[r]
                t = p.changed_at
                if p.busy and now - p.changed_at < self.busy_limit:
                    t = max(t, p.last_seen)  # busy and heard from: alive
                latest = max(latest, t)
        return latest

    def behind(self, ranks: list[int]) -> str:
        """Where each of `ranks` was last seen (for an abort message)."""
        now = time.monotonic()
        parts = []
        with self._lock:
            for r in ranks:
                p = self.peers[r]
                last = f"last collective {p.what!r}" if p.what else "no collective yet"
                parts.append(f"{p.name(r)}, {p.where()}{' (busy)' if p.busy else ''}, "
                             f"{last}, heard from {now - p.last_seen:.1f} s ago")
        return "; ".join(parts) + f"; this rank is {self.here()}"

    # ------------------------------------------------------------------ the thread
    def _message(self, bye: bool = False, ack: bool = False) -> bytes:
        body = [self._token, self.rank, self.progress, self.reached, self.what, self._busy, bye,
                self.iteration, self.phase, self._leaving, ack]
        return json.dumps(body).encode()

    def _send(self, bye: bool = False, to: list[int] | None = None, ack: bool = False) -> None:
        data = self._message(bye, ack)
        for r, peer in self.peers.items():
            if peer.done or (to is not None and r not in to):
                continue
            try:
                self._sock.sendto(data, peer.address)
            except OSError:  # a full buffer or a vanished peer: the next beat tries again
                pass

    def _receive(self, data: bytes, now: float) -> None:
        try:
            (token, rank, progress, reached, what, busy, bye, iteration, phase, leaving,
             ack) = json.loads(data)
        except (ValueError, TypeError):
            return
        if token != self._token or rank not in self.peers:
            return  # another job's datagram
        with self._lock:
            p = self.peers[rank]
            p.last_seen, p.heard = now, True
            if progress != p.progress:
                p.progress, p.changed_at = progress, now
            p.reached, p.what, p.busy = reached, what, bool(busy)
            p.iteration, p.phase = int(iteration), str(phase)
            p.done = p.done or bool(bye)
            p.acked = p.acked or bool(ack)
            news = bool(leaving) and not p.left
            if news:
                p.left = str(leaving)
        if leaving:
            if news:
                log.error("rank %d: %s is leaving before the others: %s (this rank is %s); "
                          "the job ends", self.rank, p.name(rank), leaving, self.here())
            self._send(to=[rank], ack=True)  # (again for a repeated notice: ours was lost)

    def _run(self) -> None:
        try:
            next_beat = 0.0
            while not self._closed:
                # Read what came while this thread was not running before judging anyone
                # silent: a thread kept from the CPU (a loaded host) past the timeout would
                # otherwise name a peer whose heartbeats wait unread in the socket.
                self._drain()
                now = time.monotonic()
                if now >= next_beat:
                    self._send()
                    next_beat = now + self.interval
                silent = self._silent(now)
                if silent is not None:
                    self._report_dead(silent, now)
                    return
                with self._lock:
                    watch = [p.last_seen + self.timeout for p in self.peers.values()
                             if not p.done]
                wake = min([next_beat, *watch])
                select.select([self._sock], [], [], max(0.0, wake - now))
        except BaseException as exc:  # noqa: BLE001 - kept and logged, never swallowed
            self.error = exc
            log.error("rank %d: heartbeat thread: %s: %s", self.rank, type(exc).__name__, exc)

    def _drain(self) -> None:
        """Receive every datagram waiting in the socket (it does not block)."""
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            self._receive(data, time.monotonic())

    def _silent(self, now: float) -> int | None:
        with self._lock:
            late = [(p.last_seen, r) for r, p in self.peers.items()
                    if not p.done and now - p.last_seen >= self.timeout]
        return min(late)[1] if late else None

    def _report_dead(self, rank: int, now: float) -> None:
        p = self.peers[rank]
        last = f", last collective {p.what!r}" if p.what else ""
        self.dead = (f"rank {self.rank}: {p.name(rank)} sent no heartbeat for "
                     f"{now - p.last_seen:.1f} s (--comm-timeout {self.timeout:g}): it is "
                     f"stopped, hung outside Python or gone; last heard {p.where()}{last}; "
                     f"this rank is {self.here()}; aborting all {self.comm.size} ranks")
        self._on_dead(self.dead)

    def _abort(self, message: str) -> None:

        log.error("%s", message)
        self.comm.abort(ABORT_TIMEOUT)

    def unheard(self) -> list[int]:
        """The peers none of whose heartbeats has arrived yet."""
        with self._lock:
            return sorted(r for r, p in self.peers.items() if not p.heard)

    def close(self) -> None:
        """Say goodbye (the others stop watching this rank) and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._send(bye=True)
        self._thread.join(timeout=5.0)
        self._sock.close()


#: How long start-up waits for the first heartbeat of every peer (at most half the timeout).
HANDSHAKE_SECONDS = 5.0


def start_liveness(comm: Communicator, timeout: float, *, busy_limit: float = 3600.0,
                   interval: float | None = None,
                   on_dead: Callable[[str], None] | None = None) -> Liveness | None:
    """Open this rank's heartbeat socket, exchange addresses (a collective) and start the
    thread; None with one rank, or on every rank when any rank could not open a socket or
    any rank heard no heartbeat of some peer within the start-up handshake."""
    if comm.size == 1:
        return None
    sock = None
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("", 0))
        sock.setblocking(False)
        mine = (socket.gethostname(), os.getpid(), _primary_address(), sock.getsockname()[1])
    except OSError as exc:
        if sock is not None:
            sock.close()
        sock, mine = None, (socket.gethostname(), os.getpid(), None, str(exc))
    token = comm.broadcast(secrets.token_hex(8) if comm.rank == 0 else None, root=0)
    everyone = comm.allgather(mine)
    failed = [(r, e[3]) for r, e in enumerate(everyone) if e[2] is None]
    if failed:
        if sock is not None:
            sock.close()
        if comm.rank == 0:
            log.warning("No heartbeats (rank %d could not open a UDP socket: %s): a stopped "
                        "rank is found only when a collective outlives --comm-timeout, and a "
                        "long test or snapshot on rank 0 must fit in it", *failed[0])
        return None
    now = time.monotonic()
    host = socket.gethostname()
    peers = {}
    for r, (h, pid, addr, port) in enumerate(everyone):
        if r != comm.rank:
            peers[r] = PeerState(h, pid, ("127.0.0.1" if h == host else addr, port),
                                 last_seen=now, changed_at=now)
    live = Liveness(comm, sock, token, peers, timeout, interval=interval,
                    busy_limit=busy_limit, on_dead=on_dead)
    # Every path must carry heartbeats before silence may count as death: where a firewall
    # drops UDP between nodes, every rank would otherwise be "dead" after --comm-timeout.
    deadline = time.monotonic() + min(HANDSHAKE_SECONDS, timeout / 2)
    while live.unheard() and time.monotonic() < deadline:
        time.sleep(0.01)
    unheard = comm.allgather(live.unheard())
    pairs = [(r, p) for r, missing in enumerate(unheard) for p in missing]
    if pairs:
        live.close()
        if comm.rank == 0:
            shown = ", ".join(f"rank {r} heard nothing from rank {p}" for r, p in pairs[:4])
            log.warning("No heartbeats: UDP datagrams do not pass between ranks (%s%s; a "
                        "firewall?): a stopped rank is found only when a collective "
                        "outlives --comm-timeout, and a long test or snapshot on rank 0 must "
                        "fit in it", shown, ", ..." if len(pairs) > 4 else "")
        return None
    return live

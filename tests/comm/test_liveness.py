"""Liveness judged by progress: heartbeats between thread-ranks (real UDP sockets), the
watchdog's deadline moved by the progress of the ranks that have not arrived, and the
start-up deadline kept by a watcher process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from comm_fakes import run_ranks

from mgcaffe import _launch
from mgcaffe.comm.backends.local import LocalWorld
from mgcaffe.comm.training.faults import LeaveGuard, Watchdog
from mgcaffe.comm.training.liveness import describe_rank_map, start_liveness
from mgcaffe.solvers.actions import (
    SHELL_STATUS,
    SignalHandler,
    SolverAction,
    exit_status,
    parse_exit_status,
)

pytestmark = pytest.mark.timeout(60)


def two_livenesses(timeout, on_dead):
    comms = LocalWorld(2, timeout=10).communicators()
    out, _ = run_ranks(2, lambda r: start_liveness(comms[r], timeout, interval=0.05,
                                                   on_dead=lambda m, r=r: on_dead(r, m)))
    return out


def test_a_silent_peer_is_named_after_the_timeout_not_before():
    dead = []
    a, b = two_livenesses(0.6, lambda r, m: dead.append((r, m, time.monotonic())))
    try:
        time.sleep(0.8)  # both beat: nobody is reported
        assert dead == []
        t0 = time.monotonic()
        b._closed = True  # rank 1 falls silent without a goodbye (as a stopped process)
        deadline = time.monotonic() + 10
        while not dead and time.monotonic() < deadline:
            time.sleep(0.02)
        assert dead, "the silent rank was not found"
        rank, message, when = dead[0]
        assert rank == 0 and when - t0 >= 0.6 - 0.06  # not before the timeout (less a beat)
        assert f"rank 1 ({b.peers[0].host}, pid {os.getpid()}) sent no heartbeat" in message
    finally:
        a.close()
        b.close()


def test_a_watcher_kept_from_the_cpu_reads_the_waiting_heartbeats_before_judging(monkeypatch):
    """A heartbeat thread that ran late (a loaded host: the thread waited past the timeout
    for a CPU after its wait returned) must not name a peer whose heartbeats arrived in the
    meantime and wait unread in its socket. (The peer, not hearing the late rank, may name
    it: that is what its silence looks like from outside.)"""
    from mgcaffe.comm.training import liveness as module  # noqa: PLC0415

    real_select = module.select.select
    held = []  # the socket whose thread is held back once

    class Select:  # rank 0's wait returns empty, then its thread runs 1 s late (timeout 0.6)
        @staticmethod
        def select(readable, *args):
            if held and readable[0] is held[0]:
                held.clear()
                time.sleep(1.0)
                return [], [], []
            return real_select(readable, *args)

    monkeypatch.setattr(module, "select", Select)
    dead = []
    a, b = two_livenesses(0.6, lambda r, m: dead.append((r, m)))
    try:
        time.sleep(0.3)
        held.append(a._sock)
        time.sleep(1.5)
        assert not held  # rank 0's thread was held back
        assert [m for r, m in dead if r == 0] == []
    finally:
        a.close()
        b.close()


def test_a_silent_peer_is_named_with_the_iteration_and_phase_it_was_in():
    dead = []
    a, b = two_livenesses(0.6, lambda r, m: dead.append((r, m)))
    try:
        b.enter("start barrier")  # what the old line said long after warm-up
        a.at(62, "waiting for the reduced gradients")
        b.at(61, "the update")
        b.at(62, "forward and backward")
        time.sleep(0.3)  # a few heartbeats carry it
        assert a.peers[1].where() == "at iteration 62 (forward and backward)"
        b._closed = True  # stopped
        deadline = time.monotonic() + 10
        while not dead and time.monotonic() < deadline:
            time.sleep(0.02)
        rank, message = dead[0]
        assert rank == 0 and "last heard at iteration 62 (forward and backward), last " \
            "collective 'start barrier'; this rank is at iteration 62 (waiting for the " \
            "reduced gradients)" in message, message
    finally:
        a.close()
        b.close()


def test_a_leaving_rank_is_named_by_every_peer_which_answers(caplog, monkeypatch):
    comms = LocalWorld(3, timeout=10).communicators()
    lives, _ = run_ranks(3, lambda r: start_liveness(comms[r], 5.0, interval=0.05))
    try:
        lives[1].at(20, "forward and backward")
        exits, aborted = [], []
        comms[1].abort = aborted.append
        monkeypatch.setattr(os, "_exit", exits.append)  # (the real one would end the test)
        guard = LeaveGuard(comms[1], lives[1])
        guard.install()
        try:
            assert os._exit == guard._exit
            t0 = time.monotonic()
            os._exit(0)
        finally:
            guard.restore()
        assert os._exit == exits.append  # put back
        assert aborted == [1] and exits == [1]  # status 1, not 0
        assert time.monotonic() - t0 < 1.5  # the answers came: no wait to the deadline
        assert guard.message == (f"rank 1 (pid {os.getpid()}): left before the others: "
                                 "os._exit(0) at iteration 20 (forward and backward); "
                                 "aborting all 3 ranks")
        text = caplog.text
        for r in (0, 2):
            assert f"rank {r}: rank 1 ({lives[r].peers[1].host}, pid {os.getpid()}) is " \
                   f"leaving before the others: os._exit(0) at iteration 20 (forward and " \
                   f"backward)" in text, text
    finally:
        for live in lives:
            live.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_of_a_guarded_rank_exits_as_it_asks():
    comm = LocalWorld(2, timeout=10).communicators()[0]
    aborted = []
    comm.abort = aborted.append
    guard = LeaveGuard(comm).install()
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(7)  # the child is no rank: no abort, its own status
        _, status = os.waitpid(pid, 0)
    finally:
        guard.restore()
    assert os.waitstatus_to_exitcode(status) == 7 and aborted == []


def test_thread_ranks_leave_os_exit_alone():
    """Thread-ranks share one os module: only a rank that is a process of its own is
    guarded (MpiCommunicator)."""
    from mgcaffe.comm.backends.mpi import MpiCommunicator  # noqa: PLC0415 - the class only

    comms = LocalWorld(2, timeout=10).communicators()
    assert MpiCommunicator.one_process_per_rank and not comms[0].one_process_per_rank


def test_a_goodbye_is_not_a_death_and_progress_is_seen():
    dead = []
    a, b = two_livenesses(0.5, lambda r, m: dead.append(m))
    try:
        seq = b.enter("all-reduce of group 0")
        time.sleep(0.3)
        assert a.lagging(seq) == [] and a.peers[1].what == "all-reduce of group 0"
        assert b.lagging(seq) == [0]  # rank 0 has not entered it
        b.close()
        time.sleep(1.0)
        assert dead == [] and a.peers[1].done
    finally:
        a.close()


class FakeLiveness:
    """Rank 1 lags behind every guard; its last progress is whatever the test sets."""

    def __init__(self):
        self.progress_at = time.monotonic()
        self.seq = 0

    def enter(self, what):
        self.seq += 1
        return self.seq

    def lagging(self, seq):
        return [1]

    def last_progress(self, ranks, now=None):
        return self.progress_at

    def behind(self, ranks):
        return "rank 1 (host, pid 7), last in 'x'"


def test_the_watchdog_waits_while_the_lagging_rank_progresses_then_names_it():
    fired = []
    liveness = FakeLiveness()
    comm = LocalWorld(2).communicators()[0]
    wd = Watchdog(comm, 0.3, on_expire=fired.append, liveness=liveness)
    try:
        with wd.guard("all-reduce of group 2"):
            for _ in range(8):  # 0.8 s of progress: more than twice the timeout
                liveness.progress_at = time.monotonic()
                time.sleep(0.1)
            assert fired == []
            t0 = time.monotonic()
            while not fired and time.monotonic() < t0 + 5:
                time.sleep(0.01)
        assert fired == ["all-reduce of group 2"]
        assert time.monotonic() - t0 >= 0.2  # counted from the last progress
        assert "rank 1 has not reached it (rank 1 (host, pid 7)" in wd.message
    finally:
        wd.close()


def test_rank_map_line():
    assert describe_rank_map([("n1", 10), ("n2", 11)]) == "Ranks: 0 = n1 pid 10, 1 = n2 pid 11"


def test_startup_deadline_quiet_when_done_and_ends_a_blocked_process_with_one_line():
    code = ("import time\nfrom mgcaffe.comm.backends.startup_deadline import StartupDeadline\n"
            "with StartupDeadline(20):\n    pass\nprint('ok', flush=True)\n"
            "with StartupDeadline(0.5):\n    time.sleep(30)\n")
    env = dict(os.environ, PMI_RANK="3")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=25)
    assert proc.stdout == "ok\n"  # the first block finished in time: not a word
    assert proc.returncode == -signal.SIGKILL
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mgcaffe: rank 3 (") and \
        "did not complete within 0.5 s" in lines[0], proc.stderr


def test_sigterm_snapshots_and_stops_at_once_and_none_ignores_it():
    assert threading.current_thread() is threading.main_thread()
    with SignalHandler() as handler:
        assert handler.stop_signal is None
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        got = [handler.requested_action() for _ in range(3)]
    # one request: one snapshot, then the stop at the same iteration (not a second one)
    assert got == [SolverAction.SNAPSHOT_AND_STOP, SolverAction.NONE, SolverAction.NONE]
    assert handler.stop_signal == signal.SIGTERM
    with SignalHandler(sigterm_effect="stop") as handler:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert handler.requested_action() == SolverAction.STOP
        assert handler.stop_signal == signal.SIGTERM
    with SignalHandler(sigterm_effect="none", sighup_effect="snapshot") as handler:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.05)
        assert handler.requested_action() == SolverAction.SNAPSHOT
        assert handler.requested_action() == SolverAction.NONE
        assert handler.stop_signal is None  # nothing stopped the training


def test_exit_status_after_a_signal_and_the_flag():
    assert exit_status(None) == 0
    assert [exit_status(s) for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)] == \
        [130, 129, 143]
    assert exit_status(signal.SIGTERM, 0) == 0 and exit_status(signal.SIGTERM, 75) == 75
    assert parse_exit_status("128+n") == SHELL_STATUS and parse_exit_status("0") == 0
    for bad in ("256", "-1", "x"):
        with pytest.raises(ValueError, match="0..255"):
            parse_exit_status(bad)


def test_a_ctrl_c_recorded_at_start_up_becomes_the_loops_sigint():
    _launch._record(signal.SIGINT, None)
    with SignalHandler() as handler:
        assert handler.requested_action() == SolverAction.STOP
    assert not _launch.take_pending()


def test_under_a_launcher_an_early_ctrl_c_is_recorded_for_the_ranks_to_decide(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "1")
    _launch._interrupted(signal.SIGINT, None)  # the process goes on
    assert _launch.pending() and _launch.take_pending() and not _launch.pending()


@pytest.mark.parametrize("argv, expected", [
    (["/usr/bin/python3", "-m", "mgcaffe", "train"], True),
    (["/venv/bin/python", "/venv/bin/mgcaffe", "train"], True),
    (["python", "-m", "pytest"], False),
    (["python", "script.py"], False)])
def test_command_line_launch(argv, expected):
    assert _launch.command_line_launch(argv) is expected


def test_ctrl_c_while_the_program_imports_prints_one_line():
    """A SIGINT while `python -m mgcaffe` still imports: one line, no traceback."""
    # Python's own SIGINT handler first, as in a terminal: a test run started in the
    # background by a non-interactive shell hands its children SIGINT ignored.
    code = ("import os, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "sys.orig_argv = ['python', '-m', 'mgcaffe']\n"
            "import mgcaffe\nos.kill(os.getpid(), signal.SIGINT)\nimport time\n"
            "time.sleep(5)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=25, env={k: v for k, v in os.environ.items()
                                           if k not in _launch._LAUNCHER_VARIABLES})
    assert proc.returncode == 130 and proc.stderr == "mgcaffe: interrupted\n", proc.stderr


def test_blocked_datagrams_fall_back_on_every_rank_instead_of_killing_the_job(monkeypatch,
                                                                              caplog):
    """Where a firewall drops the heartbeats of one rank, silence would look like death after
    --comm-timeout on a perfectly healthy job: start-up finds it and every rank goes without
    heartbeats, with one warning."""
    from mgcaffe.comm.training import liveness as progress  # noqa: PLC0415

    real_send = progress.Liveness._send

    def send_unless_rank_1(self, bye=False):
        if self.rank != 1:
            real_send(self, bye)

    monkeypatch.setattr(progress.Liveness, "_send", send_unless_rank_1)
    monkeypatch.setattr(progress, "HANDSHAKE_SECONDS", 0.3)
    dead = []
    with caplog.at_level("WARNING", logger="mgcaffe"):
        out = two_livenesses(5.0, lambda r, m: dead.append(m))
    assert out == [None, None]  # both ranks agree: no liveness checks
    assert "rank 0 heard nothing from rank 1" in caplog.text
    time.sleep(0.2)
    assert dead == []


def test_the_handshake_keeps_heartbeats_where_datagrams_pass():
    a, b = two_livenesses(5.0, lambda r, m: None)
    try:
        assert a is not None and b is not None and a.unheard() == [] == b.unheard()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("keep_deferred", [False, True])
def test_world_hands_a_late_start_up_ctrl_c_to_the_caller_when_asked(keep_deferred,
                                                                      monkeypatch):
    """Under a launcher, once MPI is up `world()` makes SIGINT raise KeyboardInterrupt again,
    unless the caller (train) keeps it recorded until its SignalHandler takes it over: a
    Ctrl-C in between then stops the loop on every rank, not this rank alone."""
    from mgcaffe.comm.backends.local import SingleCommunicator
    from mgcaffe.comm.training import world as distributed

    monkeypatch.setattr(distributed, "launched_by_mpi", lambda: True)
    class OneRankMpi(SingleCommunicator):  # MPI's start-up stands in, one rank
        library = "test"

    monkeypatch.setattr(distributed, "MpiCommunicator", lambda wait: OneRankMpi())
    monkeypatch.setattr(distributed, "check_world", lambda size, library: None)
    before = signal.signal(signal.SIGINT, _launch._interrupted)  # as at a command-line start
    try:
        distributed.world(None, keep_deferred=keep_deferred)
        if not keep_deferred:
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            return
        os.kill(os.getpid(), signal.SIGINT)  # after world(), before the handler: recorded
        time.sleep(0.05)
        with SignalHandler() as handler:
            assert handler.requested_action() == SolverAction.STOP
    finally:
        signal.signal(signal.SIGINT, before)
        _launch.take_pending()


def test_startup_deadline_watcher_ignores_sigint_from_its_first_instant():
    # A signal sent to every process of a job (scancel --signal=INT) reaches the watcher too:
    # it must say nothing and stay, whether the signal comes while its interpreter starts
    # (the first kill, sent as soon as it exists) or later; the rank answers for the job.
    code = ("import os, signal, sys, time\n"
            "from mgcaffe.comm.backends.startup_deadline import StartupDeadline\n"
            "with StartupDeadline(20) as d:\n"
            "    w = d._watcher\n"
            "    os.kill(w.pid, signal.SIGINT)\n"
            "    time.sleep(0.5)\n"
            "    os.kill(w.pid, signal.SIGINT)\n"
            "    time.sleep(0.3)\n"
            "    print('alive' if w.poll() is None else f'gone {w.returncode}', flush=True)\n"
            "print('exit', w.wait(5), flush=True)\n")
    env = dict(os.environ, PMI_RANK="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=25)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "alive\nexit 0\n"  # left when the pipe closed, not before
    assert proc.stderr == ""

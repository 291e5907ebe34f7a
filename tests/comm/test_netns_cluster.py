"""The namespace cluster (tools/netns_cluster.py): real TCP between hosts, shaped links,
idempotent clean-up. Needs root and network namespaces; skips with the reason otherwise."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from comm_fakes import mpiexec

TOOL = Path(__file__).resolve().parents[2] / "tools" / "netns_cluster.py"


def _load():
    spec = importlib.util.spec_from_file_location("netns_cluster", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


netns = _load()
WHY = netns.unavailable()
needs_netns = pytest.mark.skipif(WHY is not None, reason=f"namespace cluster: {WHY}")
LATENCY_WHY = WHY or (None if Path("/dev/net/tun").exists() or netns.has_netem() else
                      "neither netem nor /dev/net/tun for the delay line")
needs_latency = pytest.mark.skipif(LATENCY_WHY is not None,
                                   reason=f"namespace cluster latency: {LATENCY_WHY}")

ECHO = textwrap.dedent("""
    import socket, sys, time
    mode, addr = sys.argv[1], sys.argv[2]
    if mode == "server":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, 5999)); s.listen(1)
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (d := c.recv(4096)):
            c.sendall(d)
    else:
        deadline = time.monotonic() + 20
        while True:
            try:
                c = socket.create_connection((addr, 5999), timeout=20); break
            except OSError:
                if time.monotonic() > deadline: raise
                time.sleep(0.05)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(10):
            t = time.perf_counter(); c.sendall(b"x"); c.recv(1)
            rtts.append(time.perf_counter() - t)
        print("RTT", min(rtts), flush=True)
""")

PROGRAM = textwrap.dedent("""
    import socket, sys, time
    import numpy as np
    from mpi4py import MPI
    c = MPI.COMM_WORLD
    x = np.ones(int(sys.argv[1]) // 4, np.float32)
    t = time.perf_counter()
    for _ in range(int(sys.argv[2])):
        c.Allreduce(MPI.IN_PLACE, x)
    dt = time.perf_counter() - t
    # one write per line: the ranks share the launcher's output pipe
    sys.stdout.write(f"RESULT {c.rank} {c.size} {socket.gethostname()} {float(x[0])} {dt}\\n")
    sys.stdout.flush()
""")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="hosts"):
        netns.Cluster(0)
    with pytest.raises(ValueError, match="latency"):
        netns.Cluster(2, latency_ms=-1)


def test_each_host_gets_cpus_of_its_own_or_is_told_it_shares():
    sets, shared = netns.assign_cpus(2, [0, 1, 2, 3, 4])
    assert sets == [[0, 1], [2, 3]] and not shared  # CPU 4 left to the control host
    assert netns.assign_cpus(2, [3, 1]) == ([[1], [3]], False)
    sets, shared = netns.assign_cpus(4, [0, 1])
    assert shared and sets == [[0], [1], [0], [1]]
    with pytest.raises(ValueError, match="hosts"):
        netns.assign_cpus(0, [0])
    if WHY is None:
        note = netns.Cluster(4, cpus=[0, 1]).cpu_note
        assert "4 hosts on 2 CPU(s): hosts must share cores" in note
        assert "each host on CPUs of its own" in netns.Cluster(2, cpus=[0, 1]).cpu_note


@needs_netns
def test_down_is_idempotent_and_removes_everything():
    cluster = netns.Cluster(2, rate="100mbit", tag=f"mgct{id(object()) % 10000}")
    cluster.down()  # nothing there yet: no error
    with cluster:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for ns in cluster.all_namespaces():
            assert ns in listed
    cluster.down()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in cluster.all_namespaces())


@pytest.mark.slow
@pytest.mark.mpi
@needs_netns
def test_allreduce_crosses_the_shaped_tcp_link(tmp_path):
    prog = tmp_path / "ar.py"
    prog.write_text(PROGRAM, encoding="utf-8")
    nbytes, reps, rate_bits = 2 << 20, 3, 100e6
    with netns.Cluster(2, rate="100mbit") as cluster:
        before = cluster.link_bytes()
        status, out = cluster.run(mpiexec(), ["-n", "2", sys.executable, str(prog),
                                              str(nbytes), str(reps)], timeout=90)
        after = cluster.link_bytes()
    assert status == 0, out
    rows = [line.split() for line in out.splitlines() if line.startswith("RESULT")]
    assert len(rows) == 2, out
    # Two distinct hosts, each rank's sum of ones over 2 ranks, repeated `reps` times: 2**reps
    assert len({r[3] for r in rows}) == 2
    assert all(float(r[4]) == 2.0 ** reps for r in rows)
    # Any 2-rank all-reduce moves at least M bytes each way per call (each rank must learn
    # the other's M bytes): count them on the wire, so shared memory was not used.
    for host in after:
        sent = after[host]["tx"] - before[host]["tx"]
        assert sent >= reps * nbytes, (host, sent)
    # and the shaping holds: M bytes per call at 100 Mbit/s is a lower bound on the time
    elapsed = max(float(r[5]) for r in rows)
    assert elapsed >= 0.8 * reps * nbytes * 8 / rate_bits, elapsed


@pytest.mark.slow
@needs_latency
def test_latency_adds_its_round_trip_and_leaves_nothing_behind(tmp_path):
    # D ms per link and direction: host to host and back crosses 4 delayed links
    delay = 2.0
    prog = tmp_path / "echo.py"
    prog.write_text(ECHO, encoding="utf-8")
    with netns.Cluster(2, rate="1gbit", latency_ms=delay, tag="mgclat") as cluster:
        relay = cluster.delay_line.pid if cluster.delay_line is not None else None
        server = subprocess.Popen(["ip", "netns", "exec", cluster.namespaces[1],
                                   sys.executable, str(prog), "server", cluster.addresses[1]])
        try:
            out = subprocess.run(["ip", "netns", "exec", cluster.namespaces[0],
                                  sys.executable, str(prog), "client", cluster.addresses[1]],
                                 capture_output=True, text=True, timeout=60)
        finally:
            server.kill()
            server.wait()
    assert out.returncode == 0, out.stderr
    rtt = float(out.stdout.split()[1])
    assert rtt >= 0.95 * 4 * delay / 1e3, rtt  # a lower bound: load only adds to it
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "mgclat" not in listed
    if relay is not None:  # the delay line (no netem): ended, having forwarded the frames
        assert not Path(f"/proc/{relay}").exists()
        assert "forwarded" in cluster.relay_stats


@pytest.mark.slow
@needs_netns
@pytest.mark.parametrize("latency", [0.0, 1.0])
def test_sigterm_mid_run_leaves_no_namespace_behind(tmp_path, latency):
    # A run killed by `timeout` (SIGTERM) must unwind and remove its namespaces and the
    # processes inside them (with latency and no netem: the delay line too).
    if latency and LATENCY_WHY:
        pytest.skip(f"namespace cluster latency: {LATENCY_WHY}")
    tag = "mgcterm"
    script = tmp_path / "hold.py"
    script.write_text(textwrap.dedent(f"""
        import importlib.util, subprocess, time
        spec = importlib.util.spec_from_file_location("n", {str(TOOL)!r})
        n = importlib.util.module_from_spec(spec); spec.loader.exec_module(n)
        with n.Cluster(2, rate=None, latency_ms={latency!r}, tag={tag!r}) as c:
            inside = subprocess.Popen(["ip", "netns", "exec", c.namespaces[0], "sleep", "30"])
            time.sleep(0.3)
            relay = c.delay_line.pid if c.delay_line is not None else inside.pid
            print("UP", inside.pid, relay, flush=True)
            time.sleep(30)
    """), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        word, pid, relay = proc.stdout.readline().split()
        assert word == "UP"
        proc.terminate()
        assert proc.wait(timeout=20) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        netns.remove_stale(tag)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in listed
    # the process inside the namespace was ended (a zombie until its parent is reaped at most)
    for p in (pid, relay):
        status = Path(f"/proc/{p}/status")
        assert not status.exists() or "State:\tZ" in status.read_text()


def test_delay_line_refuses_bad_arguments_in_one_line():
    tool = TOOL.with_name("delay_line.py")
    for args, message in ((["--delay-ms", "1", "nocolon"], "expected A:B"),
                          (["--delay-ms", "-1", "a:b"], "must be >= 0")):
        proc = subprocess.run([sys.executable, str(tool), *args], capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr

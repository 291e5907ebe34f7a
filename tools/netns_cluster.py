#!/usr/bin/env python3
"""A cluster of H hosts on one machine: Linux network namespaces joined by a bridge.

    sudo tools/netns_cluster.py run --hosts 2 --rate 1gbit -- \\
        -n 2 .venv/bin/python -m mgcaffe bench-comm

creates (names carry a tag, so several clusters can coexist):

    <tag>-sw    a namespace holding the bridge `br0` (the switch)
    <tag>-ctl   the control host (unshaped link): mpiexec runs here
    <tag>-h0..  the compute hosts, each with `eth0` (10.77.0.<i+1>/24) on the bridge

Each compute host's link is shaped in both directions (a `tbf` at `rate` on the host's
`eth0` and on its switch port; its bucket `burst` defaults to 32 KB: with 256 KB a 64 KB
all-reduce passed in 0.15 ms at 1 Gbit/s instead of its 0.52 ms wire time). `latency_ms`
adds a one-way delay to each direction of each compute host's link (host to host: twice
that one way, four times that round trip): with `netem` where the kernel has it, else with
a user-space delay line (tools/delay_line.py): each host's link is then a pair of TAP
devices, `eth0` in the host and `p<i>` on the bridge, joined by one relay process in the
switch namespace that forwards frames after the delay (tbf still shapes both devices; their
gso_max_size is set below the tbf bucket so that TSO frames of ~30 KB pass tbf whole and
the relay handles one frame per ~30 KB). The control host's link is left unshaped and
undelayed: Hydra's control traffic does not use the shaped network.

`mpiexec` runs in the control namespace with `-localhost <control address>` and starts one
Hydra proxy per host through `-launcher ssh -launcher-exec <script>`: the script enters the
host's namespace and a new UTS namespace with the host's own hostname (so MPI sees distinct
nodes), pins the proxy (and so every rank it starts) to the host's CPU set with `taskset`,
then runs the proxy.

CPU sets (`assign_cpus`): a real host has cores of its own, so each emulated host gets a
disjoint set of the CPUs this tool may use, `CPUs // hosts` each (the ones left over stay
unpinned work's: the control host, the delay line). A rank then sees only its host's cores,
and mgcaffe's own thread choice (mgcaffe.cpu.cores reads the affinity mask) is right inside
the emulation without flags. With fewer CPUs than hosts, hosts must share: host i gets CPU
i mod CPUs, and `cpu_note` (printed by the command line) says so; every timing then includes
the other hosts' work on the same core. `pin=False` (`--no-pin`) leaves every host on every
CPU. `UCX_TLS=tcp,self` (and `FI_PROVIDER=tcp`) keep MPICH off shared
memory, so every byte between ranks crosses the shaped links; `link_bytes()` counts them.

`down()` removes every namespace of the tag and is idempotent (`remove_stale()` removes those
of a tag left behind by a killed run). Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN);
`unavailable()` says why a cluster cannot be made here, or returns None.

Traffic goes only between the cluster's own namespaces; nothing is routed to the outside.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

SUBNET = "10.77.0"
CONTROL_ADDRESS = f"{SUBNET}.254"
MAX_HOSTS = 16
DELAY_LINE = Path(__file__).resolve().with_name("delay_line.py")
TAP_GSO_MAX = 30000  # below the 32 KB tbf bucket: tbf splits larger frames into MTU ones


def assign_cpus(hosts: int, cpus: Sequence[int]) -> tuple[list[list[int]], bool]:
    """Each host's CPU set from the CPUs available, and whether hosts share CPUs: disjoint
    sets of len(cpus) // hosts consecutive CPUs when there are enough, else CPU i mod
    len(cpus) for host i (shared)."""
    cpus = sorted(set(int(c) for c in cpus))
    if hosts < 1 or not cpus:
        raise ValueError(f"assign_cpus: need hosts >= 1 and some CPUs, got {hosts}, {cpus}")
    if len(cpus) >= hosts:
        each = len(cpus) // hosts
        return [cpus[i * each:(i + 1) * each] for i in range(hosts)], False
    return [[cpus[i % len(cpus)]] for i in range(hosts)], True


def _cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in cpus)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def _tc(ns: str, *args: str) -> None:
    subprocess.run(["tc", "-n", ns, *args], capture_output=True, text=True, check=True,
                   timeout=30)


def unavailable() -> str | None:
    """Why a namespace cluster cannot be made on this machine, or None if it can."""
    for tool in ("ip", "tc", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    probe = f"mgcprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        veth = _ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "a1",
                   check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
        br = _ip("-n", probe, "link", "add", "b0", "type", "bridge", check=False)
        if br.returncode != 0:
            return f"cannot create a bridge: {br.stderr.strip()}"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


def has_netem() -> bool:
    """Whether the kernel can add a netem qdisc (latency emulation)."""
    probe = f"mgcnetem{os.getpid()}"
    try:
        if _ip("netns", "add", probe, check=False).returncode != 0:
            return False
        _ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "a1", check=False)
        r = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "a0", "root", "netem",
                            "delay", "1ms"], capture_output=True, timeout=30)
        return r.returncode == 0
    finally:
        _ip("netns", "del", probe, check=False)


_LAUNCHER = """#!/bin/sh
# Hydra's ssh launcher calls `<this> [options] <host> <command...>`: enter the host's
# namespace, give it its own hostname, run the command as ssh would (through a shell).
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "netns_cluster launcher: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts {pin}sh -c "hostname $name && exec $*"
"""


class Cluster:
    """H hosts in network namespaces on one bridge, each link shaped (see module docstring).

    Use as a context manager (`with Cluster(2, rate="1gbit") as c:`), or `up()` / `down()`."""

    def __init__(self, hosts: int = 2, rate: str | None = "1gbit", latency_ms: float = 0.0,
                 tag: str | None = None, burst: str = "32kb", pin: bool = True,
                 cpus: Sequence[int] | None = None):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts: between 1 and {MAX_HOSTS}, got {hosts}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms: must be >= 0, got {latency_ms}")
        self.hosts = hosts
        self.rate = rate
        self.latency_ms = float(latency_ms)
        self.burst = burst
        self.tag = tag or f"mgc{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.control = f"{self.tag}-ctl"
        self.namespaces = [f"{self.tag}-h{i}" for i in range(hosts)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(hosts)]
        self.hostnames = [f"{self.tag}-host{i}" for i in range(hosts)]
        if pin and shutil.which("taskset") is None:
            raise ValueError("pin: `taskset` is not installed (give pin=False, --no-pin, to "
                             "leave every host on every CPU)")
        self.pin = pin
        available = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
        self.cpu_sets, self.shared_cpus = assign_cpus(hosts, available)
        if not pin:
            self.cpu_sets, self.shared_cpus = [available] * hosts, hosts > 1
        self.workdir: Path | None = None
        self.delay_line = None  # the relay process (latency without netem)
        self.relay_stats = ""  # its last line, once stopped: frames, bytes, CPU seconds

    @property
    def cpu_note(self) -> str:
        """One line: which CPUs each host computes on, and whether hosts share them."""
        sets = "; ".join(f"{name} CPU {_cpu_list(c)}"
                         for name, c in zip(self.hostnames, self.cpu_sets))
        if not self.pin:
            return f"CPUs not pinned: every host runs on every CPU ({_cpu_list(self.cpu_sets[0])})"
        if self.shared_cpus:
            n = len({c for cs in self.cpu_sets for c in cs})
            return (f"{self.hosts} hosts on {n} CPU(s): hosts must share cores ({sets}); "
                    f"their timings include each other's work")
        return f"each host on CPUs of its own: {sets}"

    # -------------------------------------------------------------- set-up and removal
    def all_namespaces(self) -> list[str]:
        return [self.switch, self.control, *self.namespaces]

    def up(self) -> Cluster:
        """Create the namespaces, the bridge, the links and their shaping (removing any left
        from an earlier run with the same tag first)."""
        why = unavailable()
        if why:
            raise RuntimeError(f"netns cluster: {why}")
        self.netem = bool(self.latency_ms) and has_netem()
        if self.latency_ms and not self.netem and not os.path.exists("/dev/net/tun"):
            raise RuntimeError("netns cluster: latency needs the netem qdisc or TAP devices "
                               "(/dev/net/tun) for the delay line; this machine has neither")
        self.down()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        for ns in self.all_namespaces():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        ends = [(ns, addr, f"p{i}") for i, (ns, addr) in
                enumerate(zip(self.namespaces, self.addresses))]
        taps = bool(self.latency_ms) and not self.netem
        if taps:
            self._start_delay_line()
        ends.append((self.control, CONTROL_ADDRESS, "pc"))
        for ns, addr, port in ends:
            if taps and port != "pc":
                # the relay made t<i> and p<i> in the switch namespace: t<i> becomes eth0
                _ip("-n", self.switch, "link", "set", f"t{port[1:]}", "netns", ns)
                _ip("-n", ns, "link", "set", f"t{port[1:]}", "name", "eth0")
                for where, dev in ((ns, "eth0"), (self.switch, port)):
                    _ip("-n", where, "link", "set", "dev", dev, "gso_max_size",
                        str(TAP_GSO_MAX))
            else:
                _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
                    "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        for i, ns in enumerate(self.namespaces):
            self._shape(ns, "eth0")
            self._shape(self.switch, f"p{i}")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        cases = "\n".join(f"  {addr}|{name}) ns={ns}; name={name}; cpus={_cpu_list(cpus)} ;;"
                          for ns, addr, name, cpus in zip(self.namespaces, self.addresses,
                                                          self.hostnames, self.cpu_sets))
        launcher = self.workdir / "launcher.sh"
        pin = 'taskset -c "$cpus" ' if self.pin else ""
        launcher.write_text(_LAUNCHER.format(cases=cases, pin=pin), encoding="utf-8")
        launcher.chmod(0o755)

    def _start_delay_line(self) -> None:
        """One relay process in the switch namespace, creating the TAP pair of every host."""
        pairs = [f"t{i}:p{i}" for i in range(self.hosts)]
        self.delay_line = subprocess.Popen(
            ["ip", "netns", "exec", self.switch, sys.executable, str(DELAY_LINE),
             "--delay-ms", str(self.latency_ms), *pairs],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = ""
        if select.select([self.delay_line.stdout], [], [], 30)[0]:
            ready = self.delay_line.stdout.readline().strip()  # printed once the TAPs exist
        if ready != "ready":
            err = self._stop_delay_line()
            raise RuntimeError(f"netns cluster: the delay line did not start: "
                               f"{err.strip() or ready or 'no answer in 30 s'}")

    def _stop_delay_line(self) -> str:
        """End the relay (its TAP devices go with it); returns what it wrote on stderr."""
        proc, self.delay_line = self.delay_line, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.terminate()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines = (out or "").strip().splitlines()
        self.relay_stats = lines[-1] if lines else ""
        return err or ""

    def _shape(self, ns: str, dev: str) -> None:
        if self.latency_ms and self.netem:
            args = ["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                    f"{self.latency_ms}ms"]
            if self.rate:
                args += ["rate", self.rate]
            _tc(ns, *args)
        elif self.rate:
            _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate, "burst",
                self.burst, "latency", "50ms")

    def down(self) -> None:
        """End every process left in the cluster's namespaces, then remove the namespaces (and
        so their links); safe to repeat."""
        self._stop_delay_line()  # first: its last line says what it forwarded
        listed = _ip("netns", "list", check=False).stdout.split()
        present = [ns for ns in self.all_namespaces() if ns in listed]
        _kill_in(present)
        for ns in present:
            _ip("netns", "del", ns, check=False)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> Cluster:
        # SIGTERM (e.g. `timeout`) must unwind through __exit__, not leave namespaces behind
        self._old_term = None
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, _terminate)
        try:
            return self.up()
        except BaseException:
            self._restore_signal()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self._restore_signal()

    def _restore_signal(self) -> None:
        if getattr(self, "_old_term", None) is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    # -------------------------------------------------------------- use
    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Per compute host, the bytes its eth0 has sent and received so far."""
        out = {}
        for ns, name in zip(self.namespaces, self.hostnames):
            stats = json.loads(_ip("-j", "-s", "-n", ns, "link", "show", "dev", "eth0").stdout)
            s = stats[0]["stats64"]
            out[name] = {"tx": int(s["tx"]["bytes"]), "rx": int(s["rx"]["bytes"])}
        return out

    def mpiexec_command(self, mpiexec: str, ranks_per_host: int = 1) -> list[str]:
        """`ip netns exec <ctl> mpiexec ...` that places ranks_per_host ranks on each host;
        append `-n N program args...`."""
        if self.workdir is None:
            raise RuntimeError("netns cluster: not up")
        hosts = ",".join(f"{a}:{ranks_per_host}" for a in self.addresses)
        return ["ip", "netns", "exec", self.control, mpiexec, "-launcher", "ssh",
                "-launcher-exec", str(self.workdir / "launcher.sh"), "-localhost",
                CONTROL_ADDRESS, "-hosts", hosts,
                "-genv", "UCX_TLS", "tcp,self", "-genv", "FI_PROVIDER", "tcp",
                "-genv", "UCX_NET_DEVICES", "eth0", "-genv", "MPIR_CVAR_NOLOCAL", "1"]

    def run(self, mpiexec: str, args: list[str], *, timeout: float = 120.0,
            env: dict | None = None, ranks_per_host: int = 1) -> tuple[int | None, str]:
        """Run `mpiexec <placement> args...` across the hosts; (exit status, output). A run
        past `timeout` is killed with its process group (status None)."""
        cmd = self.mpiexec_command(mpiexec, ranks_per_host) + list(args)
        full_env = dict(os.environ, **(env or {}))
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=full_env, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            self._kill_leftovers()
            return None, out

    def _kill_leftovers(self) -> None:
        # proxies started through the launcher live in the hosts' namespaces
        _kill_in(self.namespaces + [self.control])


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def _kill_in(namespaces: list[str]) -> None:
    """SIGKILL every process inside these namespaces (each was started by this tool), with a
    bounded number of rounds."""
    for _ in range(5):
        pids = [int(p) for ns in namespaces
                for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove_stale(tag: str) -> None:
    """Remove the namespaces of a cluster `tag` left behind (e.g. by a killed run), ending
    the processes still inside them first."""
    stale = [ns for ns in _ip("netns", "list", check=False).stdout.split()
             if ns.startswith(f"{tag}-")]
    _kill_in(stale)
    for ns in stale:
        _ip("netns", "del", ns, check=False)


# ---------------------------------------------------------------------- command line
def _mpiexec_default() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="make the cluster, run mpiexec across it, remove it")
    r.add_argument("--hosts", type=int, default=2)
    r.add_argument("--rate", default="1gbit", help="link rate (tc units), or `none`")
    r.add_argument("--latency-ms", type=float, default=0.0,
                   help="one-way delay per link and direction (netem, else a TAP delay line)")
    r.add_argument("--ranks-per-host", type=int, default=1)
    r.add_argument("--no-pin", action="store_true",
                   help="leave every host on every CPU (default: disjoint CPU sets per host "
                        "where there are enough CPUs)")
    r.add_argument("--timeout", type=float, default=600.0)
    r.add_argument("--mpiexec", default=_mpiexec_default())
    r.add_argument("mpi_args", nargs=argparse.REMAINDER,
                   help="after --: mpiexec's own arguments (-n N program ...)")
    c = sub.add_parser("clean", help="remove a cluster left behind")
    c.add_argument("--tag", required=True)
    sub.add_parser("check", help="say whether a cluster can be made here")
    args = p.parse_args(argv)
    if args.cmd == "check":
        why = unavailable()
        print(f"netns cluster: {why or 'available'}; netem: {has_netem()}; TAP delay line: "
              f"{'available' if os.path.exists('/dev/net/tun') else 'no /dev/net/tun'}")
        return 1 if why else 0
    if args.cmd == "clean":
        remove_stale(args.tag)
        return 0
    mpi_args = args.mpi_args[1:] if args.mpi_args[:1] == ["--"] else args.mpi_args
    if not mpi_args:
        p.error("give mpiexec's arguments after --, e.g. -- -n 2 python prog.py")
    rate = None if args.rate.lower() == "none" else args.rate
    try:
        with Cluster(args.hosts, rate, args.latency_ms, pin=not args.no_pin) as cluster:
            print(f"netns_cluster: {cluster.cpu_note}", file=sys.stderr, flush=True)
            before = cluster.link_bytes()
            t0 = time.perf_counter()
            status, out = cluster.run(args.mpiexec, mpi_args, timeout=args.timeout,
                                      ranks_per_host=args.ranks_per_host)
            wall = time.perf_counter() - t0
            after = cluster.link_bytes()
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"netns_cluster: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(out)
    sent = {h: after[h]["tx"] - before[h]["tx"] for h in after}
    print(f"netns_cluster: {args.hosts} hosts, rate {rate or 'unshaped'}, latency "
          f"{args.latency_ms} ms; {wall:.1f} s; bytes sent per host: "
          f"{', '.join(f'{h}={n}' for h, n in sent.items())}"
          f"{'; TIMED OUT' if status is None else ''}", file=sys.stderr)
    if cluster.relay_stats:
        print(f"netns_cluster: {cluster.relay_stats}", file=sys.stderr)
    cmd = " ".join(shlex.quote(a) for a in mpi_args)
    if status:
        print(f"netns_cluster: `{cmd}` exited with {status}", file=sys.stderr)
    return 124 if status is None else status


if __name__ == "__main__":
    sys.exit(main())

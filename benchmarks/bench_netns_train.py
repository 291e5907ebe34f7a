"""The trainer's own closing line on the namespace cluster: every scheme as its own
`mgcaffe train` run, as users run it.

    sudo .venv/bin/python benchmarks/bench_netns_train.py [--model googlenet] [--hosts 2]
        [--rate 1gbit] [--latency-ms 0] [--batch 1] [--schemes wfbp synceasgd mgwfbp]
        [--iters 130] [--short-iters 30] [--out results.json] [--logs DIR]
        [--train-args "--timeline /tmp/{run}.json"] [--ddp 30]
        [--compress none fp16 bf16 auto]

Each run is `mpiexec -n HOSTS mgcaffe train --solver S --comm SCHEME` across H network
namespaces on this machine (tools/netns_cluster.py: real TCP over links shaped to `--rate`,
each host on CPUs of its own where the machine has enough, so the trainer's own thread choice
applies; no --threads flag). The net is the model's train_val with its data layers replaced by
random inputs of batch `--batch` per rank. Read from each run's log:
- the start-up all-reduce cost: how many benchmarked sizes its T(M) misses beyond their spread;
- the closing line "measured X ms (median of N), predicted Y ms by plan P".

`--ddp ITERS` also runs PyTorch DistributedDataParallel (benchmarks/torch_net.py: the same
prototxt interpreted in PyTorch, gloo over the same links, its default 25 MB buckets, SGD with
momentum, one thread per rank, batch `--batch` per rank) in the same cluster after the
mgcaffe runs, and prints its median iteration beside theirs.

`--compress` runs every scheme once per format given (`mgcaffe train --compress`: the
gradients on the wire in float16 or bfloat16, or the planner's choice per message), in the
same cluster, one after the other; the table's `--compress` column says which.

A long run (`--iters`, default 130) re-plans after warm-up; a short run (`--short-iters`,
default 30; 0 skips them) ends before any re-plan, so it shows the start-up plan. Targets
(issue "The trainer's own prediction holds on every run"): measured/predicted within
0.9-1.1 for every scheme after the re-plan, within 0.8-1.25 in the short runs; the fit within
the measured spread at every benchmarked size; the predicted-fastest scheme measured fastest or
within noise of it (noise: the spread of the measured iterations, 10th to 90th percentile, is
not in the closing line, so "within 5%" stands in for it here). A benchmark, not a test: the
exit status is 0 when a target is missed; the table says which.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from google.protobuf import text_format  # noqa: E402

from mgcaffe.comm.backends.launcher import local_mpiexec as mpiexec  # noqa: E402
from mgcaffe.formats.protoio import read_net_param  # noqa: E402
from mgcaffe.net.synthetic_data import synthesize_data_layers  # noqa: E402

MODELS = {"googlenet": REPO / "models" / "googlenet" / "train_val.prototxt",
          "resnet50": REPO / "models" / "resnet50" / "train_val.prototxt"}
CLOSING = re.compile(r"measured ([\d.]+) ms \(median of (\d+)\), predicted ([\d.]+) ms by "
                     r"plan (\S+)")
OUTSIDE = re.compile(r"(\d+) of (\d+) sizes outside their spread")
REPLANNED = "Re-planned at iteration"
UNDONE = "Re-plan undone:"
LONG_BAND, SHORT_BAND = (0.9, 1.1), (0.8, 1.25)
NEAR_FASTEST = 1.05


def netns_tool():
    """tools/netns_cluster.py as a module (the benchmarks that run on the namespace cluster
    load it through here)."""
    spec = importlib.util.spec_from_file_location("netns_cluster",
                                                  REPO / "tools" / "netns_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_solver(model: str, batch: int, max_iter: int, where: Path) -> Path:
    """A solver file training `model` on random inputs of `batch` per rank."""
    net, _ = synthesize_data_layers(read_net_param(str(MODELS[model])), None, batch)
    net_path = where / f"{model}-b{batch}.prototxt"
    net_path.write_text(text_format.MessageToString(net))
    solver = where / f"solver-{model}-{max_iter}.prototxt"
    solver.write_text(f'net: "{net_path}"\nbase_lr: 1e-6\nmomentum: 0.9\nlr_policy: "fixed"\n'
                      f'display: 0\nmax_iter: {max_iter}\nrandom_seed: 1\ntype: "SGD"\n'
                      f'snapshot_after_train: false\nsnapshot_prefix: "{where}/snap"\n')
    return solver


def run_ddp(cluster, a, tmp: Path, hook: str = "none") -> dict:
    """PyTorch DDP on the same hosts and links (benchmarks/torch_net.py), with its own
    compression hook `hook` (none, fp16, bf16): its JSON line."""
    status, out = cluster.run(
        mpiexec(), ["-genv", "MASTER_ADDR", cluster.addresses[0], "-genv", "MASTER_PORT",
                    "29500", "-genv", "GLOO_SOCKET_IFNAME", "eth0", "-genv", "OMP_NUM_THREADS",
                    "1", "-n", str(a.hosts), sys.executable,
                    str(REPO / "benchmarks" / "torch_net.py"), "--ddp-worker",
                    str(MODELS[a.model]), "--batch", str(a.batch), "--iterations",
                    str(a.ddp), "--warmup", "5", "--hook", hook], timeout=a.timeout)
    if a.logs:
        Path(a.logs).mkdir(parents=True, exist_ok=True)
        (Path(a.logs) / f"{a.model}-{a.hosts}h-{a.rate}-ddp-{hook}.log").write_text(out)
    lines = [line for line in out.splitlines() if line.startswith('{"ddp_ms"')]
    if status != 0 or not lines:
        sys.stderr.write(out[-4000:])
        raise SystemExit(f"PyTorch DDP run: exit status {status}")
    return json.loads(lines[-1])


def read_run(out: str) -> dict:
    """What one run's log says: the closing line, the fit's misses, whether it re-planned."""
    closing = CLOSING.findall(out)
    if not closing:
        raise ValueError("no closing line")
    measured, count, predicted, plan = closing[-1]
    outside = OUTSIDE.search(out)
    return {"measured_ms": float(measured), "iterations": int(count),
            "predicted_ms": float(predicted), "plan": plan,
            "ratio": float(measured) / float(predicted),
            "fit_misses": None if outside is None else [int(outside.group(1)),
                                                         int(outside.group(2))],
            "replanned": REPLANNED in out, "undone": UNDONE in out}


def verdicts(rows: list[dict]) -> list[str]:
    """One line per target: met or missed, with the numbers."""
    lines = []
    for kind, band in (("long", LONG_BAND), ("short", SHORT_BAND)):
        runs = [r for r in rows if r["kind"] == kind]
        if not runs:
            continue
        off = [f"{r['scheme']} {r['ratio']:.2f}" for r in runs
               if not band[0] <= r["ratio"] <= band[1]]
        lines.append(f"{kind} runs, measured/predicted within {band[0]}-{band[1]}: "
                     + ("met" if not off else "MISSED (" + ", ".join(off) + ")"))
        fastest_predicted = min(runs, key=lambda r: r["predicted_ms"])
        fastest_measured = min(r["measured_ms"] for r in runs)
        near = fastest_predicted["measured_ms"] <= NEAR_FASTEST * fastest_measured
        lines.append(f"{kind} runs, predicted-fastest ({fastest_predicted['scheme']}) "
                     f"measured fastest or within {100 * (NEAR_FASTEST - 1):.0f}%: "
                     + ("met" if near else f"MISSED ({fastest_predicted['measured_ms']:.1f} "
                        f"ms against {fastest_measured:.1f} ms)"))
    lines += compression_verdicts(rows)
    misses = [r for r in rows if r["fit_misses"] and r["fit_misses"][0]]
    lines.append("start-up fit within the measured spread at every size: "
                 + ("met" if not misses else "MISSED (" + ", ".join(
                     f"{r['scheme']} {r['kind']}: {r['fit_misses'][0]} of "
                     f"{r['fit_misses'][1]}" for r in misses) + ")"))
    return lines


def compression_verdicts(rows: list[dict]) -> list[str]:
    """Issue 44's targets, per scheme of the long runs: fp16 at most 0.7x none's iteration,
    auto no slower than the faster of the two (within NEAR_FASTEST)."""
    lines = []
    long = {(r["scheme"], r.get("compress", "none")): r for r in rows if r["kind"] == "long"}
    for scheme in dict.fromkeys(s for s, _ in long):
        none, fp16, auto = (long.get((scheme, c)) for c in ("none", "fp16", "auto"))
        if none and fp16:
            x = fp16["measured_ms"] / none["measured_ms"]
            lines.append(f"{scheme} --compress=fp16 at most 0.7x of none: "
                         + ("met" if x <= 0.7 else "MISSED") + f" ({x:.3f}x)")
        if none and auto:
            best = min(r["measured_ms"] for r in (none, fp16) if r)
            x = auto["measured_ms"] / best
            lines.append(f"{scheme} --compress=auto no slower than the faster of none/fp16: "
                         + ("met" if x <= NEAR_FASTEST else "MISSED") + f" ({x:.2f}x)")
    return lines


def table(rows: list[dict]) -> str:
    head = (f"{'run':<6} {'--comm':<12} {'--compress':<10} {'iters':>5} {'measured':>10} "
            f"{'predicted':>10} {'meas/pred':>9}  {'re-planned':<10} {'fit misses':<10} plan")
    lines = [head]
    for r in rows:
        misses = "-" if r["fit_misses"] is None else f"{r['fit_misses'][0]}/{r['fit_misses'][1]}"
        replanned = "undone" if r.get("undone") else "yes" if r["replanned"] else "no"
        lines.append(f"{r['kind']:<6} {r['scheme']:<12} {r.get('compress', 'none'):<10} "
                     f"{r['iterations']:>5} "
                     f"{r['measured_ms']:>8.1f}ms {r['predicted_ms']:>8.1f}ms "
                     f"{r['ratio']:>9.2f}  {replanned:<10} "
                     f"{misses:<10} {r['plan']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="googlenet")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="link rate (tc units); 'none': unshaped")
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=1, help="per-rank batch (default 1)")
    p.add_argument("--schemes", nargs="+", default=["wfbp", "synceasgd", "mgwfbp"])
    p.add_argument("--iters", type=int, default=130,
                   help="long runs: re-plan after warm-up (0: none)")
    p.add_argument("--short-iters", type=int, default=30, help="short runs (0: none)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--out", default=None, help="also write the rows as JSON")
    p.add_argument("--logs", default=None, help="keep each run's log in this directory")
    p.add_argument("--ddp", type=int, default=0, metavar="ITERS",
                   help="also time PyTorch DistributedDataParallel (gloo, 25 MB buckets, one "
                        "thread per rank) on the same net, batch and links for ITERS "
                        "iterations after 5 of warm-up (needs torch; 0: not)")
    p.add_argument("--ddp-hooks", nargs="+", default=["none"], choices=("none", "fp16", "bf16"),
                   help="with --ddp: DDP's compression hooks to time, each a run")
    p.add_argument("--compress", nargs="+", default=["none"], metavar="FORMAT",
                   help="run every scheme with each of these --compress values (none, fp16, "
                        "bf16, auto; default none)")
    p.add_argument("--train-args", default="",
                   help="more `mgcaffe train` arguments for every run, one string ('{run}' "
                        "becomes KIND-SCHEME), e.g. \"--timeline /tmp/{run}.json\"")
    a = p.parse_args()
    netns = netns_tool()
    why = netns.unavailable()
    if why:
        raise SystemExit(f"bench_netns_train: the namespace cluster is unavailable: {why}")
    kinds = [(kind, n) for kind, n in (("long", a.iters), ("short", a.short_iters)) if n]
    rows, ddps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        solvers = {kind: write_solver(a.model, a.batch, n, Path(tmp)) for kind, n in kinds}
        rate = None if a.rate == "none" else a.rate
        with netns.Cluster(a.hosts, rate, a.latency_ms) as cluster:
            print(f"{a.model}, batch {a.batch} per rank, {a.hosts} hosts, links "
                  f"{a.rate}{f' +{a.latency_ms} ms' if a.latency_ms else ''}; "
                  f"{cluster.cpu_note}", flush=True)
            for kind, _ in kinds:
                for scheme, compress in [(s, c) for s in a.schemes for c in a.compress]:
                    run_name = f"{kind}-{scheme}" + (f"-{compress}" if compress != "none"
                                                     else "")
                    t0 = time.monotonic()
                    status, out = cluster.run(
                        mpiexec(), ["-n", str(a.hosts), sys.executable, "-m", "mgcaffe",
                                    "train", "--solver", str(solvers[kind]), "--comm", scheme,
                                    "--compress", compress]
                        + a.train_args.replace("{run}", run_name).split(),
                        timeout=a.timeout)
                    if a.logs:
                        Path(a.logs).mkdir(parents=True, exist_ok=True)
                        log_name = f"{a.model}-{a.hosts}h-{a.rate}-{run_name}.log"
                        (Path(a.logs) / log_name).write_text(out)
                    if status != 0:
                        sys.stderr.write(out[-4000:])
                        raise SystemExit(f"{kind} run of --comm {scheme} --compress {compress}: "
                                         f"exit status {status}")
                    row = dict(read_run(out), kind=kind, scheme=scheme, compress=compress,
                               wall_s=round(time.monotonic() - t0, 1))
                    rows.append(row)
                    print(f"  {kind} {scheme} --compress={compress}: "
                          f"{CLOSING.findall(out)[-1]} in {row['wall_s']} s", flush=True)
            if a.ddp:
                ddps = [run_ddp(cluster, a, Path(tmp), hook) for hook in a.ddp_hooks]
    print(table(rows))
    fastest = min((r for r in rows if r["kind"] == "long"), key=lambda r: r["measured_ms"],
                  default=None)
    for ddp in ddps:
        print(f"PyTorch DDP, hook {ddp.get('hook', 'none')}: {ddp['ddp_ms']:.1f} ms per "
              f"iteration (median of "
              f"{ddp['iterations']}; {ddp['setup']})"
              + (f"; the fastest mgcaffe scheme ({fastest['scheme']}) over DDP: "
                 f"{ddp['ddp_ms'] / fastest['measured_ms']:.2f}x" if fastest else ""))
    for line in verdicts(rows):
        print(line)
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "rows": rows, "ddp": ddps}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

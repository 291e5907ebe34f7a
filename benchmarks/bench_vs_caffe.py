"""mgcaffe beside real BVLC Caffe and PyTorch CPU on the same prototxt files (issue 14).

Generates the nets (LeNet b64, CIFAR-10 quick b100, AlexNet deploy b8, GoogleNet deploy b8,
ResNet-50 deploy b4; data layers replaced by Input layers, `force_backward: true` so that
every engine runs the whole backward of the deploy nets), then runs rounds: in each round,
for each condition (idle, then loaded: one busy process per core started by this script),
every engine times every net in a fresh process, the engines' order rotating from round to
round. Prints per net the time per forward+backward (each round's value, best, spread), the
ratios to Caffe and PyTorch measured in the same round and condition, the loaded / idle
slowdown, the peak RSS, the conv+ip GFLOP/s against a matmul measured in the same run, and
per-layer tables (Caffe vs mgcaffe; PyTorch reports whole passes only). Each engine's
threads, BLAS library and kernel are printed with its results.

Engines: Caffe when `--caffe PATH` is given or `caffe` is on PATH (else its column is
skipped; this repository holds no Caffe), mgcaffe (`python -m mgcaffe time`), PyTorch when
`torch` imports (a small prototxt interpreter below; not a project dependency). Caffe and
mgcaffe report the mean over `--iterations` of forward + backward; diff clearing is not
timed (`caffe time` never clears; `mgcaffe time` clears untimed).

    python benchmarks/bench_vs_caffe.py [--caffe PATH] [--rounds 3] [--nets lenet,alexnet]
        [--conditions idle,loaded] [--scale 1.0] [--out DIR] [--json RESULTS.json]
        [--data-gradient]
    python benchmarks/bench_vs_caffe.py --torch-profile cifar10_quick   # PyTorch per op

The closing table sets mgcaffe beside PyTorch per net and condition: min and median of the
rounds, the median of the per-round ratios, and both engines' peak RSS. The nets with a loss
run the backward of training (no gradient of the data input, in every engine) unless
`--data-gradient` asks every engine for it (force_backward, as the deploy nets need anyway).

Debian's OpenBLAS 0.3.21 does not know newer Xeons and falls back to kernels without AVX:
the script sets OPENBLAS_CORETYPE for Caffe's runs (default: what numpy's OpenBLAS detects;
`--caffe-coretype` overrides it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from busy_load import BusyLoad  # noqa: E402 - same folder

# name: (prototxt, {input top: shape}, iterations at --scale 1). The iterations make each
# run last a second or more on every net: LeNet's 20 iterations (0.3-0.6 s a run) were
# a few scheduler decisions long, and its round-to-round spread measured those.
NETS = {
    "lenet": ("models/lenet/lenet_train_test.prototxt",
              {"data": (64, 1, 28, 28), "label": (64,)}, 100),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt",
                      {"data": (100, 3, 32, 32), "label": (100,)}, 25),
    "alexnet": ("models/alexnet/deploy.prototxt", {"data": (8, 3, 227, 227)}, 5),
    "googlenet": ("models/googlenet/deploy.prototxt", {"data": (8, 3, 224, 224)}, 3),
    "resnet50": ("models/resnet50/deploy.prototxt", {"data": (4, 3, 224, 224)}, 3),
}
DATA_TYPES = {"Data", "ImageData", "HDF5Data", "MemoryData", "WindowData", "DummyData",
              "Input"}
ENGINES = ("caffe", "mgcaffe", "torch")


# -- the nets
def generate(name: str, out_dir: Path, data_gradient: bool = True) -> Path:
    """The TRAIN-phase net with Input layers of the given shapes, written for every engine.

    `data_gradient` False: `force_backward` only on nets without a loss (the deploy nets,
    whose backward would otherwise not run; mgcaffe's and Caffe's `time` leave their data
    input out then), so a net with a loss runs the backward training runs, with no gradient
    of its data input, which PyTorch's training never computes either."""
    from mgcaffe.formats.protoio import filter_net, read_net_param, write_prototxt  # noqa: PLC0415
    from mgcaffe.layer_types.base import TRAIN  # noqa: PLC0415
    from mgcaffe.proto import caffe_pb2  # noqa: PLC0415

    path, shapes, _ = NETS[name]
    param = filter_net(read_net_param(ROOT / path), TRAIN)
    net = caffe_pb2.NetParameter()
    net.name = param.name or name
    net.force_backward = data_gradient or not any(
        layer.type.endswith("Loss") for layer in param.layer)
    data = caffe_pb2.LayerParameter(name="input", type="Input")
    for top, shape in shapes.items():
        data.top.append(top)
        data.input_param.shape.add().dim.extend(shape)
    net.layer.append(data)
    for layer in param.layer:
        if layer.type in DATA_TYPES:
            continue
        if layer.type == "Accuracy":  # no backward, and Caffe's time skips nothing of it
            continue
        copy = net.layer.add()
        copy.CopyFrom(layer)
        del copy.include[:]
        del copy.exclude[:]
    target = out_dir / f"{name}{'' if data_gradient else '-train'}.prototxt"
    write_prototxt(net, target)
    return target


def conv_ip_flops(prototxt: Path) -> tuple[float, list[str]]:
    """GEMM flops of Convolution/InnerProduct in one forward+backward (mgcaffe's net), and
    the names of the layers that do them."""
    from bench_engine import gemm_flops  # noqa: PLC0415

    from mgcaffe.layer_types.base import TRAIN  # noqa: PLC0415
    from mgcaffe.net import Net  # noqa: PLC0415
    from mgcaffe.net.profiling import timing_propagate_down  # noqa: PLC0415

    net = Net(str(prototxt), TRAIN)
    try:
        per_layer = gemm_flops(net, timing_propagate_down(net))
        names = [name for name, f in zip(net.layer_names, per_layer) if f]
        return float(sum(per_layer)), names
    finally:
        net.close()


# -- running one engine in a fresh process
LAYER_LINE = re.compile(r"\]\s+(\S+)\s+(forward|backward): ([0-9.e+-]+) ms")
TOTAL_LINE = re.compile(r"Average (Forward|Backward) pass: ([0-9.e+-]+) ms")


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a running process (its own peak since exec; rusage's maxrss would count
    the pages of this parent it was forked from)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def run_child(cmd: list[str], env: dict, timeout: float) -> tuple[str, int, float, float, float]:
    """(output, exit status, peak RSS in MB, CPU seconds, wall seconds) of a fresh process.

    CPU seconds: user + system of the whole process (os.wait4's rusage of this child alone),
    setup included; against the wall seconds it shows how many cores an engine kept busy,
    which under a competing load says whether it took more than its share."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT)
        deadline, rss = start + timeout, 0.0
        while True:
            pid, wait_status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            rss = max(rss, peak_rss_mb(proc.pid))
            if time.monotonic() > deadline:
                proc.kill()
                pid, wait_status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        out.seek(0)
        return out.read(), proc.returncode, rss, usage.ru_utime + usage.ru_stime, wall


def parse_time_log(text: str) -> dict | None:
    totals = dict(TOTAL_LINE.findall(text))
    if "Forward" not in totals or "Backward" not in totals:
        return None
    layers: dict = {}
    for name, which, ms in LAYER_LINE.findall(text):
        layers.setdefault(name, {})[which] = float(ms)
    return {"ms": float(totals["Forward"]) + float(totals["Backward"]),
            "forward_ms": float(totals["Forward"]), "backward_ms": float(totals["Backward"]),
            "layers": layers}


def engine_command(engine: str, prototxt: Path, iterations: int, args) -> tuple[list, dict]:
    env = dict(os.environ)
    if engine == "caffe":
        env["OPENBLAS_CORETYPE"] = args.caffe_coretype  # the flag, else numpy's own kernel
        env["GLOG_logtostderr"] = "1"
        return [args.caffe, "time", "-model", str(prototxt), "-iterations",
                str(iterations)], env
    if engine == "mgcaffe":
        return [sys.executable, "-m", "mgcaffe", "time", "--model", str(prototxt),
                "--iterations", str(iterations), "--threads", str(args.mgcaffe_threads)], env
    return [sys.executable, __file__, "--torch-worker", str(prototxt), "--iterations",
            str(iterations)], env


def run_engine(engine: str, prototxt: Path, iterations: int, args) -> dict:
    cmd, env = engine_command(engine, prototxt, iterations, args)
    text, status, rss, cpu_s, wall_s = run_child(cmd, env, args.timeout)
    if engine == "torch":
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if status == 0 and lines else None
    else:
        result = parse_time_log(text) if status == 0 else None
    if result is None:
        tail = " | ".join(text.strip().splitlines()[-3:])
        return {"error": f"exit {status}: {tail[-300:]}", "rss_mb": rss}
    result["rss_mb"] = rss
    result["cpu_s"], result["wall_s"] = cpu_s, wall_s
    if engine == "mgcaffe":
        found = re.search(r"Threads: .*", text)
        result["setup"] = found.group(0) if found else "?"
    return result


# -- engine descriptions
def describe_caffe(path: str, coretype: str) -> str:
    try:
        libs = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        libs = ""
    blas = next((ln.split("=>")[-1].split("(")[0].strip() for ln in libs.splitlines()
                 if "blas" in ln.lower()), "?")
    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") \
        or f"{len(os.sched_getaffinity(0))} (OpenBLAS default: one per CPU)"
    return f"Caffe {path}: BLAS {blas}, threads {threads}, OPENBLAS_CORETYPE={coretype}"


def numpy_coretype() -> str:
    import numpy  # noqa: F401, PLC0415
    from threadpoolctl import threadpool_info  # noqa: PLC0415

    arch = [i.get("architecture") for i in threadpool_info() if i.get("user_api") == "blas"]
    return (arch[0] or "Haswell") if arch else "Haswell"


def matmul_rate() -> float:
    from bench_engine import matmul_gflops  # noqa: PLC0415

    return matmul_gflops(repeats=10, n=1024)


# -- PyTorch: the prototxt interpreter of torch_net.py
def torch_worker(prototxt: str, iterations: int, profile: bool = False) -> None:
    """Time (or with `profile`, print torch.profiler's per-op table of) `iterations` passes of
    the net in PyTorch; prints one JSON line."""
    import torch  # noqa: PLC0415
    from torch_net import build  # noqa: PLC0415 - same folder

    from mgcaffe.formats.protoio import read_net_param  # noqa: PLC0415

    g = torch.Generator().manual_seed(0)
    net = read_net_param(prototxt)
    tn = build(net, g)
    params, steps, shapes, blobs = tn.params, tn.steps, tn.shapes, {}
    inputs = tn.inputs
    # The data input's gradient where mgcaffe computes one too (a net with a loss and
    # force_backward: Caffe's rule); never on a deploy net (`mgcaffe time` leaves it out).
    data_grad = net.force_backward and bool(tn.losses)

    def one_pass():
        """(seconds forward, seconds backward); inputs drawn and grads dropped untimed."""
        for top in inputs:
            s = shapes[top]
            blobs[top] = (torch.zeros(s) if len(s) == 1 else
                          torch.randn(*s, generator=g).requires_grad_(data_grad))
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        for f, b, tops in steps:
            blobs[tops[0]] = f(*[blobs[x] for x in b])
        out = blobs[steps[-1][2][0]]
        t1 = time.perf_counter()
        (out if out.dim() == 0 else out.sum()).backward()
        return t1 - t0, time.perf_counter() - t1

    one_pass()
    if profile:
        from torch.profiler import ProfilerActivity  # noqa: PLC0415
        from torch.profiler import profile as torch_profile  # noqa: PLC0415

        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(iterations):
                one_pass()
        print(f"PyTorch per op and input shapes, {iterations} passes (self CPU time per call "
              f"is the column to read):")
        print(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=40,
            max_shapes_column_width=80))
        return
    forward = backward = 0.0
    for _ in range(iterations):
        f, b = one_pass()
        forward += f
        backward += b
    cfg = torch.__config__.parallel_info().splitlines()
    print(json.dumps({"ms": (forward + backward) / iterations * 1e3,
                      "forward_ms": forward / iterations * 1e3,
                      "backward_ms": backward / iterations * 1e3,
                      "setup": f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
                               f"{'; '.join(c.strip() for c in cfg if 'ATen' in c or 'MKL' in c)}"
                               f", CPU capability {torch.backends.cpu.get_cpu_capability()}"}))


# -- the report
def fmt(ms) -> str:
    return "-" if ms is None else (f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}")


def median_ratio(runs: list, refs: list) -> tuple[list, float | None]:
    """The per-round ratios of two engines' times (rounds where both ran) and their median."""
    ratios = [a["ms"] / b["ms"] for a, b in zip(runs, refs) if a.get("ms") and b.get("ms")]
    return ratios, (statistics.median(ratios) if ratios else None)


def summary(results: dict, nets: list, engines: list, conditions: list) -> None:
    """One row per net and condition: mgcaffe and PyTorch side by side (ms per
    forward+backward, min / median of the rounds, forward / backward medians), the median of
    the per-round ratios, and each engine's peak RSS."""
    if "mgcaffe" not in engines or "torch" not in engines:
        return
    print("\n## mgcaffe / PyTorch (forward+backward per iteration; ratio: median of the "
          "per-round ratios)")
    print("| condition | net | batch | mgcaffe ms min / median (fwd / bwd) | PyTorch ms min / "
          "median (fwd / bwd) | per-round ratios | mgcaffe/PyTorch | peak RSS MB mgcaffe / "
          "PyTorch |")
    print("|---|---|---|---|---|---|---|---|")

    def times(runs):
        ok = [r for r in runs if r.get("ms")]
        if not ok:
            return "-"
        med = statistics.median
        return (f"{fmt(min(r['ms'] for r in ok))} / {fmt(med(r['ms'] for r in ok))} "
                f"({fmt(med(r['forward_ms'] for r in ok))} / "
                f"{fmt(med(r['backward_ms'] for r in ok))})")

    for cond in conditions:
        for name in nets:
            mg, tr = results[name][cond]["mgcaffe"], results[name][cond]["torch"]
            ratios, ratio = median_ratio(mg, tr)
            rss = [max((r.get("rss_mb", 0) for r in runs), default=0) for runs in (mg, tr)]
            batch = next(iter(NETS[name][1].values()))[0]
            print(f"| {cond} | {name} | {batch} | {times(mg)} | {times(tr)} | "
                  f"{', '.join(f'{x:.2f}' for x in ratios)} | "
                  f"{'-' if ratio is None else f'**{ratio:.2f}**'} | "
                  f"{rss[0]:.0f} / {rss[1]:.0f} |")


def report(results: dict, nets: list, engines: list, conditions: list, rounds: int,
           flops: dict, rate: float, setups: dict, gemm_layers: dict | None = None) -> None:
    print("\n## Engines")
    for engine in engines:
        print(f"- {engine}: {setups.get(engine, '?')}")
    print(f"\nmatmul rate measured in this run: {rate:.1f} GFLOP/s (1024^3 float32, numpy; "
          f"the best of a measurement before the run and one before each idle round)")
    for name in nets:
        print(f"\n## {name} (forward+backward per iteration, ms; rounds 1..{rounds})")
        print("| condition | engine | per round | best | spread max/min | peak RSS MB "
              "| / Caffe per round | / PyTorch per round |")
        print("|---|---|---|---|---|---|---|---|")
        for cond in conditions:
            for engine in engines:
                runs = results[name][cond][engine]
                ms = [r.get("ms") for r in runs]
                ok = [m for m in ms if m is not None]
                ratios = {}
                for ref in ("caffe", "torch"):
                    if ref in engines and ref != engine:
                        pairs = zip(ms, [r.get("ms") for r in results[name][cond][ref]])
                        ratios[ref] = ", ".join(f"{a / b:.2f}" if a and b else "-"
                                                for a, b in pairs)
                errors = [r["error"] for r in runs if "error" in r]
                spread = f"{max(ok) / min(ok):.2f}" if len(ok) > 1 else "-"
                rss = max((r.get("rss_mb", 0) for r in runs), default=0)
                print(f"| {cond} | {engine} | {', '.join(fmt(m) for m in ms)} | "
                      f"{fmt(min(ok) if ok else None)} | {spread} | {rss:.0f} | "
                      f"{ratios.get('caffe', '')} | {ratios.get('torch', '')} |")
                if errors:
                    print(f"|  | {engine} error | {errors[0]} |")
        if "idle" in conditions and "loaded" in conditions:
            parts = []
            for engine in engines:
                idle = [r.get("ms") for r in results[name]["idle"][engine] if r.get("ms")]
                busy = [r.get("ms") for r in results[name]["loaded"][engine] if r.get("ms")]
                if idle and busy:
                    slowdown = statistics.median(busy) / statistics.median(idle)
                    parts.append(f"{engine} {slowdown:.2f}")
            print(f"\nloaded / idle (medians): {', '.join(parts)}")
        cores = []
        for cond in conditions:
            for engine in engines:
                runs = [r for r in results[name][cond][engine] if r.get("wall_s")]
                if runs:
                    share = statistics.median(r["cpu_s"] / r["wall_s"] for r in runs)
                    cores.append(f"{cond} {engine} {share:.2f}")
        if cores:
            print(f"CPU time / wall time of the whole process (median; cores kept busy): "
                  f"{', '.join(cores)}")
        mg = [r.get("ms") for r in results[name].get("idle", {}).get("mgcaffe", [])
              if r.get("ms")]
        if mg and flops.get(name):
            gflops = flops[name] / (min(mg) / 1e3) / 1e9
            print(f"mgcaffe conv+ip (whole pass, best idle): {gflops:.1f} GFLOP/s = "
                  f"{gflops / rate:.2f} of the matmul rate")
        idle_runs = results[name].get("idle", {})
        own = [conv_ip_rate(idle_runs.get(engine, []), flops[name],
                            (gemm_layers or {}).get(name)) for engine in ("mgcaffe", "caffe")]
        if own[0]:
            caffe = f"; Caffe {own[1]:.1f} = {own[1] / rate:.2f}" if own[1] else ""
            print(f"conv+ip layers' own time (best idle round): mgcaffe {own[0]:.1f} GFLOP/s = "
                  f"{own[0] / rate:.2f} of the matmul rate{caffe}")
        if "caffe" in engines and "mgcaffe" in engines:
            layer_table(results[name], conditions[0])
    summary(results, nets, engines, conditions)


def conv_ip_rate(runs: list, flops: float, names: list | None) -> float | None:
    """GFLOP/s of the conv+ip layers over their own forward+backward time, in the run where
    they took least (None without per-layer times)."""
    if not names or not flops:
        return None
    times = [sum(run["layers"][n]["forward"] + run["layers"][n]["backward"] for n in names)
             for run in runs if all(n in run.get("layers", {}) for n in names)]
    return flops / (min(times) / 1e3) / 1e9 if times else None


def layer_table(result: dict, cond: str) -> None:
    best = {}
    for engine in ("caffe", "mgcaffe"):
        for run in result[cond][engine]:
            for layer, times in run.get("layers", {}).items():
                for which, ms in times.items():
                    key = (layer, which)
                    best.setdefault(key, {}).setdefault(engine, ms)
                    best[key][engine] = min(best[key][engine], ms)
    rows = [(k, v) for k, v in best.items() if "caffe" in v and "mgcaffe" in v]
    if not rows:
        return
    rows.sort(key=lambda kv: -max(kv[1].values()))
    print(f"\nper layer ({cond}, best of rounds, ms; slowest 12):")
    print("| layer | pass | caffe | mgcaffe | mgcaffe / caffe |")
    print("|---|---|---|---|---|")
    for (layer, which), v in rows[:12]:
        ratio = v["mgcaffe"] / v["caffe"] if v["caffe"] > 0 else float("inf")
        print(f"| {layer} | {which} | {fmt(v['caffe'])} | {fmt(v['mgcaffe'])} | {ratio:.2f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caffe", default=shutil.which("caffe"),
                        help="path of a real Caffe `caffe` binary (default: on PATH)")
    parser.add_argument("--mgcaffe-threads", default="adaptive",
                        help="mgcaffe's --threads (default `adaptive`: steadier on a busy node)")
    parser.add_argument("--caffe-coretype", default=None,
                        help="OPENBLAS_CORETYPE for Caffe (default: numpy's OpenBLAS's)")
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--conditions", default="idle,loaded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-gradient", action="store_true",
                        help="every engine computes the data input's gradient on the nets "
                             "with a loss (force_backward: true; default: the backward of "
                             "training, without it)")
    parser.add_argument("--torch-profile", default=None, metavar="NET",
                        help="print PyTorch's per-op profile of one net (torch.profiler) "
                             "and exit")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply each net's iterations (at least 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--out", default=None, help="where the prototxt files go")
    parser.add_argument("--json", default=None,
                        help="also write the raw results here (after every round)")
    parser.add_argument("--report-from", default=None, metavar="RESULTS.json",
                        help="print the report of a saved --json file and exit")
    parser.add_argument("--torch-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        torch_worker(args.torch_worker, args.iterations)
        return 0
    if args.torch_profile:
        if args.torch_profile not in NETS:
            parser.error(f"unknown net {args.torch_profile}; choose from {', '.join(NETS)}")
        out_dir = Path(args.out or tempfile.mkdtemp(prefix="bench_vs_caffe_"))
        out_dir.mkdir(parents=True, exist_ok=True)
        path = generate(args.torch_profile, out_dir, args.data_gradient)
        torch_worker(str(path), max(1, round(NETS[args.torch_profile][2] * args.scale)),
                     profile=True)
        return 0
    if args.report_from:
        saved = json.loads(Path(args.report_from).read_text())
        report(saved["results"], saved["nets"], saved["engines"], saved["conditions"],
               saved["rounds"], saved["flops"], saved["matmul_gflops"], saved["setups"],
               saved.get("gemm_layers"))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    nets = [n for n in args.nets.split(",") if n]
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        parser.error(f"unknown net(s) {unknown}; choose from {', '.join(NETS)}")
    engines = [e for e in args.engines.split(",") if e]
    setups = {}
    if "caffe" in engines and not (args.caffe and os.access(args.caffe, os.X_OK)):
        print("no Caffe binary given or on PATH: its column is skipped")
        engines.remove("caffe")
    if "torch" in engines:
        try:
            import torch  # noqa: F401, PLC0415
        except ImportError:
            print("torch does not import: its column is skipped")
            engines.remove("torch")
    args.caffe_coretype = args.caffe_coretype or numpy_coretype()
    if "caffe" in engines:
        setups["caffe"] = describe_caffe(args.caffe, args.caffe_coretype)
    conditions = [c for c in args.conditions.split(",") if c]
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="bench_vs_caffe_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {n: generate(n, out_dir, args.data_gradient) for n in nets}
    counted = {n: conv_ip_flops(files[n]) for n in nets}
    flops = {n: f for n, (f, _) in counted.items()}
    gemm_layers = {n: names for n, (_, names) in counted.items()}
    # Measured before every idle round too, the best kept: one measurement on a shared
    # machine once read 210 GFLOP/s where the others read 377-380, and every "of the
    # matmul rate" ratio would have been inflated 1.8x.
    rate = matmul_rate()
    cores = len(os.sched_getaffinity(0))
    results = {n: {c: {e: [] for e in engines} for c in conditions} for n in nets}
    print(f"nets in {out_dir}; {len(engines)} engines, {args.rounds} rounds, conditions "
          f"{conditions} (loaded: {cores} busy processes)", flush=True)
    for r in range(args.rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for cond in conditions:
            if cond == "idle":
                rate = max(rate, matmul_rate())
            with BusyLoad(cores if cond == "loaded" else 0):
                for name in nets:
                    iterations = max(1, round(NETS[name][2] * args.scale))
                    for engine in order:
                        res = run_engine(engine, files[name], iterations, args)
                        if "setup" in res:
                            setups.setdefault(engine, res["setup"])
                        results[name][cond][engine].append(res)
                        print(f"round {r + 1} {cond:6s} {name:13s} {engine:7s} "
                              f"{fmt(res.get('ms'))} ms  rss {res.get('rss_mb', 0):.0f} MB"
                              f"{'  ' + res['error'] if 'error' in res else ''}", flush=True)
            if args.json:  # a run cut short keeps its finished rounds
                Path(args.json).write_text(json.dumps(
                    {"results": results, "setups": setups, "matmul_gflops": rate,
                     "flops": flops, "gemm_layers": gemm_layers, "nets": nets,
                     "engines": engines,
                     "conditions": conditions, "rounds": r + 1}, indent=1))
    report(results, nets, engines, conditions, args.rounds, flops, rate, setups, gemm_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())

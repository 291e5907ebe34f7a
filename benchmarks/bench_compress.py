"""What gradient compression (`--compress`, issue 44) costs in accuracy and in casts.

    .venv/bin/python benchmarks/bench_compress.py [--parts digits cifar alexnet casts mpi]
        [--digits-iters 500] [--cifar-iters 60]

- digits: the digits net of `make demo` (models/digits), trained in full on 2 MPI ranks with
  float32 and with each compressed format: the final test accuracy of each (target: float16
  within 0.5 points of float32).
- cifar: CIFAR-10 quick's net (models/cifar10_quick) on the digits data (no CIFAR-10 here),
  batch 32 per rank, 2 ranks, a short run: the last training loss (mean of 20 iterations)
  of each format (target: within 2% of float32's).
- alexnet: one AlexNet-size gradient (models/alexnet/deploy.prototxt, random inputs and
  random top diffs, batch 2 per "rank", two ranks' backward passes in this process)
  averaged as the ranks do: float32, and divided, cast, summed in float32 and rounded as a
  compressed all-reduce does; the relative error ||g_f - g_32|| / ||g_32|| of the whole
  gradient and the worst layer's.
- casts: what casting a float32 gradient to each format and back (with the overflow check,
  and with a 2-rank host sum) costs per MB on this CPU (`wire.cast_cost`, best of 5 over 8
  MB), through the compiled loops and through the numpy functions, numpy's own
  float32->float16 conversion beside them.
- mpi: 2 ranks (on this machine's shared memory, or `--rate R`: 2 namespace hosts linked at
  R), per gradient size: float32's all-reduce, float16 payloads summed by MPI's
  MPI_FLOAT16_T all-reduce and by all-to-all + host sum + all-gather
  (`MpiCommunicator(half_sum=...)`), and bfloat16 (the latter way); median of 7.

A benchmark, not a test: run it alone (the cast and MPI numbers are timings).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mgcaffe.comm.backends.launcher import local_mpiexec as mpiexec  # noqa: E402
from mgcaffe.comm.backends.wire import (  # noqa: E402
    bf16_bits,
    cast_cost,
    from_wire,
    sum_payloads,
    to_wire,
)

FORMATS = ("none", "fp16", "bf16")
WIRE = {"fp16": "float16", "bf16": "bfloat16"}
ACCURACY = re.compile(r"Test net output #\d+: accuracy = ([\d.]+)")
LOSS = re.compile(r"Iteration \d+.*, loss = ([\d.eE+-]+)")


def train(solver: Path, compress: str, ranks: int = 2, timeout: float = 900.0) -> str:
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mgcaffe", "train", "--solver",
           str(solver), "--compress", compress]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"training with --compress={compress}: exit status {proc.returncode}")
    return proc.stdout + proc.stderr


def digits(tmp: Path, iters: int) -> dict:
    data = tmp / "digits"
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_digits.py"), "--out",
                    str(data)], check=True, capture_output=True, timeout=300)
    net = (REPO / "models" / "digits" / "train_test.prototxt").read_text().replace(
        "data/digits/", f"{data}/")
    (tmp / "digits.prototxt").write_text(net)
    solver = (REPO / "models" / "digits" / "solver.prototxt").read_text()
    solver = solver.replace('"models/digits/train_test.prototxt"', f'"{tmp}/digits.prototxt"')
    solver = re.sub(r"max_iter: \d+", f"max_iter: {iters}", solver)
    solver = solver.replace('snapshot_prefix: "demo-output/digits"',
                            f'snapshot_prefix: "{tmp}/digits"')
    path = tmp / "digits_solver.prototxt"
    path.write_text(solver + "\nsnapshot_after_train: false\n")
    out = {}
    for fmt in FORMATS:
        log = train(path, fmt)
        out[fmt] = float(ACCURACY.findall(log)[-1])
        print(f"  digits --compress={fmt}: test accuracy {100 * out[fmt]:.2f}%", flush=True)
    return out


def cifar(tmp: Path, iters: int, lr: float = 0.001) -> dict:
    """CIFAR-10 quick's net (its layers after the data layers) on the digits data: no
    CIFAR-10 here, and random inputs teach nothing to compare (constant labels drive every
    format's loss to 0, random ones keep it at ln 10); the 8x8 digits pass its three
    poolings down to 1x1."""
    data = tmp / "digits"
    if not data.exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "convert_digits.py"), "--out",
                        str(data)], check=True, capture_output=True, timeout=300)
    digits_net = (REPO / "models" / "digits" / "train_test.prototxt").read_text()
    quick = (REPO / "models" / "cifar10_quick" / "cifar10_quick_train_test.prototxt").read_text()
    head = digits_net[:_nth_layer(digits_net, 2)].replace("data/digits/", f"{data}/")
    # CIFAR-10 quick's first filters (std 1e-4) expect pixels in 0..255, unscaled
    head = head.replace("batch_size: 64", "batch_size: 32").replace(
        "transform_param { scale: 0.00390625 }", "")
    net_path = tmp / "cifar_quick_digits.prototxt"
    net_path.write_text(head + quick[_nth_layer(quick, 2):])
    path = tmp / "cifar_solver.prototxt"
    path.write_text(f'net: "{net_path}"\nbase_lr: {lr:g}\nmomentum: 0.9\nweight_decay: 0.004\n'
                    f'lr_policy: "fixed"\ndisplay: 20\naverage_loss: 20\nmax_iter: {iters}\n'
                    f'random_seed: 5\ntype: "SGD"\nsnapshot_after_train: false\n'
                    f'snapshot_prefix: "{tmp}/cifar"\n')
    out = {}
    for fmt in FORMATS:
        log = train(path, fmt)
        out[fmt] = float(LOSS.findall(log)[-1])
        print(f"  cifar10 quick's net --compress={fmt}: final loss {out[fmt]:.5f} (mean of "
              f"the last 20 iterations)", flush=True)
    return out


def _nth_layer(text: str, n: int) -> int:
    """Where the n-th (0-based) top-level `layer {` of a prototxt begins."""
    return [m.start() for m in re.finditer(r"^layer \{", text, re.M)][n]


def alexnet(tmp: Path) -> dict:
    from mgcaffe import TRAIN, Net  # noqa: PLC0415 - the engine, only for this part

    # a deploy net has no loss: force_backward makes backward run from the top diff given
    deploy = (REPO / "models" / "alexnet" / "deploy.prototxt").read_text()
    path = tmp / "alexnet.prototxt"
    path.write_text("force_backward: true\n" + deploy)
    net = Net(str(path), TRAIN)
    net.blobs["data"].reshape(2, 3, 227, 227)
    net.reshape()
    rng = np.random.default_rng(3)
    out_name = net.outputs[0]
    grads = []
    for _ in range(2):  # two ranks' gradients: two batches of random inputs and top diffs
        for blobs in net.params.values():
            for b in blobs:
                b.diff[...] = 0
        net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].data.shape)
        net.forward()
        top = rng.standard_normal(net.blobs[out_name].data.shape).astype(np.float32)
        net.backward(**{out_name: top})
        grads.append({name: [np.array(b.diff, np.float32) for b in blobs]
                      for name, blobs in net.params.items()})
    names = list(grads[0])
    ref = {n: [(a + b) / np.float32(2) for a, b in zip(grads[0][n], grads[1][n])]
           for n in names}
    size = sum(x.size for n in names for x in ref[n])
    out = {"parameters": int(size)}
    for fmt in ("float16", "bfloat16"):
        num = den = 0.0
        worst = (0.0, "")
        for n in names:
            for i, (a, b) in enumerate(zip(grads[0][n], grads[1][n])):
                payloads = []
                for g in (a, b):
                    p = np.empty(g.size, np.float16 if fmt == "float16" else np.uint16)
                    to_wire(g.reshape(-1), 2, fmt, p)
                    payloads.append(p)
                mean = np.empty(a.size, np.float32)
                from_wire(sum_payloads(payloads, fmt), fmt, mean)
                err = float(np.linalg.norm(mean - ref[n][i].reshape(-1)))
                norm = float(np.linalg.norm(ref[n][i]))
                num += err ** 2
                den += norm ** 2
                if norm > 0 and err / norm > worst[0]:
                    worst = (err / norm, f"{n}[{i}]")
        out[fmt] = {"relative_error": (num / den) ** 0.5, "worst_blob": worst[1],
                    "worst_relative_error": worst[0]}
        print(f"  AlexNet gradient ({size / 1e6:.1f}M parameters) {fmt}: relative error "
              f"{out[fmt]['relative_error']:.2e} (worst blob {worst[1]}: {worst[0]:.2e})",
              flush=True)
    return out


def casts() -> dict:
    """Per MB of float32 gradient: each format's casts with the check, and with a 2-rank
    host sum, through the compiled loops and through the numpy functions (numba hidden),
    side by side."""
    from mgcaffe.comm.backends import wire_loops  # noqa: PLC0415

    out = {}
    compiled = wire_loops.load
    for way, load in (("compiled loops", compiled), ("numpy", lambda: None)):
        wire_loops.load = load
        try:
            for parts, what in ((0, ""), (2, " + 2-rank sum")):
                for f, c in cast_cost(("float16", "bfloat16"), nbytes=8 << 20,
                                      sum_parts=parts).items():
                    out[f"{f}{what} ({way})"] = c * 1e9
        finally:
            wire_loops.load = compiled
    x = np.random.default_rng(0).standard_normal(2 << 20).astype(np.float32)
    best = min(_timed(lambda: x.astype(np.float16)) for _ in range(5))
    out["numpy astype float16 (one way)"] = best / x.nbytes * 1e9
    for k, v in out.items():
        print(f"  casts {k}: {v:.3g} ms per MB", flush=True)
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def mpi_halves(rate: str | None) -> dict:
    """The worker on 2 ranks: on this machine's shared memory, or (`rate`) on 2 hosts of
    the namespace cluster (tools/netns_cluster.py) linked at that rate."""
    args = ["-n", "2", sys.executable, __file__, "--worker-half"]
    if rate is None:
        proc = subprocess.run([mpiexec(), *args], capture_output=True, text=True,
                              timeout=600, cwd=REPO)
        status, text = proc.returncode, proc.stdout + proc.stderr
    else:
        from bench_netns_train import netns_tool

        with netns_tool().Cluster(2, None if rate == "none" else rate) as cluster:
            status, text = cluster.run(mpiexec(), args[2:], timeout=900)
    lines = [x for x in text.splitlines() if x.startswith("{")]
    if status != 0 or not lines:
        raise SystemExit(f"mpi part: exit status {status}: {text[-2000:]}")
    out = json.loads(lines[-1])
    for size, times in out.items():
        print(f"  2 ranks{f' at {rate}' if rate else ''}: a gradient of {int(size) / 1e6:g} MB "
              f"(median of {REPEATS}): "
              + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items()), flush=True)
    return out


REPEATS = 7


def worker_half() -> None:
    """Times the ways a float32 gradient of each size can be all-reduced: float32; float16
    payloads summed by MPI or by all-to-all + host sum; bfloat16 by all-to-all + host sum (the
    collectives only, no casts)."""
    from mgcaffe.comm.backends.mpi import HALF_SUMS, MpiCommunicator  # noqa: PLC0415

    comms = {h: MpiCommunicator(half_sum=h) for h in HALF_SUMS}
    out = {}
    for nbytes in (1 << 20, 16 << 20, 53_500_000):
        n = nbytes // 4
        # a mean gradient's magnitudes: MPICH's float16 sum is far slower on subnormals
        f32 = (np.random.default_rng(0).standard_normal(n) * 1e-5).astype(np.float32)
        f16 = f32.astype(np.float16)
        bf16 = bf16_bits(f32)
        ways = {"float32": lambda x=f32: comms["mpi"].allreduce_sum(x)}
        for h, comm in comms.items():
            ways[f"float16 half_sum={h}"] = lambda c=comm, p=f16: c.allreduce_wire(p, "float16")
        ways["bfloat16"] = lambda p=bf16: comms["host"].allreduce_wire(p, "bfloat16")
        out[nbytes] = {}
        for name, way in ways.items():
            times = []
            for _ in range(REPEATS):
                comms["mpi"].barrier()
                times.append(_timed(way))
            out[nbytes][name] = float(np.median(times))
    if comms["mpi"].rank == 0:
        print(json.dumps(out), flush=True)


def main() -> int:
    if "--worker-half" in sys.argv:
        worker_half()
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=["casts", "mpi", "alexnet", "digits", "cifar"])
    p.add_argument("--digits-iters", type=int, default=500)
    p.add_argument("--cifar-iters", type=int, default=300)
    p.add_argument("--rate", default=None,
                   help="mpi part: 2 hosts of the namespace cluster linked at this rate (tc "
                        "units, 'none': unshaped; needs root) instead of shared memory")
    p.add_argument("--out", default=None, help="also write the results as JSON")
    a = p.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for part in a.parts:
            print(f"{part}:", flush=True)
            if part == "casts":
                results[part] = casts()
            elif part == "mpi":
                results[part] = mpi_halves(a.rate)
            elif part == "alexnet":
                results[part] = alexnet(tmp)
            elif part == "digits":
                results[part] = r = digits(tmp, a.digits_iters)
                print(f"  float16 against float32: {100 * (r['fp16'] - r['none']):+.2f} "
                      f"points (target within 0.5)", flush=True)
            elif part == "cifar":
                results[part] = r = cifar(tmp, a.cifar_iters)
                print(f"  float16 against float32: {100 * (r['fp16'] / r['none'] - 1):+.2f}% "
                      f"(target within 2%)", flush=True)
            else:
                raise SystemExit(f"--parts: unknown part {part!r}")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`make demo`: the main job on built-in defaults, and what MG-WFBP is for.

1. Convert scikit-learn's bundled handwritten digits into Caffe LMDBs (data/digits/).
2. Train the LeNet-style digits net (models/digits/) on 2 MPI ranks as if they were 2 of a
   32-node 10GbE cluster (`--emulate-network models/paper/network-10gbe.json --emulate-nodes
   32`: every all-reduce lasts at least that cluster's a + b*M by the ring formula, a = 2.8
   ms, several times a layer's backward), where merging pays: in full with `--comm=mgwfbp`
   (the exact optimum of the merge model), then briefly with `--comm=wfbp` and
   `--comm=synceasgd`. Each run profiles its first iterations, plans, re-plans once from a
   profile taken after warm-up, and logs its plan and measured against predicted iteration
   time (measured from the re-plan on).
3. Print a table of the three modes (messages, measured iteration time, the re-plan's
   prediction and the start-up profile's) with the groups MG-WFBP chose, plot the MG-WFBP
   training log to demo-output/training.png and print the final test accuracy.

Run from the repository root (the Makefile does). `--ranks 1` trains in one process;
`--no-emulation` uses the real (shared-memory) all-reduce, where nothing needs merging.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "demo-output"


def run(cmd: list[str], log_path: Path | None = None) -> None:
    """Run a command from the repo root, echoing its output (and teeing it to log_path)."""
    print("+", " ".join(cmd), flush=True)
    if log_path is None:
        subprocess.run(cmd, cwd=ROOT, check=True)
        return
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        if proc.wait() != 0:
            raise SystemExit(f"demo: {cmd[0]} failed with exit status {proc.returncode}; "
                             f"log in {log_path}")


SUMMARY = re.compile(r"measured ([0-9.]+) ms \(median of (\d+)\), predicted ([0-9.]+) ms by "
                     r"plan ([\w-]+)")
PLAN = re.compile(r"plan ([\w-]+) \(\w+\): (\d+) all-reduce\(s\) for (\d+) learnable layers")
REPLAN = re.compile(r"Re-planned at iteration (\d+): predicted iteration ([0-9.]+) ms \(the "
                    r"start-up profile predicted ([0-9.]+) ms\)")
GROUP = re.compile(r"^\s+group \d+: ([0-9.]+) MB\s+(.*)$", re.M)


def summarise(mode: str, log_path: Path) -> dict:
    """Messages, groups, measured and predicted iteration time from one training log."""
    text = log_path.read_text()
    plans = list(PLAN.finditer(text))
    summary = SUMMARY.search(text)
    if not plans or not summary:
        raise SystemExit(f"demo: no plan or no timing summary in {log_path}")
    last = plans[-1]
    groups = [g.group(2) for g in GROUP.finditer(text, last.end())][:int(last.group(2))]
    replan = REPLAN.search(text)
    return {"mode": mode, "messages": int(last.group(2)), "groups": groups,
            "measured": float(summary.group(1)), "iterations": int(summary.group(2)),
            "predicted": float(summary.group(3)),
            "startup": float(replan.group(3)) if replan else None}


def table(rows: list[dict]) -> str:
    lines = [f"{'--comm':10} {'messages':>8} {'measured':>10} {'predicted':>10} "
             f"{'meas/pred':>9} {'start-up':>10}  (forward start to reduced gradients, "
             f"median; predicted after warm-up, start-up: from the first iterations)"]
    for r in rows:
        startup = f"{r['startup']:8.2f}ms" if r.get("startup") else f"{'-':>10}"
        lines.append(f"{r['mode']:10} {r['messages']:8d} {r['measured']:8.2f}ms "
                     f"{r['predicted']:8.2f}ms {r['measured'] / r['predicted']:9.2f} "
                     f"{startup}")
    mg = next((r for r in rows if r["mode"] == "mgwfbp"), None)
    if mg is not None:
        lines.append("MG-WFBP's groups (output side first): " +
                     " | ".join(g.replace(", ", "+") for g in mg["groups"]))
        for base in ("wfbp", "synceasgd"):
            other = next((r for r in rows if r["mode"] == base), None)
            if other is not None:
                measured = other["measured"] / mg["measured"]
                predicted = other["predicted"] / mg["predicted"]
                lines.append(f"MG-WFBP over {base}: measured {measured:.2f}x, predicted "
                             f"{predicted:.2f}x")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="MPI ranks (default 2)")
    parser.add_argument("--short-iters", type=int, default=150,
                        help="iterations of the wfbp and synceasgd runs (default 120)")
    parser.add_argument("--no-emulation", action="store_true",
                        help="the real all-reduce instead of an emulated 32-node 10GbE cluster")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    python = sys.executable
    run([python, "tools/convert_digits.py", "--out", "data/digits"])

    base = [python, "-m", "mgcaffe", "train", "--solver", "models/digits/solver.prototxt"]
    if args.ranks > 1:
        mpiexec = Path(python).with_name("mpiexec")
        base = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(args.ranks), *base]
    if not args.no_emulation:
        base += ["--emulate-network", "models/paper/network-10gbe.json",
                 "--emulate-nodes", "32"]
    rows = []
    # MG-WFBP trains in full first (plot, accuracy), the other two modes briefly. Each run
    # predicts from its own profile taken after warm-up (the re-plan), in the same
    # conditions as the iterations it is measured on.
    for mode in ("mgwfbp", "wfbp", "synceasgd"):
        cmd = base + [f"--comm={mode}"]
        if mode == "mgwfbp":
            cmd += ["--save-plan", str(OUT / "plan-mgwfbp.json")]
        else:
            cmd += ["--iterations", str(args.short_iters)]
        log_path = OUT / ("train.log" if mode == "mgwfbp" else f"train-{mode}.log")
        run(cmd, log_path)
        if args.ranks > 1:
            rows.append(summarise(mode, log_path))
    rows.sort(key=lambda r: ("wfbp", "synceasgd", "mgwfbp").index(r["mode"]))

    log_path = OUT / "train.log"
    plot = OUT / "training.png"
    run([python, "tools/plot_training_log.py", str(log_path), "-o", str(plot)])
    accuracies = re.findall(r"Test net output #\d+: accuracy = ([0-9.]+)", log_path.read_text())
    if not accuracies:
        raise SystemExit(f"demo: no test accuracy in {log_path}")
    if rows:
        where = ("real all-reduce" if args.no_emulation
                 else "emulated 32-node 10GbE cluster (models/paper/network-10gbe.json, "
                      "ring formula)")
        print(f"\n{args.ranks} ranks, {where}:\n{table(rows)}")
    print(f"\nFinal test accuracy (mgwfbp): {float(accuracies[-1]):.4f} "
          f"(log: {log_path.relative_to(ROOT)}, plot: {plot.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

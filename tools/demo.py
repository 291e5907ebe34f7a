"""`make demo`: the main job on built-in defaults, and what MG-WFBP is for.

1. Convert scikit-learn's bundled handwritten digits into Caffe LMDBs (data/digits/).
2. Train the LeNet-style digits net (models/digits/) on 2 MPI ranks as if they were 2 of a
   32-node 10GbE cluster (`--emulate-network models/paper/network-10gbe.json --emulate-nodes
   32`: every all-reduce lasts at least that cluster's a + b*M by the ring formula, a = 2.8
   ms, several times a layer's backward), where merging pays: in full with `--comm=mgwfbp`
   (the exact optimum of the merge model), which measures the profile, then briefly with
   `--comm=wfbp` and `--comm=synceasgd` planned from that same profile. Each run logs its
   plan and measured against predicted iteration time.
3. Print a table of the three modes (messages, measured and predicted iteration time) with
   the groups MG-WFBP chose, plot the MG-WFBP training log to demo-output/training.png and
   print the final test accuracy.

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
                     r"plan (\w+)")
PLAN = re.compile(r"plan (\w+) \(\w+\): (\d+) all-reduce\(s\) for (\d+) learnable layers")
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
    return {"mode": mode, "messages": int(last.group(2)), "groups": groups,
            "measured": float(summary.group(1)), "iterations": int(summary.group(2)),
            "predicted": float(summary.group(3))}


def profile_from_plan(plan_path: Path, profile_path: Path) -> None:
    """The profile a saved plan was made from (its per-layer backward spans)."""
    sys.path.insert(0, str(ROOT))
    from mgcaffe.comm.planner import load_plan  # noqa: PLC0415
    from mgcaffe.comm.profile import LayerProfile, Profile  # noqa: PLC0415

    plan = load_plan(plan_path)
    layers = tuple(LayerProfile(n, nb // 4, max(0.0, e - s)) for n, nb, s, e in
                   zip(plan.layers, plan.layer_bytes, plan.backward_start, plan.backward_end))
    Profile(plan.model, None, 4, plan.forward_time, layers).save(profile_path)


def table(rows: list[dict]) -> str:
    lines = [f"{'--comm':10} {'messages':>8} {'measured':>10} {'predicted':>10} "
             f"{'meas/pred':>9}  (forward start to reduced gradients, median)"]
    for r in rows:
        lines.append(f"{r['mode']:10} {r['messages']:8d} {r['measured']:8.2f}ms "
                     f"{r['predicted']:8.2f}ms {r['measured'] / r['predicted']:9.2f}")
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
    parser.add_argument("--short-iters", type=int, default=120,
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
    plan_path, profile_path = OUT / "plan-mgwfbp.json", OUT / "profile.json"
    # MG-WFBP trains in full first (plot, accuracy) and measures the profile; the other two
    # modes then plan from that same profile, so that the predictions are comparable.
    for mode in ("mgwfbp", "wfbp", "synceasgd"):
        cmd = base + [f"--comm={mode}"]
        if mode == "mgwfbp":
            cmd += ["--save-plan", str(plan_path)]
        else:
            cmd += ["--iterations", str(args.short_iters)]
            if profile_path.exists():
                cmd += ["--profile", str(profile_path)]
        log_path = OUT / ("train.log" if mode == "mgwfbp" else f"train-{mode}.log")
        run(cmd, log_path)
        if mode == "mgwfbp" and plan_path.exists():
            profile_from_plan(plan_path, profile_path)
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

"""`make demo`: the main job on built-in defaults.

1. Convert scikit-learn's bundled handwritten digits into Caffe LMDBs (data/digits/).
2. Train the LeNet-style digits net (models/digits/) on 2 MPI ranks with MG-WFBP
   (`mpiexec -n 2 mgcaffe train --solver models/digits/solver.prototxt --comm=mgwfbp`),
   logging the measured profile, the fitted all-reduce cost, the plan and the measured
   against predicted iteration time.
3. Plot the training log to demo-output/training.png and print the final test accuracy.

Run from the repository root (the Makefile does). `--ranks 1` trains in one process.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="MPI ranks (default 2)")
    parser.add_argument("--comm", default="mgwfbp",
                        help="wfbp | synceasgd | mgwfbp | threshold (default mgwfbp)")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    python = sys.executable
    run([python, "tools/convert_digits.py", "--out", "data/digits"])

    train = [python, "-m", "mgcaffe", "train", "--solver", "models/digits/solver.prototxt"]
    if args.ranks > 1:
        mpiexec = Path(python).with_name("mpiexec")
        train = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(args.ranks),
                 *train, f"--comm={args.comm}"]
    log_path = OUT / "train.log"
    run(train, log_path)

    plot = OUT / "training.png"
    run([python, "tools/plot_training_log.py", str(log_path), "-o", str(plot)])
    accuracies = re.findall(r"Test net output #\d+: accuracy = ([0-9.]+)", log_path.read_text())
    if not accuracies:
        raise SystemExit(f"demo: no test accuracy in {log_path}")
    print(f"\nFinal test accuracy: {float(accuracies[-1]):.4f} "
          f"(log: {log_path.relative_to(ROOT)}, plot: {plot.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

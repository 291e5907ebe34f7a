"""Plot a Caffe or mgcaffe training log: loss, test outputs and learning rate vs iterations.

    python tools/plot_training_log.py train.log [-o train.png] [--title TEXT]

Reads the lines Caffe's own tools/extra/parse_log.py reads (glog heads are ignored):
    Iteration N (... iter/s, ...s/K iters), loss = L      training loss (smoothed)
    Iteration N, loss = L                                 (the final one)
        Train net output #i: name = v (...)
    Iteration N, lr = v
    Iteration N, Testing net (#k)
        Test net output #i: name = v (...)
and writes a PNG of three panels: losses (training and every test output named like a loss),
the other test outputs (accuracy ...), and the learning rate.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|-?inf))"
RE_ITER = re.compile(r"Iteration (\d+)")
RE_LOSS = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = " + NUM)
RE_LR = re.compile(r"Iteration (\d+), lr = " + NUM)
RE_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
RE_TRAIN_OUT = re.compile(r"Train net output #\d+: (\S+) = " + NUM)
RE_TEST_OUT = re.compile(r"Test net output #\d+: (\S+) = " + NUM)


@dataclass
class TrainingLog:
    """Series of (iteration, value) pairs found in a log."""

    train_loss: list[tuple[int, float]] = field(default_factory=list)
    train_outputs: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    test_outputs: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    lr: list[tuple[int, float]] = field(default_factory=list)


def parse_log(text: str) -> TrainingLog:
    """Collect the series of a Caffe-format log (the text of the whole file)."""
    out = TrainingLog()
    it, test_net = 0, 0
    for line in text.splitlines():
        if m := RE_TESTING.search(line):
            it, test_net = int(m.group(1)), int(m.group(2))
        elif m := RE_LR.search(line):
            out.lr.append((int(m.group(1)), float(m.group(2))))
        elif m := RE_LOSS.search(line):
            out.train_loss.append((int(m.group(1)), float(m.group(2))))
        elif m := RE_TRAIN_OUT.search(line):
            out.train_outputs.setdefault(m.group(1), []).append((it, float(m.group(2))))
        elif m := RE_TEST_OUT.search(line):
            # Several test nets: the outputs of net #k > 0 are told apart by a suffix.
            name = m.group(1) + (f" (test net #{test_net})" if test_net else "")
            out.test_outputs.setdefault(name, []).append((it, float(m.group(2))))
        if m := RE_ITER.search(line):
            it = int(m.group(1))
    return out


def plot(log: TrainingLog, path, title: str | None = None) -> None:
    """Write the three-panel PNG of `log` to `path`."""
    import matplotlib  # noqa: PLC0415 - only plotting needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (ax_loss, ax_test, ax_lr) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    _series(ax_loss, {"train loss": log.train_loss,
                      **{f"test {k}": v for k, v in log.test_outputs.items() if "loss" in k}},
            "loss")
    _series(ax_test, {f"test {k}": v for k, v in log.test_outputs.items() if "loss" not in k},
            "test output")
    _series(ax_lr, {"learning rate": log.lr}, "learning rate")
    ax_lr.set_xlabel("iteration")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _series(ax, series: dict, ylabel: str) -> None:
    drawn = False
    for label, points in series.items():
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="." if len(points) < 50 else None, label=label)
            drawn = True
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data in the log", ha="center", va="center",
                transform=ax.transAxes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="a Caffe or mgcaffe training log")
    parser.add_argument("-o", "--output", help="the PNG to write (default: LOG with .png)")
    parser.add_argument("--title", help="figure title (default: the log's file name)")
    args = parser.parse_args(argv)
    try:
        text = Path(args.log).read_text(errors="replace")
    except OSError as exc:
        print(f"plot_training_log: error: {args.log}: {exc.strerror}", file=sys.stderr)
        return 1
    log = parse_log(text)
    if not (log.train_loss or log.test_outputs or log.lr):
        print(f"plot_training_log: error: {args.log}: no training lines found (expected "
              "Caffe's 'Iteration N ..., loss = L' lines)", file=sys.stderr)
        return 1
    output = args.output or str(Path(args.log).with_suffix(".png"))
    plot(log, output, args.title or Path(args.log).name)
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

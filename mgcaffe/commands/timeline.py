"""`mgcaffe timeline`: draw a `--timeline` trace as the paper's Figures 2-4.

    mgcaffe timeline trace.json --out timeline.png [--iteration I] [--count K]

One compute row and one communication row per rank, bars named after their layers; by
default a typical iteration of the final plan (the median one among those that all-reduced
the plan's groups), not the last (end-of-run work) nor the first (profiling). The log gives
each rank's measured iteration (median over the traced iterations after the first) beside
the plan's prediction stored in the trace, and which iteration was drawn.
"""

from __future__ import annotations

import logging
import statistics

from ..comm.runtime.timeline_plot import plot_timeline, scheme_of, typical_iteration
from ..comm.runtime.trace import iteration_times, load_trace
from ..errors import CommError

NAME = "timeline"
HELP = "draw a --timeline trace: a compute and a communication row per rank"

log = logging.getLogger("mgcaffe.comm")


def add_arguments(parser) -> None:
    parser.add_argument("trace", help="trace JSON written by `mgcaffe train --timeline`")
    parser.add_argument("--out", default="timeline.png", help="image to write (png, svg, pdf)")
    parser.add_argument("--iteration", type=int, default=None,
                        help="first solver iteration to draw (default: a typical iteration "
                             "of the final plan, the median one)")
    parser.add_argument("--count", type=int, default=1, help="iterations to draw (default 1)")


def measured_vs_predicted(doc: dict) -> list[str]:
    """One line per rank: the median traced iteration beside the plan's prediction."""

    predicted = doc.get("metadata", {}).get("predicted_iteration_s")
    ranks = sorted({e["pid"] for e in doc["traceEvents"] if e.get("cat") == "iteration"})
    lines = []
    for rank in ranks:
        times = iteration_times(doc, rank, skip=1) or iteration_times(doc, rank)
        med = statistics.median(times)
        line = f"rank {rank}: iteration {med * 1e3:.2f} ms (median of {len(times)})"
        if predicted:
            line += (f", predicted {predicted * 1e3:.2f} ms "
                     f"({(med / predicted - 1) * 100:+.1f}%, update included in the measure)")
        lines.append(line)
    return lines


def run(args) -> int:

    if args.count < 1:
        raise CommError("--count must be >= 1")
    doc = load_trace(args.trace)
    for line in measured_vs_predicted(doc):
        log.info("%s", line)
    path = plot_timeline(doc, args.out, args.iteration, args.count)
    if args.iteration is None:
        it, why = typical_iteration(doc)
        what = f"iteration {it}" if args.count == 1 else f"iterations {it}..{it + args.count - 1}"
        log.info("Drew %s of %s (%s) to %s", what, scheme_of(doc) or "the trace", why, path)
    else:
        log.info("Drew iteration %d to %s", args.iteration, path)
    return 0

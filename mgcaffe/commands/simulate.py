"""`mgcaffe simulate`: predicted weak scaling of every merge scheme over numbers of nodes.

    mgcaffe simulate --profile models/paper/resnet50-k80.json \\
                     --network models/paper/network-10gbe.json --nodes 4 8 16 32 64 \\
                     [--json | --markdown] [--plot scaling.png] [--gantt 64 gantt.png]

For each N: every scheme's speed-up over one node (N (t_f + t_b) / t_iter) and scaling
efficiency, the speed-ups of MG-WFBP (Algorithm 1) and of the optimal grouping over WFBP and
SyncEASGD, and how far Algorithm 1 is above the optimum. `--plot` draws the scaling curves
(the paper's Figure 9), `--gantt N FILE` the timelines of one iteration at N nodes (its
Figures 2-4). `--markdown` prints the table as docs/reproducing-the-paper.md shows it.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..comm.model import plots
from ..comm.model.simulate import Scaling, weak_scaling
from ..errors import PlanError
from ._plan_inputs import (
    add_input_arguments,
    describe_cost,
    describe_interference,
    describe_profile,
    load_inputs,
)

NAME = "simulate"
HELP = "predict weak-scaling speed-up and efficiency of every merge scheme for several N"

_SHORT = {"wfbp": "WFBP", "synceasgd": "SyncEASGD", "mgwfbp": "MG-WFBP", "optimal": "optimal",
          "threshold": "buckets"}


def _ratio_columns(scaling: Scaling) -> list[tuple[str, str, str]]:
    cols = []
    for f, s in (("mgwfbp", "wfbp"), ("mgwfbp", "synceasgd"), ("optimal", "wfbp"),
                 ("optimal", "synceasgd")):
        if f in scaling.schemes and s in scaling.schemes:
            cols.append((f, s, f"{_SHORT[f]}/{_SHORT[s]}"))
    return cols


def table_rows(scaling: Scaling) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the scaling table: N, a, b, speed-up (efficiency) per scheme, the
    speed-up ratios, and Algorithm 1's excess over the optimum."""
    head = ["N", "a (ms)", "b (ns/B)"]
    for s in scaling.schemes:
        label = _SHORT[s]
        if s == "threshold" and scaling.bucket_bytes is not None:
            label = f"buckets {scaling.bucket_bytes / 2**20:g} MiB"
        head.append(label)
    ratio_cols = _ratio_columns(scaling)
    head += [label for _, _, label in ratio_cols]
    excess = "mgwfbp" in scaling.schemes and "optimal" in scaling.schemes
    if excess:
        head.append("Alg. 1 above optimal")
    rows = []
    for p in scaling.points:
        row = [str(p.nodes), f"{p.cost.a * 1e3:.3f}", f"{p.cost.b * 1e9:.3f}"]
        for s in scaling.schemes:
            sp = p.schemes[s]
            row.append(f"{sp.speedup:.2f} ({100 * sp.efficiency:.1f}%)")
        row += [f"{p.ratio(f, s):.3f}" for f, s, _ in ratio_cols]
        if excess:
            row.append(f"{100 * p.above_optimal('mgwfbp'):.2f}%")
        rows.append(row)
    return head, rows


def format_table(scaling: Scaling) -> str:
    head, rows = table_rows(scaling)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join(h.rjust(w) for h, w in zip(head, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def format_markdown(scaling: Scaling) -> str:
    """The table in Markdown: speed-up over one node (scaling efficiency) per scheme."""
    head, rows = table_rows(scaling)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, many_nodes=True)
    parser.add_argument("--markdown", action="store_true",
                        help="print the table as Markdown (as in docs/reproducing-the-paper.md)")
    parser.add_argument("--plot", metavar="PNG", help="draw speed-up and efficiency against N")
    parser.add_argument("--gantt", nargs=2, metavar=("N", "PNG"),
                        help="draw one iteration's timeline of every scheme at N nodes")


def run(args) -> int:
    profile, network, schemes, bucket = load_inputs(args)
    if args.json and args.markdown:
        raise PlanError("--json and --markdown: choose one")
    gantt_nodes = None
    if args.gantt:
        try:
            gantt_nodes = int(args.gantt[0])
        except ValueError:
            raise PlanError(f"--gantt: N must be an integer, got {args.gantt[0]!r}") from None
        if gantt_nodes < 1:
            raise PlanError(f"--gantt: N must be >= 1, got {gantt_nodes}")
    nodes = list(dict.fromkeys(args.nodes))
    scaling = weak_scaling(profile, network, nodes, schemes, use_formula=args.use_formula,
                           a=args.a, b=args.b, bucket_bytes=bucket)
    if args.json:
        json.dump(scaling.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.markdown:
        print(format_markdown(scaling))
    else:
        print(describe_profile(profile))
        print(f"network: {scaling.network}; speed-up over one node (scaling efficiency); "
              f"X/Y = how many times X is faster than Y")
        for point in scaling.points:
            terms = describe_interference(point.cost)
            if terms:
                print(f"N = {point.nodes}: {terms}")
            if any(not p.exact for p in point.plans.values()):
                print(f"N = {point.nodes}: optimal's search was cut: not proven optimal")
        print()
        print(format_table(scaling))
    if args.plot or args.gantt:

        if args.plot:
            plots.scaling_plot(scaling, args.plot)
        if args.gantt:
            if gantt_nodes in nodes:
                point = scaling.point(gantt_nodes)
            else:
                point = weak_scaling(profile, network, [gantt_nodes], schemes,
                                     use_formula=args.use_formula, a=args.a, b=args.b,
                                     bucket_bytes=bucket).points[0]
            plots.gantt_chart(point.plans, args.gantt[1])
            if not (args.json or args.markdown):
                print(f"\ngantt: {describe_cost(point.cost, network)}")
    return 0

"""`mgcaffe simulate`: predicted weak scaling of every scheme over numbers of nodes.

    mgcaffe simulate --profile models/paper/resnet50-k80.json \\
                     --network models/paper/network-10gbe.json --nodes 4 8 16 32 64 \\
                     [--json | --markdown] [--plot scaling.png] [--gantt 64 gantt.png]

For each N: every registered scheme's speed-up over one node (N (t_f + t_b) / t_iter) and
scaling efficiency, the lower bound's (no schedule of any scheme can be faster under the
model: scheduler.lower_bound), then how many times each merging scheme is faster than each
of the two extremes (wfbp, synceasgd). A scheme's column is named as `--comm` names it; the
lines under the table give the flags that train each one. `--plot` draws the scaling curves
(the paper's Figure 9), `--gantt N FILE` the timelines of one iteration at N nodes (its
Figures 2-4).
`--markdown` prints the table as docs/reproducing-the-paper.md shows it.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..comm.model import plots
from ..comm.model.simulate import Scaling, ratio_pairs, weak_scaling
from ..comm.model.timeline import cycle
from ..errors import PlanError
from ._plan_inputs import (
    add_input_arguments,
    compression,
    describe_compression,
    describe_cost,
    describe_interference,
    describe_profile,
    load_inputs,
    train_table,
)

NAME = "simulate"
HELP = "predict weak-scaling speed-up and efficiency of every scheme for several N"


def table_rows(scaling: Scaling) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the scaling table: N, a, b, the speed-up (efficiency) of each
    scheme, and the lower bound's (the speed-up no schedule can beat under the model)."""
    head = ["N", "a (ms)", "b (ns/B)", *scaling.schemes, "lower bound"]
    rows = []
    for p in scaling.points:
        row = [str(p.nodes), f"{p.cost.a * 1e3:.3f}", f"{p.cost.b * 1e9:.3f}"]
        for s in scaling.schemes:
            sp = p.schemes[s]
            row.append(f"{sp.speedup:.2f} ({100 * sp.efficiency:.1f}%)")
        row.append(f"{p.bound_speedup:.2f} ({100 * p.bound_speedup / p.nodes:.1f}%)")
        rows.append(row)
    return head, rows


def ratio_rows(scaling: Scaling) -> tuple[str, list[str], list[list[str]]]:
    """Caption, header and rows of the comparison table: per N, how many times each merging
    scheme is faster than each of the two extremes (the registry's baselines)."""
    pairs = ratio_pairs(scaling.schemes)
    slower = list(dict.fromkeys(s for _, s in pairs))
    faster = list(dict.fromkeys(f for f, _ in pairs))
    caption = f"how many times faster than {' / '.join(slower)}"
    rows = [[str(p.nodes), *(" / ".join(f"{p.ratio(f, s):.3f}" for s in slower)
                             for f in faster)] for p in scaling.points]
    return caption, ["N", *faster], rows


def _text(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells):
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    top = line(head)
    return [top, "-" * len(top), *map(line, rows)]


def _markdown(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def format_table(scaling: Scaling) -> str:
    """The scaling table, then (when a merging scheme and a baseline are both there) the
    comparison table."""
    out = _text(*table_rows(scaling))
    caption, head, rows = ratio_rows(scaling)
    if len(head) > 1:
        out += ["", f"{caption}:", *_text(head, rows)]
    return "\n".join(out)


def format_markdown(scaling: Scaling) -> str:
    """Both tables in Markdown: speed-up over one node (scaling efficiency) per scheme, and
    how many times each merging scheme is faster than wfbp and synceasgd."""
    out = _markdown(*table_rows(scaling))
    caption, head, rows = ratio_rows(scaling)
    if len(head) > 1:
        out += ["", f"{caption[0].upper()}{caption[1:]}:", "", *_markdown(head, rows)]
    return "\n".join(out)


def layer_cycles(profile, cost, plans) -> dict:
    """The steady-state cycle of each plan that updates layer by layer (for the picture)."""
    index = {name: i + 1 for i, name in enumerate(profile.names)}
    return {s: cycle(profile, cost, [[index[n] for n in g] for g in p.groups], p.schedule)
            for s, p in plans.items() if p.schedule is not None
            and p.schedule.update == "per-layer"}


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
                           a=args.a, b=args.b, bucket_bytes=bucket, model=args.cost_model)
    wires, cast = compression(args)
    packed = None
    if wires:  # the same schemes with compressed messages: the compressed columns
        packed = weak_scaling(profile, network, nodes, schemes, use_formula=args.use_formula,
                              a=args.a, b=args.b, bucket_bytes=bucket, model=args.cost_model,
                              wires=wires, cast=cast)
    if args.json:
        out = scaling.to_dict()
        if packed is not None:
            out["compressed"] = {"compress": args.compress, "wires": list(wires),
                                 "cast": dict(cast), **packed.to_dict()}
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.markdown:
        print(format_markdown(scaling))
        if packed is not None:
            print(f"\nWith --compress={args.compress}:\n")
            print(format_markdown(packed))
    else:
        print(describe_profile(profile))
        print(f"network: {scaling.network}; speed-up over one node (scaling efficiency) of "
              f"each --comm scheme")
        for point in scaling.points:
            terms = describe_interference(point.cost)
            if terms:
                print(f"N = {point.nodes}: {terms}")
            cut = [s for s, p in point.plans.items() if p.schedule is None and not p.exact]
            if cut:
                print(f"N = {point.nodes}: the search of {', '.join(cut)} was cut: not "
                      f"proven optimal")
        print()
        print(format_table(scaling))
        if packed is not None:
            print(f"\nwith --compress={args.compress}: "
                  + describe_compression(wires, cast, args.cast_ns_per_byte is None))
            print(format_table(packed))
            print("formats chosen (messages compressed of all, per scheme, at each N): "
                  + "; ".join(f"N = {p.nodes}: " + ", ".join(
                      f"{s} {sum(pl.wire(g) != 'float32' for g in range(len(pl.groups)))}/"
                      f"{len(pl.groups)}" for s, pl in p.plans.items())
                      for p in packed.points))
        print()
        print("Each scheme trains with:")
        print(train_table(scaling.schemes, scaling.bucket_bytes))
    wrote = []
    if args.plot:
        wrote.append(f"wrote the scaling plot to {plots.scaling_plot(scaling, args.plot)}")
    if args.gantt:
        if gantt_nodes in nodes:
            point = scaling.point(gantt_nodes)
        else:
            point = weak_scaling(profile, network, [gantt_nodes], schemes,
                                 use_formula=args.use_formula, a=args.a, b=args.b,
                                 bucket_bytes=bucket, model=args.cost_model).points[0]
        path = plots.gantt_chart(point.plans, args.gantt[1],
                                 cycles=layer_cycles(profile, point.cost, point.plans))
        wrote.append(f"wrote the timelines at N = {gantt_nodes} to {path} "
                     f"({describe_cost(point.cost, network)})")
    for line in wrote:  # on stderr with --json/--markdown, whose output is the data alone
        print(line, file=sys.stderr if args.json or args.markdown else sys.stdout)
    return 0

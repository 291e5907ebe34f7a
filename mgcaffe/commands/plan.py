"""`mgcaffe plan`: the message groups and predicted iteration time of every scheme.

    mgcaffe plan --profile models/paper/googlenet-k80.json \\
                 --network models/paper/network-10gbe.json --nodes 8 [--scheme mgwfbp wfbp]
                 [--json] [--a A --b B] [--bucket-mb 25] [--use-formula] [--save-plan plan.json]

The table compares every registered scheme, each row named as `mgcaffe train --comm` names it
and ending with the flags that train it (how far each is above the fastest row, too); the
groups of each merging scheme follow. `--json` prints {"model", "nodes", "a", "b", "ideal",
"schemes": {scheme: {"groups", "group_sizes", "iteration_time", "non_overlapped_comm",
"train_flags", ...}}}. `--save-plan` writes the plan of the single scheme asked for (or of
the default, mgwfbp) for `mgcaffe train --plan`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..comm.model.cost import CostModel, Network, cost_for
from ..comm.model.interference_search import grouping_lower_bound
from ..comm.model.plan import Plan
from ..comm.model.profile import Profile
from ..comm.model.schemes import DEFAULT_SCHEME, make_plans
from ..errors import PlanError
from ._plan_inputs import (
    add_input_arguments,
    compression,
    describe_compression,
    describe_cost,
    describe_profile,
    fmt_bytes,
    load_inputs,
    train_flags,
)

NAME = "plan"
HELP = "plan gradient-merging (MG-WFBP) for a profile and network; compare every scheme"


# ----------------------------------------------------------------------------- output
def describe_wire(p: Plan) -> str:
    """'float16 3/5 26.8 MB' (the formats, how many messages compressed, the bytes on the
    wire per iteration); 'float32' for a plan that does not compress."""
    if not p.compressed:
        return "float32"
    kinds = "/".join(sorted({f for f in p.formats if f != "float32"}))
    k = sum(f != "float32" for f in p.formats)
    return f"{kinds} {k}/{len(p.formats)} {p.wire_bytes / 1e6:.3g} MB"


def plans_to_json(profile: Profile, cost: CostModel, plans: dict[str, Plan],
                  plain: dict[str, Plan] | None = None, compress: str = "none") -> dict:
    best = min(p.iteration_time for p in plans.values())
    out = {"model": profile.model, "nodes": cost.nodes, "a": cost.a, "b": cost.b,
           "cost_origin": cost.origin, "ideal": next(iter(plans.values())).ideal,
           "default": DEFAULT_SCHEME, "schemes": {}}
    out["cost_model"] = cost.kind
    if cost.times:
        out["times"] = [[m, t] for m, t in cost.times]
    if cost.interference:
        out["interference"] = [[m, rho] for m, rho in cost.interference]
    if cost.comm_slowdown:
        out["comm_slowdown"] = [[m, sigma] for m, sigma in cost.comm_slowdown]
    if cost.wires:
        out["compress"] = compress
        out["wires"] = list(cost.wires)
        out["cast"] = {w: c for w, c in cost.cast}
    for s, p in plans.items():
        d = {"groups": [list(g) for g in p.groups], "group_sizes": list(p.group_sizes),
             "messages": p.num_messages, "iteration_time": p.iteration_time,
             "non_overlapped_comm": p.non_overlapped_comm,
             "comm_start": list(p.comm_start), "comm_end": list(p.comm_end),
             "digest": p.digest(), "above_best": p.iteration_time / best - 1,
             "train_flags": train_flags(s, p.bucket_bytes, compress),
             "formats": [p.wire(g) for g in range(len(p.groups))],
             "wire_bytes": p.wire_bytes}
        if plain:
            d["float32_iteration_time"] = plain[s].iteration_time
        if cost.nodes is not None:
            d["speedup"] = cost.nodes * p.ideal / p.iteration_time
            d["efficiency"] = p.ideal / p.iteration_time
        if p.bucket_bytes is not None:
            d["bucket_bytes"] = p.bucket_bytes
        if not p.exact:
            d["exact"] = False
        out["schemes"][s] = d
    return out


def format_plans(profile: Profile, cost: CostModel, network: Network | None,
                 plans: dict[str, Plan], plain: dict[str, Plan] | None = None,
                 compress: str = "none", measured: bool = False) -> str:
    """The table (with `plain`, the same schemes' float32 plans: the compressed columns),
    then each scheme's groups."""
    first = next(iter(plans.values()))
    lines = [describe_profile(profile), describe_cost(cost, network)]
    if cost.wires:
        lines.append(f"--compress={compress}: "
                     + describe_compression(cost.wires, cost.cast, measured))
    lines += [f"ideal t_f + t_b = {first.ideal * 1e3:.2f} ms", ""]
    best = min(p.iteration_time for p in plans.values())
    width = max(len("scheme"), *(len(s) for s in plans))
    head = (f"{'scheme':<{width}} {'messages':>8} {'t_iter (ms)':>12} {'not hidden (ms)':>16}"
            f" {'vs best':>8}")
    if cost.nodes is not None:
        head += f" {'speed-up':>9} {'efficiency':>10}"
    wire = {s: describe_wire(p) for s, p in plans.items()}
    wwidth = max(len("wire"), *(len(w) for w in wire.values()))
    if plain:
        head += f" {'float32 (ms)':>12}  {'wire':<{wwidth}}"
    head += "  train with"
    rows = []
    for s, p in plans.items():
        row = (f"{s:<{width}} {p.num_messages:>8} {p.iteration_time * 1e3:>12.3f} "
               f"{p.non_overlapped_comm * 1e3:>16.3f} "
               f"{100 * (p.iteration_time / best - 1):>+7.2f}%")
        if cost.nodes is not None:
            row += (f" {cost.nodes * p.ideal / p.iteration_time:>9.2f} "
                    f"{100 * p.ideal / p.iteration_time:>9.1f}%")
        if plain:
            row += f" {plain[s].iteration_time * 1e3:>12.3f}  {wire[s]:<{wwidth}}"
        row += f"  {train_flags(s, p.bucket_bytes, compress)}"
        if s == DEFAULT_SCHEME:
            row += " (the default)"
        rows.append(row)
    lines += [head, "-" * max(len(r) for r in [head, *rows]), *rows]
    for s, p in plans.items():
        bound = getattr(p.schedule, "bound", None)
        if bound:  # the scheduler's search: how far from the lower bound it computes
            lines.append(f"{s}: {100 * max(0.0, p.iteration_time / bound - 1):.2f}% above the "
                         f"lower bound {bound * 1e3:.3f} ms on any schedule"
                         f"{' (proven optimal)' if p.exact else ''}")
        elif not p.exact:
            bound = grouping_lower_bound(profile, cost)
            lines.append(f"{s}: the search was cut (too many states): "
                         f"{100 * max(0.0, p.iteration_time / bound - 1):.2f}% above the lower "
                         f"bound {bound * 1e3:.3f} ms on any grouping, never slower than wfbp, "
                         f"synceasgd or mgwfbp-paper")
    for s, p in plans.items():
        lines.append("")
        extra = f", buckets of >= {fmt_bytes(p.bucket_bytes)}" if p.bucket_bytes else ""
        if p.num_messages == p.num_layers and p.num_layers > 1:
            lines.append(f"{s}: each of the {p.num_layers} layers is its own message{extra}")
            continue
        lines.append(f"{s}: {p.num_messages} message{'s' if p.num_messages > 1 else ''}"
                     f"{extra} (output side first)")
        for g, (group, (start, end)) in enumerate(zip(p.groups, p.group_spans())):
            span = group[0] if len(group) == 1 else f"{group[0]} .. {group[-1]}"
            lines.append(f"  {g + 1:>3}  {span:<50} {len(group):>4} layer"
                         f"{'s' if len(group) > 1 else ' '} {fmt_bytes(p.group_sizes[g]):>10}"
                         f"  {start * 1e3:9.3f} -> {end * 1e3:9.3f} ms"
                         + (f"  {p.wire(g)}" if cost.wires else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, many_nodes=False)
    parser.add_argument("--save-plan", metavar="PLAN.json",
                        help="write the plan of the one scheme given by --scheme (default: "
                             f"{DEFAULT_SCHEME}) as JSON, for `mgcaffe train --plan`")


def run(args) -> int:
    profile, network, schemes, bucket = load_inputs(args)
    if args.nodes is None and (args.a is None or args.b is None):
        raise PlanError("--nodes: missing (the cost of an all-reduce depends on N)")
    nodes = args.nodes
    if nodes is None:
        cost = CostModel(args.a, args.b, origin="--a/--b")
    else:
        cost = cost_for(network, nodes, args.use_formula, a=args.a, b=args.b,
                        model=args.cost_model)
    wires, cast = compression(args)
    plain = None
    if wires:
        plain = make_plans(profile, cost, schemes, bucket, nodes=nodes)
        cost = dataclasses.replace(cost, wires=wires, cast=cast)
    plans = make_plans(profile, cost, schemes, bucket, nodes=nodes)
    if args.save_plan:
        if len(plans) == 1:
            chosen = next(iter(plans.values()))
        elif DEFAULT_SCHEME in plans:
            chosen = plans[DEFAULT_SCHEME]
        else:
            raise PlanError(f"--save-plan: give one --scheme to save (or include "
                            f"{DEFAULT_SCHEME})")
        try:
            chosen.save(args.save_plan)
        except OSError as exc:
            raise PlanError(f"{args.save_plan}: cannot write: {exc.strerror or exc}") from None
    if args.json:
        json.dump(plans_to_json(profile, cost, plans, plain, args.compress), sys.stdout,
                  indent=1)
        sys.stdout.write("\n")
    else:
        print(format_plans(profile, cost, network, plans, plain, args.compress,
                           args.cast_ns_per_byte is None))
        if args.save_plan:
            print(f"\nsaved the {chosen.scheme} plan to {args.save_plan} "
                  f"(digest {chosen.digest()[:16]}); train it with `mgcaffe train ... "
                  f"--plan {args.save_plan}` on {chosen.nodes or 'N'} ranks")
    return 0

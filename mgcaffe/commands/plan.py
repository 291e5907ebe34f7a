"""`mgcaffe plan`: the message groups and predicted iteration time of every merge scheme.

    mgcaffe plan --profile models/paper/googlenet-k80.json \\
                 --network models/paper/network-10gbe.json --nodes 8 [--scheme mgwfbp optimal]
                 [--json] [--a A --b B] [--bucket-mb 25] [--use-formula] [--save-plan plan.json]

The table compares the schemes (and how far each is above the exact optimum); the groups of
each merging scheme follow. `--json` prints {"model", "nodes", "a", "b", "ideal", "schemes":
{scheme: {"groups", "group_sizes", "iteration_time", "non_overlapped_comm", ...}}}.
`--save-plan` writes the plan of the single scheme asked for (or `optimal`) for the trainer.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..comm.model.cost import CostModel, Network, cost_for
from ..comm.model.planner import Plan, make_plans
from ..comm.model.profile import Profile
from ..errors import PlanError
from ._plan_inputs import (
    add_input_arguments,
    describe_cost,
    describe_profile,
    fmt_bytes,
    load_inputs,
)

NAME = "plan"
HELP = "plan gradient-merging (MG-WFBP) for a profile and network; compare every scheme"


# ----------------------------------------------------------------------------- output
def plans_to_json(profile: Profile, cost: CostModel, plans: dict[str, Plan]) -> dict:
    best = plans["optimal"].iteration_time if "optimal" in plans else None
    out = {"model": profile.model, "nodes": cost.nodes, "a": cost.a, "b": cost.b,
           "cost_origin": cost.origin, "ideal": next(iter(plans.values())).ideal,
           "schemes": {}}
    if cost.interference:
        out["interference"] = [[m, rho] for m, rho in cost.interference]
    if cost.comm_slowdown:
        out["comm_slowdown"] = [[m, sigma] for m, sigma in cost.comm_slowdown]
    for s, p in plans.items():
        d = {"groups": [list(g) for g in p.groups], "group_sizes": list(p.group_sizes),
             "messages": p.num_messages, "iteration_time": p.iteration_time,
             "non_overlapped_comm": p.non_overlapped_comm,
             "comm_start": list(p.comm_start), "comm_end": list(p.comm_end),
             "digest": p.digest()}
        if cost.nodes is not None:
            d["speedup"] = cost.nodes * p.ideal / p.iteration_time
            d["efficiency"] = p.ideal / p.iteration_time
        if best is not None:
            d["above_optimal"] = p.iteration_time / best - 1
        if p.bucket_bytes is not None:
            d["bucket_bytes"] = p.bucket_bytes
        if not p.exact:
            d["exact"] = False
        out["schemes"][s] = d
    return out


def format_plans(profile: Profile, cost: CostModel, network: Network | None,
                 plans: dict[str, Plan]) -> str:
    first = next(iter(plans.values()))
    lines = [describe_profile(profile), describe_cost(cost, network),
             f"ideal t_f + t_b = {first.ideal * 1e3:.2f} ms", ""]
    best = plans["optimal"].iteration_time if "optimal" in plans else None
    head = f"{'scheme':<10} {'messages':>8} {'t_iter (ms)':>12} {'not hidden (ms)':>16}"
    if cost.nodes is not None:
        head += f" {'speed-up':>9} {'efficiency':>10}"
    if best is not None:
        head += f" {'vs optimal':>11}"
    lines += [head, "-" * len(head)]
    for s, p in plans.items():
        row = (f"{s:<10} {p.num_messages:>8} {p.iteration_time * 1e3:>12.3f} "
               f"{p.non_overlapped_comm * 1e3:>16.3f}")
        if cost.nodes is not None:
            row += (f" {cost.nodes * p.ideal / p.iteration_time:>9.2f} "
                    f"{100 * p.ideal / p.iteration_time:>9.1f}%")
        if best is not None:
            row += f" {100 * (p.iteration_time / best - 1):>+10.2f}%"
        lines.append(row)
    for s, p in plans.items():
        if not p.exact:
            lines.append(f"{s}: the search was cut (too many states): not proven optimal, "
                         f"never slower than wfbp, synceasgd or mgwfbp")
    for s, p in plans.items():
        lines.append("")
        extra = f", buckets of >= {fmt_bytes(p.bucket_bytes)}" if p.bucket_bytes else ""
        if p.num_messages == p.num_layers and p.num_layers > 1:
            lines.append(f"{s}: each of the {p.num_layers} layers is its own message{extra}")
            continue
        lines.append(f"{s}: {p.num_messages} message{'s' if p.num_messages > 1 else ''}"
                     f"{extra} (output side first)")
        for g, group in enumerate(p.groups):
            span = group[0] if len(group) == 1 else f"{group[0]} .. {group[-1]}"
            lines.append(f"  {g + 1:>3}  {span:<50} {len(group):>4} layer"
                         f"{'s' if len(group) > 1 else ' '} {fmt_bytes(p.group_sizes[g]):>10}"
                         f"  {p.comm_start[g] * 1e3:9.3f} -> {p.comm_end[g] * 1e3:9.3f} ms")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, many_nodes=False)
    parser.add_argument("--save-plan", metavar="PLAN.json",
                        help="write the plan of the one scheme given by --scheme (default: "
                             "optimal) as JSON, for training")


def run(args) -> int:
    profile, network, schemes, bucket = load_inputs(args)
    if args.nodes is None and (args.a is None or args.b is None):
        raise PlanError("--nodes: missing (the cost of an all-reduce depends on N)")
    nodes = args.nodes
    if nodes is None:
        cost = CostModel(args.a, args.b, origin="--a/--b")
    else:
        cost = cost_for(network, nodes, args.use_formula, a=args.a, b=args.b)
    plans = make_plans(profile, cost, schemes, bucket, nodes=nodes)
    if args.save_plan:
        if len(plans) == 1:
            chosen = next(iter(plans.values()))
        elif "optimal" in plans:
            chosen = plans["optimal"]
        else:
            raise PlanError("--save-plan: give one --scheme to save (or include optimal)")
        try:
            chosen.save(args.save_plan)
        except OSError as exc:
            raise PlanError(f"{args.save_plan}: cannot write: {exc.strerror or exc}") from None
    if args.json:
        json.dump(plans_to_json(profile, cost, plans), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_plans(profile, cost, network, plans))
        if args.save_plan:
            print(f"\nsaved the {chosen.scheme} plan to {args.save_plan} "
                  f"(digest {chosen.digest()[:16]})")
    return 0

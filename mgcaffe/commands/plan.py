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

from ..comm.model.cost import CostModel, Network, cost_for, load_network
from ..comm.model.planner import SCHEMES, Plan, canonical_scheme, make_plans
from ..comm.model.profile import Profile, load_profile
from ..errors import PlanError

NAME = "plan"
HELP = "plan gradient-merging (MG-WFBP) for a profile and network; compare every scheme"


# ----------------------------------------------------------------------------- shared options
def add_input_arguments(parser: argparse.ArgumentParser, *, many_nodes: bool) -> None:
    """--profile, --network, --nodes, --scheme, --a/--b, --bucket-mb, --use-formula, --json
    (shared with `mgcaffe simulate`)."""
    parser.add_argument("--profile", required=True, metavar="PROFILE.json",
                        help="per-layer profile (params, backward_time; see docs/planner.md)")
    parser.add_argument("--network", metavar="NETWORK.json",
                        help="all-reduce costs: alpha/beta/gamma + algorithm, and/or per-N fits")
    if many_nodes:
        parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32, 64],
                            metavar="N", help="numbers of nodes (default: 4 8 16 32 64)")
    else:
        parser.add_argument("--nodes", type=int, metavar="N",
                            help="number of nodes (required unless both --a and --b are given)")
    parser.add_argument("--scheme", nargs="+", default=list(SCHEMES), metavar="SCHEME",
                        help=f"schemes to compare (default: all of {', '.join(SCHEMES)})")
    parser.add_argument("--a", type=float, default=None, metavar="SECONDS",
                        help="all-reduce start-up a, overriding the network's")
    parser.add_argument("--b", type=float, default=None, metavar="SECONDS_PER_BYTE",
                        help="all-reduce per-byte cost b, overriding the network's")
    parser.add_argument("--bucket-mb", type=float, default=25.0, metavar="MIB",
                        help="bucket size of the `threshold` scheme in MiB (default 25, as "
                             "PyTorch DDP)")
    parser.add_argument("--use-formula", action="store_true",
                        help="use the algorithm's formula even for N the network has fits for")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_inputs(args) -> tuple[Profile, Network | None, list[str], int]:
    """(profile, network or None, schemes, bucket bytes) from the shared options."""
    profile = load_profile(args.profile)
    if not profile.forward_time + profile.backward_time > 0:
        # Speed-up and efficiency are ratios to the compute time: a zero one divides by 0.
        raise PlanError(f"{args.profile}: forward_time and every backward_time are 0; a "
                        "profile needs measured compute times (mgcaffe time --profile-out)")
    network = load_network(args.network) if args.network else None
    if network is None and (args.a is None or args.b is None):
        raise PlanError("--network: missing (or give both --a and --b)")
    schemes = list(dict.fromkeys(canonical_scheme(s) for s in args.scheme))
    if args.bucket_mb is None or not args.bucket_mb >= 0:
        raise PlanError(f"--bucket-mb: must be >= 0, got {args.bucket_mb}")
    return profile, network, schemes, int(round(args.bucket_mb * 2**20))


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def describe_profile(profile: Profile) -> str:
    size = fmt_bytes(profile.total_params * profile.dtype_bytes)
    return (f"{profile.model}: {profile.num_layers} learnable layers, "
            f"{profile.total_params} parameters ({size}), "
            f"t_f = {profile.forward_time * 1e3:.2f} ms, "
            f"t_b = {profile.backward_time * 1e3:.2f} ms")


def describe_cost(cost: CostModel, network: Network | None) -> str:
    where = f"; {network.source}" if network is not None else ""
    nodes = f"N = {cost.nodes}: " if cost.nodes is not None else ""
    interference = describe_interference(cost)
    return (f"{nodes}a = {cost.a * 1e6:.2f} us, b = {cost.b * 1e9:.4f} ns/B "
            f"({cost.origin or 'given'}{where}){'; ' if interference else ''}{interference}")


def describe_interference(cost: CostModel) -> str:
    """The extended model's terms, '' without any: rho (backward slowed during an
    all-reduce) and sigma (an all-reduce slowed while backward runs)."""
    def points(pts, fmt):
        if len(pts) == 1:  # one point: every size
            return f"every size {fmt(pts[0][1])}"
        return ", ".join(f"{fmt_bytes(m)} {fmt(v)}" for m, v in pts)

    parts = []
    if cost.interference:
        parts.append("backward slowed during an all-reduce: "
                     + points(cost.interference, lambda rho: f"+{rho * 100:.0f}%"))
    if cost.comm_slowdown:
        parts.append("all-reduces slowed while backward runs: "
                     + points(cost.comm_slowdown, lambda sigma: f"x{sigma:.2f}"))
    return "; ".join(parts)


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

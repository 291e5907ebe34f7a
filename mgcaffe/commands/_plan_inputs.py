"""What `mgcaffe plan` and `mgcaffe simulate` share: their input flags (profile, network,
nodes, schemes) and the lines that describe those inputs."""

from __future__ import annotations

import argparse

from ..comm.backends.wire import cast_cost
from ..comm.model.cost import (
    COMPRESS,
    COST_MODELS,
    DEFAULT_COST_MODEL,
    CostModel,
    Network,
    compress_wires,
    load_network,
)
from ..comm.model.profile import Profile, load_profile
from ..comm.model.schemes import DEFAULT_SCHEME, SCHEMES, canonical_scheme, scheme_named
from ..errors import PlanError


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
                        help=f"schemes to compare, named as `mgcaffe train --comm` names them "
                             f"(default: all of {', '.join(SCHEMES)})")
    parser.add_argument("--a", type=float, default=None, metavar="SECONDS",
                        help="all-reduce start-up a, overriding the network's")
    parser.add_argument("--b", type=float, default=None, metavar="SECONDS_PER_BYTE",
                        help="all-reduce per-byte cost b, overriding the network's")
    parser.add_argument("--bucket-mb", type=float, default=25.0, metavar="MIB",
                        help="bucket size of the `threshold` scheme in MiB (default 25, as "
                             "PyTorch DDP's bucket_cap_mb)")
    parser.add_argument("--cost-model", choices=COST_MODELS, default=DEFAULT_COST_MODEL,
                        help="T(M): piecewise (the network's measured times where it has "
                             "them, else its line) or paper (the line a + b*M only, as the "
                             f"paper; default {DEFAULT_COST_MODEL})")
    parser.add_argument("--use-formula", action="store_true",
                        help="use the algorithm's formula even for N the network has fits for")
    parser.add_argument("--compress", default="none", metavar="|".join(COMPRESS),
                        help="the gradients' format on the wire, as `mgcaffe train "
                             "--compress`: fp16/bf16 price every message in that format, "
                             "auto lets the planner choose per message (default none)")
    parser.add_argument("--cast-ns-per-byte", type=float, default=None, metavar="NS",
                        help="what casting to the wire format and back costs per float32 "
                             "byte (default: measured on this CPU, with the sum of the 16-bit "
                             "payloads a CPU rank does itself)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def compression(args) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """(wire formats offered, cast seconds per byte per format) of --compress and
    --cast-ns-per-byte; () for none."""
    wires = compress_wires(args.compress)
    if not wires:
        return (), ()
    if args.cast_ns_per_byte is not None:
        if not args.cast_ns_per_byte >= 0:
            raise PlanError(f"--cast-ns-per-byte: must be >= 0, got {args.cast_ns_per_byte}")
        return wires, tuple((w, args.cast_ns_per_byte * 1e-9) for w in wires
                            if w != "float32")
    # as `mgcaffe train` measures it on a host communicator: the casts and a rank's sum of
    # the payloads (about the same work for any number of ranks: n values read, n added)
    return wires, tuple(cast_cost(wires, sum_parts=2).items())


def describe_compression(wires, cast, measured: bool) -> str:
    """'wire formats float16 (casts 1.2 ns/B, measured on this CPU)'; '' for none."""
    if not wires:
        return ""
    casts = ", ".join(f"{w} {c * 1e9:.3g} ns/B" for w, c in cast)
    return (f"wire formats {', '.join(wires)} (casts {casts or 'none'}"
            f"{', measured on this CPU' if measured else ''})")


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


def train_flags(scheme: str, bucket_bytes: int | None = None, compress: str = "none") -> str:
    """The `mgcaffe train` flags that train `scheme` (the bucket size where it takes one,
    and the compression)."""
    flags = f"--comm={scheme}"
    if scheme_named(scheme).bucket and bucket_bytes is not None:
        flags += f" --bucket-mb {bucket_bytes / 2**20:g}"
    if compress != "none":
        flags += f" --compress={compress}"
    return flags


def train_table(schemes, bucket_bytes: int | None = None) -> str:
    """One line per scheme: its name, the flags that train it, what it sends."""
    width = max(len(s) for s in schemes)
    flags = {s: train_flags(s, bucket_bytes) for s in schemes}
    fwidth = max(len(f) for f in flags.values())
    return "\n".join(
        f"  {s:<{width}}  {flags[s]:<{fwidth}}  {scheme_named(s).summary}"
        + (" (the default)" if s == DEFAULT_SCHEME else "") for s in schemes)


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
    curve = (f", {cost.kind}: measured at {len(cost.times)} sizes from "
             f"{fmt_bytes(cost.times[0][0])} to {fmt_bytes(cost.times[-1][0])}"
             if cost.times else "")
    return (f"{nodes}a = {cost.a * 1e6:.2f} us, b = {cost.b * 1e9:.4f} ns/B{curve} "
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

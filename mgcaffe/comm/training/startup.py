"""Start-up pieces of distributed training: the identical start, the layer and plan
agreement, and what is logged about the plan."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ...backend import to_host
from ...errors import CommError
from ..backends.communicator import Communicator
from ..model.timeline import wire_choice
from ..runtime.layout import check_plan_layers

__all__ = ["agree_on_layers_and_plan", "benchmark_sizes", "broadcast_parameters",
           "describe_groups", "describe_plan", "describe_profile", "learnable_summary",
           "plan_summary", "synceasgd_groups"]


def _blob_arrays(net: Any) -> list[Any]:
    """Every parameter blob's data, each array once (shared blobs alias one array)."""
    seen, out = set(), []
    for blobs in net.params.values():
        for blob in blobs:
            if id(blob.data) not in seen:
                seen.add(id(blob.data))
                out.append(blob.data)
    return out


def broadcast_parameters(comm: Communicator, net: Any) -> int:
    """Give every rank rank 0's parameters (learnable or not: BatchNorm statistics too);
    returns the number of bytes sent."""
    total = 0
    for data in _blob_arrays(net):
        if isinstance(data, np.ndarray) and data.flags.c_contiguous:
            comm.broadcast(data, root=0)
        else:  # a device array: through a host copy
            host = np.ascontiguousarray(to_host(data))
            comm.broadcast(host, root=0)
            data[...] = net.xp.asarray(host)
        total += data.nbytes
    return total


def learnable_summary(net: Any) -> tuple[list[str], list[int]]:
    """The learnable layer names (input side first) and their parameter counts."""
    names, counts = [], []
    for layer in net.learnable_layers:
        names.append(layer.name)
        counts.append(sum(int(net.learnable_params[p].diff.size) for p in layer.param_ids))
    return names, counts


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"position {i}: {x!r} vs {y!r}"
    return f"{len(a)} vs {len(b)} entries"


def agree_on_layers_and_plan(comm: Communicator, names: list[str], counts: list[int],
                             plan: Any, iteration: int | None = None) -> None:
    """Every rank holds the same learnable layers and the same plan (and, for a plan switched
    to during training, switches at the same `iteration`), or every rank raises a CommError
    naming the ranks that differ from rank 0 and how."""
    check_plan_layers([list(g) for g in plan.groups], names, comm.rank)
    digest = plan.digest() if hasattr(plan, "digest") else repr([list(g) for g in plan.groups])
    everyone = comm.allgather((names, counts, digest, iteration))
    ref_names, ref_counts, ref_digest, ref_iteration = everyone[0]
    problems = []
    for r, (n, c, d, i) in enumerate(everyone[1:], start=1):
        if n != ref_names:
            problems.append(f"rank {r}'s learnable layers differ from rank 0's "
                            f"({_first_difference(n, ref_names)})")
        elif c != ref_counts:
            problems.append(f"rank {r}'s parameter counts differ from rank 0's "
                            f"({_first_difference(c, ref_counts)})")
        elif d != ref_digest:
            problems.append(f"rank {r} holds plan {d[:12]} but rank 0 holds {ref_digest[:12]}")
        elif i != ref_iteration:
            problems.append(f"rank {r} switches to plan {d[:12]} at iteration {i} but rank 0 "
                            f"at iteration {ref_iteration}")
    if problems:
        raise CommError(f"rank {comm.rank}: ranks disagree: {'; '.join(problems)}")


def check_plan_sizes(plan: Any, names: list[str], counts: list[int], itemsize: int,
                     source: str) -> None:
    """A saved plan's layers must hold as many parameters as the net's layers of the same
    name (a plan made for another variant of the net would group the wrong bytes)."""
    planned = dict(zip(plan.layers, plan.layer_bytes))
    for name, count in zip(names, counts):
        if name in planned and planned[name] != count * itemsize:
            raise CommError(f"{source}: layer {name!r} has {planned[name]} bytes of parameters "
                            f"in the plan but {count * itemsize} in the net ({count} x "
                            f"{itemsize} B): the plan was made for another net; plan again")


def synceasgd_groups(names: list[str]) -> SimpleNamespace:
    """A stand-in plan (one message after backward) used while the profile is measured."""
    return SimpleNamespace(groups=[list(reversed(names))])


def in_wire_formats(chosen: Any, plan: Any, cost: Any, names: list[str], counts: list[int],
                    itemsize: int) -> Any:
    """`chosen` (a plan, or group lists), each group in the format training would send it
    in: the running `plan`'s own formats for its own groups, else the cost model's choice
    for the group's bytes. `chosen` as it is when the model offers no compression (every
    message float32). The re-plan window runs such stand-ins beside the plan: sent in
    float32, they would time other messages than the plan's, and the calibration would
    compare a float32 iteration with the plan's compressed prediction."""
    if not getattr(cost, "wires", ()):
        return chosen
    groups = [list(g) for g in getattr(chosen, "groups", chosen)]
    if groups == [list(g) for g in getattr(plan, "groups", ())] and \
            getattr(plan, "formats", ()):
        return SimpleNamespace(groups=groups, formats=list(plan.formats))
    size = dict(zip(names, counts))
    sizes = [sum(size[n] for n in g) * itemsize for g in groups]
    return SimpleNamespace(groups=groups, formats=wire_choice(cost, sizes).get("formats", ()))


def describe_groups(plan: Any, limit: int = 6) -> str:
    """The plan's messages in a short phrase, output side first: `ip2+ip1 | conv2+conv1`,
    spans of long groups as `first..last (k)`, and only a count past `limit` groups."""
    groups = [list(g) for g in plan.groups]
    if len(groups) > 1 and all(len(g) == 1 for g in groups):
        return "one per layer"
    if len(groups) > limit:
        return f"{len(groups)} groups of {min(map(len, groups))}-{max(map(len, groups))} layers"
    return " | ".join("+".join(g) if len(g) <= 3 else f"{g[0]}..{g[-1]} ({len(g)})"
                      for g in groups)


def plan_summary(plan: Any, where: str) -> str:
    """The plan in one log line: its scheme (the --comm value), digest, where it came from,
    its messages and its predicted iteration."""
    n = len(plan.groups)
    return (f"Plan {plan.scheme} ({plan.digest()[:12]}) {where}: {n} all-reduce"
            f"{'s' if n != 1 else ''} ({describe_groups(plan)}) for {len(plan.layers)} "
            f"learnable layers{describe_formats(plan)}; predicted "
            f"{plan.iteration_time * 1e3:.2f} ms per iteration (t_f + t_b "
            f"{plan.ideal * 1e3:.2f} ms)")


def describe_formats(plan: Any) -> str:
    """', wire float16 (12 of 14 messages; 53.5 -> 26.8 MB)' for a compressing plan, ''
    for one all float32."""
    formats = list(getattr(plan, "formats", ()) or ())
    if not any(f != "float32" for f in formats):
        return ""
    kinds = sorted({f for f in formats if f != "float32"})
    k = sum(f != "float32" for f in formats)
    return (f", wire {'/'.join(kinds)} ({k} of {len(formats)} messages; "
            f"{sum(plan.group_sizes) / 1e6:.3g} -> {plan.wire_bytes / 1e6:.3g} MB)")


def describe_plan(plan: Any) -> str:
    """The plan in a few log lines: scheme, groups, predicted times (the verbose level)."""
    lines = [f"plan {plan.scheme} ({plan.digest()[:12]}): {len(plan.groups)} all-reduce(s) "
             f"for {len(plan.layers)} learnable layers, a = {plan.a * 1e6:.2f} us, "
             f"b = {plan.b * 1e9:.4f} ns/B"]
    for g, (group, size) in enumerate(zip(plan.groups, plan.group_sizes)):
        wire = plan.wire(g) if hasattr(plan, "wire") else "float32"
        lines.append(f"  group {g}: {size / 1e6:.3f} MB {wire}  {', '.join(group)}")
    lines.append(f"predicted iteration {plan.iteration_time * 1e3:.2f} ms (t_f + t_b = "
                 f"{plan.ideal * 1e3:.2f} ms, not overlapped communication "
                 f"{plan.non_overlapped_comm * 1e3:.2f} ms)")
    return "\n".join(lines)


def describe_profile(profile: dict, where: str) -> str:
    """The profile the plan is made from, one line per learnable layer (output side first)."""
    layers = profile["layers"]
    tb = sum(layer["backward_time"] for layer in layers)
    lines = [f"profile ({where}): t_f = {profile['forward_time'] * 1e3:.2f} ms, t_b = "
             f"{tb * 1e3:.2f} ms, {len(layers)} learnable layers"]
    for layer in reversed(layers):
        lines.append(f"  {layer['name']:>24} {layer['params']:>10d} params  backward "
                     f"{layer['backward_time'] * 1e3:8.3f} ms")
    return "\n".join(lines)


def benchmark_sizes(total_bytes: int) -> list[int]:
    """4 bytes up to the whole gradient (at least 1 MB, at most 64 MB), by factors of 4."""
    largest = min(max(total_bytes, 1 << 20), 64 << 20)
    sizes, m = [], 4
    while m < largest:
        sizes.append(m)
        m *= 4
    sizes.append(largest // 4 * 4)
    return sizes

"""What every rank must agree on before training together, compared at start.

Ranks started with different settings would otherwise train on silently (a different base_lr
diverges the weights; a different batch size averages gradients with the wrong weights) or
wait in mismatched collectives until the timeout (a different max_iter, an extra layer).

`settings_of(solver, options)` lists the settings as `{field: value}`, with values that
compare by ==; `agree_on_settings(comm, settings)` compares them across ranks with one
allgather of a digest, and only when the digests differ, a second allgather of every field
to say which field differs and on which ranks. Both are collectives: every rank calls them,
before any collective whose shape depends on these settings.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ...errors import CommError
from ..backends.communicator import Communicator

__all__ = ["COMM_FIELDS", "SOLVER_FIELDS", "agree_on_settings", "describe_difference",
           "settings_of"]

# SolverParameter fields that change the update, its schedule or when rank 0 stops the
# others (test passes, snapshots); display, random_seed and the like may differ.
SOLVER_FIELDS = ("type", "base_lr", "lr_policy", "gamma", "power", "stepsize", "stepvalue",
                 "momentum", "momentum2", "delta", "rms_decay", "weight_decay",
                 "regularization_type", "max_iter", "iter_size", "clip_gradients",
                 "test_interval", "test_initialization", "snapshot", "snapshot_prefix",
                 "snapshot_format", "snapshot_diff", "snapshot_after_train")

# distributed Options fields, each named as the user sets it (its flag); save_plan and
# thread_nice concern one rank only
COMM_FIELDS = {"comm": "--comm", "bucket_mb": "--bucket-mb", "profile_iters": "--profile-iters",
               "replan_after": "--replan-after", "timeout": "--comm-timeout",
               "emulate_nodes": "--emulate-nodes", "check_sync": "--check-sync",
               "test_timeout": "the test timeout", "backend": "--comm-backend",
               "pack_gradients": "--pack-gradients", "compress": "--compress"}
# Options holding a path: whether one is given must agree (it decides which collectives run
# at start), not the path (a node may hold its copy elsewhere; a plan's content is compared
# by its digest later)
COMM_PATHS = ("profile", "network", "plan", "emulate_network", "timeline")


def _plain(value: Any) -> Any:
    """A JSON-able form of a protobuf scalar or repeated field (floats as the float32 the
    prototxt gave: 0.01, not 0.009999999776482582)."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    try:
        return [_plain(v) for v in value]
    except TypeError:
        return str(value)


def settings_of(solver: Any, options: Any) -> dict[str, Any]:
    """The settings that must agree: the net's learnable layout (layer names and parameter
    shapes), the batch size of every data layer (a layer without bottoms: the first
    dimension of its first top), the solver's fields, and the distributed options."""
    net = solver.net
    out: dict[str, Any] = {}
    layout = []
    for layer in net.learnable_layers:
        shapes = [list(net.learnable_params[p].data.shape) for p in layer.param_ids]
        layout.append([layer.name, shapes])
    out["learnable layers"] = [name for name, _ in layout]
    out["parameter shapes"] = layout
    for name, tops in net.top_names.items():
        if not net.bottom_names.get(name) and tops:
            shape = net.blobs[tops[0]].data.shape
            out[f"batch size of layer {name!r}"] = int(shape[0]) if len(shape) else 1
    param = solver.param
    for field in SOLVER_FIELDS:
        out[f"solver {field}"] = _plain(getattr(param, field))
    out["solver class"] = type(solver).__name__
    for field, flag in COMM_FIELDS.items():
        out[flag] = _plain(getattr(options, field))
    for field in COMM_PATHS:
        out[f"whether --{field.replace('_', '-')} is given"] = bool(getattr(options, field, None))
    return out


def _digest(settings: dict[str, Any]) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_difference(everyone: list[dict[str, Any]]) -> str | None:
    """One line naming the first field whose value differs between ranks and which ranks
    hold which value; None when all agree."""
    fields = []
    for settings in everyone:
        fields.extend(f for f in settings if f not in fields)
    for field in fields:
        holders: dict[str, list[int]] = {}
        for rank, settings in enumerate(everyone):
            value = _short(settings.get(field, "(absent)"))
            holders.setdefault(value, []).append(rank)
        if len(holders) > 1:
            parts = [f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}: {v}"
                     for v, r in holders.items()]
            return f"ranks disagree on {field} ({'; '.join(parts)})"
    return None


def agree_on_settings(comm: Communicator, settings: dict[str, Any]) -> None:
    """Return when every rank holds the same settings; otherwise raise CommError on every
    rank with one line naming the field and the ranks that differ (a collective)."""
    if comm.size == 1:
        return
    digests = comm.allgather(_digest(settings))
    if len(set(digests)) == 1:
        return
    everyone = comm.allgather(settings)
    text = describe_difference(everyone) or "ranks disagree on their settings"
    raise CommError(f"rank {comm.rank}: {text}; start every rank with the same solver, net "
                    f"and flags")

"""Data layers' reading positions in the solver state, for a resume that continues exactly.

Caffe restarts every data layer at its first record on resume. mgcaffe also stores, in the
extension field `SolverState.mgcaffe_data_position` (proto/caffe.proto), each data layer's
position after the last batch consumed (its cursor and its prefetch RNG) for every rank,
and puts it back on resume. A state without the field resumes as Caffe does.
"""

from __future__ import annotations

import json
import logging

from ..errors import SolverError

log = logging.getLogger("mgcaffe.solvers")


def _nets(solver) -> dict:
    return {"train": solver.net, **{f"test{k}": n for k, n in enumerate(solver.test_nets)}}


def local_positions(solver) -> dict:
    """{net: {layer: state}} of this process's data layers that can say where they are."""
    out = {}
    for key, net in _nets(solver).items():
        states = {}
        for name, layer in zip(net.layer_names, net.layers):
            position = getattr(layer, "data_position", None)
            state = position() if position is not None else None
            if state is not None:
                states[name] = state
        if states:
            out[key] = states
    return out


def encode(ranks: list[dict]) -> bytes:
    """The field's bytes for every rank's positions (b"" when no layer has one)."""
    if not any(ranks):
        return b""
    return json.dumps({"world_size": len(ranks), "ranks": ranks},
                      separators=(",", ":")).encode()


def apply(solver, data: bytes, path: str) -> None:
    """Put this rank's saved positions back into the solver's data layers."""
    if not data:
        return  # a state written by Caffe (or without data layers): start over, as Caffe
    try:
        saved = json.loads(data.decode())
        world_size, ranks = int(saved["world_size"]), saved["ranks"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SolverError(f"{path}: mgcaffe_data_position is not readable ({exc})") from None
    size = getattr(solver, "world_size", 1)
    if world_size != size or len(ranks) != world_size:
        log.warning("%s: data positions were saved by %d rank(s), this run has %d: the data "
                    "layers start from their first record (as Caffe's do)", path, world_size,
                    size)
        return
    mine = ranks[getattr(solver, "rank", 0)]
    nets = _nets(solver)
    for key, states in mine.items():
        net = nets.get(key)
        for name, state in states.items():
            if net is None or name not in net.layer_names:
                log.warning("%s: no data layer %r in the %s net to continue; it starts over",
                            path, name, key)
                continue
            net.layers[net.layer_names.index(name)].set_data_position(state)

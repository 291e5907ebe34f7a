"""Per-layer profile of one training iteration: what the planner needs to know about a model.

JSON format (times in seconds; `model`, `forward_time` and `layers` are required):

    {"model": "googlenet", "batch_size": 64, "dtype_bytes": 4, "forward_time": 0.1027,
     "layers": [{"name": "conv1/7x7_s2", "params": 9472, "backward_time": 0.0151}, ...]}

- `layers` lists the LEARNABLE layers only, from the input side (layer 1) to the output side
  (layer L); backward runs L, L-1, ..., 1. `params` counts every parameter blob of the layer
  (weights and bias); the layer's message is `params * dtype_bytes` bytes.
- `backward_time` is the time of that layer's backward (the time between its gradient and the
  next learnable layer's gradient, non-learnable layers included, if measured end to end).
- `forward_time` (t_f) is the whole forward pass. `batch_size` (per worker) is informational;
  `dtype_bytes` defaults to 4 (float32).
- Optional, per layer, for the schedules that overlap the next forward pass (comm/model/
  schedule.py): `forward_time`, the time from the start of this layer's forward to the start
  of the next learnable layer's (non-learnable layers between them included; the part of t_f
  before learnable layer 1 needs no parameters); `update_time`, the solver's update of the
  layer's parameters. Without them a layer's forward is t_f in proportion to its backward
  time (the paper's convention t_f = t_b / 2 gives the same shares) and its update is free.
- Unknown extra keys (e.g. `source`, a free-text provenance note) are ignored.

A saved plan (`mgcaffe train --save-plan`, `mgcaffe plan --save-plan`) is read as the profile
it was made from: its forward time, and each layer's bytes and backward time (its backward
end minus its start). So `mgcaffe plan --profile plan.json` plans every scheme from the
profile a training run measured. A plan predicted with interference holds slowed times, not
a profile: it is refused.

Every validation error is a `PlanError` of one line naming the file and the field:
`profile.json: layers[3].backward_time: must be >= 0, got -1`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import PlanError
from ...formats.jsonio import read_json as read

__all__ = ["LayerProfile", "Profile", "load_profile", "read_json"]


# ----------------------------------------------------------------------------- validation
def read_json(path: str | Path) -> Any:
    """Parse a JSON file; any failure is a one-line PlanError naming the file."""

    return read(path, PlanError)


def _where(source: str, field: str) -> str:
    return f"{source}: {field}" if field else source


def require_mapping(value: Any, source: str, field: str = "") -> dict:
    if not isinstance(value, dict):
        raise PlanError(f"{_where(source, field or 'top level')}: must be a JSON object, "
                        f"got {type(value).__name__}")
    return value


def require(d: dict, key: str, source: str, prefix: str = "") -> Any:
    if key not in d:
        raise PlanError(f"{source}: {prefix}{key}: missing")
    return d[key]


def as_float(value: Any, source: str, field: str, *, minimum: float | None = 0.0) -> float:
    """A finite real number (not a bool), >= minimum when given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{source}: {field}: must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise PlanError(f"{source}: {field}: must be finite, got {value!r}")
    if minimum is not None and x < minimum:
        raise PlanError(f"{source}: {field}: must be >= {minimum:g}, got {value!r}")
    return x


def as_int(value: Any, source: str, field: str, *, minimum: int = 0) -> int:
    """An integer (an integral float such as 9472.0 is accepted), >= minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{source}: {field}: must be an integer, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise PlanError(f"{source}: {field}: must be an integer, got {value!r}")
    n = int(value)
    if n < minimum:
        raise PlanError(f"{source}: {field}: must be >= {minimum}, got {value!r}")
    return n


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class LayerProfile:
    """One learnable layer: its name, parameter count and backward time (seconds); optionally
    its forward time (None: a share of t_f) and update time (seconds)."""

    name: str
    params: int
    backward_time: float
    forward_time: float | None = None
    update_time: float = 0.0


@dataclass(frozen=True)
class Profile:
    """A model's profile; `layers` input side first (layer 1 .. L), backward runs L .. 1."""

    model: str
    batch_size: int | None
    dtype_bytes: int
    forward_time: float
    layers: tuple[LayerProfile, ...]

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))

    # -- derived quantities
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def names(self) -> list[str]:
        """Layer names, input side first."""
        return [layer.name for layer in self.layers]

    @property
    def total_params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def backward_time(self) -> float:
        """t_b: the sum of the layers' backward times."""
        return math.fsum(layer.backward_time for layer in self.layers)

    @property
    def ideal_time(self) -> float:
        """t_f + t_b: one iteration with every byte of communication hidden (or one worker)."""
        return self.forward_time + self.backward_time

    def layer_bytes(self, layer: LayerProfile) -> int:
        return layer.params * self.dtype_bytes

    def forward_segments(self) -> tuple[float, list[float]]:
        """(prefix, f): the forward time before learnable layer 1 (it needs no parameters) and
        f[l-1], learnable layer l's forward up to layer l+1's. From the layers' own
        `forward_time` where every layer has one (the prefix is what t_f leaves), else t_f
        shared in proportion to the backward times (equally when they are all zero)."""
        given = [layer.forward_time for layer in self.layers]
        if all(f is not None for f in given):
            return max(0.0, self.forward_time - math.fsum(given)), list(given)
        total = self.backward_time
        L = self.num_layers
        if total > 0:
            return 0.0, [self.forward_time * layer.backward_time / total
                         for layer in self.layers]
        return 0.0, [self.forward_time / L] * L

    @property
    def update_time(self) -> float:
        """The update of every layer's parameters, seconds (0 unless the profile gives it)."""
        return math.fsum(layer.update_time for layer in self.layers)

    # -- (de)serialisation
    @classmethod
    def from_dict(cls, d: Any, source: str = "profile") -> Profile:
        """Validate a parsed profile (or a saved plan: `from_plan`); `source` (usually the
        file name) prefixes every error."""
        source = str(source)
        d = require_mapping(d, source)
        if "groups" in d and "profile" not in d:
            return cls.from_plan(d, source)
        model = require(d, "model", source)
        if not isinstance(model, str):
            raise PlanError(f"{source}: model: must be a string, got {model!r}")
        batch_size = d.get("batch_size")
        if batch_size is not None:
            batch_size = as_int(batch_size, source, "batch_size", minimum=1)
        dtype_bytes = as_int(d.get("dtype_bytes", 4), source, "dtype_bytes", minimum=1)
        forward_time = as_float(require(d, "forward_time", source), source, "forward_time")
        raw_layers = require(d, "layers", source)
        if not isinstance(raw_layers, list):
            raise PlanError(f"{source}: layers: must be a list, got "
                            f"{type(raw_layers).__name__}")
        if not raw_layers:
            raise PlanError(f"{source}: layers: must not be empty (no learnable layer)")
        layers = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(raw_layers):
            at = f"layers[{i}]"
            raw = require_mapping(raw, source, at)
            name = require(raw, "name", source, f"{at}.")
            if not isinstance(name, str) or not name:
                raise PlanError(f"{source}: {at}.name: must be a non-empty string, got {name!r}")
            if name in seen:
                raise PlanError(f"{source}: {at}.name: {name!r} repeats layers[{seen[name]}].name")
            seen[name] = i
            params = as_int(require(raw, "params", source, f"{at}."), source, f"{at}.params")
            bt = as_float(require(raw, "backward_time", source, f"{at}."), source,
                          f"{at}.backward_time")
            ft = raw.get("forward_time")
            if ft is not None:
                ft = as_float(ft, source, f"{at}.forward_time")
            ut = as_float(raw.get("update_time", 0.0), source, f"{at}.update_time")
            layers.append(LayerProfile(name, params, bt, ft, ut))
        return cls(model, batch_size, dtype_bytes, forward_time, tuple(layers))

    @classmethod
    def from_plan(cls, d: dict, source: str = "plan") -> Profile:
        """The profile a saved plan (its JSON) was made from: t_f, and per layer its bytes
        (as float32 parameters) and backward time, backward_end - backward_start."""
        for key in ("interference", "comm_slowdown"):
            if d.get(key):
                raise PlanError(f"{source}: {key}: this plan was predicted with interference, "
                                "so its layer times are slowed ones, not a profile; give the "
                                "profile itself")
        model = d.get("model") or "plan"
        forward_time = as_float(require(d, "forward_time", source), source, "forward_time")
        raw_layers = require(d, "layers", source)
        if not isinstance(raw_layers, list) or not raw_layers:
            raise PlanError(f"{source}: layers: must be a non-empty list")
        layers = []
        for i, raw in enumerate(raw_layers):
            at = f"layers[{i}]"
            raw = require_mapping(raw, source, at)
            name = require(raw, "name", source, f"{at}.")
            nbytes = as_int(require(raw, "bytes", source, f"{at}."), source, f"{at}.bytes")
            start, end = (as_float(require(raw, k, source, f"{at}."), source, f"{at}.{k}")
                          for k in ("backward_start", "backward_end"))
            if nbytes % 4:
                raise PlanError(f"{source}: {at}.bytes: {nbytes} is not a whole number of "
                                "float32 values")
            layers.append(LayerProfile(str(name), nbytes // 4, max(0.0, end - start)))
        return cls(str(model), None, 4, forward_time, tuple(layers))

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"model": self.model}
        if self.batch_size is not None:
            d["batch_size"] = self.batch_size
        d["dtype_bytes"] = self.dtype_bytes
        d["forward_time"] = self.forward_time
        d["layers"] = [_layer_dict(layer) for layer in self.layers]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


def _layer_dict(layer: LayerProfile) -> dict:
    d: dict[str, Any] = {"name": layer.name, "params": layer.params,
                         "backward_time": layer.backward_time}
    if layer.forward_time is not None:
        d["forward_time"] = layer.forward_time
    if layer.update_time:
        d["update_time"] = layer.update_time
    return d


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file (errors name the file and the field)."""
    return Profile.from_dict(read_json(path), source=str(path))

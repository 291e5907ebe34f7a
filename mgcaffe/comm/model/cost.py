"""All-reduce cost model T_ar(M): seconds to all-reduce an M-byte message among N workers.

Two forms (`CostModel.kind`, the value `COST_MODELS` lists):

- `paper`: the paper's line T_ar(M) = a + b*M (Eq. 9), for every size.
- `piecewise`: measured times at a set of sizes, T_ar piecewise linear between them (flat below
  the smallest, the last segment's slope above the largest). Over TCP one line misses the
  large messages by tens of percent (the kernel's buffers and TCP's windows change with the
  size); a measured curve predicts every measured size within its measured spread. Its `a`
  and `b` are the line fitted to the same points, kept for the paper's Algorithm 1 and for
  output. Times never decrease with the size (the planner's optimum is exact for any
  non-decreasing T_ar).

A network description gives the cost for each N, either by an all-reduce algorithm's formula
from the alpha-beta-gamma constants or by measured per-N fits. JSON format (seconds, seconds per
byte):

    {"alpha": 4.526e-05, "beta": 9.93e-10, "gamma": 2.5e-09, "algorithm": "ring",
     "fits": {"8": {"a": 0.00083, "b": 3.34e-09,
                    "times": [[4, 6.1e-05], [1048576, 0.0094], [53500000, 0.58]]}}}

- `alpha`: latency of one message step; `beta`: wire time per byte; `gamma`: reduction
  arithmetic per byte (default 0); `algorithm` (default "ring") picks the formula below.
- `fits` (optional): measured (a, b) per number of nodes; they take precedence over the formula
  for the N they list (`cost_for(..., use_formula=True)` ignores them). alpha and beta may be
  left out when fits cover every N asked for.
- `times` (optional, inside a fit): measured `[[bytes, seconds], ...]`, at least two sizes,
  seconds not decreasing with bytes: the `piecewise` T_ar of that N (`mgcaffe bench-comm`
  writes them). Without them, or with `cost_for(..., model="paper")`, T_ar is a + b*M.
- `interference` (optional, inside a fit): how much backward slows while an all-reduce is in
  flight, as measured points `[[bytes, slowdown], ...]`: backward runs at 1/(1 + slowdown) of
  its speed while a message of that size is being all-reduced (docs/planner.md). Sizes in
  between are interpolated linearly in log2(bytes), sizes outside take the nearest point.
- `comm_slowdown` (optional, inside a fit): the other direction, how much an all-reduce slows
  while backward runs, sigma >= 1: a message progresses at 1/sigma of its speed while backward
  is still computing, at full speed once backward is done. One number (every size) or points
  `[[bytes, sigma], ...]`, interpolated like `interference`; absent means 1 (no slowdown).
- Unknown extra keys (`source`, `units`, `fits_all_sizes`, ... and `rms_s` etc. inside a fit)
  are ignored.

The standard costs (Thakur, Rabenseifner and Gropp 2005; Chan et al. 2007) for N workers and
message size M, with log2(N) rounded up for N that is not a power of two:

    ring                        a = 2(N-1) alpha        b = 2(N-1)/N beta + (N-1)/N gamma
    binary_tree (reduce+bcast)  a = 2 log2(N) alpha     b = log2(N) (2 beta + gamma)
    recursive_doubling          a = log2(N) alpha       b = log2(N) (beta + gamma)
    recursive_halving_doubling  a = 2 log2(N) alpha     b = 2(N-1)/N beta + (N-1)/N gamma
      (Rabenseifner: reduce-scatter by recursive halving, allgather by recursive doubling)

With N = 1 every formula gives a = b = 0 (nothing to exchange).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import PlanError
from .profile import as_float, as_int, read_json, require_mapping

__all__ = ["ALGORITHMS", "COMPRESS", "COST_MODELS", "DEFAULT_COST_MODEL", "WIRE_BYTES",
           "WIRE_FORMATS", "CostModel", "Network", "canonical_algorithm",
           "canonical_compress", "canonical_cost_model", "compress_wires", "cost_for",
           "fit_linear", "fit_relative", "formula", "load_network"]

ALGORITHMS = ("ring", "binary_tree", "recursive_doubling", "recursive_halving_doubling")
#: The forms of T_ar (see the module docstring): measured points where there are any, or the
#: paper's line a + b*M.
COST_MODELS = ("piecewise", "paper")
DEFAULT_COST_MODEL = "piecewise"

#: What a message travels as (its wire format), and the bytes per gradient element it takes.
#: A float32 gradient is divided by the world size, cast, reduced in that format and cast
#: back (docs/distributed.md, "Gradient compression").
WIRE_FORMATS = ("float32", "float16", "bfloat16")
WIRE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: `--compress` / `comm_param.compress`: the formats the planner may give a message.
COMPRESS = {"none": (), "fp16": ("float16",), "bf16": ("bfloat16",),
            "auto": ("float32", "float16", "bfloat16")}


def canonical_compress(name: str, source: str = "--compress") -> str:
    """One of COMPRESS's keys ("float16" and "half" are fp16, "bfloat16" bf16, "float32"
    none); PlanError naming the choices otherwise."""
    key = str(name).strip().lower().replace("-", "")
    key = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "none",
           "fp32": "none"}.get(key, key)
    if key not in COMPRESS:
        raise PlanError(f"{source}: unknown compression {name!r} (choose from "
                        f"{', '.join(COMPRESS)})")
    return key


def compress_wires(compress: str, available: Sequence[str] = WIRE_FORMATS
                   ) -> tuple[str, ...]:
    """The wire formats `--compress` lets the planner choose from, among those the array
    library has (`available`): () for none (every message float32, as before). auto keeps
    what is available; fp16 or bf16 where the library lacks it is a PlanError naming what
    is."""
    key = canonical_compress(compress)
    wires = COMPRESS[key]
    if key == "auto":
        return tuple(w for w in wires if w in available)
    missing = [w for w in wires if w not in available]
    if missing:
        have = ["none"] + [k for k, v in COMPRESS.items() if k not in ("none", "auto")
                           and all(w in available for w in v)] + ["auto"]
        raise PlanError(f"--compress={key}: {missing[0]} is not available here (the array "
                        f"library lacks it); available: {', '.join(have)}")
    return wires


_ALIASES = {
    "ring": "ring", "ring_allreduce": "ring",
    "binary_tree": "binary_tree", "tree": "binary_tree", "btree": "binary_tree",
    "binomial_tree": "binary_tree", "reduce_bcast": "binary_tree",
    "recursive_doubling": "recursive_doubling", "doubling": "recursive_doubling",
    "rd": "recursive_doubling",
    "recursive_halving_doubling": "recursive_halving_doubling",
    "recursive_halving_and_doubling": "recursive_halving_doubling",
    "halving_doubling": "recursive_halving_doubling", "rabenseifner": "recursive_halving_doubling",
    "rhd": "recursive_halving_doubling",
}


def canonical_algorithm(name: str, source: str = "network", field_name: str = "algorithm") -> str:
    """Map an algorithm name or alias ("tree", "rabenseifner", "recursive-doubling") to one of
    ALGORITHMS; anything else is a PlanError naming the field."""
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    if key not in _ALIASES:
        raise PlanError(f"{source}: {field_name}: unknown all-reduce algorithm {name!r} "
                        f"(choose from {', '.join(ALGORITHMS)})")
    return _ALIASES[key]


@dataclass(frozen=True)
class CostModel:
    """T_ar(M) for one N: the paper's line a + b*M (`a` start-up seconds, `b` seconds per
    byte), or, with `times`, piecewise linear through measured (bytes, seconds) points (a and
    b are then the line fitted to them: Algorithm 1's start-up and output only).

    `nodes`, `origin` (e.g. "fit", "ring formula", "--a/--b") and `doubt` are informational and
    do not take part in comparisons."""

    a: float
    b: float
    nodes: int | None = field(default=None, compare=False)
    origin: str = field(default="", compare=False)
    interference: tuple[tuple[int, float], ...] = ()  # (bytes, backward slowdown), sorted
    comm_slowdown: tuple[tuple[int, float], ...] = ()  # (bytes, sigma >= 1), sorted
    times: tuple[tuple[int, float], ...] = ()  # (bytes, seconds), sorted: the piecewise T_ar
    # why T may be far off (the start-up benchmark's fit missed a size beyond its spread);
    # "" when nothing is known against it. Informational, like origin.
    doubt: str = field(default="", compare=False)
    # the wire formats a message may travel in (WIRE_FORMATS; () = float32 only, the paper's
    # model) and what casting costs, seconds per float32 byte per format (both casts, on the
    # rank's device): T(M) is then the cheapest format's T_ar(wire bytes) + cast * M
    wires: tuple[str, ...] = ()
    cast: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        for name in ("a", "b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise PlanError(f"cost model: {name}: must be a finite number, got {v!r}")
            if v < 0:
                raise PlanError(f"cost model: {name}: must be >= 0, got {v!r}")
            object.__setattr__(self, name, float(v))
        object.__setattr__(self, "interference", _points(self.interference, "interference",
                                                         "slowdown", 0.0))
        object.__setattr__(self, "comm_slowdown", _points(self.comm_slowdown, "comm_slowdown",
                                                          "sigma", 1.0))
        times = _points(self.times, "times", "seconds", 0.0)
        _check_times(times)
        object.__setattr__(self, "times", times)
        # the curve's knots as two lists, for bisection (not fields: no part of equality)
        object.__setattr__(self, "_sizes", [m for m, _ in times])
        object.__setattr__(self, "_seconds", [t for _, t in times])
        wires = tuple(self.wires)
        for w in wires:
            if w not in WIRE_FORMATS:
                raise PlanError(f"cost model: wires: unknown format {w!r} (choose from "
                                f"{', '.join(WIRE_FORMATS)})")
        cast = tuple(sorted((str(w), as_float(c, "cost model", f"cast[{w}]", minimum=0.0))
                            for w, c in dict(self.cast).items()))
        object.__setattr__(self, "wires", wires)
        object.__setattr__(self, "cast", cast)
        # one format offered is a forced one; float32 alone is no compression at all
        object.__setattr__(self, "_plain", wires in ((), ("float32",)))

    @property
    def kind(self) -> str:
        """Which form T_ar takes: "piecewise" (measured points) or "paper" (a + b*M)."""
        return "piecewise" if self.times else "paper"

    def time(self, nbytes: float) -> float:
        """Seconds to all-reduce a message of `nbytes` float32 bytes (never less for more
        bytes): T_ar(nbytes), or with `wires` the cheapest format's `wire_time` (a minimum
        of non-decreasing functions is non-decreasing: the planner stays exact)."""
        if self._plain:
            return self.link_time(nbytes)
        return min(self.wire_time(nbytes, w) for w in self.wires)

    def wire_for(self, nbytes: float) -> str:
        """The format a message of `nbytes` float32 bytes travels in: the cheapest of `wires`
        (ties go to the earlier of WIRE_FORMATS: float32, then float16)."""
        if self._plain:
            return "float32"
        return min(self.wires, key=lambda w: (self.wire_time(nbytes, w),
                                              WIRE_FORMATS.index(w)))

    def cast_time(self, nbytes: float, wire: str) -> float:
        """Seconds to cast `nbytes` float32 bytes to `wire` and back (0 for float32)."""
        return 0.0 if wire == "float32" else dict(self.cast).get(wire, 0.0) * nbytes

    def wire_time(self, nbytes: float, wire: str) -> float:
        """`nbytes` float32 bytes sent as `wire`: T_ar of the bytes on the wire plus the
        casts."""
        return self.link_time(nbytes * WIRE_BYTES[wire] / 4) + self.cast_time(nbytes, wire)

    def uncompressed(self) -> CostModel:
        """This model with every message float32 (what the link costs)."""
        return dataclasses.replace(self, wires=(), cast=())

    def link_time(self, nbytes: float) -> float:
        """Seconds the link takes to all-reduce `nbytes` bytes as they are (T_ar(M))."""
        if not self.times:
            return self.a + self.b * nbytes
        xs, ys = self._sizes, self._seconds
        i = bisect.bisect_right(xs, nbytes)
        if i == 0:
            return ys[0]
        if xs[i - 1] == nbytes:  # a measured size: its time exactly
            return ys[i - 1]
        if i == len(xs):  # above the largest: the last segment's slope goes on
            i -= 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0)

    def part_time(self, nbytes: float, whole: float) -> float:
        """Seconds for `nbytes` sent as a part of a message of `whole` bytes cut into parts
        sent back to back: T(nbytes), but never less than its share of T(whole) plus one
        start-up, T(0) + (T(whole) - T(0)) * nbytes / whole, so that k parts cost at least
        T(whole) + (k - 1) * T(0): cutting a message never makes it cheaper. For the paper's
        line this is T(nbytes) itself. A measured curve is taken one message at a time, after
        an idle link, where a small message rides on empty buffers and looks cheaper per byte
        than a large one (over 1 Gbit/s TCP: 16 KB all-reduced alone in 0.12 ms, 7.5
        ns/byte, 53.5 MB at 11.6 ns/byte); parts sent back to back do not get that (16 KB
        parts of the 53.5 MB took 0.15-0.26 ms each). With wire formats, every part travels
        in its message's format (`wire_for(whole)`), as the data path sends it, whether or
        not that format is the cheapest for the part alone."""
        wire = self.wire_for(max(whole, nbytes))
        t = self.wire_time(nbytes, wire)
        if not self.times or whole <= nbytes or whole <= 0:
            return t
        t0 = self.wire_time(0, wire)
        return max(t, t0 + (self.wire_time(whole, wire) - t0) * nbytes / whole)

    def paper(self) -> CostModel:
        """The paper's line a + b*M of this model (the `paper` form), other terms kept."""
        return dataclasses.replace(self, times=())

    def with_times(self, points) -> CostModel:
        """The same model with T_ar piecewise linear through these (bytes, seconds) points."""
        return dataclasses.replace(self, times=tuple(points))

    @property
    def interferes(self) -> bool:
        """Whether communication and backward slow each other (a rho > 0 or a sigma > 1):
        the planner then uses the extended model (docs/planner.md)."""
        return (any(rho > 0 for _, rho in self.interference)
                or any(sigma > 1 for _, sigma in self.comm_slowdown))

    def slowdown(self, nbytes: float) -> float:
        """rho(M): while an all-reduce of M bytes is in flight backward runs at 1/(1 + rho)
        of its speed; interpolated linearly in log2(M) between the measured points."""
        return _interpolate(self.interference, nbytes, 0.0)

    def sigma(self, nbytes: float) -> float:
        """sigma(M) >= 1: while backward runs an all-reduce of M bytes progresses at 1/sigma
        of its speed; interpolated linearly in log2(M) between the points (1 without any)."""
        return _interpolate(self.comm_slowdown, nbytes, 1.0)

    def with_interference(self, points, comm_slowdown=None) -> CostModel:
        """The same T_ar with measured (bytes, slowdown) points; `comm_slowdown` (bytes,
        sigma) points replace the present ones when given."""
        sigma = self.comm_slowdown if comm_slowdown is None else tuple(comm_slowdown)
        return dataclasses.replace(self, interference=tuple(points), comm_slowdown=sigma)

    def with_comm_slowdown(self, points) -> CostModel:
        """The same model with these (bytes, sigma) points."""
        return self.with_interference(self.interference, points)

    def scaled_time(self, c: float, keep=()) -> CostModel:
        """The same model with T_ar c times as long (c > 0), except at the measured sizes
        `keep`, which stay as they are (T then made non-decreasing again: a scaled point
        never drops below a kept one before it, nor rises above one after it)."""
        if not self.times:
            return dataclasses.replace(self, a=self.a * c, b=self.b * c)
        kept = set(keep)
        sizes = [m for m, _ in self.times]
        t = [s if m in kept else s * c for m, s in self.times]
        for i in range(len(t) - 2, -1, -1):  # a scaled point no higher than the next
            if sizes[i] not in kept and t[i] > t[i + 1]:
                t[i] = t[i + 1]
        for i in range(1, len(t)):  # ... and no lower than the one before
            t[i] = max(t[i], t[i - 1])
        return self.with_times(zip(sizes, t))

    def scaled_interference(self, k: float) -> CostModel:
        """The same model with its interference k times as strong: rho(M) -> k rho(M) and
        sigma(M) -> 1 + k (sigma(M) - 1) (k = 0: none, the paper's model; 1: as given)."""
        return self.with_interference([(m, k * rho) for m, rho in self.interference],
                                      [(m, 1.0 + k * (s - 1.0)) for m, s in self.comm_slowdown])

    def describe(self) -> str:
        """T_ar in a few words: the line, or the measured curve's extent and its line."""
        line = f"a = {self.a * 1e6:.3f} us, b = {self.b * 1e9:.4f} ns/byte"
        if not self.times:
            return f"T(M) = a + b*M (paper): {line}"
        (m0, t0), (m1, t1) = self.times[0], self.times[-1]
        return (f"T(M) piecewise linear through {len(self.times)} measured sizes "
                f"({_size(m0)} {t0 * 1e3:.3g} ms .. {_size(m1)} {t1 * 1e3:.3g} ms; the line "
                f"through them {line})")

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"a": self.a, "b": self.b}
        if self.times:
            d["times"] = [[m, t] for m, t in self.times]
        if self.interference:
            d["interference"] = [[m, rho] for m, rho in self.interference]
        if self.comm_slowdown:
            d["comm_slowdown"] = [[m, sigma] for m, sigma in self.comm_slowdown]
        if self.wires:
            d["wires"] = list(self.wires)
        if self.cast:
            d["cast"] = {w: c for w, c in self.cast}
        if self.nodes is not None:
            d["nodes"] = self.nodes
        if self.origin:
            d["origin"] = self.origin
        return d


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def _check_times(times: tuple[tuple[int, float], ...]) -> None:
    """A piecewise T_ar needs two distinct sizes and times that never decrease with size
    (the planner's exactness rests on it)."""
    if not times:
        return
    if len(times) < 2 or len({m for m, _ in times}) != len(times):
        raise PlanError(f"cost model: times: need at least two distinct sizes, got "
                        f"{[m for m, _ in times]}")
    for (m0, t0), (m1, t1) in zip(times, times[1:]):
        if t1 < t0:
            raise PlanError(f"cost model: times: {m1} bytes take {t1:g} s, less than "
                            f"{m0} bytes ({t0:g} s): T(M) must not decrease with M")


def _points(raw, name: str, what: str, least: float) -> tuple[tuple[int, float], ...]:
    """Validated (bytes, value) points sorted by size; every value >= `least`."""
    points = []
    for i, point in enumerate(raw):
        try:
            m, v = point
        except (TypeError, ValueError):
            raise PlanError(f"cost model: {name}[{i}]: expected [bytes, {what}], "
                            f"got {point!r}") from None
        m = as_int(m, "cost model", f"{name}[{i}][0]", minimum=1)
        points.append((m, as_float(v, "cost model", f"{name}[{i}][1]", minimum=least)))
    return tuple(sorted(points))


def _interpolate(pts, nbytes: float, default: float) -> float:
    """Linear in log2(bytes) between the points, clamped at both ends."""
    if not pts:
        return default
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        return pts[-1][1]
    x = math.log2(nbytes)
    for (m0, r0), (m1, r1) in zip(pts, pts[1:]):
        if nbytes <= m1:
            x0, x1 = math.log2(m0), math.log2(m1)
            return r0 + (r1 - r0) * (x - x0) / (x1 - x0)
    return pts[-1][1]  # not reached


def _log2_steps(nodes: int) -> int:
    return math.ceil(math.log2(nodes)) if nodes > 1 else 0


def formula(algorithm: str, nodes: int, alpha: float, beta: float,
            gamma: float = 0.0) -> tuple[float, float]:
    """(a, b) of an all-reduce among `nodes` workers by the standard alpha-beta-gamma cost of
    `algorithm` (see the module docstring)."""
    algorithm = canonical_algorithm(algorithm)
    n = nodes
    if algorithm == "ring":
        return 2 * (n - 1) * alpha, 2 * (n - 1) / n * beta + (n - 1) / n * gamma
    steps = _log2_steps(n)
    if algorithm == "binary_tree":
        return 2 * steps * alpha, steps * (2 * beta + gamma)
    if algorithm == "recursive_doubling":
        return steps * alpha, steps * (beta + gamma)
    # recursive_halving_doubling (Rabenseifner)
    return 2 * steps * alpha, 2 * (n - 1) / n * beta + (n - 1) / n * gamma


@dataclass(frozen=True)
class Network:
    """A cluster's all-reduce costs: alpha/beta/gamma and an algorithm, and/or per-N fits."""

    alpha: float | None
    beta: float | None
    gamma: float = 0.0
    algorithm: str = "ring"
    fits: dict[int, CostModel] = field(default_factory=dict)
    source: str = field(default="network", compare=False)

    @classmethod
    def from_dict(cls, d: Any, source: str = "network") -> Network:
        source = str(source)
        d = require_mapping(d, source)
        alpha = as_float(d["alpha"], source, "alpha") if d.get("alpha") is not None else None
        beta = as_float(d["beta"], source, "beta") if d.get("beta") is not None else None
        gamma = as_float(d["gamma"], source, "gamma") if d.get("gamma") is not None else 0.0
        algorithm = canonical_algorithm(d.get("algorithm", "ring"), source)
        fits: dict[int, CostModel] = {}
        raw_fits = d.get("fits")
        if raw_fits is not None:
            raw_fits = require_mapping(raw_fits, source, "fits")
            for key, fit in raw_fits.items():
                try:
                    n = int(key)
                except ValueError:
                    raise PlanError(f"{source}: fits: key {key!r} is not a number of nodes") \
                        from None
                if n < 1:
                    raise PlanError(f"{source}: fits: key {key!r}: must be >= 1")
                fit = require_mapping(fit, source, f"fits.{key}")
                for name in ("a", "b"):
                    if name not in fit:
                        raise PlanError(f"{source}: fits.{key}.{name}: missing")
                a = as_float(fit["a"], source, f"fits.{key}.a")
                b = as_float(fit["b"], source, f"fits.{key}.b")
                points = fit.get("interference") or ()
                if not isinstance(points, (list, tuple)):
                    raise PlanError(f"{source}: fits.{key}.interference: must be a list of "
                                    f"[bytes, slowdown]")
                sigma = fit.get("comm_slowdown") or ()
                if isinstance(sigma, (int, float)) and not isinstance(sigma, bool):
                    sigma = [[1, sigma]]  # one number: every size
                if not isinstance(sigma, (list, tuple)):
                    raise PlanError(f"{source}: fits.{key}.comm_slowdown: must be a number or "
                                    f"a list of [bytes, sigma]")
                times = fit.get("times") or ()
                if not isinstance(times, (list, tuple)):
                    raise PlanError(f"{source}: fits.{key}.times: must be a list of "
                                    f"[bytes, seconds]")
                try:
                    fits[n] = CostModel(a, b, nodes=n, origin="fit",
                                        interference=tuple(points),
                                        comm_slowdown=tuple(sigma), times=tuple(times))
                except PlanError as exc:
                    raise PlanError(f"{source}: fits.{key}.{str(exc).split(': ', 1)[1]}") \
                        from None
        if (alpha is None) != (beta is None):
            missing = "beta" if beta is None else "alpha"
            raise PlanError(f"{source}: {missing}: missing (alpha and beta go together)")
        if alpha is None and not fits:
            raise PlanError(f"{source}: alpha: missing (give alpha and beta, or fits)")
        return cls(alpha, beta, gamma, algorithm, fits, source)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        if self.alpha is not None:
            d.update(alpha=self.alpha, beta=self.beta, gamma=self.gamma)
        d["algorithm"] = self.algorithm
        if self.fits:
            d["fits"] = {str(n): c.to_dict() for n, c in sorted(self.fits.items())}
            for fit in d["fits"].values():
                fit.pop("nodes", None)
                fit.pop("origin", None)
        return d


def load_network(path: str | Path) -> Network:
    """Read and validate a network JSON file (errors name the file and the field)."""
    return Network.from_dict(read_json(path), source=str(path))


def canonical_cost_model(name: str | None) -> str:
    """One of COST_MODELS (None: the default); PlanError naming the choices otherwise."""
    key = DEFAULT_COST_MODEL if name is None else str(name).strip().lower()
    if key not in COST_MODELS:
        raise PlanError(f"cost model: unknown form {name!r} (choose from "
                        f"{', '.join(COST_MODELS)})")
    return key


def cost_for(network: Network | None, nodes: int, use_formula: bool = False, *,
             a: float | None = None, b: float | None = None,
             model: str | None = None) -> CostModel:
    """T_ar for `nodes` workers: the measured fit for that N if the network lists one (unless
    `use_formula`), otherwise the algorithm's formula from alpha, beta and gamma.

    `model` (COST_MODELS; default "piecewise") is the form: "piecewise" uses the fit's
    measured `times` where it has them, "paper" only its line a + b*M. `a` and/or `b` (the
    command line's --a/--b) override what the network gives and make it a line; with both,
    `network` may be None."""
    source = network.source if network is not None else "cost"
    nodes = as_int(nodes, source, "nodes", minimum=1)
    model = canonical_cost_model(model)
    if a is not None:
        a = as_float(a, "--a", "a")
    if b is not None:
        b = as_float(b, "--b", "b")
    if a is not None and b is not None:
        return CostModel(a, b, nodes=nodes, origin="--a/--b")
    if network is None:
        raise PlanError("cost: need a network description, or both --a and --b")
    if not use_formula and nodes in network.fits:
        base = network.fits[nodes]
        origin = "fit"
    elif network.alpha is None:
        listed = ", ".join(str(n) for n in sorted(network.fits))
        why = "use_formula asked for" if use_formula else f"fits list only N = {listed}"
        raise PlanError(f"{network.source}: alpha: missing, needed for the formula at "
                        f"N={nodes} ({why})")
    else:
        fa, fb = formula(network.algorithm, nodes, network.alpha, network.beta, network.gamma)
        base = CostModel(fa, fb)
        origin = f"{network.algorithm} formula"
    times = base.times if model == "piecewise" and a is None and b is None else ()
    if a is not None or b is not None:
        origin += " with --a" if a is not None else " with --b"
    elif base.times and not times:
        origin += ", its line a + b*M (paper)"
    return CostModel(base.a if a is None else a, base.b if b is None else b, nodes=nodes,
                     origin=origin, interference=base.interference,
                     comm_slowdown=base.comm_slowdown, times=times)


def fit_linear(sizes: Sequence[float], times: Sequence[float],
               weights: Sequence[float] | None = None) -> tuple[CostModel, float]:
    """Least-squares fit of times = a + b*sizes (bytes, seconds): returns (CostModel(a, b), rms)
    with rms the root-mean-square residual in seconds (unweighted).

    `weights` (default all 1) weigh each point's squared residual: `fit_relative` passes
    1/t^2 so that the relative error is what is minimised. A negative a or b, which noise can
    produce, is replaced by the constrained optimum (the best fit with that coefficient at 0),
    as non-negative least squares gives: a cost model never has negative terms. Needs at least
    two distinct sizes."""
    xs = [float(x) for x in sizes]
    ys = [float(y) for y in times]
    if len(xs) != len(ys):
        raise PlanError(f"fit_linear: {len(xs)} sizes but {len(ys)} times")
    n = len(xs)
    if n == 0:
        raise PlanError("fit_linear: no points")
    ws = [1.0] * n if weights is None else [float(w) for w in weights]
    if len(ws) != n or not all(math.isfinite(w) and w > 0 for w in ws):
        raise PlanError(f"fit_linear: need {n} positive finite weights")
    sw = math.fsum(ws)
    mx = math.fsum(w * x for w, x in zip(ws, xs)) / sw
    my = math.fsum(w * y for w, y in zip(ws, ys)) / sw
    sxx = math.fsum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    sxy = math.fsum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys))
    if not sxx > 0:
        raise PlanError("fit_linear: need at least two distinct message sizes")
    b = sxy / sxx
    a = my - b * mx
    if a < 0 or b < 0:
        candidates = []
        x2 = math.fsum(w * x * x for w, x in zip(ws, xs))
        if x2 > 0:  # a = 0
            bb = max(0.0, math.fsum(w * x * y for w, x, y in zip(ws, xs, ys)) / x2)
            candidates.append((0.0, bb))
        candidates.append((max(0.0, my), 0.0))  # b = 0
        a, b = min(candidates, key=lambda ab: math.fsum(
            w * (y - ab[0] - ab[1] * x) ** 2 for w, x, y in zip(ws, xs, ys)))
    rms = math.sqrt(math.fsum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / n)
    return CostModel(a, b, origin="fit"), rms


def fit_relative(sizes: Sequence[float], times: Sequence[float]) -> tuple[CostModel, float]:
    """The fit of times = a + b*sizes that minimises the squared RELATIVE error (weights
    1/t^2), so that a microsecond-long small message counts as much as a 100 ms large one;
    returns (CostModel, worst relative error |fit - t| / t over the points)."""
    ys = [float(y) for y in times]
    if any(not y > 0 for y in ys):
        raise PlanError("fit_relative: every time must be > 0")
    fit, _ = fit_linear(sizes, ys, [1.0 / (y * y) for y in ys])
    worst = max(abs(fit.time(x) - y) / y for x, y in zip(sizes, ys))
    return fit, worst

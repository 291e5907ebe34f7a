"""Draw a measured trace as the paper's Figures 2-4: per rank, a compute row and a
communication row on one time axis (matplotlib, Agg backend).

Compute row: forward of each layer (light), backward (dark), the wait for the last gradients
(hatched), each bar named after its layer where the name fits. Communication row: one bar per
all-reduce, named after the layers it carries. A dashed line marks the end of backward (the
last gradient ready) on each rank. The legend sits below the plot, where it hides no bar.

By default the drawn iteration is a typical one of the final plan: among rank 0's traced
iterations that all-reduced the plan's groups (the plan in the trace's metadata), the one of
median duration; the first ones of a run profile and warm up, and the last may hold
end-of-run work, so neither the first nor the last is typical.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CommError, PlanError
from ..model.plan import Plan

__all__ = ["iteration_window", "plot_timeline", "scheme_of", "timeline_figure",
           "typical_iteration"]

_COLORS = {"forward": "#9ecae1", "backward": "#3182bd", "allreduce": "#e6550d",
           "unpack": "#fdae6b", "wait": "#d9d9d9"}
_LABELS = {"forward": "forward (a layer)", "backward": "backward (a layer)",
           "allreduce": "all-reduce (its layers)", "unpack": "average / copy back",
           "wait": "wait for the reduced gradients"}
_CHAR = 0.0055  # a 6-point character's width, as a fraction of the axis (12-inch figure)


def _pyplot():
    import matplotlib  # noqa: PLC0415 - plotting is optional and slow to import

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def scheme_of(doc: dict) -> str:
    """The trace's scheme under today's name (a plan of the old format names it the old way;
    its metadata's plan says which)."""
    meta = doc.get("metadata", {})
    plan = meta.get("plan")
    if plan:
        try:
            return Plan.from_dict(plan, source="the trace's plan").scheme
        except PlanError:
            pass
    return str(meta.get("scheme") or meta.get("comm") or "")


def _iterations(doc: dict, rank: int) -> dict[int, dict]:
    return {e["args"]["iter"]: e for e in doc["traceEvents"]
            if e.get("cat") == "iteration" and e.get("ph") == "X" and e.get("pid") == rank}


def typical_iteration(doc: dict, rank: int | None = None) -> tuple[int, str]:
    """(iteration, why): the median-duration iteration among those of `rank` (default: 0,
    else the lowest traced) that all-reduced the final plan's groups (all traced iterations
    but the first when the trace has no plan, or none ran it)."""
    rank = _first_rank(doc) if rank is None else rank
    its = _iterations(doc, rank)
    if not its:
        raise CommError("trace has no iteration events (was it written by --timeline?)")
    groups = (doc.get("metadata", {}).get("plan") or {}).get("groups")
    candidates, why = sorted(its), "traced iterations"
    if groups:
        sent: dict[int, list] = {}
        for e in doc["traceEvents"]:
            if e.get("cat") == "allreduce" and e.get("pid") == rank and e.get("ph") == "X":
                sent.setdefault(e["args"]["iter"], []).append(e["args"].get("layers"))
        planned = [it for it in candidates if sent.get(it) == groups]
        if planned:
            candidates, why = planned, "iterations of the final plan"
    if len(candidates) > 1 and why == "traced iterations":
        candidates = candidates[1:]  # the first traced one warms up
    ranked = sorted(candidates, key=lambda it: (its[it]["dur"], it))
    median = ranked[(len(ranked) - 1) // 2]
    return median, (f"median of {len(ranked)} {why}, "
                    f"{its[median]['dur'] / 1e3:.2f} ms")


def iteration_window(doc: dict, iteration: int | None = None, count: int = 1
                     ) -> tuple[int, int]:
    """The solver iterations [first, last] to draw: from `iteration` (default: the typical
    one, `typical_iteration`), `count` of them."""
    its = sorted({e["args"]["iter"] for e in doc["traceEvents"]
                  if e.get("cat") == "iteration" and e.get("ph") == "X"})
    if not its:
        raise CommError("trace has no iteration events (was it written by --timeline?)")
    if iteration is None:
        first = typical_iteration(doc)[0]
    elif iteration in its:
        first = iteration
    else:
        raise CommError(f"iteration {iteration} is not in the trace (it holds "
                        f"{_ranges(its)})")
    return first, first + count - 1


def _first_rank(doc: dict) -> int:
    """The rank to pick the typical iteration on: 0 when traced, else the lowest."""
    ranks = sorted({e["pid"] for e in doc["traceEvents"] if e.get("cat") == "iteration"})
    return 0 if 0 in ranks or not ranks else ranks[0]


def _ranges(its: list[int]) -> str:
    """`3..7, 10` for [3, 4, 5, 6, 7, 10]: what a windowed trace holds."""
    out, start = [], its[0]
    for a, b in zip(its, its[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}..{a}")
            start = b
    return ", ".join(out)


def _bar_label(e: dict) -> str | None:
    cat = e["cat"]
    if cat in ("forward", "backward"):
        return e["name"]
    if cat == "allreduce":
        layers = e["args"].get("layers") or []
        if len(layers) == 1:
            return layers[0]
        if layers:
            return "+".join(layers)
        return e["name"]
    return None


def _fit(label: str, width: float, span: float) -> str | None:
    """The label if it fits in `width` (a bar's share of `span`), else a shorter form."""
    room = int(width / span / _CHAR)
    if len(label) <= room:
        return label
    if "+" in label:
        parts = label.split("+")
        short = f"{parts[0]}..{parts[-1]} ({len(parts)})"
        if len(short) <= room:
            return short
        short = f"{len(parts)} layers"
        if len(short) <= room:
            return short
    return None


def timeline_figure(doc: dict, iteration: int | None = None, count: int = 1,
                    title: str | None = None) -> tuple[Any, dict]:
    """The figure of iterations [iteration, iteration+count) and what it shows:
    {"first", "last", "why", "legend"} (the legend's artist, for checks)."""
    first, last = iteration_window(doc, iteration, count)
    why = typical_iteration(doc)[1] if iteration is None else "as asked"
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"
              and first <= e.get("args", {}).get("iter", -1) <= last]
    ranks = sorted({e["pid"] for e in events})
    starts = [e["ts"] for e in events if e.get("cat") == "iteration"]
    t0 = min(starts) if starts else min(e["ts"] for e in events)
    span = max((e["ts"] + e["dur"] - t0) / 1e3 for e in events) or 1.0
    plt = _pyplot()
    height = 0.8 + 0.9 * len(ranks)
    fig, ax = plt.subplots(figsize=(12, height + 1.2))
    yticks, ylabels = [], []
    for i, rank in enumerate(ranks):
        base = (len(ranks) - 1 - i) * 2.4
        rows = {0: base + 1.2, 1: base}  # compute above communication
        yticks += [rows[0] + 0.4, rows[1] + 0.4]
        ylabels += [f"rank {rank} compute", f"rank {rank} comm"]
        last_grad: dict[int, float] = {}  # iteration -> end of its last backward
        for e in events:
            if e["pid"] != rank or e.get("cat") not in _COLORS:
                continue
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            cat = e["cat"]
            ax.broken_barh([(x, w)], (rows[e["tid"]], 0.8), facecolors=_COLORS[cat],
                           edgecolors="black", linewidth=0.3,
                           hatch="//" if cat == "wait" else None)
            if cat == "backward":
                it = e["args"]["iter"]
                last_grad[it] = max(last_grad.get(it, 0.0), x + w)
            label = _bar_label(e)
            text = _fit(label, w, span) if label else None
            if text:
                ax.text(x + w / 2, rows[e["tid"]] + 0.4, text, ha="center", va="center",
                        fontsize=6, clip_on=True,
                        color="white" if cat in ("backward", "allreduce") else "black")
        for x in last_grad.values():
            ax.vlines(x, base - 0.1, base + 2.1, linestyles="dashed", colors="gray",
                      linewidth=0.8)
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("time from the start of the iteration (ms)")
    meta = doc.get("metadata", {})
    if title is None:
        scheme = scheme_of(doc)
        title = f"{scheme}: iteration {first}" + (f"..{last}" if last > first else "")
        title += f" ({why})"
        if meta.get("predicted_iteration_s"):
            title += f"; predicted {meta['predicted_iteration_s'] * 1e3:.1f} ms"
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black",
                             hatch="//" if k == "wait" else None) for k, c in _COLORS.items()]
    handles.append(plt.Line2D([0], [0], color="gray", linestyle="dashed", linewidth=0.8))
    labels = [*(_LABELS[k] for k in _COLORS), "end of backward"]
    # below the axes, outside them: it covers no bar of any rank
    legend = ax.legend(handles, labels, loc="upper center",
                       bbox_to_anchor=(0.5, -0.1 - 0.25 / height), fontsize=7, ncol=3,
                       frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig, {"first": first, "last": last, "why": why, "legend": legend, "axes": ax}


def plot_timeline(doc: dict, out: str | Path, iteration: int | None = None,
                  count: int = 1, title: str | None = None) -> Path:
    """Write the figure of iterations [iteration, iteration+count) to `out` (default: the
    typical iteration of the final plan)."""
    fig, _ = timeline_figure(doc, iteration, count, title)
    plt = _pyplot()
    path = Path(out)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise CommError(f"{path}: cannot write the timeline: {exc}") from None
    finally:
        plt.close(fig)
    return path

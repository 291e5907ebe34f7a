"""Draw a measured trace as the paper's Figures 2-4: per rank, a compute row and a
communication row on one time axis (matplotlib, Agg backend).

Compute row: forward of each layer (light), backward (dark), the wait for the last
gradients (hatched). Communication row: one bar per all-reduce, labelled with its group.
A dashed line marks the end of backward (the last gradient ready) on each rank.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import CommError

__all__ = ["iteration_window", "plot_timeline"]

_COLORS = {"forward": "#9ecae1", "backward": "#3182bd", "allreduce": "#e6550d",
           "unpack": "#fdae6b", "wait": "#d9d9d9"}


def _pyplot():
    import matplotlib  # noqa: PLC0415 - plotting is optional and slow to import

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def iteration_window(doc: dict, iteration: int | None = None, count: int = 1) -> tuple[int, int]:
    """The solver iterations [first, last] to draw: by default the last `count` traced
    (the final ones run the final plan; the first ones may be profiling)."""
    its = sorted({e["args"]["iter"] for e in doc["traceEvents"]
                  if e.get("cat") == "iteration" and e.get("ph") == "X"})
    if not its:
        raise CommError("trace has no iteration events (was it written by --timeline?)")
    if iteration is None:
        first = its[max(0, len(its) - count)]
    elif iteration in its:
        first = iteration
    else:
        raise CommError(f"iteration {iteration} is not in the trace (it has {its[0]}..{its[-1]})")
    return first, first + count - 1


def plot_timeline(doc: dict, out: str | Path, iteration: int | None = None,
                  count: int = 1, title: str | None = None) -> Path:
    """Write the figure of iterations [iteration, iteration+count) to `out`."""
    first, last = iteration_window(doc, iteration, count)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"
              and first <= e.get("args", {}).get("iter", -1) <= last]
    ranks = sorted({e["pid"] for e in events})
    starts = [e["ts"] for e in events if e.get("cat") == "iteration"]
    t0 = min(starts) if starts else min(e["ts"] for e in events)
    plt = _pyplot()
    height = 0.8 + 0.9 * len(ranks)
    fig, ax = plt.subplots(figsize=(12, height + 0.8))
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
            label = e["args"].get("group") if cat == "allreduce" else None
            if label is not None and w > 0:
                ax.text(x + w / 2, rows[1] + 0.4, f"g{label}", ha="center", va="center",
                        fontsize=7, clip_on=True)
        for x in last_grad.values():
            ax.vlines(x, base - 0.1, base + 2.1, linestyles="dashed", colors="gray",
                      linewidth=0.8)
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_xlabel("time from the start of the iteration (ms)")
    meta = doc.get("metadata", {})
    if title is None:
        scheme = meta.get("scheme") or meta.get("comm") or ""
        title = f"{scheme}: iteration {first}" + (f"..{last}" if last > first else "")
        if meta.get("predicted_iteration_s"):
            title += f" (predicted {meta['predicted_iteration_s'] * 1e3:.1f} ms)"
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black",
                             hatch="//" if k == "wait" else None) for k, c in _COLORS.items()]
    ax.legend(handles, list(_COLORS), loc="upper right", fontsize=7, ncol=len(_COLORS))
    ax.grid(axis="x", alpha=0.3)
    path = Path(out)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise CommError(f"{path}: cannot write the timeline: {exc}") from None
    finally:
        plt.close(fig)
    return path

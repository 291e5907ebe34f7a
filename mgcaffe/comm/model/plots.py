"""Plots of planner and simulator output (matplotlib, Agg backend: no display needed).

- `scaling_plot`: weak-scaling speed-up and efficiency of every scheme against N, like the
  paper's Figure 9.
- `gantt_chart`: one iteration's per-layer compute and per-message communication of each
  scheme on a shared time axis, like the paper's Figures 2-4; for a scheme that updates layer
  by layer (given its `timeline.Cycle`), the forward with its waits and updates, and the next
  iteration's forward beside the messages still under way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ...errors import PlanError
from .plan import Plan
from .schemes import SCHEMES, scheme_named
from .simulate import Scaling
from .timeline import Cycle

__all__ = ["gantt_chart", "label", "scaling_plot"]

# colours and markers by the scheme's place in the registry, so that a scheme keeps its
# colour whichever subset is drawn, and a newly registered one gets the next
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan")
_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*", "h")


def _style(scheme: str) -> tuple[str, str]:
    i = SCHEMES.index(scheme) if scheme in SCHEMES else len(SCHEMES)
    return _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]


def label(scheme: str, plan_or_scaling=None) -> str:
    """A scheme's label in pictures: its name (the --comm value), with the bucket size for a
    scheme that takes one."""
    bucket = getattr(plan_or_scaling, "bucket_bytes", None)
    if scheme in SCHEMES and scheme_named(scheme).bucket and bucket is not None:
        return f"{scheme} ({bucket / 2**20:g} MiB buckets)"
    return scheme


def _pyplot():
    import matplotlib  # noqa: PLC0415 - plotting is optional and slow to import

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save(fig, path: str | Path, plt) -> Path:
    path = Path(path)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: cannot write the plot: {exc}") from None
    finally:
        plt.close(fig)
    return path


def scaling_plot(scaling: Scaling, path: str | Path, title: str | None = None) -> Path:
    """Speed-up (left, with the linear ideal) and efficiency (right) of every scheme vs N."""
    plt = _pyplot()
    nodes = [p.nodes for p in scaling.points]
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    ax_s.plot(nodes, nodes, color="0.6", linestyle="--", label="linear")
    for s in scaling.schemes:
        color, marker = _style(s)
        ax_s.plot(nodes, [p.schemes[s].speedup for p in scaling.points], marker=marker,
                  color=color, label=label(s, scaling))
        ax_e.plot(nodes, [100 * p.schemes[s].efficiency for p in scaling.points],
                  marker=marker, color=color, label=label(s, scaling))
    for ax in (ax_s, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes)
        ax.set_xticklabels([str(n) for n in nodes])
        ax.set_xlabel("nodes N")
        ax.grid(True, alpha=0.3)
    ax_s.set_ylabel("speed-up over one node (weak scaling)")
    ax_e.set_ylabel("scaling efficiency (%)")
    ax_e.set_ylim(0, 105)
    ax_s.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or f"{scaling.model}: weak scaling ({scaling.network})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, plt)


def _forward_lane(ax, plan: Plan, cycle: Cycle | None, ms: float) -> None:
    """The compute lane's forward: one block, or (a per-layer cycle) this iteration's forward
    layer by layer with its updates (dark) and the gaps where a layer waits for its gradients,
    then the next iteration's the same way, one iteration later (hatched)."""
    if cycle is None:
        ax.broken_barh([(0, plan.forward_time * ms)], (10, 8), facecolors="0.75")
        if plan.forward_time > 0.05 * plan.iteration_time:
            ax.text(plan.forward_time * ms / 2, 14, "forward", ha="center", va="center",
                    fontsize=7)
        return
    period = cycle.iteration_time
    for shift, hatch in ((-period, None), (0.0, "////")):
        spans = [((cycle.prefix[0] + shift) * ms, (cycle.prefix[1] - cycle.prefix[0]) * ms)]
        spans += [((s + shift) * ms, (e - s) * ms)
                  for s, e in zip(cycle.forward_start, cycle.forward_end)]
        ax.broken_barh(spans, (10, 8), facecolors="0.75", edgecolor="0.55" if hatch else "none",
                       hatch=hatch, linewidth=0)
        updates = [((s + shift) * ms, (e - s) * ms)
                   for s, e in zip(cycle.update_start, cycle.update_end) if e > s]
        if updates:
            ax.broken_barh(updates, (10, 8), facecolors="0.35", edgecolor="none")
    ax.text(period * ms, 19.5, "next forward", ha="left", va="bottom", fontsize=7)


def gantt_chart(plans: Mapping[str, Plan], path: str | Path, title: str | None = None,
                cycles: Mapping[str, Cycle] | None = None) -> Path:
    """For each plan, a compute lane (forward, then each layer's backward, output side first)
    and a communication lane (each message, labelled with its layer count when merged).
    `cycles`: per scheme that updates layer by layer, its steady-state `timeline.Cycle`, to
    draw its forward's waits and updates and the next forward beside the messages."""
    if not plans:
        raise PlanError("gantt: no plan to draw")
    cycles = cycles or {}
    plt = _pyplot()
    items = list(plans.items())
    fig, axes = plt.subplots(len(items), 1, figsize=(11, 1.25 * len(items) + 0.8),
                             sharex=True, squeeze=False)
    ends = [p.iteration_time for _, p in items]
    ends += [max(max(c.forward_end, default=0.0), max(c.comm_end, default=0.0))
             for c in cycles.values()]
    t_max = max(ends) * 1e3
    for ax, (scheme, plan) in zip(axes[:, 0], items):
        ms = 1e3
        _forward_lane(ax, plan, cycles.get(scheme), ms)
        bars = [((s * ms), (e - s) * ms) for s, e in zip(plan.backward_start, plan.backward_end)]
        bars.reverse()  # backward order
        ax.broken_barh(bars, (10, 8), facecolors=["tab:blue", "lightsteelblue"] * len(bars),
                       edgecolor="none")
        color = _style(scheme)[0]
        comm = [(s * ms, (e - s) * ms) for s, e in zip(plan.comm_start, plan.comm_end)]
        ax.broken_barh(comm, (0, 8), facecolors=color, edgecolor="white", linewidth=0.5)
        if scheme in cycles:  # the previous iteration's messages still under way at 0
            period = plan.iteration_time * ms
            tail = [(max(0.0, s - period), s + w - period - max(0.0, s - period))
                    for s, w in comm if s + w > period]
            ax.broken_barh(tail, (0, 8), facecolors=color, alpha=0.4, edgecolor="none")
        for (s, w), (g, _, _) in zip(comm, plan.messages):
            group = plan.groups[g]
            if len(group) > 1 and w > 0.04 * t_max:
                ax.text(s + w / 2, 4, str(len(group)), ha="center", va="center", fontsize=7,
                        color="white")
        ax.axvline(plan.ideal * ms, color="0.4", linestyle=":", linewidth=1)
        ax.axvline(plan.iteration_time * ms, color=color, linewidth=1)
        ax.set_yticks([4, 14])
        ax.set_yticklabels(["comm", "compute"], fontsize=8)
        ax.set_ylim(-1, 23 if scheme in cycles else 19)
        msgs = f"{plan.num_messages} message{'s' if plan.num_messages != 1 else ''}"
        ax.set_title(f"{label(scheme, plan)}: {msgs}, t_iter "
                     f"{plan.iteration_time * ms:.1f} ms (ideal {plan.ideal * ms:.1f} ms)",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time from the start of forward (ms)")
    axes[-1, 0].set_xlim(0, t_max * 1.02)
    first = items[0][1]
    nodes = f", N = {first.nodes}" if first.nodes else ""
    fig.suptitle(title or f"{first.model}{nodes}: a = {first.a * 1e6:.1f} us, "
                 f"b = {first.b * 1e9:.3g} ns/B", fontsize=10)
    fig.tight_layout()
    return _save(fig, path, plt)

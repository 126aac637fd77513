"""Figures for Chapter 4 and Lab 4: who ran when, and what latency a throughput costs.

- ``plot_timeline``: one row per batch slot, one bar per forward pass a request took part in
  (prefill, outlined in black; decode; padding in a static batch, grey and hatched), and a cross
  where a request was preempted; a legend says which is which. Built from the ``Iteration`` log
  of an engine run or a simulation.
- ``plot_latency_throughput``: for each policy, a latency percentile against the throughput
  reached at each offered load: the curve an operator reads a service's capacity from.
- ``plot_steady_state``: the same from steady states (``inferlab.sim.steady_state``): achieved
  against offered throughput, where each policy saturates, and the latency of the loads it
  sustains; an overloaded point is drawn hollow, at its longest trace, because its latency
  grows with the trace.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from inferlab.analysis.figures import legend_outside, plain_log_ticks


def _slots(iterations):
    """Give each running request a stable row (batch slot) for as long as it runs."""
    rows, free, placed = {}, [], []
    for it in iterations:
        order = list(dict.fromkeys(r.seq_id for r in it.rows))
        for sid in list(rows):
            if sid not in order:
                free.append(rows.pop(sid))
        free.sort()
        for sid in order:
            if sid not in rows:
                rows[sid] = free.pop(0) if free else len(rows) + len(free)
        placed.append(dict(rows))
    return placed


def plot_timeline(iterations, ax=None, title: str = "", time_unit: float = 1e-3,
                  unit_label: str = "ms", legend: bool = True):
    """Draw which request occupied which batch slot over time; returns the axes.

    Each request has its own colour. ``legend`` explains the bar styles beside the axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    colors = plt.get_cmap("tab20").colors
    placed = _slots(iterations)
    preempted = False
    for it, rows in zip(iterations, placed):
        t = it.start_s
        for f in it.forwards:
            for row in f.rows:
                style = dict(color=colors[row.seq_id % 20])
                if row.prefill:
                    style.update(edgecolor="black", linewidth=0.6)
                elif row.seq_id in it.padding_ids:
                    style = dict(color="lightgrey", hatch="///", edgecolor="grey", linewidth=0)
                ax.barh(rows[row.seq_id], f.seconds / time_unit, left=t / time_unit,
                        height=0.8, **style)
            t += f.seconds
        for sid in it.preempted:
            ax.plot(it.start_s / time_unit, rows.get(sid, 0), "kx", markersize=7)
            preempted = True
    slots = sorted({row for rows in placed for row in rows.values()})
    ax.set_yticks(slots)
    ax.set_xlabel(f"time ({unit_label})")
    ax.tick_params(labelbottom=True)   # keep the time labels under every panel of a shared axis
    ax.set_ylabel("batch slot")
    ax.invert_yaxis()
    if legend:
        handles = [Patch(facecolor="tab:blue", edgecolor="black", linewidth=0.6,
                         label="prefill (outlined)"),
                   Patch(facecolor="tab:blue", label="decode step"),
                   Patch(facecolor="lightgrey", hatch="///", edgecolor="grey", linewidth=0,
                         label="padding: row held, no token")]
        if preempted:
            handles.append(Line2D([], [], color="black", marker="x", linestyle="none",
                                  markersize=7, label="preempted"))
        legend_outside(ax, handles=handles, title="one colour per request",
                       title_fontsize="small")
    if title:
        ax.set_title(title)
    return ax


def plot_latency_throughput(curves: dict[str, list[tuple[float, float]]], ax=None,
                            metric: str = "p99 latency", unit: str = "s", title: str = "",
                            measured: dict[str, list[tuple[float, float]]] | None = None):
    """``curves[policy]`` = [(throughput tok/s, latency), ...] by offered load; returns the axes.

    ``measured`` adds points from real runs beside the simulated curves.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    styles = {"static": ("tab:red", "s"), "continuous": ("tab:blue", "o")}
    for policy, points in curves.items():
        color, marker = styles.get(policy, ("tab:grey", "^"))
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker=marker, color=color, label=f"{policy} (simulated)")
    for policy, points in (measured or {}).items():
        color, _ = styles.get(policy, ("tab:grey", "^"))
        xs, ys = zip(*points)
        ax.scatter(xs, ys, s=90, facecolors="none", edgecolors=color, linewidths=2,
                   label=f"{policy} (measured)", zorder=3)
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel(f"{metric} ({unit})")
    ax.set_yscale("log")
    plain_log_ticks(ax, "y")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax, fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def _style(policy):
    return {"static": ("tab:red", "s"), "continuous": ("tab:blue", "o")}.get(policy,
                                                                          ("tab:grey", "^"))


def plot_steady_state(states: dict, axes=None, metric: str = "p99", title: str = ""):
    """Two panels from ``states[policy]`` = [SteadyState, ...] by offered rate; returns the axes.

    Left: achieved against offered output tokens/s, the diagonal where the server keeps up, and
    each policy's saturation throughput (the mean of its overloaded points) as a dashed line.
    Right: the ``metric`` percentile of end-to-end latency against the offered rate; filled
    markers are steady states, hollow ones overloaded (the value at the longest trace, which a
    longer trace would raise) or not settled within the longest trace.
    """
    from matplotlib.lines import Line2D

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    left, right = axes
    top = max(st.window.offered_out_tok_s for ss in states.values() for st in ss)
    left.plot([0, top * 1.05], [0, top * 1.05], color="grey", lw=1, ls=":")
    handles = [Line2D([], [], color="grey", lw=1, ls=":", label="achieved = offered")]
    for policy, ss in states.items():
        color, marker = _style(policy)
        ok = [st for st in ss if st.stable]
        bad = [st for st in ss if not st.stable]
        for group, face in ((ok, color), (bad, "none")):
            if group:
                left.plot([st.window.offered_out_tok_s for st in group],
                          [st.window.achieved_out_tok_s for st in group], marker, ms=7,
                          color=color, markerfacecolor=face, ls="none")
                right.plot([st.rate for st in group],
                           [getattr(st.window.latency, metric) for st in group], marker, ms=7,
                           color=color, markerfacecolor=face, ls="none")
        left.plot([st.window.offered_out_tok_s for st in ss],
                  [st.window.achieved_out_tok_s for st in ss], color=color, lw=1)
        right.plot([st.rate for st in ok], [getattr(st.window.latency, metric) for st in ok],
                   color=color, lw=1)
        handles.append(Line2D([], [], color=color, marker=marker, ms=7, lw=1,
                              label=f"{policy}: steady state"))
        if bad:
            handles.append(Line2D([], [], color=color, marker=marker, ms=7, lw=0,
                                  markerfacecolor="none",
                                  label=f"{policy}: overloaded or not settled"))
        over = [st.window.achieved_out_tok_s for st in bad if st.status == "overloaded"]
        if over:
            cap = sum(over) / len(over)
            left.axhline(cap, color=color, ls="--", lw=1)
            handles.append(Line2D([], [], color=color, ls="--", lw=1,
                                  label=f"{policy}: saturates at {cap:,.0f} tok/s"))
    left.set(xlabel="offered load (output tokens/s)", ylabel="achieved (output tokens/s)",
             xlim=(0, top * 1.05), ylim=(0, top * 1.05))
    right.set(xlabel="offered load (requests/s)",
              ylabel=f"{metric} end-to-end latency (s)", yscale="log")
    plain_log_ticks(right, "y")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    if title:
        left.figure.suptitle(title, fontsize="medium")
    legend_outside(right, handles=handles)
    return axes

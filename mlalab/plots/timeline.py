"""The measured per-CTA time line of the sm_90 stage 1 (`mlalab.kernels.sm90.timeline`) as a Gantt chart: one row per
CTA (plan slot), time on x, each tile's life split into its phases, from recorded events (`mlalab.records.profiles`)
or `CtaTimeline.events()` directly; and the ablations: what the call would take if the tensor-core work were free."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..records.profiles import ablation_kind, check_ablations, timeline_events
from .palette import place_title

__all__ = ["PHASES", "cta_timeline_figure", "ablation_figure", "check_goal", "finish_ratio_figure"]


#: (name, from event, to event, colour): the segments drawn per tile. "from tile i" pairs with "to ... i", except
#: the wait, which runs from PV issue of tile i to the arrival of tile i + 1 (data or compute of the CTA's next tile).
PHASES = (
    ("header: plan row, first TMAs issued", "start", "issued", "#bbbbbb"),
    ("first tile in flight", "issued", "tile0", "#f2c14e"),
    ("scores (QK) + V", "tile", "qk_done", "#3b7dd8"),
    ("softmax, P, PV issued", "qk_done", "pv_issued", "#e4572e"),
    ("waiting for the next tile", "pv_issued", "next_tile", "#f2c14e"),
    ("last PV + epilogue (output stores)", "pv_issued", "work_done", "#2a9d8f"),
    # the epilogue of each CTA's last work in two parts (files recorded before these stamps draw it as one)
    ("last PV completes, softmax sum", "pv_issued", "lse_done", "#8ab17d"),
    ("normalise + output stores", "lse_done", "end", "#264653"),
)


def cta_timeline_figure(events: pd.DataFrame, batch: int, kv_len: int, *, title: str | None = None) -> go.Figure:
    """Gantt chart of one shape's stage-1 launch: y = CTA (plan slot), x = µs from the first CTA's start."""
    d = timeline_events(events, batch, kv_len)
    segs: dict[str, tuple[list[float | None], list[float | None]]] = {p[0]: ([], []) for p in PHASES}

    def seg(name: str, cta: int, t0: float, t1: float) -> None:
        xs, ys = segs[name]
        xs += [t0 / 1e3, t1 / 1e3, None]
        ys += [cta, cta, None]

    for cta, g in d.groupby("cta"):
        ev = {e: dict(zip(h["index"], h["t_ns"])) for e, h in g.groupby("event")}
        tiles = ev.get("tile", {})
        n = len(tiles)
        seg(PHASES[0][0], cta, ev["start"][0], ev["issued"][0])
        if n:
            seg(PHASES[1][0], cta, ev["issued"][0], tiles[0])
        for i in range(n):
            seg(PHASES[2][0], cta, tiles[i], ev["qk_done"][i])
            seg(PHASES[3][0], cta, ev["qk_done"][i], ev["pv_issued"][i])
            if i + 1 < n:
                seg(PHASES[4][0], cta, ev["pv_issued"][i], tiles[i + 1])
        if n and "lse_done" in ev:
            seg(PHASES[6][0], cta, ev["pv_issued"][n - 1], ev["lse_done"][0])
            seg(PHASES[7][0], cta, ev["lse_done"][0], ev["end"][0])
        elif n:
            seg(PHASES[5][0], cta, ev["pv_issued"][n - 1], ev["end"][0])
    fig = go.Figure()
    for name, _a, _b, colour in PHASES:
        xs, ys = segs[name]
        if xs:
            fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name=name, line={"color": colour, "width": 4}))
    done = d[d["event"] == "work_done"]
    fig.add_trace(go.Scattergl(x=done["t_ns"] / 1e3, y=done["cta"], mode="markers", name="work's output stored",
                               marker={"symbol": "line-ns-open", "size": 9, "color": "black"}))  # fmt: skip
    run = f" ({d['run'].iloc[0]})" if "run" in d.columns else ""
    fig.update_layout(
        title=title or f"stage 1 per CTA, B{batch} × L{kv_len}: measured on the H200{run}",
        xaxis_title="µs from the first CTA's start (one launch, not graph-timed)",
        yaxis_title="CTA (plan slot)",
        yaxis={"autorange": "reversed"},
        height=520,
        legend={"orientation": "h", "y": -0.2},
    )
    return place_title(fig)


def ablation_figure(profile: pd.DataFrame, goal: float | None = None, kind: str = "wgmma") -> go.Figure:
    """Per shape, our call's time over the base of ablation `kind` (`ABLATION_KINDS`: "wgmma" over FlashMLA fp8, "fp4"
    over our a8w8), as measured and with compute skipped (one process, `load_ablation_profile`); the legend gives
    each geomean, the dashed line the goal (default the kind's). Where even the last bar stays above the line, the
    compute it skips is not what keeps a shape from the goal."""
    if not isinstance(profile, pd.DataFrame):
        raise TypeError(f"profile must be a pandas DataFrame, got {type(profile).__name__}")
    k = ablation_kind(kind)
    goal = k.goal if goal is None else goal
    check_goal(goal)
    check_ablations(profile, "profile lacks columns", "profile must have rows, every time a positive number of µs",
                    kind)  # fmt: skip
    d = profile.sort_values(["L", "B"])
    shapes = [f"B{b}·L{n}" for b, n in zip(d["B"], d["L"])]
    fig = go.Figure()
    for col, label in (*k.bars, *((c, lab) for c, lab in k.extra if c in d.columns)):
        ratio = d[col] / d[k.base]
        geo = float(np.exp(np.log(ratio).mean()))
        hover = [f"{u:.2f} µs vs {k.base_label} {f:.2f} µs" for u, f in zip(d[col], d[k.base])]
        fig.add_trace(go.Bar(x=shapes, y=ratio, name=f"{label}: geomean {geo:.3f}×", hovertext=hover))
    gpu = str(d["gpu"].iloc[0]) if "gpu" in d.columns else "the H200"
    run = f" ({d['run'].iloc[0]})" if "run" in d.columns else ""
    fig = finish_ratio_figure(fig, goal, f"time / {k.base_label}, measured on {gpu} in one process{run}",
                              peer=k.base_label)  # fmt: skip
    return fig.update_layout(xaxis_title="shape (batch · kv_len)")


def check_goal(goal: object) -> None:
    """A goal on the geomean of time / a base time (FlashMLA fp8's, our a8w8's): a positive number."""
    if isinstance(goal, bool) or not (isinstance(goal, float | int) and goal > 0):
        raise ValueError(f"goal must be a positive ratio, got {goal!r}")


def finish_ratio_figure(fig: go.Figure, goal: float | None, title: str, peer: str = "FlashMLA fp8") -> go.Figure:
    """The common frame of the figures of per-shape bars of time / the peer's time (FlashMLA fp8 unless said;
    `ablation_figure`, `mlalab.plots.experiments.experiment_figure`): the goal as a dashed line (None: none), grouped
    bars, legend below."""
    if goal is not None:
        fig.add_hline(
            y=goal, line_dash="dash", annotation_text=f"goal {goal}× (geomean)", annotation_position="top left"
        )
    fig.update_layout(
        barmode="group",
        title=title,
        yaxis_title=f"× {peer}'s time (lower is faster)",
        height=440,
        legend={"orientation": "h", "y": -0.25},
    )
    return place_title(fig)

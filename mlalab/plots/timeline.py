"""The measured per-CTA timeline of the sm_90 stage 1 (`mlalab.splitkv.timeline`) as a Gantt chart: one row per CTA
(plan slot), time on x, each tile's life split into its phases. Reads the events that `scripts/profile_hopper.py`
records (data/profiles/*_timeline.csv: B, L, cta, event, index, t_ns) or `CtaTimeline.events()` directly; and the
same script's ablations (data/profiles/*_profile.csv with ``--ablations``): what the call would take if the tensor-core
work were free."""

from __future__ import annotations

import glob
import math
import os

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..io import natural_key

__all__ = [
    "PROFILE_DIR",
    "load_timelines",
    "timeline_summary",
    "cta_timeline_figure",
    "PHASES",
    "ABLATIONS",
    "load_ablation_profile",
    "ablation_figure",
    "check_goal",
    "finish_ratio_figure",
]

PROFILE_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "profiles"
)
_COLUMNS = ("B", "L", "cta", "event", "index", "t_ns")


def _name_order(path: str) -> tuple:
    """Newest last: file names in `natural_key` order (``s10`` after ``s9``)."""
    return natural_key(os.path.basename(path))


#: (name, from event, to event, colour): the segments drawn per tile. "from tile i" pairs with "to ... i", except
#: the wait, which runs from PV issue of tile i to the arrival of tile i + 1 (data or compute of the CTA's next tile).
PHASES = (
    ("header: plan row, first TMAs issued", "start", "issued", "#bbbbbb"),
    ("first tile in flight", "issued", "tile0", "#f2c14e"),
    ("scores (QK) + V", "tile", "qk_done", "#3b7dd8"),
    ("softmax, P, PV issued", "qk_done", "pv_issued", "#e4572e"),  # (and the refill, before run 9)
    ("waiting for the next tile", "pv_issued", "next_tile", "#f2c14e"),
    ("last PV + epilogue (output stores)", "pv_issued", "work_done", "#2a9d8f"),
    # recorded from 2026-12-03's second profile on: the epilogue of each CTA's last work in two parts
    ("last PV completes, softmax sum", "pv_issued", "lse_done", "#8ab17d"),
    ("normalise + output stores", "lse_done", "end", "#264653"),
)


def load_timelines(path: str | None = None) -> pd.DataFrame:
    """The newest ``*_timeline.csv`` in data/profiles (or `path`), with its file name in column ``run``."""
    if path is None:
        files = sorted(glob.glob(os.path.join(PROFILE_DIR, "*_timeline.csv")), key=_name_order)
        if not files:
            raise FileNotFoundError(f"no *_timeline.csv in {PROFILE_DIR} (record one with scripts/profile_hopper.py)")
        path = files[-1]
    df = pd.read_csv(path)
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path} is not a timeline events file: missing columns {missing}")
    return df.assign(run=os.path.basename(path))


def _shape(events: pd.DataFrame, batch: int, kv_len: int) -> pd.DataFrame:
    if not isinstance(events, pd.DataFrame):
        raise TypeError(f"events must be a pandas DataFrame, got {type(events).__name__}")
    missing = [c for c in _COLUMNS if c not in events.columns]
    if missing:
        raise ValueError(f"events lack columns {missing}")
    d = events[(events["B"] == batch) & (events["L"] == kv_len)]
    if d.empty:
        have = sorted({(int(b), int(n)) for b, n in zip(events["B"], events["L"])})
        raise ValueError(f"no timeline for B{batch} x L{kv_len}; recorded shapes: {have}")
    return d


#: `CtaTimeline.summary` key -> the label `timeline_summary` shows (in µs, but the CTA count); indented: parts of
#: the line above.
_SUMMARY_LABELS = {
    "ctas_busy": "ctas busy",
    "span_ns": "span",
    "header_ns": "header",
    "first_tile_ns": "first tile arrives",
    "tile_interval_ns": "per tile",
    "tile_qk_ns": "  scores (QK) + V",
    "tile_softmax_ns": "  softmax .. PV issued",
    "last_tile_to_end_ns": "last tile to end",
    "epilogue_pv_wait_ns": "  last PV completes",
    "epilogue_sum_ns": "  softmax sum",
    "epilogue_store_ns": "  normalise + stores",
    "end_spread_ns": "spread of the CTA ends",
}
_EPILOGUE_PARTS = ("epilogue_pv_wait_ns", "epilogue_sum_ns", "epilogue_store_ns")


def timeline_summary(events: pd.DataFrame, batch: int, kv_len: int) -> dict[str, float]:
    """Where stage 1's time goes at one shape (µs, medians over the CTAs that streamed tiles): the recorded events
    rebuilt into a `CtaTimeline` and summarised by its `summary` (one definition for live and recorded launches).
    The epilogue's parts are left out for files recorded before those stamps."""
    from ..splitkv.timeline import CtaTimeline

    s = CtaTimeline.from_events(_shape(events, batch, kv_len)).summary()
    return {
        label: s[k] if k == "ctas_busy" else s[k] / 1e3
        for k, label in _SUMMARY_LABELS.items()
        if not (k in _EPILOGUE_PARTS and math.isnan(s[k]))
    }


def cta_timeline_figure(events: pd.DataFrame, batch: int, kv_len: int, *, title: str | None = None) -> go.Figure:
    """Gantt chart of one shape's stage-1 launch: y = CTA (plan slot), x = µs from the first CTA's start."""
    d = _shape(events, batch, kv_len)
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
    return fig


#: (column of a ``scripts/profile_hopper.py --ablations`` file, label): the whole call as measured and with compute
#: skipped (`KernelConfig.hopper_ablate`: the outputs are wrong; only the time means something).
ABLATIONS = (
    ("full_us", "our decode (a8w8)"),
    ("full_no_qk_us", "… with the score wgmma skipped"),
    ("full_no_qk_pv_us", "… with both wgmmas skipped"),
)

#: what an ablation profile must hold: the shape, FlashMLA fp8's µs and the `ABLATIONS` columns
_ABLATION_COLUMNS = ("B", "L", "flashmla_us", *(c for c, _ in ABLATIONS))


def _check_ablations(df: pd.DataFrame, missing_msg: str, times_msg: str) -> None:
    missing = [c for c in _ABLATION_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{missing_msg} {missing} (scripts/profile_hopper.py --ablations)")
    if df.empty or not (df[list(_ABLATION_COLUMNS[2:])] > 0).all().all():
        raise ValueError(times_msg)


def load_ablation_profile(path: str | None = None) -> pd.DataFrame:
    """The newest ``*_profile.csv`` in data/profiles that has the ablation columns (newest = last in name order,
    numbers by value, as the files are named ``<device>_<date>[session]_profile.csv``; or `path`), with its file name
    in column ``run``: per shape (``B``, ``L``) FlashMLA fp8's µs (``flashmla_us``) and the `ABLATIONS` columns."""
    if path is None:
        files = sorted(glob.glob(os.path.join(PROFILE_DIR, "*_profile.csv")), key=_name_order)
        files = [f for f in files if set(_ABLATION_COLUMNS) <= set(pd.read_csv(f, nrows=0).columns)]
        if not files:
            raise FileNotFoundError(f"no *_profile.csv with ablations in {PROFILE_DIR} (record one with "
                                    "scripts/profile_hopper.py --ablations --out-dir)")  # fmt: skip
        path = files[-1]
    df = pd.read_csv(path)
    _check_ablations(df, f"{path} has no ablation columns", f"{path}: every time must be a positive number of µs")
    return df.assign(run=os.path.basename(path))


def ablation_figure(profile: pd.DataFrame, goal: float = 0.65) -> go.Figure:
    """Per shape, our call's time over FlashMLA fp8's, as measured and with the tensor-core work skipped (one process,
    `load_ablation_profile`); the legend gives each geomean, the dashed line the goal. Where even "both wgmmas
    skipped" stays above the line, the matrix products are not what keeps a shape from the goal."""
    if not isinstance(profile, pd.DataFrame):
        raise TypeError(f"profile must be a pandas DataFrame, got {type(profile).__name__}")
    check_goal(goal)
    _check_ablations(profile, "profile lacks columns", "profile must have rows, every time a positive number of µs")
    d = profile.sort_values(["L", "B"])
    shapes = [f"B{b}·L{n}" for b, n in zip(d["B"], d["L"])]
    fig = go.Figure()
    for col, label in ABLATIONS:
        ratio = d[col] / d["flashmla_us"]
        geo = float(np.exp(np.log(ratio).mean()))
        hover = [f"{u:.2f} µs vs FlashMLA fp8 {f:.2f} µs" for u, f in zip(d[col], d["flashmla_us"])]
        fig.add_trace(go.Bar(x=shapes, y=ratio, name=f"{label}: geomean {geo:.3f}×", hovertext=hover))
    run = f" ({d['run'].iloc[0]})" if "run" in d.columns else ""
    return finish_ratio_figure(fig, goal, f"time / FlashMLA fp8, measured on the H200 in one process{run}")


def check_goal(goal: object) -> None:
    """A goal on the geomean of time / FlashMLA fp8: a positive number."""
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
    return fig

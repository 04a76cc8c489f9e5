"""Figures of recorded decode timings (`mlalab.records.timings` views of data/timings/*.csv): bars per shape,
achieved bandwidth against the copy bandwidth, a roofline, and the plan behind a recorded Triton time (its work map
and per-CU load, rebuilt from the planner name and plan slots in the record). Each builder returns a go.Figure."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..config import DecodeCase
from ..plan import WorkPlan
from ..records.timings import PRE_ONE_WAVE_RUNS, RecordedView, as_view, plan_check, series_rows
from ..traffic import decode_traffic
from .palette import PRECISION_DASH, PRECISION_PATTERN, color_for, place_title
from .splitkv import cu_load_figure, work_map_figure

__all__ = ["BF16_MATMUL_ROOF_TFLOPS", "ROOF_SOURCE", "bars_per_shape", "bandwidth_figure", "roofline_figure",
           "plan_time_facts", "plan_time_figures"]  # fmt: skip

#: The compute roof of the roofline: a dense bf16 matmul, not a datasheet peak. An 8192x8192x8192 bf16 matrix product
#: through PyTorch measured 769 to 798 TFLOP/s on random data on the H200 we time on (the device's notes).
BF16_MATMUL_ROOF_TFLOPS = 790.0
ROOF_SOURCE = (
    "bf16 dense matmul roof, 790 TFLOP/s: an 8192³ bf16 matmul through PyTorch measured 769–798 TFLOP/s on random "
    "data on this H200"
)


def _label(d: pd.DataFrame) -> list[str]:
    return [f"B{b}·L{l}" for b, l in zip(d["batch"], d["kv_len"])]


def _name(view: RecordedView, d: pd.DataFrame, be: str, prec: str) -> str:
    return f"{be} {prec}" + (f" (best of ≤{int(d['n_candidates'].max())})" if view.best_of_all else "")


def _bar_style(be: str, prec: str) -> dict[str, Any]:
    """A backend's palette colour, its precision as the pattern (a8w8 plain)."""
    return {"color": color_for("backend", be), "pattern_shape": PRECISION_PATTERN.get(prec, "x")}


def _line_style(be: str, prec: str) -> dict[str, Any]:
    return {"color": color_for("backend", be), "dash": PRECISION_DASH.get(prec, "dashdot")}


def _files_note(view: RecordedView) -> str:
    return f"files: {', '.join(view.files)}"


def bars_per_shape(
    df: pd.DataFrame | RecordedView, series: list[tuple[str, str]], planner: str | None = None, *,
    best_of_all: bool = False, run: str | None = None,
) -> go.Figure:  # fmt: skip
    """Grouped bars of µs per call, one group per shape, one bar per (backend, precision); floor as markers. The
    rows come from `recorded_view` (one run by default); hover shows each bar's run · planner · config."""
    view = as_view(df, best_of_all, run, planner)
    fig = go.Figure()
    for be, prec in series:
        d = series_rows(view, be, prec)
        fig.add_bar(x=_label(d), y=d["us_median"], name=_name(view, d, be, prec), hovertext=d["source"],
                    marker=_bar_style(be, prec), error_y={"type": "data", "array": d["us_iqr"] / 2})  # fmt: skip
    if series:
        d = series_rows(view, *series[0])
        fig.add_scatter(x=_label(d), y=d["floor_us"], mode="markers", name=f"floor ({series[0][1]} bytes)",
                        marker={"color": "black", "symbol": "line-ew-open", "size": 14})  # fmt: skip
    title = f"Decode time per shape — {view.short}<br><sub>{_files_note(view)}</sub>"
    fig.update_layout(barmode="group", yaxis_title="µs per call (median, IQR bars)",
                      xaxis_title="shape (batch · KV tokens per request)",
                      yaxis_type="log", title=title)  # fmt: skip
    return place_title(fig)


def bandwidth_figure(
    df: pd.DataFrame | RecordedView, series: list[tuple[str, str]], planner: str | None = None, *,
    best_of_all: bool = False, run: str | None = None,
) -> go.Figure:  # fmt: skip
    """Achieved TB/s per shape with the copy bandwidth measured in the same run(s) as the ceiling."""
    view = as_view(df, best_of_all, run, planner)
    fig = go.Figure()
    for be, prec in series:
        d = series_rows(view, be, prec)
        fig.add_scatter(x=_label(d), y=d["tbps"], mode="lines+markers", name=_name(view, d, be, prec),
                        hovertext=d["source"], line=_line_style(be, prec))  # fmt: skip
    bw = float(view.rows["copy_tbps"].median())
    fig.add_hline(y=bw, line_dash="dash", annotation_text=f"copy {bw:.2f} TB/s (median over {len(view.files)} run(s))")
    fig.update_layout(yaxis_title="achieved bandwidth, TB/s (bytes counted once)",
                      xaxis_title="shape (batch · KV tokens per request)",
                      title=f"Bandwidth — {view.short}<br><sub>{_files_note(view)}</sub>")  # fmt: skip
    return place_title(fig)


def roofline_figure(
    df: pd.DataFrame | RecordedView, series: list[tuple[str, str]], peak_tflops: float = BF16_MATMUL_ROOF_TFLOPS, *,
    best_of_all: bool = False, run: str | None = None, planner: str | None = None,
) -> go.Figure:  # fmt: skip
    """Achieved TFLOP/s vs arithmetic intensity (FLOP/B, both from `mlalab.traffic.decode_traffic`) under the
    copy-bandwidth roof of the run and the bf16 dense-matmul roof (`ROOF_SOURCE`)."""
    if not (isinstance(peak_tflops, (int, float)) and not isinstance(peak_tflops, bool) and peak_tflops > 0):
        raise ValueError(f"peak_tflops must be a positive number, got {peak_tflops!r}")
    view = as_view(df, best_of_all, run, planner)
    fig = go.Figure()
    bw = float(view.rows["copy_tbps"].median())
    xs = [1, 10, 30, 60, 100, 300, 1000]
    roof = f"roof: copy {bw:.2f} TB/s, then {ROOF_SOURCE}" if peak_tflops == BF16_MATMUL_ROOF_TFLOPS else (
        f"roof: copy {bw:.2f} TB/s, then {peak_tflops:g} TFLOP/s (given)")  # fmt: skip
    fig.add_scatter(x=xs, y=[min(peak_tflops, bw * x) for x in xs], mode="lines", name="roof", line_dash="dash",
                    hovertext=[roof] * len(xs))  # fmt: skip
    for be, prec in series:
        d = series_rows(view, be, prec)
        flop = pd.Series([decode_traffic(DecodeCase.uniform(int(b), int(L))).flops
                          for b, L in zip(d["batch"], d["kv_len"])], index=d.index)  # fmt: skip
        fig.add_scatter(x=flop / d["bytes"], y=flop / (d["us_median"] * 1e-6) / 1e12, mode="markers",
                        name=_name(view, d, be, prec), text=_label(d), hovertext=d["source"],
                        marker={"color": color_for("backend", be)})  # fmt: skip
    fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="arithmetic intensity (FLOP per byte)",
                      yaxis_title="achieved TFLOP/s",
                      title=f"Roofline (useful FLOP: 16 heads, no padding) — {view.short}<br><sub>{roof}; "
                      f"{_files_note(view)}</sub>")  # fmt: skip
    return place_title(fig)


def plan_time_facts(row: pd.Series, plan: WorkPlan) -> dict[str, Any]:
    """Measured time beside what the plan predicts: busy slots, longest slot vs mean, and a one-line reading."""
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    s = plan.summary()
    sms = int(row["sm_count"])
    loads = plan.cu_loads()
    busy = loads[loads > 0]
    mean_busy = float(busy.double().mean()) if busy.numel() else 0.0
    longest = int(loads.max()) if loads.numel() else 0
    ratio = longest / mean_busy if mean_busy else float("nan")
    slots = plan.num_cus
    per_sm = f" ({slots / sms:g} per SM)" if slots != sms else ""
    # an even split of all tokens over all slots is the best any plan can do; the longest slot sets the time
    even = int(loads.sum()) / slots if slots else 0.0
    eff = 100.0 * even / longest if longest else float("nan")
    pct = float(row["pct_copy"])
    sentence = (
        f"{s['busy_cus']} of {slots} plan slots{per_sm} get work; the longest streams {longest} tokens vs a busy "
        f"mean of {mean_busy:.0f} ({ratio:.2f}x), so this plan runs at {eff:.0f} % of a perfectly even split over "
        f"all slots: the plan accounts for at most {100 / eff:.2f}x of the time, the rest of the gap to copy bandwidth "
        f"({pct:.0f} % reached) is how fast each slot streams (and fixed per-call costs at small shapes)."
    )
    status, check = plan_check(row, plan)
    note = (
        f" Recorded in {row['run']} before the one-wave rule of the simple planner: the map shows today's plan."
        if status == "unknown" and row["planner"] == "simple" and row.get("run") in PRE_ONE_WAVE_RUNS
        else " " + check
    )
    return {
        "us_median": float(row["us_median"]),
        "pct_copy": float(row["pct_copy"]),
        "planner": str(row["planner"]),
        "slots": slots,
        "sm_count": sms,
        "works": s["works"],
        "busy_slots": s["busy_cus"],
        "longest_tokens": longest,
        "mean_busy_tokens": mean_busy,
        "longest_over_mean": ratio,
        "pct_of_even_split": eff,
        "plan_check": status,
        "sentence": sentence + note,
    }


def plan_time_figures(row: pd.Series, plan: WorkPlan) -> tuple[go.Figure, go.Figure]:
    """(work map, per-CU load) of the plan behind a recorded row (`mlalab.plots.splitkv`'s builders)."""
    title = (
        f"B{int(row['batch'])} x L{int(row['kv_len'])}: {plan.planner} on {plan.num_cus} slots, "
        f"{plan.n_work} works — measured {float(row['us_median']):.1f} µs ({float(row['pct_copy']):.1f} % of copy BW)"
    )
    return work_map_figure(plan, title=title), cu_load_figure(plan)


def layout_cost_figure(costs: pd.DataFrame, gpu: str) -> go.Figure:
    """What each decode layout costs (`mlalab.records.timings.layout_costs` of one GPU): bars of our time / our
    contiguous time (geomean over the shapes; whiskers: the best and worst shape), one group per layout and q_len, one
    bar per precision; the layouts issue's goals (a8w8) as dashed lines. Hover names the two runs."""
    need = {"precision", "q_len", "causal", "layout", "vs_contiguous", "min", "max", "goal", "run", "contiguous_run"}
    if not isinstance(costs, pd.DataFrame) or not need <= set(costs.columns):
        raise TypeError(f"costs must be the DataFrame of layout_costs (columns {sorted(need)})")
    if costs.empty:
        raise ValueError(f"costs is empty: no layout of {gpu} has runs covering the shapes on both sides")
    d = costs.sort_values(["layout", "q_len", "causal"], kind="stable")
    x = [f"{lay} · q_len {q}" + (" · causal" if c else "") for lay, q, c in zip(d["layout"], d["q_len"], d["causal"])]
    d = d.assign(x=x)
    fig = go.Figure()
    for prec in sorted(d["precision"].unique()):
        p = d[d["precision"] == prec]
        fig.add_bar(x=p["x"], y=p["vs_contiguous"], name=prec, marker={"color": color_for("precision", prec)},
                    error_y={"type": "data", "symmetric": False, "array": p["max"] - p["vs_contiguous"],
                             "arrayminus": p["vs_contiguous"] - p["min"]},
                    hovertext=p["run"] + " vs " + p["contiguous_run"])  # fmt: skip
    for goal, layouts in d.dropna(subset=["goal"]).groupby("goal")["layout"]:
        fig.add_hline(y=float(goal), line_dash="dash", line_color="gray",
                      annotation_text=f"goal ≤ {goal:.2f}× ({', '.join(sorted(set(layouts)))}, a8w8)")  # fmt: skip
    fig.add_hline(y=1.0, line_color="black", line_width=1)
    order = {"categoryorder": "array", "categoryarray": list(dict.fromkeys(x))}
    fig.update_layout(barmode="group", yaxis_title="our time / our contiguous time (geomean; whiskers: min, max)",
                      xaxis_title="layout · q_len", xaxis=order,
                      title=f"What a decode layout costs — {gpu}<br><sub>each side one recorded run "
                            f"(data/layouts, data/timings)</sub>")  # fmt: skip
    return place_title(fig)

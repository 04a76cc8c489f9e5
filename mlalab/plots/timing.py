"""Figures of decode timings (records from `mlalab.timing` / data/timings/*.csv): bars per shape, achieved
bandwidth against the floor, a roofline, speedups vs peers, and the plan behind a recorded Triton time (its work
map and per-CU load, rebuilt from the planner name and plan slots in the record). Each builder returns a
go.Figure."""

from __future__ import annotations

import glob
import math
import os
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..splitkv import WorkPlan, indptrs_for, make_plan
from ..timing import parse_config
from .splitkv import cu_load_figure, work_map_figure

__all__ = ["DATA_DIR", "load_recorded", "best_per_shape", "bars_per_shape", "bandwidth_figure", "roofline_figure",
           "speedup_table", "fastest_record", "plan_of_record", "plan_time_facts", "plan_time_figures",
           "PRE_ONE_WAVE_RUNS", "main"]  # fmt: skip

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "timings")
FLOP_PER_TOKEN = 2 * 16 * (576 + 512)


def load_recorded(data_dir: str = DATA_DIR) -> pd.DataFrame:
    """All recorded timing CSVs, status 'ok' rows only, with a `run` column (file name)."""
    files = sorted(glob.glob(os.path.join(data_dir, "*.csv")))
    if not files:
        raise FileNotFoundError(f"no timing CSVs under {data_dir}")
    dfs = [pd.read_csv(f).assign(run=os.path.basename(f)) for f in files]
    df = pd.concat(dfs, ignore_index=True)
    return df[df["status"] == "ok"].copy()


def best_per_shape(df: pd.DataFrame, backend: str, precision: str, planner: str | None = None) -> pd.DataFrame:
    """Fastest row per (batch, kv_len) of one backend / precision (optionally one planner)."""
    d = df[(df["backend"] == backend) & (df["precision"] == precision)]
    if planner is not None and backend == "triton":
        d = d[d["planner"] == planner]
    if d.empty:
        raise ValueError(f"no records for backend={backend!r}, precision={precision!r}, planner={planner!r}")
    # drop_duplicates keeps whole rows (groupby.first() would fill an empty `config` from a slower row)
    d = d.sort_values("us_median", kind="stable").drop_duplicates(["batch", "kv_len"])
    return d.sort_values(["kv_len", "batch"])


def _label(d: pd.DataFrame) -> list[str]:
    return [f"B{b}·L{l}" for b, l in zip(d["batch"], d["kv_len"])]


def bars_per_shape(df: pd.DataFrame, series: list[tuple[str, str]], planner: str | None = None) -> go.Figure:
    """Grouped bars of µs per call, one group per shape, one bar per (backend, precision); floor as markers."""
    fig = go.Figure()
    for be, prec in series:
        d = best_per_shape(df, be, prec, planner)
        fig.add_bar(x=_label(d), y=d["us_median"], name=f"{be} {prec}",
                    error_y={"type": "data", "array": d["us_iqr"] / 2})  # fmt: skip
    if series:
        d = best_per_shape(df, *series[0], planner)
        fig.add_scatter(x=_label(d), y=d["floor_us"], mode="markers", name=f"floor ({series[0][1]} bytes)")
    fig.update_layout(barmode="group", yaxis_title="µs per call (median, IQR bars)", xaxis_title="shape",
                      yaxis_type="log", title="Decode time per shape")  # fmt: skip
    return fig


def bandwidth_figure(df: pd.DataFrame, series: list[tuple[str, str]], planner: str | None = None) -> go.Figure:
    """Achieved TB/s per shape with the measured copy bandwidth as the ceiling."""
    fig = go.Figure()
    for be, prec in series:
        d = best_per_shape(df, be, prec, planner)
        fig.add_scatter(x=_label(d), y=d["tbps"], mode="lines+markers", name=f"{be} {prec}")
    bw = float(df["copy_tbps"].median())
    fig.add_hline(y=bw, line_dash="dash", annotation_text=f"copy {bw:.2f} TB/s")
    fig.update_layout(yaxis_title="achieved TB/s (bytes counted once)", xaxis_title="shape", title="Bandwidth")
    return fig


def roofline_figure(df: pd.DataFrame, series: list[tuple[str, str]], peak_tflops: float = 790.0) -> go.Figure:
    """Achieved TFLOP/s vs arithmetic intensity (FLOP/B) under the copy-bandwidth and bf16-MMA roofs."""
    fig = go.Figure()
    bw = float(df["copy_tbps"].median())
    xs = [1, 10, 30, 60, 100, 300, 1000]
    fig.add_scatter(x=xs, y=[min(peak_tflops, bw * x) for x in xs], mode="lines", name="roof", line_dash="dash")
    for be, prec in series:
        d = best_per_shape(df, be, prec)
        flop = d["batch"] * d["kv_len"] * FLOP_PER_TOKEN
        fig.add_scatter(x=flop / d["bytes"], y=flop / (d["us_median"] * 1e-6) / 1e12, mode="markers",
                        name=f"{be} {prec}", text=_label(d))  # fmt: skip
    fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="FLOP per byte", yaxis_title="TFLOP/s",
                      title="Roofline (useful FLOP: 16 heads, no padding)")  # fmt: skip
    return fig


def speedup_table(df: pd.DataFrame, ours: tuple[str, str], peers: list[tuple[str, str]]) -> pd.DataFrame:
    """Per shape: peer time / our time for each peer (>1 means ours is faster), plus a geomean row."""
    o = best_per_shape(df, *ours).set_index(["batch", "kv_len"])["us_median"]
    cols = {}
    for be, prec in peers:
        p = best_per_shape(df, be, prec).set_index(["batch", "kv_len"])["us_median"]
        cols[f"{be} {prec}"] = p / o
    t = pd.DataFrame(cols)
    t.loc[("geomean", ""), :] = [math.exp(t[c].apply(math.log).mean()) for c in t.columns]
    return t


#: runs recorded before commit 201e9af, whose "simple" plan did not yet grow its chunk to one wave: a plan rebuilt
#: with today's rule is not the one those rows measured.
PRE_ONE_WAVE_RUNS = ("h200_2026-12-02_run1.csv", "h200_2026-12-02_run2.csv")


def fastest_record(
    df: pd.DataFrame, batch: int, kv_len: int, backend: str = "triton", precision: str = "a8w8"
) -> pd.Series:
    """The fastest ok row of `backend` / `precision` at shape (batch, kv_len); ValueError if there is none."""
    for name, v in (("batch", batch), ("kv_len", kv_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    d = df[(df["backend"] == backend) & (df["precision"] == precision) & (df["batch"] == batch)]
    d = d[d["kv_len"] == kv_len]
    if d.empty:
        raise ValueError(f"no {backend} {precision} records for B{batch} x L{kv_len}")
    return d.sort_values("us_median", kind="stable").iloc[0]


def plan_of_record(row: pd.Series) -> WorkPlan:
    """Rebuild the WorkPlan a recorded Triton row ran: its planner on ``indptrs_for([kv_len] * batch)`` with the
    plan slots of its config (``num_cus``; the run's SM count when absent) and the simple planner's ``plan_block``."""
    if not isinstance(row, pd.Series):
        raise TypeError(f"row must be a pandas Series (one record), got {type(row).__name__}")
    if row.get("backend") != "triton":
        raise ValueError(f"only triton rows carry a plan, got backend {row.get('backend')!r}")
    cfg = parse_config(row.get("config"))
    slots = int(cfg.get("num_cus", row["sm_count"]))
    knobs: dict[str, Any] = (
        {"block": int(cfg["plan_block"])} if row["planner"] == "simple" and "plan_block" in cfg else {}
    )
    qo, kv = indptrs_for([int(row["kv_len"])] * int(row["batch"]))
    return make_plan(str(row["planner"]), qo, kv, slots, **knobs).validate(qo, kv)


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
    note = (
        f" Recorded in {row['run']} before the one-wave rule of the simple planner: the map shows today's plan."
        if row["planner"] == "simple" and row.get("run") in PRE_ONE_WAVE_RUNS
        else ""
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
        "sentence": sentence + note,
    }


def plan_time_figures(row: pd.Series, plan: WorkPlan) -> tuple[go.Figure, go.Figure]:
    """(work map, per-CU load) of the plan behind a recorded row (`mlalab.plots.splitkv`'s builders)."""
    title = (
        f"B{int(row['batch'])} x L{int(row['kv_len'])}: {plan.planner} on {plan.num_cus} slots, "
        f"{plan.n_work} works — measured {float(row['us_median']):.1f} µs ({float(row['pct_copy']):.1f} % of copy BW)"
    )
    return work_map_figure(plan, title=title), cu_load_figure(plan)


def main() -> None:
    df = load_recorded()
    print(speedup_table(df, ("triton", "a8w8"), [("flashmla", "a8w8"), ("flashmla", "bf16")]).round(2))
    row = fastest_record(df, 64, 8192)
    print(plan_time_facts(row, plan_of_record(row))["sentence"])


if __name__ == "__main__":
    main()

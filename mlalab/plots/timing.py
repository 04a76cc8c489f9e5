"""Figures of decode timings (records from `mlalab.timing` / data/timings/*.csv): bars per shape, achieved
bandwidth against the floor, a roofline, and speedups vs peers. Each builder returns a go.Figure."""

from __future__ import annotations

import glob
import math
import os

import pandas as pd
import plotly.graph_objects as go

__all__ = ["DATA_DIR", "load_recorded", "best_per_shape", "bars_per_shape", "bandwidth_figure", "roofline_figure",
           "speedup_table", "main"]  # fmt: skip

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
    d = d.sort_values("us_median").groupby(["batch", "kv_len"], as_index=False).first()
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


def main() -> None:
    df = load_recorded()
    print(speedup_table(df, ("triton", "a8w8"), [("flashmla", "a8w8"), ("flashmla", "bf16")]).round(2))


if __name__ == "__main__":
    main()

"""Figures for quantization accuracy: metrics table, SQNR heatmap, error histograms, value histograms with the
fp8 normal / subnormal / overflow bands. Builders take plain data and return ``go.Figure``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from ..quant import Fp8Format, get_fp8_format

__all__ = ["TABLE_COLUMNS", "metrics_table", "sqnr_heatmap", "error_histogram", "value_histogram"]

TABLE_COLUMNS = (
    "q_scheme",
    "kv_scheme",
    "fp8_format",
    "kv_bytes_per_token",
    "rel_l2",
    "sqnr_db",
    "max_abs",
    "max_abs_over_ref_rms",
    "cosine",
    "worst_row_cosine",
    "lse_max_abs_err",
    "nan_count",
    "q_subnormal_frac",
    "q_overflow_frac",
)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if v == 0 or math.isinf(v):
            return str(v)
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def metrics_table(df: pd.DataFrame, columns: Sequence[str] | None = None, *, title: str = "") -> go.Figure:
    """A plotly table of the chosen columns (default: the main metrics plus every mismatch column)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    if columns is None:
        columns = [c for c in TABLE_COLUMNS if c in df] + [c for c in df if "mismatch@" in c]
    missing = [c for c in columns if c not in df]
    if missing:
        raise ValueError(f"columns not in df: {missing}")
    cells = [[_fmt(v) for v in df[c].tolist()] for c in columns]
    fig = go.Figure(go.Table(header={"values": list(columns), "align": "left"}, cells={"values": cells}))
    fig.update_layout(
        title=title or None, margin={"l": 5, "r": 5, "t": 30 if title else 5, "b": 5}, height=80 + 28 * max(len(df), 1)
    )
    return fig


def sqnr_heatmap(df: pd.DataFrame, value: str = "sqnr_db", *, title: str | None = None) -> go.Figure:
    """Heatmap of `value` over (Q scheme rows × KV scheme columns); NaN cells (overflow) are annotated."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    for c in ("q_scheme", "kv_scheme", value):
        if c not in df:
            raise ValueError(f"df needs a {c!r} column")
    piv = df.pivot_table(index="q_scheme", columns="kv_scheme", values=value, aggfunc="mean", dropna=False, sort=False)
    z = piv.to_numpy(dtype=float)
    text = [[("NaN" if math.isnan(v) else f"{v:.1f}") for v in row] for row in z]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(piv.columns),
            y=list(piv.index),
            text=text,
            texttemplate="%{text}",
            colorscale="Viridis",
            colorbar={"title": value},
        )
    )
    fig.update_layout(
        title=title if title is not None else f"{value} (higher is better): Q scheme × KV scheme",
        xaxis_title="KV scheme",
        yaxis_title="Q scheme",
        yaxis_autorange="reversed",
        height=120 + 32 * len(piv.index),
        margin={"t": 40},
    )
    return fig


def error_histogram(
    errors: Mapping[str, torch.Tensor], *, bins: int = 80, relative_to: float | None = None
) -> go.Figure:
    """Overlaid histograms (as lines) of output error per variant. `relative_to` divides errors by it (e.g. ref
    RMS). Non-finite errors are counted in the legend, not binned."""
    if not errors:
        raise ValueError("errors must name at least one variant")
    flat = {k: v.detach().double().flatten().numpy() for k, v in errors.items()}
    finite = [a[np.isfinite(a)] for a in flat.values()]
    lim = max((float(np.abs(a).max()) for a in finite if a.size), default=1.0) or 1.0
    div = relative_to if relative_to else 1.0
    edges = np.linspace(-lim / div, lim / div, bins + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure()
    for name, a in flat.items():
        good = a[np.isfinite(a)] / div
        counts, _ = np.histogram(good, edges)
        bad = a.size - good.size
        label = f"{name}" + (f" ({bad} NaN/inf)" if bad else "")
        fig.add_trace(go.Scatter(x=centers, y=counts, mode="lines", line_shape="hvh", name=label))
    fig.update_layout(
        title="output error (variant − fp64 reference)" + (" / ref RMS" if relative_to else ""),
        xaxis_title="error" + (" / ref RMS" if relative_to else ""),
        yaxis_title="elements",
        yaxis_type="log",
        height=320,
        margin={"t": 40},
    )
    return fig


def value_histogram(
    x: torch.Tensor, fp8_format: str | Fp8Format, *, scale: float = 1.0, title: str = "", bins: int = 90
) -> go.Figure:
    """Histogram of log2|x / scale| with fp8's flushed, subnormal, normal and overflow bands shaded.

    `scale` is the quantization scale (1 for the direct cast, amax/fp8_max for per-tensor)."""
    f = get_fp8_format(fp8_format)
    if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    a = (x.detach().double().abs().flatten() / scale).numpy()
    nz = a[(a > 0) & np.isfinite(a)]
    lg = np.log2(nz)
    lo = min(float(lg.min()) if lg.size else -12, math.log2(f.min_subnormal) - 2)
    hi = max(float(lg.max()) if lg.size else 10, math.log2(f.max) + 1)
    counts, edges = np.histogram(lg, bins=bins, range=(lo, hi))
    fig = go.Figure(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=edges[1] - edges[0], name="values"))
    bands = (
        (lo, math.log2(f.min_subnormal / 2), "flushed to 0", "rgba(120,120,120,0.25)"),
        (math.log2(f.min_subnormal / 2), math.log2(f.min_normal), "subnormal", "rgba(255,165,0,0.25)"),
        (math.log2(f.min_normal), math.log2(f.max), "normal", "rgba(60,179,113,0.15)"),
        (math.log2(f.max), hi, "overflow", "rgba(220,20,60,0.25)"),
    )
    for x0, x1, label, color in bands:
        if x1 > x0:
            fig.add_vrect(
                x0=x0,
                x1=x1,
                fillcolor=color,
                line_width=0,
                layer="below",
                annotation_text=label,
                annotation_position="top left",
            )
    n = max(a.size, 1)
    sub = float(((a > 0) & (a < f.min_normal)).sum()) / n
    over = float((a > f.max).sum()) / n
    fig.update_layout(
        title=(title or "values") + f" — {f.name}, scale {scale:.3g}: {sub:.1%} subnormal, {over:.2%} overflow",
        xaxis_title="log2 |x / scale|",
        yaxis_title="elements",
        height=300,
        margin={"t": 40},
        showlegend=False,
    )
    return fig

"""Figures for quantization accuracy: metrics table (HTML that scrolls), heatmaps over any two dimensions of a table
(Q scheme × KV scheme, scheme × distribution × shape of a study), error vs kv_len with the spread over seeds, error
histograms and value histograms with the fp8 normal / subnormal / overflow bands. Builders take plain data and return
``go.Figure`` (or HTML text); titles sit left of plotly's toolbar, which stands vertically at the right."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
import torch

from ..quant import Fp8Format, get_fp8_format
from .palette import color_for

__all__ = [
    "TABLE_COLUMNS",
    "STUDY_DIMENSIONS",
    "metrics_table",
    "metrics_table_html",
    "sqnr_heatmap",
    "error_vs_kv_len",
    "error_histogram",
    "value_histogram",
]

#: Columns of a study table one can slice by (heatmap axes, filters).
STUDY_DIMENSIONS = ("q_scheme", "kv_scheme", "fp8_format", "dist", "batch", "kv_len", "q_len", "seed")
#: Title at the left and plotly's toolbar standing vertically at the right: they never overlap.
_TOP = {"title_x": 0.01, "title_xanchor": "left", "modebar_orientation": "v"}

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


def metrics_table_html(df: pd.DataFrame, columns: Sequence[str], *, title: str = "") -> str:
    """The chosen columns as an HTML table that wraps its headers and scrolls sideways inside its own box when
    wider than the page (values are never cut)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df]
    if missing:
        raise ValueError(f"columns not in df: {missing}")

    def head(c: str) -> str:  # break long names only after _ @ , (never inside a word)
        return "".join(ch + "<wbr>" if ch in "_@," else ch for ch in html.escape(str(c)))

    th = "".join(
        f"<th style='padding:2px 6px;text-align:left;vertical-align:bottom;max-width:8em;white-space:normal;"
        f"border-bottom:1px solid #999'>{head(c)}</th>"
        for c in columns
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td style='padding:2px 6px;white-space:nowrap;font-family:monospace'>{html.escape(_fmt(v))}</td>"
            for v in (row[c] for c in columns)
        )
        + "</tr>"
        for _, row in df.iterrows()
    )
    cap = f"<div style='font-weight:bold;margin:4px 0'>{html.escape(title)}</div>" if title else ""
    return (  # width 0 + min-width 100%: as wide as the panel, never widening it; wider tables scroll
        f"<div style='line-height:1.3'>{cap}<div class='mlalab-scroll' style='overflow-x:auto;width:0;min-width:100%'>"
        f"<table style='border-collapse:collapse;font-size:12px'><thead><tr>{th}</tr></thead>"
        f"<tbody>{body}</tbody></table></div></div>"
    )


def sqnr_heatmap(
    df: pd.DataFrame,
    value: str = "sqnr_db",
    *,
    title: str | None = None,
    rows: str = "q_scheme",
    columns: str = "kv_scheme",
) -> go.Figure:
    """Heatmap of `value` over (`rows` × `columns`), default Q scheme × KV scheme; several rows of the table in
    one cell (other dimensions, seeds) are averaged. NaN cells (overflow) are annotated."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    for c in (rows, columns, value):
        if c not in df:
            raise ValueError(f"df needs a {c!r} column")
    if rows == columns:
        raise ValueError(f"rows and columns must differ, got {rows!r} twice")
    piv = df.pivot_table(index=rows, columns=columns, values=value, aggfunc="mean", dropna=False, sort=False)
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
    better = " (higher is better)" if value == "sqnr_db" else ""
    fig.update_layout(
        title=title if title is not None else f"{value}{better}: {rows} × {columns}",
        xaxis_title=columns.replace("_", " "),
        yaxis_title=rows.replace("_", " "),
        xaxis_type="category",
        yaxis_type="category",
        yaxis_autorange="reversed",
        height=140 + 32 * len(piv.index),
        margin={"t": 72 if title is not None and "<br>" in title else 50},  # (a two-line title)
        **_TOP,
    )
    return fig


def error_vs_kv_len(
    df: pd.DataFrame, value: str = "rel_l2", *, color: str = "kv_scheme", title: str | None = None
) -> go.Figure:
    """`value` against kv_len, one line per `color` group (the mean over seeds and any other rows) with a band
    from the smallest to the largest seed's value: how much of a difference is only the draw."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    for c in ("kv_len", color, value):
        if c not in df:
            raise ValueError(f"df needs a {c!r} column")
    fig = go.Figure()
    kind = "scheme" if color in ("q_scheme", "kv_scheme") else ("fp8_format" if color == "fp8_format" else None)
    palette = plotly.colors.qualitative.Plotly
    for i, (name, g) in enumerate(df.groupby(color, sort=False)):
        per = g.groupby(["kv_len", "seed"] if "seed" in g else ["kv_len"])[value].mean().reset_index()
        st = per.groupby("kv_len")[value].agg(["mean", "min", "max", "count"]).reset_index().sort_values("kv_len")
        x = st.kv_len.tolist()
        c = color_for(kind, str(name)) if kind else palette[i % len(palette)]  # a scheme keeps its colour everywhere
        fig.add_trace(
            go.Scatter(
                x=x, y=st["mean"], mode="lines+markers", name=str(name), legendgroup=str(name), line={"color": c}
            )
        )
        if int(st["count"].max()) > 1:
            fig.add_trace(
                go.Scatter(
                    x=x + x[::-1],
                    y=st["max"].tolist() + st["min"].tolist()[::-1],
                    fill="toself",
                    fillcolor=c,
                    opacity=0.2,
                    line={"width": 0},
                    hoverinfo="skip",
                    legendgroup=str(name),
                    showlegend=False,
                    name=f"{name} seed range",
                )
            )
    seeds = int(df.seed.nunique()) if "seed" in df else 1
    fig.update_layout(
        title=title if title is not None else f"{value} vs kv_len (line: mean of {seeds} seed(s); band: min–max)",
        xaxis_title="kv_len (tokens, log scale)",
        yaxis_title=value.replace("_", " "),
        xaxis_type="log",
        yaxis_type="log" if value in ("rel_l2", "max_abs", "max_abs_over_ref_rms") else "linear",
        height=380,
        margin={"t": 50},
        **_TOP,
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
        margin={"t": 50},
        **_TOP,
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
    for i, (x0, x1, label, color) in enumerate(b for b in bands if b[1] > b[0]):
        fig.add_vrect(x0=x0, x1=x1, fillcolor=color, line_width=0, layer="below")
        # labels centred on their band, on alternating heights so narrow neighbours never overlap
        fig.add_annotation(
            x=(x0 + x1) / 2, y=1.0 if i % 2 == 0 else 0.9, yref="paper", text=label, showarrow=False, font={"size": 11}
        )
    n = max(a.size, 1)
    sub = float(((a > 0) & (a < f.min_normal)).sum()) / n
    over = float((a > f.max).sum()) / n
    fig.update_layout(
        title=(title or "values")
        + f"<br><sub>{f.name}, scale {scale:.3g}: {sub:.1%} subnormal, {over:.2%} overflow</sub>",
        xaxis_title="log2 |x / scale|",
        yaxis_title="elements",
        height=320,
        margin={"t": 70},
        showlegend=False,
        **_TOP,
    )
    return fig

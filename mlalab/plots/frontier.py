"""Figures of the precision frontier (`mlalab.accuracy.frontier.frontier_table`): time against accuracy per precision
with the non-dominated points joined, and the bytes per KV token with each precision's bandwidth floor.

Measured times are filled markers; a precision with no recorded time is an open marker at its bandwidth floor, named
"not measured: bandwidth floor" in the legend and the hover, never drawn as a measurement.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..accuracy.frontier import FRONTIER_METRICS
from .palette import color_for, legend_rank, place_title

__all__ = ["FLOOR_LABEL", "frontier_figure", "bytes_floor_figure"]

#: What an unmeasured point is called in the legend, the hover and the table.
FLOOR_LABEL = "not measured: bandwidth floor"

_NEEDED = {"precision", "us", "time_kind", "floor_us", "kv_bytes_per_token", "copy_tbps"}


def _check(df: object, metric: str | None = None) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame) or not set(df.columns) >= _NEEDED:
        raise ValueError(f"df must be a frontier_table (columns {sorted(_NEEDED)})")
    if metric is not None and metric not in FRONTIER_METRICS:
        raise ValueError(f"metric must be one of {', '.join(FRONTIER_METRICS)}, got {metric!r}")
    return df.sort_values("precision", key=lambda s: s.map(lambda n: legend_rank("precision", n)))


def _line(df: pd.DataFrame, flag: str, metric: str) -> pd.DataFrame:
    return df[df[flag]].sort_values("us")


def frontier_figure(df: pd.DataFrame, metric: str = "rel_l2", *, title: str | None = None) -> go.Figure:
    """Time (µs, log) against `metric` (log; one of `FRONTIER_METRICS`) per precision; the frontier of the measured
    points (solid) and, dotted, the one if the unmeasured points ran at their bandwidth floor."""
    df = _check(df, metric)
    fig = go.Figure()
    for flag, name, dash in (
        (f"on_frontier:{metric}", "frontier (measured points)", "solid"),
        (f"on_frontier_with_floors:{metric}", "frontier if fp4 ran at its floor", "dot"),
    ):
        pts = _line(df, flag, metric)
        if len(pts) > 1:
            fig.add_scatter(
                x=pts["us"],
                y=pts[metric],
                mode="lines",
                name=name,
                hoverinfo="skip",
                line={"color": "#555", "dash": dash, "width": 1.5},
            )
    for _, r in df.iterrows():
        floor = r["time_kind"] != "measured"
        what = FLOOR_LABEL if floor else f"measured (recorded on {r['gpu']})"
        fig.add_scatter(
            x=[r["us"]],
            y=[r[metric]],
            mode="markers",
            name=f"{r['precision']}" + (f" ({FLOOR_LABEL})" if floor else ""),
            marker={
                "color": color_for("precision", r["precision"]),
                "size": 13,
                "symbol": "circle-open" if floor else "circle",
                "line": {"width": 2.5 if floor else 1},
            },
            hovertemplate=f"<b>{r['precision']}</b> ({r.get('label', '')})<br>{r['us']:.3g} µs: {what}<br>"
            f"floor {r['floor_us']:.3g} µs at {r['copy_tbps']:.2f} TB/s copy<br>"
            f"{metric} %{{y:.3g}}<extra></extra>",
        )
    shape = df.attrs.get("shape")
    where = f" ({df.attrs['run']}, {df.attrs['gpu']})" if "run" in df.attrs and "gpu" in df.attrs else ""
    default = (f"Time vs accuracy per precision — B{shape[0]} × L{shape[1]}" if shape else "Time vs accuracy") + where
    fig.update_layout(
        title=title or default,
        height=520,
        xaxis={"title": "µs per call (log; open markers: bandwidth floor)", "type": "log"},
        yaxis={"title": FRONTIER_METRICS[metric], "type": "log"},
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "font": {"size": 11}},
        margin={"l": 70, "r": 20, "b": 60},
    )
    return place_title(fig)


def bytes_floor_figure(df: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Bytes per KV token per precision (bars), each labelled with its bandwidth floor at the shape and, where
    recorded, the measured time."""
    df = _check(df)
    text = [
        f"floor {f:.3g} µs" + (f" · measured {u:.3g} µs" if k == "measured" else " · not measured")
        for f, u, k in zip(df["floor_us"], df["us"], df["time_kind"])
    ]
    fig = go.Figure(
        go.Bar(
            y=df["precision"],
            x=df["kv_bytes_per_token"],
            orientation="h",
            text=text,
            textposition="auto",
            marker_color=[color_for("precision", p) for p in df["precision"]],
            showlegend=False,
            hovertemplate="%{y}: %{x:.0f} bytes per KV token<extra></extra>",
        )
    )
    shape = df.attrs.get("shape")
    copy = float(df["copy_tbps"].iloc[0])
    default = (
        f"Bytes per KV token and bandwidth floor (B{shape[0]} × L{shape[1]}, {copy:.2f} TB/s copy)"
        if shape
        else ("Bytes per KV token and bandwidth floor")
    )
    fig.update_layout(
        title=title or default,
        height=330,
        xaxis_title="bytes per KV token (576 values, scales included)",
        yaxis={"autorange": "reversed", "title": "precision (q · KV)"},
        margin={"l": 110, "r": 20, "b": 50},
    )
    return place_title(fig)

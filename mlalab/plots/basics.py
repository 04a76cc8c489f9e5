"""Figures for notebook 01: bytes moved and the bandwidth floor of a decode call per GPU target."""

from __future__ import annotations

import plotly.graph_objects as go

from ..config import GPU_TARGETS, DecodeCase
from ..traffic import decode_traffic
from .palette import color_for, place_title


def floor_by_target_figure(case: DecodeCase, kv_formats: tuple[str, ...] = ("bf16", "fp8", "mxfp4")) -> go.Figure:
    """Grouped bars: bandwidth floor (µs) per GPU target, one bar per KV storage format in `kv_formats` order, each
    format in its palette colour (`mlalab.plots.palette`), so a format keeps its colour whatever else is shown.

    H200 uses the copy bandwidth measured on our H200; MI300X/MI355X use datasheet peaks (labelled)."""
    fig = go.Figure()
    names = [
        f"{t.name}<br>({'measured copy' if t.copy_tbps else 'datasheet'} {t.bandwidth_tbps:.1f} TB/s)"
        for t in GPU_TARGETS.values()
    ]
    for fmt in kv_formats:
        tr = decode_traffic(case, fmt, 2.0 if fmt == "bf16" else 1.0)
        floors = [tr.floor_us(k) for k in GPU_TARGETS]
        fig.add_bar(
            x=names,
            y=floors,
            name=f"KV {fmt}",
            marker_color=color_for("scheme", fmt),
            text=[f"{f:.1f}" for f in floors],
            textposition="outside",
            hovertemplate="%{x}<br>floor %{y:.2f} µs<extra>KV " + fmt + "</extra>",
        )
    fig.update_layout(
        title=f"Bandwidth floor of one decode call — {case.short_str()}",
        yaxis_title="floor: µs per call (bytes / bandwidth)",
        xaxis_title="GPU (bandwidth used for the floor)",
        barmode="group",
        height=420,
        margin={"t": 60, "b": 40},
    )
    return place_title(fig)


def floor_vs_kv_len_figure(
    batch: int,
    target: str = "h200",
    kv_formats: tuple[str, ...] = ("bf16", "fp8", "mxfp4"),
    kv_lens: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384),
) -> go.Figure:
    """Floor (µs) versus KV length on one target, log-log, one line per KV format."""
    fig = go.Figure()
    for fmt in kv_formats:
        ys = [
            decode_traffic(DecodeCase.uniform(batch, L), fmt, 2.0 if fmt == "bf16" else 1.0).floor_us(target)
            for L in kv_lens
        ]
        fig.add_scatter(
            x=list(kv_lens), y=ys, mode="lines+markers", name=f"KV {fmt}", line_color=color_for("scheme", fmt)
        )
    fig.update_layout(
        title=f"Bandwidth floor vs kv_len, batch {batch}, {target}",
        xaxis_type="log",
        yaxis_type="log",
        xaxis_title="kv_len (tokens per request)",
        yaxis_title="floor: µs per call (bytes / bandwidth)",
        height=380,
    )
    return place_title(fig)

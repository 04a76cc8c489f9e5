"""One colour table for every figure, notebook panel and the HTML report: a backend, a precision, a quantization
scheme (or KV storage format) and an fp8 format each have ONE colour, whatever else a figure shows.

    from mlalab.plots.palette import color_for
    fig.add_bar(..., marker_color=color_for("backend", "triton"))

Names not in the table (e.g. ``fp8-static:3.0``, ``fp8-block64``, a new backend) get a colour from a hash of the
name, so they too keep it from one selection to the next. `legend_rank` gives a stable legend order.
"""

from __future__ import annotations

import zlib

import plotly.graph_objects as go

__all__ = ["KINDS", "PALETTE", "color_for", "legend_rank", "PRECISION_PATTERN", "PRECISION_DASH", "place_title"]

#: kind -> {name: colour}. Within a kind the colours are distinct. A precision and the scheme / storage format of
#: the same name share its colour (bf16 is blue everywhere, fp8 per-tensor orange).
PALETTE: dict[str, dict[str, str]] = {
    "backend": {
        "triton": "#1f77b4",  # ours: blue
        "flashmla": "#ff7f0e",
        "flashinfer": "#2ca02c",
        "aiter": "#d62728",
        "reference": "#7f7f7f",
        "reference-torch": "#8c564b",
        "emulated": "#9467bd",
    },
    "precision": {
        "bf16": "#4c78a8",
        "a16w8": "#72b7b2",
        "a8w8": "#f58518",
        "a16w4-mxfp4": "#54a24b",
        "a8w4-mxfp4": "#2e6b2a",
        "a16w4-nvfp4": "#d67195",
        "a8w4-nvfp4": "#9e3d64",
    },
    "scheme": {
        # KV storage formats (mlalab.traffic.KV_STORAGE)
        "bf16": "#4c78a8",
        "fp8": "#f58518",
        "mxfp4": "#54a24b",
        # Q / KV quantization schemes (mlalab.quant)
        "fp8-tensor": "#f58518",
        "fp8-tensor-bf16math": "#ffbf79",
        "fp8-direct": "#e45756",
        "fp8-direct-sat": "#ff9d98",
        "fp8-token": "#b79a20",
        "fp8-head": "#eeca3b",
        "fp8-token-head": "#9d755d",
        "fp8-block128": "#bab0ac",
        "fp8-static": "#79706e",
        "fp8-flashmla-v32": "#b279a2",
        "mxfp4-aiter": "#54a24b",
        "mxfp4-torchao-even": "#88d27a",
        "mxfp4-ocp": "#2e6b2a",
        "mxfp4-rceil": "#a3c585",
        "nvfp4": "#d67195",
    },
    "fp8_format": {
        "e4m3fn": "#1b9e77",
        "e4m3fnuz": "#d95f02",
        "e4m3fnuz-224": "#7570b3",
        "e5m2": "#e7298a",
    },
}

KINDS = tuple(PALETTE)

#: Where a figure colours by backend, the precision shows as a bar pattern / a line dash (a8w8 plain), so one
#: backend at two precisions stays two distinguishable series.
PRECISION_PATTERN: dict[str, str] = {"a8w8": "", "a16w8": "/", "bf16": ".", "a16w4-mxfp4": "x", "a8w4-mxfp4": "+",
                                     "a16w4-nvfp4": "-", "a8w4-nvfp4": "|"}  # fmt: skip
PRECISION_DASH: dict[str, str] = {"a8w8": "solid", "a16w8": "dash", "bf16": "dot", "a16w4-mxfp4": "dashdot",
                                  "a8w4-mxfp4": "longdash", "a16w4-nvfp4": "longdashdot",
                                  "a8w4-nvfp4": "5px,2px"}  # fmt: skip

# colours for names outside the table, picked by a hash of the name (stable across runs and selections)
_SPARE = ("#17becf", "#bcbd22", "#e377c2", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
          "#31a354", "#756bb1", "#636363")  # fmt: skip


def _canonical(kind: str, name: str) -> str:
    n = name.strip().lower()
    if kind == "scheme":
        if n.startswith("fp8-static:"):
            return "fp8-static"
        if n.startswith("kv "):  # figure labels such as "KV fp8"
            return n[3:]
    return n


def color_for(kind: str, name: str) -> str:
    """The colour (``#rrggbb``) of `name` of `kind` (one of `KINDS`: backend, precision, scheme, fp8_format).

    Unknown names get a colour from a hash of the name: the same every time, never one that depends on what else
    is shown."""
    if kind not in PALETTE:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    n = _canonical(kind, name)
    table = PALETTE[kind]
    if n in table:
        return table[n]
    return _SPARE[zlib.crc32(f"{kind}:{n}".encode()) % len(_SPARE)]


def legend_rank(kind: str, name: str) -> tuple[int, str]:
    """A sort key that puts the names of `kind` in the table's order (unknown names after, alphabetically)."""
    if kind not in PALETTE:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    order = list(PALETTE[kind])
    n = _canonical(kind, str(name))
    return (order.index(n), n) if n in order else (len(order), n)


def place_title(fig: go.Figure, gap: int = 10) -> go.Figure:
    """Put `fig`'s title just above its plot area (anchored at the plot's top, `gap` px above it, margin grown to fit
    it), below the strip where plotly draws its toolbar, so a long title never runs under the toolbar. Subplot
    figures pass a `gap` that clears their subplot titles (~30 px). Returns `fig`."""
    if not isinstance(fig, go.Figure | go.FigureWidget):
        raise TypeError(f"fig must be a plotly Figure, got {type(fig).__name__}")
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise ValueError(f"gap must be an int >= 0 (pixels), got {gap!r}")
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 60
    fig.update_layout(
        title={"yref": "paper", "y": 1, "yanchor": "bottom", "pad": {"b": gap}, "automargin": True},
        margin={"t": max(int(top), 40) + 18 + gap},
    )
    return fig

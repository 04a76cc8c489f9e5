"""Notebook 05 panel: preset (inputs and check), shape, accuracy axis and tolerance -> the time-vs-accuracy figure of
every precision with its frontier, the bytes-per-token / bandwidth-floor figure and the table behind both
(`mlalab.accuracy.frontier.frontier_table`; the accuracy is computed live on the CPU, the times read from data/)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from ..accuracy import DEFAULT_TOLERANCES, PRESETS
from ..accuracy.frontier import FRONTIER_METRICS, frontier_table
from ..plots.frontier import FLOOR_LABEL, bytes_floor_figure, frontier_figure
from .export import BusyIndicator, ExportBar, export_bar, show_figure

__all__ = ["FrontierPanel", "frontier_panel", "TABLE_COLUMNS"]

#: The table's columns, in order.
TABLE_COLUMNS = (
    "precision",
    "q_scheme",
    "kv_scheme",
    "kv_bytes_per_token",
    "us",
    "time_kind",
    "floor_us",
    "rel_l2",
    "worst_row_cosine",
    "mismatch",
    "passes",
)
PRESET_CHECK = "the preset's check"


@dataclass
class FrontierPanel:
    """Handles to every control and output, so tests can drive the panel from Python."""

    preset: W.Dropdown
    shape: W.Dropdown
    metric: W.Dropdown
    tolerance: W.Dropdown
    message: W.HTML
    table: W.HTML
    frontier: go.FigureWidget
    bytes: go.FigureWidget
    box: W.VBox
    busy: BusyIndicator
    export: ExportBar
    df: pd.DataFrame = field(default_factory=pd.DataFrame)
    _cache: dict[Any, Any] = field(default_factory=dict)

    def update(self, *_: object) -> None:
        with self.busy("computing the accuracy of every precision"):
            try:
                self._update()
            except (ValueError, FileNotFoundError) as e:  # shown in the panel, never a traceback
                self.message.value = f"<span style='color:#b00'>⚠ {html.escape(str(e))}</span>"

    def _update(self) -> None:
        b, n = self.shape.value
        tol = None if self.tolerance.value == PRESET_CHECK else self.tolerance.value
        df = frontier_table(b, n, self.preset.value, tol, cache=self._cache)
        self.df = df
        metric = str(self.metric.value)
        show_figure(self.frontier, frontier_figure(df, metric))
        show_figure(self.bytes, bytes_floor_figure(df))
        shown = df[list(TABLE_COLUMNS)].copy()
        shown["time_kind"] = shown["time_kind"].map(lambda k: "measured" if k == "measured" else FLOOR_LABEL)
        self.table.value = (
            "<div style='overflow-x:auto'>"
            + shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
            + "</div>"
        )
        a = df.attrs
        floors = ", ".join(df.loc[df["time_kind"] != "measured", "precision"]) or "none"
        front = ", ".join(df.loc[df[f"on_frontier:{metric}"], "precision"]) or "none (no measured point at this shape)"
        cap = (
            f" Accuracy on the first {a['accuracy_batch']} requests ({a['accuracy_case']}): errors are per element"
            " and requests independent draws."
            if a["capped"]
            else f" Accuracy case {a['accuracy_case']}."
        )
        self.message.value = (
            f"Preset {html.escape(a['preset'])}: {html.escape(PRESETS[a['preset']].description)}. "
            f"Times: {html.escape(a['run'])} (recorded on {html.escape(a['gpu'])}, Triton default config). "
            f"<b>Not measured, drawn at their bandwidth floor: {floors}.</b> "
            f"Frontier of the measured points ({metric}): {front}. Mismatch and passes: {html.escape(a['check'])}."
            + cap
        )


def frontier_panel(
    preset: str = "competition", shape: tuple[int, int] = (4, 1024), metric: str = "rel_l2"
) -> FrontierPanel:
    """Build the panel and compute its first state. Display ``panel.box``."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if metric not in FRONTIER_METRICS:
        raise ValueError(f"metric must be one of {', '.join(FRONTIER_METRICS)}, got {metric!r}")
    style, lay = {"description_width": "120px"}, W.Layout(width="380px")
    pre = W.Dropdown(
        options=list(PRESETS),
        value=preset,
        description="preset (inputs)",
        style=style,
        layout=lay,
        tooltip="; ".join(f"{k}: {v.description}" for k, v in PRESETS.items()),
    )

    def shapes(name: str) -> list[tuple[str, tuple[int, int]]]:
        return [(f"batch {b} × kv_len {n}", (b, n)) for b, n in PRESETS[name].shapes]

    opts = shapes(preset)
    if shape not in [v for _, v in opts]:
        raise ValueError(f"shape must be one of the preset's shapes {PRESETS[preset].shapes}, got {shape!r}")
    shp = W.Dropdown(options=opts, value=shape, description="shape", style=style, layout=lay)
    met = W.Dropdown(
        options=[(v.split(" (")[0], k) for k, v in FRONTIER_METRICS.items()],
        value=metric,
        description="accuracy axis",
        style=style,
        layout=lay,
    )
    tol = W.Dropdown(
        options=[PRESET_CHECK, *[(f"rtol {r:g}, atol {a:g}", (r, a)) for r, a in DEFAULT_TOLERANCES]],
        value=PRESET_CHECK,
        description="mismatch at",
        style=style,
        layout=lay,
    )
    msg, table, busy = W.HTML(), W.HTML(), BusyIndicator()
    figs = [go.FigureWidget(), go.FigureWidget()]
    holder: dict[str, FrontierPanel] = {}
    exp = export_bar(
        lambda: f"frontier_{holder['p'].preset.value}_B{holder['p'].shape.value[0]}_L{holder['p'].shape.value[1]}",
        table=lambda: holder["p"].df,
        figures=lambda: {"frontier": figs[0], "bytes_floor": figs[1]},
    )
    controls = W.HBox([W.VBox([pre, shp]), W.VBox([met, tol])], layout=W.Layout(flex_flow="row wrap"))
    box = W.VBox([controls, busy.widget, msg, figs[0], figs[1], table, exp.box])
    panel = FrontierPanel(pre, shp, met, tol, msg, table, figs[0], figs[1], box, busy, exp)
    holder["p"] = panel

    def on_preset(_: object) -> None:
        new = shapes(str(pre.value))
        keep = shp.value if shp.value in [v for _, v in new] else new[0][1]
        shp.unobserve(panel.update, names="value")
        shp.options, shp.value = new, keep
        shp.observe(panel.update, names="value")
        panel.update()

    pre.observe(on_preset, names="value")
    for w in (shp, met, tol):
        w.observe(panel.update, names="value")
    panel.update()
    return panel

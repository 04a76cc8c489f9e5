"""Notebook 01 panel: batch, kv_len, KV dtype and target -> bytes, FLOPs and the bandwidth floor; a busy line while
it updates and an export bar (table CSV, figure HTML/PNG)."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from ..config import GPU_TARGETS, DecodeCase
from ..plots.basics import floor_by_target_figure
from ..traffic import KV_STORAGE, decode_traffic
from .export import BusyIndicator, ExportBar, export_bar, show_figure


@dataclass
class TrafficPanel:
    """Handles to the controls and outputs, so tests can drive the panel from Python."""

    batch: W.IntSlider
    kv_len: W.Dropdown
    kv_dtype: W.Dropdown
    target: W.Dropdown
    table: W.HTML
    message: W.HTML
    figure: go.FigureWidget
    box: W.VBox
    busy: BusyIndicator
    export: ExportBar | None = None
    rows: tuple[tuple[str, str], ...] = ()

    def frame(self) -> pd.DataFrame:
        """The table the panel shows, as a DataFrame (what the CSV export writes)."""
        return pd.DataFrame(list(self.rows), columns=["quantity", "value"])

    def update(self, *_: object) -> None:
        with self.busy("computing bytes and floors"):
            self._update()

    def _update(self) -> None:
        try:
            case = DecodeCase.uniform(int(self.batch.value), int(self.kv_len.value))
            fmt = str(self.kv_dtype.value)
            tr = decode_traffic(case, fmt, 2.0 if fmt == "bf16" else 1.0)
            tgt = GPU_TARGETS[str(self.target.value)]
            rows = [
                ("KV bytes", f"{tr.kv_bytes / 1e6:,.2f} MB"),
                ("Q + output bytes", f"{(tr.q_bytes + tr.out_bytes) / 1e6:,.3f} MB"),
                ("FLOPs", f"{tr.flops / 1e9:,.2f} GFLOP"),
                ("Arithmetic intensity", f"{tr.intensity:,.1f} FLOP/byte"),
                (f"Floor on {tgt.name}", f"{tr.floor_us(tgt):,.2f} µs at {tgt.bandwidth_label}"),
            ]
            self.rows = tuple(rows)
            self.table.value = (
                "<table>"
                + "".join(f"<tr><td style='padding-right:1em'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
                + "</table>"
            )
            # the chosen format joins the three usual ones in a fixed order, each in its palette colour
            formats = tuple(f for f in KV_STORAGE if f in ("bf16", "fp8", "mxfp4") or f == fmt)
            show_figure(self.figure, floor_by_target_figure(case, formats))
            self.message.value = ""
        except (ValueError, TypeError) as e:  # show the problem in the panel, never a traceback
            self.message.value = f"<span style='color:#b00'>⚠ {e}</span>"


def traffic_panel(batch: int = 32, kv_len: int = 8192, kv_dtype: str = "fp8", target: str = "h200") -> TrafficPanel:
    """The panel at the given start values; each change recomputes the table and the floor figure."""
    style = {"description_width": "140px"}
    b = W.IntSlider(
        value=batch,
        min=1,
        max=256,
        description="batch (requests)",
        style=style,
        layout=W.Layout(width="420px"),
        continuous_update=False,
    )
    L = W.Dropdown(
        options=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
        value=kv_len,
        description="kv_len (tokens)",
        style=style,
    )
    d = W.Dropdown(options=list(KV_STORAGE), value=kv_dtype, description="KV storage", style=style)
    t = W.Dropdown(
        options=[(v.name, k) for k, v in GPU_TARGETS.items()], value=target, description="target GPU", style=style
    )
    table, msg = W.HTML(), W.HTML()
    fig = go.FigureWidget()
    busy = BusyIndicator()
    controls = W.HBox([W.VBox([b, L]), W.VBox([d, t])], layout=W.Layout(flex_flow="row wrap"))
    box = W.VBox([controls, busy.widget, msg, table, fig])
    panel = TrafficPanel(b, L, d, t, table, msg, fig, box, busy)
    stem = lambda: f"floor_B{b.value}_L{L.value}_{d.value}_{t.value}"  # noqa: E731
    panel.export = export_bar(stem, table=panel.frame, figures=lambda: {"floor": fig})
    box.children = (*box.children, panel.export.box)
    for w in (b, L, d, t):
        w.observe(panel.update, names="value")
    panel.update()
    return panel

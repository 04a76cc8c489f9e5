"""Panel for notebook 04: pick backends, planner, precision and a shape; bars, bandwidth and speedup update.
Live measurement needs a GPU; without one the panel shows the recorded H200 data and says so."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go
import torch

from ..plots.timing import bandwidth_figure, bars_per_shape, load_recorded, speedup_table

__all__ = ["TimingPanel", "timing_panel"]


@dataclass
class TimingPanel:
    panel: W.Widget
    backends: W.SelectMultiple
    precision: W.Dropdown
    planner: W.Dropdown
    bars: go.FigureWidget
    bandwidth: go.FigureWidget
    message: W.HTML
    table: W.HTML


def timing_panel(df: pd.DataFrame | None = None) -> TimingPanel:
    source = "live GPU available: run `python -m mlalab bench` to add records;" if torch.cuda.is_available() else ""
    if df is None:
        df = load_recorded()
    note = W.HTML(
        f"<b>{source or 'No GPU here: showing the recorded H200 data (data/timings)'}</b> — "
        f"{df['gpu'].iloc[0]}, {df['date'].iloc[0]}, copy bandwidth {df['copy_tbps'].median():.2f} TB/s"
    )
    backends = W.SelectMultiple(options=sorted(df["backend"].unique()), value=("triton", "flashmla"),
                                description="backends")  # fmt: skip
    precision = W.Dropdown(options=sorted(df["precision"].unique()), value="a8w8", description="precision")
    planner = W.Dropdown(options=sorted(df.loc[df["backend"] == "triton", "planner"].unique()), description="planner")
    message, table = W.HTML(), W.HTML()
    bars, bw = go.FigureWidget(), go.FigureWidget()

    def refresh(*_: object) -> None:
        series = [(b, precision.value) for b in backends.value
                  if not df[(df["backend"] == b) & (df["precision"] == precision.value)].empty]  # fmt: skip
        missing = [b for b in backends.value if (b, precision.value) not in series]
        message.value = (
            (
                f"<i>no records for {', '.join(missing)} at precision {precision.value} "
                "(flashmla: bf16/a8w8, flashinfer: bf16/a16w8, reference-torch: bf16)</i>"
            )
            if missing
            else ""
        )
        for fw, build in ((bars, bars_per_shape), (bw, bandwidth_figure)):
            with fw.batch_update():
                fw.data = ()
                if series:
                    f = build(df, series, planner.value)
                    fw.add_traces(list(f.data))
                    fw.layout = f.layout
        ours = ("triton", precision.value)
        peers = [s for s in series if s[0] != "triton"]
        if ("triton", precision.value) in series and peers:
            table.value = "<b>speedup (peer µs / triton µs)</b>" + speedup_table(df, ours, peers).round(2).to_html()
        else:
            table.value = ""

    for w in (backends, precision, planner):
        w.observe(refresh, names="value")
    refresh()
    panel = W.VBox([note, W.HBox([backends, W.VBox([precision, planner])]), message, bars, bw, table])
    return TimingPanel(panel, backends, precision, planner, bars, bw, message, table)

"""Panels for notebook 04: pick backends, planner, precision and a shape; bars, bandwidth and speedup update
(`timing_panel`); pick a shape and see the work map and per-CU load of the plan behind its fastest recorded Triton
time (`plan_time_panel`). Live measurement needs a GPU; without one the panels show the recorded H200 data and
say so."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go
import torch

from ..plots.timing import (
    bandwidth_figure,
    bars_per_shape,
    fastest_record,
    load_recorded,
    plan_of_record,
    plan_time_facts,
    plan_time_figures,
    speedup_table,
)
from ..timing import COMPETITION_SHAPES

__all__ = ["TimingPanel", "timing_panel", "PlanTimePanel", "plan_time_panel"]


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


@dataclass
class PlanTimePanel:
    """The plan↔time panel plus handles tests drive: the shape dropdown, both figures, the facts and a message."""

    panel: W.Widget
    shape: W.Dropdown
    work_map: go.FigureWidget
    cu_load: go.FigureWidget
    facts: W.HTML
    message: W.HTML


def _replace(fw: go.FigureWidget, fig: go.Figure | None) -> None:
    with fw.batch_update():
        fw.data = ()
        if fig is not None:
            fw.add_traces(list(fig.data))
            fw.layout = fig.layout


def plan_time_panel(
    df: pd.DataFrame | None = None, precision: str = "a8w8", shape: tuple[int, int] = (4, 1024)
) -> PlanTimePanel:
    """Shape dropdown (the 12 competition shapes) -> the plan of the fastest recorded Triton row at `precision`,
    rebuilt from its planner name and plan slots, drawn as a work map and per-CU load beside the measured time."""
    if df is None:
        df = load_recorded()
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame of timing records, got {type(df).__name__}")
    if tuple(shape) not in COMPETITION_SHAPES:
        raise ValueError(f"shape must be one of the competition shapes {COMPETITION_SHAPES}, got {shape!r}")
    options = [(f"B{b} × L{L}", (b, L)) for b, L in COMPETITION_SHAPES]
    dd = W.Dropdown(options=options, value=tuple(shape), description="shape (batch × KV tokens)",
                    style={"description_width": "initial"})  # fmt: skip
    work_map, cu_load = go.FigureWidget(), go.FigureWidget()
    facts, message = W.HTML(), W.HTML()

    def refresh(*_: object) -> None:
        b, L = dd.value
        try:
            row = fastest_record(df, b, L, "triton", precision)
            plan = plan_of_record(row)
        except ValueError as e:  # no record, or a planner that cannot rebuild it: say so in the panel
            message.value = f"<i>{e}</i>"
            facts.value = ""
            _replace(work_map, None)
            _replace(cu_load, None)
            return
        f = plan_time_facts(row, plan)
        wm, cl = plan_time_figures(row, plan)
        _replace(work_map, wm)
        _replace(cu_load, cl)
        message.value = ""
        cfg = row["config"] if isinstance(row["config"], str) else "the defaults of that run"
        facts.value = (
            f"<b>measured {f['us_median']:.1f} µs per call, {f['pct_copy']:.1f} % of copy bandwidth</b> "
            f"(planner <code>{f['planner']}</code>, {f['slots']} plan slots on {f['sm_count']} SMs, "
            f"{f['works']} works; config <code>{cfg}"
            f"</code>, {row['run']})<br>{f['sentence']}"
        )

    dd.observe(refresh, names="value")
    refresh()
    panel = W.VBox([dd, message, facts, work_map, cu_load])
    return PlanTimePanel(panel, dd, work_map, cu_load, facts, message)

"""Panels for notebook 04: pick backends, planner, precision, run (or best of all runs) and the bars, bandwidth and
speedup update (`timing_panel`); pick a shape and see the work map and per-CU load of the plan behind the Triton
time the view shows (`plan_time_panel`); pick a shape and see stage 1's measured per-CTA timeline
(`timeline_panel`); pick a recorded design experiment and see each variant against FlashMLA
(`experiments_panel`, each file titled by the question it answers). Every view names the file(s) it read, and its
banner and figure titles are computed from what it shows (an empty selection says so in the figure). The timing and
experiments panels show a busy line while they update and an export bar (table CSV, figures HTML/PNG). Live
measurement needs a GPU; without one the panels show the recorded data (H200 and H100 runs, named) and say so."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go
import torch

from ..config import COMPETITION_SHAPES
from ..io import natural_key
from ..plots.experiments import experiment_figure, experiment_questions
from ..plots.timeline import cta_timeline_figure
from ..plots.timing import bandwidth_figure, bars_per_shape, plan_time_facts, plan_time_figures
from ..records.ab import experiment_geomeans, list_experiments, load_experiment, peer_name
from ..records.profiles import load_timelines, timeline_summary
from ..records.timings import (
    LAYOUTS_DIR,
    REFERENCE_GPU,
    TIMINGS_DIR,
    RecordedView,
    default_run,
    layout_costs_by_gpu,
    load_recorded,
    plan_of_record,
    record_for_shape,
    recorded_view,
    speedup_table,
    winners_table,
    with_case_columns,
)
from .export import BusyIndicator, ExportBar, export_bar, show_figure

__all__ = [
    "TimingPanel",
    "timing_panel",
    "PlanTimePanel",
    "plan_time_panel",
    "TimelinePanel",
    "timeline_panel",
    "ExperimentsPanel",
    "experiments_panel",
]


@dataclass
class TimingPanel:
    panel: W.Widget
    backends: W.SelectMultiple
    precision: W.Dropdown
    planner: W.Dropdown
    run: W.Dropdown
    best_of_all: W.Checkbox
    bars: go.FigureWidget
    bandwidth: go.FigureWidget
    view: W.HTML
    message: W.HTML
    table: W.HTML
    note: W.HTML
    busy: BusyIndicator
    export: ExportBar
    shown: dict[str, object]  # what the panel shows now: "rows" (DataFrame of the series drawn), "stem" (file name)
    layout: W.Dropdown | None = None  # the decode layout: (q_len, KV layout, causal) triples recorded


#: wide enough for every recorded file name (dropdowns cut their text at their width)
_WIDE = W.Layout(width="34em", max_width="100%")
_WRAP = "style='overflow-wrap:anywhere;white-space:normal'"


def _check_df(df: object) -> pd.DataFrame:
    if df is None:
        return load_recorded((TIMINGS_DIR, LAYOUTS_DIR))
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame of timing records, got {type(df).__name__}")
    return df


def _layout_cost_html(costs: pd.DataFrame, precision: str, case: tuple[int, str, bool], gpu: str) -> str:
    """One sentence: what the chosen layout costs against our contiguous cache on `gpu` (`costs`: its `layout_costs`),
    or why it cannot be said; empty for the contiguous layout."""
    q_len, layout, causal = case
    if layout == "contiguous":
        return ""
    pick = costs[(costs["precision"] == precision) & (costs["q_len"] == q_len) & (costs["layout"] == layout)
                 & (costs["causal"] == causal)]  # fmt: skip
    if pick.empty:
        return (f"<p><b>What {layout} costs:</b> <i>no {gpu} runs of {layout} and of the contiguous cache at "
                f"{precision}, q_len {q_len} cover the 12 competition shapes</i></p>")  # fmt: skip
    r = pick.iloc[0]
    goal = "" if r["goal"] is None or pd.isna(r["goal"]) else (
        f"; the layouts issue's goal ≤ {r['goal']:.2f}×: {'met' if r['met'] else 'not met'}")  # fmt: skip
    runs = f"both from {r['run']}" if r["same_run"] else f"{r['run']} against {r['contiguous_run']} (two runs)"
    return (f"<p><b>What {layout} costs on {gpu}:</b> our {precision} time is {r['vs_contiguous']:.3f}× our contiguous"
            f" time (geomean of the 12 competition shapes; {r['min']:.2f}–{r['max']:.2f}× by shape, worst "
            f"{r['worst_shape']}{goal}); {runs}.</p>")  # fmt: skip


def timing_panel(df: pd.DataFrame | None = None) -> TimingPanel:
    """Backends / precision / planner / run controls over the recorded timings (`df`; default: data/timings and
    data/layouts). Default view: ONE run (the newest full suite run) with Triton at its default config; the "best of
    all" box switches to the fastest row per shape over every run and config, labelled as such with the winning
    run · config per shape."""
    df = _check_df(df)
    source = "live GPU available: run `python -m mlalab bench` to add records;" if torch.cuda.is_available() else ""
    note = W.HTML()
    backends = W.SelectMultiple(options=sorted(df["backend"].unique()), value=("triton", "flashmla"),
                                description="backends")  # fmt: skip
    precision = W.Dropdown(options=sorted(df["precision"].unique()), value="a8w8", description="precision")
    planner = W.Dropdown(options=sorted(df.loc[df["backend"] == "triton", "planner"].unique()), value="simple",
                         description="planner")  # fmt: skip
    runs = sorted(df["run"].astype(str).unique(), key=natural_key)
    try:
        first = default_run(df)
    except ValueError:
        first = runs[-1]
    run = W.Dropdown(options=runs, value=first, description="run (file)", style={"description_width": "initial"},
                     layout=_WIDE)  # fmt: skip
    best = W.Checkbox(value=False, description="best of all runs and configs on the run's GPU (fastest row per shape)",
                      indent=False,
                      layout=W.Layout(width="auto"))  # fmt: skip
    full = with_case_columns(df)
    cases = sorted({(int(q), str(lay), bool(c)) for q, lay, c in zip(full["q_len"], full["layout"], full["causal"])})
    labels = [f"q_len {q} · {lay}" + (" · causal" if c else "") for q, lay, c in cases]
    layout = W.Dropdown(options=list(zip(labels, cases)),
                        value=(1, "contiguous", False) if (1, "contiguous", False) in cases else cases[0],
                        description="decode layout", style={"description_width": "initial"},
                        disabled=len(cases) < 2)  # fmt: skip
    view_html, message, table = W.HTML(), W.HTML(), W.HTML()
    bars, bw = go.FigureWidget(), go.FigureWidget()
    busy = BusyIndicator()
    shown: dict[str, object] = {"rows": None, "stem": "timings"}
    costs: dict[str, object] = {}  # layout_costs_by_gpu (or why it failed), computed when first asked for

    def refresh(*_: object) -> None:
        with busy("reading the recorded timings"):
            _refresh()

    def cost_html(gpu: str) -> str:
        if "by_gpu" not in costs:
            try:
                costs["by_gpu"] = layout_costs_by_gpu(df)
            except ValueError as e:  # (a run with two default rows of one case and shape: say so, show the rest)
                costs["by_gpu"] = f"<p><i>what each layout costs cannot be said: {e}</i></p>"
        by_gpu = costs["by_gpu"]
        if isinstance(by_gpu, str):
            return by_gpu if layout.value[1] != "contiguous" else ""
        empty = pd.DataFrame(columns=["precision", "q_len", "layout", "causal"])
        return _layout_cost_html(by_gpu.get(gpu, empty), precision.value, layout.value, gpu)

    def _refresh() -> None:
        run.disabled = best.value
        gpu = str(df.loc[df["run"] == run.value, "gpu"].iloc[0]) if "gpu" in df else REFERENCE_GPU
        where = f"best of all {gpu} runs" if best.value else str(run.value)
        try:
            view: RecordedView = recorded_view(
                df, best_of_all=best.value, run=None if best.value else run.value, planner=planner.value,
                q_len=layout.value[0], layout=layout.value[1], causal=layout.value[2], gpu=gpu,
            )  # fmt: skip
        except ValueError as e:
            view_html.value, message.value, table.value = "", f"<i>{e}</i>", ""
            note.value = f"<b>{source or 'No GPU here: recorded data'}</b> — nothing in {where}"
            for fw in (bars, bw):
                show_figure(fw, None, f"no records in {where} for planner {planner.value}")
            shown.update(rows=None, stem=f"timings_{where}")
            return
        rows = view.rows
        dates = ", ".join(sorted(rows["date"].astype(str).unique()))
        gpus = ", ".join(sorted(rows["gpu"].astype(str).unique()))
        note.value = f"<b>{source or 'No GPU here: showing recorded data'}</b> — {gpus}, {dates}"
        view_html.value = f"<b>Showing:</b> {view.label}. <b>Files read:</b> {', '.join(view.files)}."
        have = set(zip(rows["backend"], rows["precision"]))
        series = [(b, precision.value) for b in backends.value if (b, precision.value) in have]
        missing = [b for b in backends.value if (b, precision.value) not in series]
        message.value = (
            f"<i>no records for {', '.join(missing)} at precision {precision.value} in this view "
            "(flashmla: bf16/a8w8, flashinfer: bf16/a16w8, reference-torch: bf16; Triton: only the default config "
            "of the chosen planner unless best of all is on)</i>"
            if missing
            else ""
        )
        empty = f"no records for {', '.join(backends.value) or 'the chosen backends'} at {precision.value} in {where}"
        for fw, build in ((bars, bars_per_shape), (bw, bandwidth_figure)):
            show_figure(fw, build(view, series) if series else None, empty)
        picked = rows[[(b, p) in series for b, p in zip(rows["backend"], rows["precision"])]]
        cols = [c for c in ("batch", "kv_len", "backend", "precision", "planner", "us_median", "us_iqr", "tbps",
                            "pct_copy", "floor_us", "run", "config") if c in picked.columns]  # fmt: skip
        shown.update(rows=picked[cols].reset_index(drop=True), stem=f"timings_{precision.value}_{where}")
        ours = ("triton", precision.value)
        peers = [s for s in series if s[0] != "triton"]
        html = ""
        if ours in series and peers:
            html = (
                "<b>speedup = peer µs / triton µs (&gt; 1: ours faster, &lt; 1: the peer is)</b>"
                + speedup_table(view, ours, peers).round(2).to_html()
            )
        if view.best_of_all and series:
            html += "<b>which run · planner · config won each shape</b>" + winners_table(view, series).round(1).to_html(
                index=False
            )
        html = cost_html(gpu) + html
        table.value = f"<div style='overflow-x:auto;max-width:100%'>{html}</div>" if html else ""

    for w in (backends, precision, planner, run, best, layout):
        w.observe(refresh, names="value")
    exp = export_bar(lambda: str(shown["stem"]), table=lambda: shown["rows"],  # type: ignore[arg-type,return-value]
                     figures=lambda: {"time": bars, "bandwidth": bw})  # fmt: skip
    refresh()
    controls = W.HBox([backends, W.VBox([precision, planner, layout, run, best])],
                      layout=W.Layout(flex_flow="row wrap"))  # fmt: skip
    panel = W.VBox([note, controls, busy.widget, view_html, message, bars, bw, table, exp.box])
    return TimingPanel(panel, backends, precision, planner, run, best, bars, bw, view_html, message, table, note,
                       busy, exp, shown, layout)  # fmt: skip


@dataclass
class PlanTimePanel:
    """The plan↔time panel plus handles tests drive: the shape dropdown, both figures, the facts and a message."""

    panel: W.Widget
    shape: W.Dropdown
    work_map: go.FigureWidget
    cu_load: go.FigureWidget
    facts: W.HTML
    message: W.HTML


def _replace(fw: go.FigureWidget, fig: go.Figure | None, empty: str = "nothing to show") -> None:
    show_figure(fw, fig, empty)


def plan_time_panel(
    df: pd.DataFrame | None = None, precision: str = "a8w8", shape: tuple[int, int] = (4, 1024),
    best_of_all: bool = False,
) -> PlanTimePanel:  # fmt: skip
    """Shape dropdown (the 12 competition shapes) -> the plan of the Triton row the timing view shows at
    `precision` (one run's default config; the fastest row over all runs with `best_of_all`), rebuilt from its
    planner name and plan slots, drawn as a work map and per-CU load beside the measured time. Says whether the
    rebuilt plan is the measured one (plan digest in the record) or only today's plan (older runs)."""
    df = _check_df(df)
    if tuple(shape) not in COMPETITION_SHAPES:
        raise ValueError(f"shape must be one of the competition shapes {COMPETITION_SHAPES}, got {shape!r}")
    if not isinstance(best_of_all, bool):
        raise TypeError(f"best_of_all must be a bool, got {type(best_of_all).__name__}")
    options = [(f"B{b} × L{L}", (b, L)) for b, L in COMPETITION_SHAPES]
    dd = W.Dropdown(options=options, value=tuple(shape), description="shape (batch × KV tokens)",
                    style={"description_width": "initial"})  # fmt: skip
    work_map, cu_load = go.FigureWidget(), go.FigureWidget()
    facts, message = W.HTML(), W.HTML()
    busy = BusyIndicator()
    shown: dict[str, object] = {"table": None, "stem": "plan"}

    def refresh(*_: object) -> None:
        with busy("rebuilding the plan of the recorded row"):
            _refresh()

    def _refresh() -> None:
        b, L = dd.value
        shown.update(table=None, stem=f"plan_{precision}_B{b}_L{L}")
        try:
            row = record_for_shape(df, b, L, "triton", precision, best_of_all=best_of_all)
            plan = plan_of_record(row)
        except ValueError as e:  # no record, or a planner that cannot rebuild it: say so in the panel
            message.value = f"<i>{e}</i>"
            facts.value = ""
            _replace(work_map, None, f"no plan to show for B{b} × L{L}")
            _replace(cu_load, None, f"no plan to show for B{b} × L{L}")
            return
        f = plan_time_facts(row, plan)
        shown["table"] = plan.to_frame()
        wm, cl = plan_time_figures(row, plan)
        _replace(work_map, wm)
        _replace(cu_load, cl)
        message.value = ""
        cfg = row["config"] if isinstance(row["config"], str) else "the defaults of that run"
        how = "fastest over all runs and configs" if best_of_all else "default config of one run"
        facts.value = (
            f"<div {_WRAP}><b>measured {f['us_median']:.1f} µs per call, {f['pct_copy']:.1f} % of copy bandwidth</b> "
            f"({how}: planner <code>{f['planner']}</code>, {f['slots']} plan slots on {f['sm_count']} SMs, "
            f"{f['works']} works; config <code>{cfg}"
            f"</code>; file {row['run']})<br>{f['sentence']}</div>"
        )

    dd.observe(refresh, names="value")
    refresh()
    exp = export_bar(lambda: str(shown["stem"]), table=lambda: shown["table"],  # type: ignore[arg-type,return-value]
                     figures=lambda: {"work_map": work_map, "cu_load": cu_load})  # fmt: skip
    panel = W.VBox([dd, busy.widget, message, facts, work_map, cu_load, exp.box])
    return PlanTimePanel(panel, dd, work_map, cu_load, facts, message)


@dataclass
class TimelinePanel:
    """The per-CTA timeline panel plus handles tests drive: the shape dropdown, the Gantt chart, the summary."""

    panel: W.Widget
    shape: W.Dropdown
    figure: go.FigureWidget
    summary: W.HTML


def timeline_panel(events: pd.DataFrame | None = None, shape: tuple[int, int] | None = None) -> TimelinePanel:
    """Shape dropdown (the shapes the events file recorded) -> the Gantt chart of stage 1 per CTA and a table of
    where its time goes (`mlalab.plots.timeline`). Default: the newest data/profiles/*_timeline.csv (H200)."""
    if events is None:
        try:
            events = load_timelines()
        except FileNotFoundError as e:  # a checkout without recorded profiles: say so instead of failing
            return TimelinePanel(W.HTML(f"<i>{e}</i>"), W.Dropdown(), go.FigureWidget(), W.HTML(f"<i>{e}</i>"))
    if not isinstance(events, pd.DataFrame):
        raise TypeError(f"events must be a pandas DataFrame, got {type(events).__name__}")
    shapes = sorted({(int(b), int(n)) for b, n in zip(events["B"], events["L"])}, key=lambda s: (s[1], s[0]))
    if not shapes:
        raise ValueError("the events frame is empty")
    shape = shapes[0] if shape is None else tuple(shape)
    if shape not in shapes:
        raise ValueError(f"shape must be one of the recorded shapes {shapes}, got {shape!r}")
    dd = W.Dropdown(options=[(f"B{b} × L{n}", (b, n)) for b, n in shapes], value=shape,
                    description="shape (batch × KV tokens)", style={"description_width": "initial"})  # fmt: skip
    fig, summary = go.FigureWidget(), W.HTML()
    busy = BusyIndicator()

    def refresh(*_: object) -> None:
        with busy("drawing the time line"):
            b, n = dd.value
            _replace(fig, cta_timeline_figure(events, b, n))
            rows = "".join(f"<tr><td>{k}</td><td>{v:.2f}</td></tr>" for k, v in timeline_summary(events, b, n).items())
            src = events["run"].iloc[0] if "run" in events.columns else "the given events"
            summary.value = (f"<b>where stage 1's time goes</b> (µs, medians over busy CTAs; ctas busy is a count; "
                             f"one stamped launch from {src})<table>{rows}</table>")  # fmt: skip

    def shown_events() -> pd.DataFrame:
        b, n = dd.value
        return events[(events["B"] == b) & (events["L"] == n)].reset_index(drop=True)

    dd.observe(refresh, names="value")
    refresh()
    exp = export_bar(lambda: f"timeline_B{dd.value[0]}_L{dd.value[1]}", table=shown_events,
                     figures=lambda: {"timeline": fig})  # fmt: skip
    return TimelinePanel(W.VBox([dd, busy.widget, summary, fig, exp.box]), dd, fig, summary)


@dataclass
class ExperimentsPanel:
    """The design-experiments panel plus handles tests drive: the file dropdown, the figure, the geomean table."""

    panel: W.Widget
    experiment: W.Dropdown
    figure: go.FigureWidget
    table: W.HTML


def experiments_panel(name: str | None = None) -> ExperimentsPanel:
    """File dropdown (data/profiles/*_ab_*.csv: kernel variants timed beside FlashMLA fp8 in one process) -> each
    variant's time over FlashMLA's per shape and the geomeans (`mlalab.plots.experiments`). Default: the last file in
    name order."""
    names = list_experiments()
    if not names:
        msg = "<i>no recorded experiments (data/ab/*.csv; record one with experiments/ab.py)</i>"
        return ExperimentsPanel(W.HTML(msg), W.Dropdown(), go.FigureWidget(), W.HTML(msg))
    name = names[-1] if name is None else name
    if name not in names:
        raise ValueError(f"name must be one of the recorded experiments {names}, got {name!r}")
    dd = W.Dropdown(options=names, value=name, description="experiment (file)", style={"description_width": "initial"},
                    layout=_WIDE)  # fmt: skip
    fig, table, question = go.FigureWidget(), W.HTML(), W.HTML()
    questions = experiment_questions()
    busy = BusyIndicator()
    shown: dict[str, object] = {}

    def refresh(*_: object) -> None:
        with busy("reading the experiment"):
            df = load_experiment(dd.value)
            q = questions.get(dd.value, "")
            title = f"{q}<br><sub>{dd.value}</sub>" if q else None
            _replace(fig, experiment_figure(df, title=title))
            question.value = (f"<div {_WRAP}><b>Question:</b> {q or '(not in data/INDEX.csv)'} — what each variant "
                              "code changed, and whether it was kept: the rows of docs/journal.md that name "
                              f"<code>ab/{dd.value}</code>.</div>")  # fmt: skip
            g = experiment_geomeans(df)
            shown.update(table=g, stem=dd.value.removesuffix(".csv"))
            rows = "".join(f"<tr><td>{r.variant}</td><td>{r.geomean_us:.2f}</td><td>{r.vs_reference:.3f}×</td>"
                           f"<td>{r.shapes}</td></tr>" for r in g.itertuples())  # fmt: skip
            head = "<tr><th>variant</th><th>µs</th><th>ratio</th><th>shapes</th></tr>"
            table.value = (f"<div {_WRAP}><b>geomean over the shapes each ran</b> (µs; × {peer_name(df)} over the "
                           f"same shapes), measured on the H200 in one process ({dd.value})<table>{head}{rows}</table>"
                           "</div>")  # fmt: skip

    dd.observe(refresh, names="value")
    refresh()
    exp = export_bar(lambda: str(shown["stem"]), table=lambda: shown["table"],  # type: ignore[arg-type,return-value]
                     figures=lambda: {"ratios": fig})  # fmt: skip
    return ExperimentsPanel(W.VBox([dd, busy.widget, question, table, fig, exp.box]), dd, fig, table)

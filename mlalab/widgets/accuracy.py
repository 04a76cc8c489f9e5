"""Notebook 02 panel: case, input distribution, fp8 flavour, Q scheme, KV schemes, tolerance (an (rtol, atol) pair or a
competition's named check) and a competition preset (its distribution, std, seed and check) -> metrics table
(HTML, scrolls sideways), SQNR heatmap (every Q scheme × the chosen KV schemes) with a note when the Q schemes tie
and a button for inputs that separate them, error histograms and value histograms with fp8 bands.

Results are cached per (case, format, scheme), so changing only the tolerance or the selection redraws at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go
import torch

from ..accuracy import (
    CHECKS,
    DEFAULT_TOLERANCES,
    PRESETS,
    NamedCheck,
    Prepared,
    check_key,
    decode_q_variants,
    evaluate_prepared,
    mismatch_key,
    prepare,
)
from ..checks import TooLargeError
from ..config import DecodeCase, InputDist
from ..plots.accuracy import (
    STUDY_DIMENSIONS,
    TABLE_COLUMNS,
    error_histogram,
    error_vs_kv_len,
    metrics_table_html,
    sqnr_heatmap,
    value_histogram,
)
from ..quant import FP8_FORMATS, KV_SCHEMES, Q_SCHEMES, Fp8Scheme, concrete_names, get_kv_scheme, get_q_scheme
from .export import BusyIndicator, ExportBar, export_bar

__all__ = ["AccuracyPanel", "accuracy_panel", "q_tie_note", "StudyPanel", "study_panel"]

STATIC = "fp8-static"  # the widget's label for fp8-static:<amax>, with the amax from its own box
PROGRESS_ABOVE_TOKENS = 8192  # bigger cases show a progress bar
TIE_DB = 1.0  # Q schemes whose SQNR differs by less than this (per KV scheme) are said to tie
ALL = "(all)"  # a study filter that keeps every value
SEPARATING_INPUT = ("heavy-tail", 1.0)  # (distribution, std) where the Q schemes' errors differ by several dB
_STD_OPTIONS = [
    ("distribution default", 0.0),
    ("0.002", 0.002),
    ("0.02", 0.02),
    ("0.2", 0.2),
    ("1", 1.0),
    ("10", 10.0),
    ("100", 100.0),
    ("300", 300.0),
]


def _replace(fig: go.FigureWidget, fresh: go.Figure) -> None:
    with fig.batch_update():
        fig.data = []
        for tr in fresh.data:
            fig.add_trace(tr)
        fig.layout = fresh.layout


@dataclass
class AccuracyPanel:
    """Handles to every control and output, so tests can drive the panel from Python."""

    batch: W.IntSlider
    kv_len: W.Dropdown
    q_len: W.Dropdown
    dist: W.Dropdown
    std: W.Dropdown
    fp8_format: W.Dropdown
    q_scheme: W.Dropdown
    kv_schemes: W.SelectMultiple
    static_amax: W.BoundedFloatText
    tolerance: W.Dropdown
    preset: W.Dropdown  # "" = custom inputs; a preset's name sets dist, std, seed and tolerance
    message: W.HTML
    status: W.HTML  # the busy line: "computing …" while it works, then "updated in N s"
    progress: W.IntProgress
    table: W.HTML
    tie_note: W.HTML
    separate: W.Button
    heatmap: go.FigureWidget
    errors: go.FigureWidget
    q_values: go.FigureWidget
    kv_values: go.FigureWidget
    box: W.VBox
    busy: BusyIndicator
    export: ExportBar
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    last_seconds: float = 0.0
    _prep: dict[Any, Prepared] = field(default_factory=dict)
    _kv: dict[Any, torch.Tensor] = field(default_factory=dict)
    _rec: dict[Any, dict[str, Any]] = field(default_factory=dict)
    _qstats: dict[Any, dict[str, float]] = field(default_factory=dict)

    _held: bool = False

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Change several controls without an update after each (call `update` afterwards)."""
        self._held = True
        try:
            yield
        finally:
            self._held = False

    def _name(self, n: str) -> str:
        return f"fp8-static:{float(self.static_amax.value):g}" if n == STATIC else n

    def case(self) -> DecodeCase:
        std = float(self.std.value)
        b, n = int(self.batch.value), int(self.kv_len.value)
        return DecodeCase.uniform(
            b,
            n,
            q_len=int(self.q_len.value),
            dist=str(self.dist.value),
            scale=std if std > 0 else None,
            seed=PRESETS[self.preset.value].seed_for(b, n) if self.preset.value else 0,
        )

    def apply_preset(self, *_: object) -> None:
        """Set the inputs (distribution, std; the shape when the current one is not among the preset's) and the
        tolerance to the chosen preset's, then update once."""
        if not self.preset.value:
            return
        pr = PRESETS[self.preset.value]
        with self.hold():
            self.dist.value, self.std.value = pr.dist.value, float(pr.scale)
            if (int(self.batch.value), int(self.kv_len.value)) not in pr.shapes:
                self.batch.value, self.kv_len.value = pr.shapes[0]
            self.tolerance.value = pr.check
        self.update()

    def _inputs_changed(self, *_: object) -> None:
        """A distribution or std the preset does not use turns the preset off (custom inputs)."""
        if self._held or not self.preset.value:
            return
        pr = PRESETS[self.preset.value]
        if (self.dist.value, float(self.std.value)) != (pr.dist.value, float(pr.scale)):
            with self.hold():
                self.preset.value = ""

    def _prepared(self, case: DecodeCase) -> Prepared:
        if case not in self._prep:
            self._prep.clear()  # one case at a time: bounded memory
            self._kv.clear()
            self._rec.clear()
            self._qstats.clear()
            self._prep[case] = prepare(case)
        return self._prep[case]

    def _records(self, p: Prepared, qs: list[str], kv: str, fmt: str) -> list[dict[str, Any]]:
        """Records of every Q scheme with one KV scheme; missing ones are decoded together in one call."""
        missing = [q for q in qs if (q, kv, fmt) not in self._rec]
        if missing:
            if (kv, fmt) not in self._kv:
                self._kv[(kv, fmt)] = get_kv_scheme(kv, fmt).fake_quant(p.kv)
            for q in missing:
                if ("q", q, fmt) not in self._kv:
                    sch = get_q_scheme(q, fmt)
                    self._kv[("q", q, fmt)] = sch.fake_quant(p.inputs.q)
                    self._qstats[(q, fmt)] = sch.range_stats(p.inputs.q)
            kd = self._kv[(kv, fmt)]
            decoded = decode_q_variants(p, [self._kv[("q", q, fmt)] for q in missing], kd)
            for q, dec in zip(missing, decoded):
                rec = evaluate_prepared(
                    p,
                    q,
                    kv,
                    fmt,
                    tolerances=DEFAULT_TOLERANCES,
                    kv_deq=kd,
                    q_deq=self._kv[("q", q, fmt)],
                    q_stats=self._qstats[(q, fmt)],
                    decoded=dec,
                    return_tensors=True,
                )
                t = rec.pop("_tensors")
                rec["_err"] = t["out"] - t["ref"]
                self._rec[(q, kv, fmt)] = rec
        return [self._rec[(q, kv, fmt)] for q in qs]

    def update(self, *_: object) -> None:
        if self._held:
            return
        with self.busy("computing the accuracy records"):
            self._update()
        self.last_seconds = float(self.busy.last_seconds or 0.0)

    def _update(self) -> None:
        try:
            case = self.case()
            fmt = str(self.fp8_format.value)
            kvs = [self._name(n) for n in self.kv_schemes.value]
            if not kvs:
                raise ValueError("select at least one KV scheme (ctrl/shift-click for several)")
            q_sel = self._name(str(self.q_scheme.value))
            qs = list(dict.fromkeys([*concrete_names(Q_SCHEMES), q_sel]))
            for n in qs:
                get_q_scheme(n, fmt)  # validate names before the heavy work
            for n in kvs:
                get_kv_scheme(n, fmt)
            tol = self.tolerance.value
            rt, at = (tol.rtol, tol.atol) if isinstance(tol, NamedCheck) else tol
            big = case.total_kv > PROGRESS_ABOVE_TOKENS
            self.progress.layout.visibility = "visible" if big else "hidden"
            self.progress.max, self.progress.value = len(kvs), 0
            p = self._prepared(case)
            recs = []
            for kv in kvs:
                recs.extend(self._records(p, qs, kv, fmt))
                self.progress.value += 1
            df = pd.DataFrame([{k: v for k, v in r.items() if k != "_err"} for r in recs])
            self.records = df
            chosen = df[df.q_scheme == get_q_scheme(q_sel, fmt).name]
            if isinstance(tol, NamedCheck):
                extra = [check_key(tol, "mismatch"), check_key(tol, "passes")] + [
                    check_key(tol, "passes", b) for b in ("zeros_", "meanv_", "halfkv_")
                ]
                what = tol.describe()
            else:
                extra = [mismatch_key(rt, at, b) for b in ("", "zeros_", "meanv_", "halfkv_")]
                what = f"mismatch at rtol={rt:g}, atol={at:g}"
            cols = [c for c in TABLE_COLUMNS if c in df] + extra
            self.table.value = metrics_table_html(chosen, cols, title=f"Q scheme {q_sel}, {what}")
            _replace(self.heatmap, sqnr_heatmap(df))
            self.tie_note.value = q_tie_note(df, case)
            errs = {
                f"{r['q_scheme']} + {r['kv_scheme']}": r["_err"]
                for r in recs
                if r["q_scheme"] == chosen.iloc[0]["q_scheme"]
            }
            _replace(self.errors, error_histogram(errs, relative_to=float(chosen.iloc[0]["ref_rms"])))
            self._values(p, q_sel, kvs, fmt)
            first = chosen.iloc[0]
            if isinstance(tol, NamedCheck):
                zeros_pass, cheat_pass = (
                    bool(first[check_key(tol, "passes", "zeros_")]),
                    bool(first[check_key(tol, "passes", "halfkv_")]),
                )
            else:
                zeros_pass = float(first[mismatch_key(rt, at, "zeros_")]) == 0
                cheat_pass = float(first[mismatch_key(rt, at, "halfkv_")]) == 0
            warn = (
                " <b>An all-zeros output passes this tolerance: it cannot see errors at this input scale.</b>"
                if zeros_pass
                else ""
            )
            if cheat_pass:
                warn += " <b>The half-KV cheat (every other KV page) passes it too.</b>"
            self.message.value = (
                f"{case.short_str()}: reference RMS {float(chosen.iloc[0]['ref_rms']):.3g}, "
                f"max |o| {float(chosen.iloc[0]['ref_max_abs']):.3g}.{warn}"
            )
        except (ValueError, TypeError, TooLargeError) as e:  # show the problem in the panel, never a traceback
            self.message.value = f"<span style='color:#b00'>⚠ {e}</span>"
        finally:
            self.progress.layout.visibility = "hidden"

    def _values(self, p: Prepared, q_sel: str, kvs: list[str], fmt: str) -> None:
        qs = get_q_scheme(q_sel, fmt)
        if isinstance(qs, Fp8Scheme):
            _replace(self.q_values, value_histogram(qs.scaled_values(p.inputs.q), fmt, title=f"q / scale ({q_sel})"))
        else:
            _replace(self.q_values, value_histogram(p.inputs.q, fmt, title="q, direct cast (scale 1)"))
        kv_fp8 = next((n for n in kvs if isinstance(get_kv_scheme(n, fmt), Fp8Scheme)), "fp8-tensor")
        ks = get_kv_scheme(kv_fp8, fmt)
        assert isinstance(ks, Fp8Scheme)
        _replace(self.kv_values, value_histogram(ks.scaled_values(p.kv), fmt, title=f"kv / scale ({kv_fp8})"))


def q_tie_note(df: pd.DataFrame, case: DecodeCase) -> str:
    """Why every Q-scheme row of the heatmap can be the same: computed from the records shown. Empty when the Q
    schemes differ by TIE_DB or more for some KV scheme."""
    if not isinstance(df, pd.DataFrame) or not {"q_scheme", "kv_scheme", "sqnr_db"} <= set(df):
        raise ValueError("df must be the panel's records (q_scheme, kv_scheme, sqnr_db columns)")
    piv = df.pivot_table(index="q_scheme", columns="kv_scheme", values="sqnr_db", aggfunc="mean")
    spread = (piv.max() - piv.min()).dropna()
    if spread.empty or float(spread.max()) >= TIE_DB:
        return ""
    dist, std = SEPARATING_INPUT
    bf16 = piv.loc["bf16", "bf16"] if "bf16" in piv.index and "bf16" in piv.columns else None
    out_round = f" (for bf16 KV, only the bf16 rounding of the output is left: {bf16:.1f} dB)" if bf16 else ""
    return (
        f"<b>Why every Q scheme gives the same SQNR here</b> (they differ by at most {float(spread.max()):.2f} dB per "
        f"KV scheme): with inputs of std {case.std:g} the scores q·k are tiny, so attention is nearly uniform and the "
        "small error that quantizing q adds to the scores barely moves the output. The error you see is the KV "
        f"scheme's{out_round}. With std-1 inputs attention is peaked and q's error shows; with heavy-tailed inputs "
        f"the scaling granularities differ too. The button below switches to {dist}, std {std:g}."
    )


def accuracy_panel(
    batch: int = 4,
    kv_len: int = 1024,
    dist: str = "competition",
    fp8_format: str = "e4m3fn",
    q_scheme: str = "fp8-tensor",
    kv_schemes: tuple[str, ...] = ("bf16", "fp8-tensor", "mxfp4-aiter"),
) -> AccuracyPanel:
    """Build the panel and compute its first state. Display ``panel.box``."""
    style = {"description_width": "150px"}
    lay = W.Layout(width="360px")
    b = W.IntSlider(
        value=batch, min=1, max=64, description="batch (requests)", style=style, layout=lay, continuous_update=False
    )
    L = W.Dropdown(
        options=[64, 256, 512, 1024, 2048, 4096, 8192, 16384],
        value=kv_len,
        description="kv_len (tokens)",
        style=style,
        layout=lay,
    )
    ql = W.Dropdown(options=[1, 2, 4], value=1, description="q_len (tokens/request)", style=style, layout=lay)
    d = W.Dropdown(
        options=[x.value for x in InputDist], value=dist, description="input distribution", style=style, layout=lay
    )
    sd = W.Dropdown(options=_STD_OPTIONS, value=0.0, description="input std (× randn)", style=style, layout=lay)
    f = W.Dropdown(options=list(FP8_FORMATS), value=fp8_format, description="fp8 flavour", style=style, layout=lay)
    q_opts = [*concrete_names(Q_SCHEMES), STATIC]
    kv_opts = [*concrete_names(KV_SCHEMES), STATIC]
    q = W.Dropdown(options=q_opts, value=q_scheme, description="Q scheme", style=style, layout=lay)
    kv = W.SelectMultiple(
        options=kv_opts, value=tuple(kv_schemes), rows=6, description="KV schemes (multi)", style=style, layout=lay
    )
    amax = W.BoundedFloatText(
        value=0.1, min=1e-6, max=1e6, description="static amax (|x| units)", style=style, layout=lay
    )
    tol = W.Dropdown(
        options=[(f"rtol {r:g}, atol {a:g}", (r, a)) for r, a in DEFAULT_TOLERANCES]
        + [(f"{c.name} check", c) for c in CHECKS.values()],
        value=DEFAULT_TOLERANCES[0],
        description="tolerance",
        style=style,
        layout=lay,
    )
    pre = W.Dropdown(
        options=[("custom inputs", ""), *[(name, name) for name in PRESETS]],
        value="",
        description="competition preset",
        style=style,
        layout=lay,
    )
    msg, busy = W.HTML(), BusyIndicator()
    prog = W.IntProgress(value=0, min=0, max=1, description="computing", layout=W.Layout(visibility="hidden"))
    table = W.HTML()
    note = W.HTML()
    dist_sep, std_sep = SEPARATING_INPUT
    sep = W.Button(
        description=f"inputs that separate Q schemes ({dist_sep}, std {std_sep:g})",
        layout=W.Layout(width="auto"),
        tooltip="switch the input distribution and std to where quantizing q changes the output visibly",
    )
    figs = [go.FigureWidget() for _ in range(4)]
    controls = W.HBox(
        [W.VBox([b, L, ql, d, sd]), W.VBox([f, q, kv, amax, tol, pre])], layout=W.Layout(flex_flow="row wrap")
    )
    # one column: every figure gets the notebook's full width (nothing clipped at 1280 px)
    shown: dict[str, AccuracyPanel] = {}
    exp = export_bar(
        lambda: f"accuracy_{shown['panel'].case().short_str()}",
        table=lambda: shown["panel"].records,
        figures=lambda: dict(zip(("sqnr_heatmap", "errors", "q_values", "kv_values"), figs)),
    )
    box = W.VBox([controls, prog, msg, busy.widget, table, figs[0], note, sep, *figs[1:], exp.box])
    panel = AccuracyPanel(
        b, L, ql, d, sd, f, q, kv, amax, tol, pre, msg, busy.widget, prog, table, note, sep, *figs, box, busy, exp
    )
    shown["panel"] = panel
    for w in (d, sd):
        w.observe(panel._inputs_changed, names="value")  # before the update: a changed input ends the preset
    for w in (b, L, ql, d, sd, f, q, kv, amax, tol):
        w.observe(panel.update, names="value")
    pre.observe(panel.apply_preset, names="value")

    def separate(_: object) -> None:
        with panel.hold():
            d.value, sd.value = dist_sep, std_sep
        panel.update()

    sep.on_click(separate)
    panel.update()
    return panel


@dataclass
class StudyPanel:
    """Slices of a study table: a heatmap over two chosen dimensions (the others filtered or averaged) and the
    chosen metric against kv_len with the spread over seeds."""

    df: pd.DataFrame
    rows: W.Dropdown
    columns: W.Dropdown
    value: W.Dropdown
    filters: dict[str, W.Dropdown]
    message: W.HTML
    heatmap: go.FigureWidget
    curves: go.FigureWidget
    box: W.VBox
    export: ExportBar

    def selection(self) -> pd.DataFrame:
        df = self.df[self.df.error == ""] if "error" in self.df else self.df
        for col, w in self.filters.items():
            if w.value != ALL:
                df = df[df[col].astype(str) == str(w.value)]
        return df

    def update(self, *_: object) -> None:
        try:
            if self.rows.value == self.columns.value:
                raise ValueError("pick two different dimensions for the heatmap's rows and columns")
            sel = self.selection()
            if sel.empty:
                raise ValueError("no rows match these filters")
            fixed = ", ".join(f"{c} {w.value}" for c, w in self.filters.items() if w.value != ALL) or "every row"
            avg = [c for c in STUDY_DIMENSIONS if c in sel and c not in (self.rows.value, self.columns.value)]
            avg = [c for c in avg if sel[c].nunique() > 1]
            # the filters and the averaged dimensions on a second, smaller line: a long one stays clear of the toolbar
            title = f"{self.value.value}: {self.rows.value} × {self.columns.value}<br><sup>{fixed}"
            title += f"; mean over {', '.join(avg)}</sup>" if avg else "</sup>"
            _replace(
                self.heatmap,
                sqnr_heatmap(sel, self.value.value, rows=self.rows.value, columns=self.columns.value, title=title),
            )
            _replace(self.curves, error_vs_kv_len(sel, self.value.value, color="kv_scheme"))
            self.message.value = f"{len(sel)} rows of {len(self.df)} selected ({fixed})."
        except ValueError as e:
            self.message.value = f"<span style='color:#b00'>⚠ {e}</span>"


def study_panel(df: pd.DataFrame, *, value: str = "sqnr_db", **fixed: object) -> StudyPanel:
    """Build the study panel on a sweep table (`mlalab.accuracy.read_table` / `recorded_study`); `fixed` preselects
    filters, e.g. ``q_scheme="fp8-tensor"``. Display ``panel.box``."""
    if not isinstance(df, pd.DataFrame) or not {"q_scheme", "kv_scheme", "kv_len", value} <= set(df):
        raise ValueError(f"df must be a sweep table with q_scheme, kv_scheme, kv_len and {value!r} columns")
    dims = [c for c in STUDY_DIMENSIONS if c in df]
    style, lay = {"description_width": "110px"}, W.Layout(width="300px")
    metrics = [c for c in ("sqnr_db", "rel_l2", "max_abs_over_ref_rms", "worst_row_cosine") if c in df]
    rows = W.Dropdown(options=dims, value="kv_scheme", description="heatmap rows", style=style, layout=lay)
    cols = W.Dropdown(
        options=dims, value="dist" if "dist" in dims else "q_scheme", description="columns", style=style, layout=lay
    )
    val = W.Dropdown(options=metrics, value=value, description="metric", style=style, layout=lay)
    filters = {}
    for c in dims:
        opts = [ALL, *sorted(df[c].astype(str).unique(), key=lambda v: (len(v), v))]
        pick = str(fixed.get(c, ALL))
        if pick not in opts:
            raise ValueError(f"{c}={fixed.get(c)!r} is not in the table; it holds {opts[1:]}")
        filters[c] = W.Dropdown(options=opts, value=pick, description=c, style=style, layout=lay)
    msg = W.HTML()
    figs = [go.FigureWidget(), go.FigureWidget()]
    controls = W.HBox(
        [W.VBox([rows, cols, val]), W.VBox(list(filters.values()))], layout=W.Layout(flex_flow="row wrap")
    )
    shown: dict[str, StudyPanel] = {}
    exp = export_bar(
        lambda: f"study_{val.value}_{rows.value}_x_{cols.value}",
        table=lambda: shown["panel"].selection(),
        figures=lambda: {"heatmap": figs[0], "vs_kv_len": figs[1]},
    )
    box = W.VBox([controls, msg, *figs, exp.box])
    panel = StudyPanel(df, rows, cols, val, filters, msg, *figs, box, exp)
    shown["panel"] = panel
    for w in (rows, cols, val, *filters.values()):
        w.observe(panel.update, names="value")
    panel.update()
    return panel

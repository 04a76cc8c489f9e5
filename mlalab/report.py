"""A standalone HTML report of the key figures, for sharing results without Jupyter.

The page reads top to bottom: the recorded timings, every design experiment in one table and one figure (each
experiment's own figure only with ``details``), the quantization accuracy, the bandwidth floor and a split-KV work
map. It embeds plotly.js once, gzip-compressed inline (the browser unpacks it with ``DecompressionStream``), so it
opens offline (file://, e-mail attachment) and stays under 2 MB. Every figure comes from the figure builders in
``mlalab.plots.<topic>`` — nothing is re-implemented here. A section whose data is missing says so in the page,
with the reason, instead of showing a made-up figure. The page names files relative to the repository (``data/...``),
never a path of the machine that made it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import html
import json
import os
import platform
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import plotly
import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from . import __version__
from .accuracy import sweep
from .accuracy.frontier import frontier_table
from .config import GPU_TARGETS, DecodeCase
from .io import natural_key
from .plan import indptrs_for, make_plan
from .plots.accuracy import sqnr_heatmap
from .plots.basics import floor_by_target_figure
from .plots.experiments import (
    experiment_figure,
    experiment_questions,
    experiment_summary,
    experiments_summary_figure,
)
from .plots.frontier import bytes_floor_figure, frontier_figure
from .plots.splitkv import cu_load_figure, work_map_figure
from .plots.timeline import ablation_figure
from .plots.timing import bandwidth_figure, bars_per_shape, layout_cost_figure
from .records.ab import list_experiments, load_experiment
from .records.profiles import ABLATION_KINDS, load_ablation_profile
from .records.timings import layout_costs_by_gpu, load_recorded, recorded_view

__all__ = [
    "ReportOptions",
    "Section",
    "SECTION_BUILDERS",
    "build_sections",
    "render_html",
    "write_report",
    "default_data_dir",
    "SIZE_LIMIT_BYTES",
    "DETAIL_SECTIONS",
]

#: The page's size limit (checked by the tests): plotly.js compressed (~1.9 MB) plus the figures.
SIZE_LIMIT_BYTES = 2_000_000


def default_data_dir() -> Path:
    """``data/`` of the repository this package lives in (``MLALAB_DATA`` overrides)."""
    env = os.environ.get("MLALAB_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True)
class ReportOptions:
    """What the report shows. Defaults match the competition shapes and run in seconds on a 2-core CPU."""

    kv_len: int = 1024
    batch: int = 4
    target: str = "mi300x"
    planner: str = "aiter-fast"
    seed: int = 0
    data_dir: Path = field(default_factory=default_data_dir)
    title: str = "mlalab report — DeepSeek-R1 MLA decode"
    details: bool = False  # also each experiment's own figure (per shape, variant codes in the legend)

    def __post_init__(self) -> None:
        for name in ("kv_len", "batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(self.planner, str) or not self.planner:
            raise ValueError(f"planner must be a planner name, got {self.planner!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")
        if not isinstance(self.target, str) or self.target.lower() not in GPU_TARGETS:
            raise ValueError(f"target must be one of {sorted(GPU_TARGETS)}, got {self.target!r}")
        if not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not isinstance(self.title, str):
            raise TypeError(f"title must be a str, got {type(self.title).__name__}")
        if not isinstance(self.details, bool):
            raise TypeError(f"details must be a bool, got {type(self.details).__name__}")


@dataclass(frozen=True)
class Section:
    """One part of the page: a figure, or the reason there is none."""

    key: str
    title: str
    description: str
    figures: tuple[go.Figure, ...] = ()
    unavailable: str | None = None  # why the section has no figure (shown in the page)
    source: str = ""  # which builder made it, e.g. "mlalab.plots.basics.floor_by_target_figure"
    table_html: str = ""  # a table shown above the figures (already escaped HTML)

    def __post_init__(self) -> None:
        if not self.figures and not self.unavailable and not self.table_html:
            raise ValueError(f"section {self.key!r}: give figures, a table or the reason they are unavailable")
        for f in self.figures:
            if not isinstance(f, go.Figure):
                raise TypeError(f"section {self.key!r}: figures must be plotly go.Figure, got {type(f).__name__}")


def _unavailable(key: str, title: str, description: str, reason: str) -> Section:
    return Section(key, title, description, unavailable=reason)


# --- sections ------------------------------------------------------------------------------------------------


def section_floor(opts: ReportOptions) -> Section:
    key, title = "floor", "Bandwidth floor of one decode call"
    desc = (
        f"Bytes moved per call divided by bandwidth, per GPU target and KV storage format "
        f"(batch {opts.batch}, kv_len {opts.kv_len}). H200: measured copy bandwidth; MI300X/MI355X: datasheet."
    )
    fig = floor_by_target_figure(DecodeCase.uniform(opts.batch, opts.kv_len))
    return Section(key, title, desc, (fig,), source="mlalab.plots.basics.floor_by_target_figure")


# Q × KV schemes of the report's heatmap: the plain casts, the competition's per-tensor fp8, finer fp8 scales,
# and the 4-bit KV formats.
# (Q schemes barely move the output SQNR — notebook 02 shows it — so three rows are enough here.)
ACCURACY_Q_SCHEMES = ("bf16", "fp8-direct", "fp8-tensor")
ACCURACY_KV_SCHEMES = ("bf16", "fp8-tensor", "fp8-block128", "mxfp4-aiter", "nvfp4")


def section_accuracy(opts: ReportOptions) -> Section:
    key, title = "accuracy", "Quantization accuracy: SQNR over Q scheme × KV scheme"
    tgt = GPU_TARGETS[opts.target.lower()]
    desc = (
        f"Output SQNR (dB, higher is better) of the fake-quantized decode against the exact fp64 reference, "
        f"computed now on batch {opts.batch}, kv_len {opts.kv_len}, competition inputs (randn·0.02), seed "
        f"{opts.seed}, fp8 flavour {tgt.fp8_flavour} ({tgt.name}). NaN = overflow."
    )
    case = DecodeCase.uniform(opts.batch, opts.kv_len, seed=opts.seed)
    df = sweep(case, ACCURACY_Q_SCHEMES, ACCURACY_KV_SCHEMES, (tgt.fp8_flavour,), progress=False)
    fig = sqnr_heatmap(df, title=f"SQNR (dB): Q scheme × KV scheme — {case.short_str()}, {tgt.fp8_flavour}")
    return Section(key, title, desc, (fig,), source="mlalab.accuracy.sweep → mlalab.plots.accuracy.sqnr_heatmap")


def section_workmap(opts: ReportOptions) -> Section:
    key, title = "workmap", "Persistent split-KV: work map per CU"
    tgt = GPU_TARGETS[opts.target.lower()]
    desc = (
        f"Work items of planner '{opts.planner}' on {tgt.name} ({tgt.num_cus} CUs) for batch {opts.batch} × kv_len "
        f"{opts.kv_len}: which CU processes which KV range of which request, and the KV tokens each CU reads."
    )
    qo, kv = indptrs_for([opts.kv_len] * opts.batch)
    plan = make_plan(opts.planner, qo, kv, opts.target.lower())
    load = cu_load_figure(plan).update_layout(xaxis_title="compute unit (CU) running one persistent workgroup")
    figs = (work_map_figure(plan), load)
    return Section(key, title, desc, figs, source="mlalab.plots.splitkv.work_map_figure, cu_load_figure")


# Series of the timing figures, in legend order; those without records are left out (and listed in the text).
TIMING_SERIES = (("triton", "a8w8"), ("flashmla", "a8w8"), ("flashinfer", "a16w8"), ("flashmla", "bf16"))


def section_timings(opts: ReportOptions) -> Section:
    key, title = "timings", "Kernel timings (recorded)"
    tdir = opts.data_dir / "timings"
    desc = "Recorded on the H200 (data/timings, not measured now): µs per call per shape, and achieved bandwidth."
    try:
        df = load_recorded(str(tdir))
    except FileNotFoundError as e:
        return _unavailable(key, title, desc, f"no timing CSV in data/timings ({type(e).__name__})")
    try:  # one run (the newest full suite run), Triton at its default config: the numbers the README quotes
        view = recorded_view(df)
    except ValueError as e:
        return _unavailable(key, title, desc, f"no full suite run to show: {e}")
    rows = view.rows
    have = set(zip(rows["backend"], rows["precision"]))
    series = [s for s in TIMING_SERIES if s in have]
    if not series:
        return _unavailable(key, title, desc, f"no records of {TIMING_SERIES} in {', '.join(view.files)}")
    gpus = ", ".join(sorted(rows["gpu"].astype(str).unique())) if "gpu" in rows else "?"
    dates = ", ".join(sorted(rows["date"].astype(str).unique())) if "date" in rows else "?"
    missing = [f"{b} {p}" for b, p in TIMING_SERIES if (b, p) not in have]
    desc += f" Shown: {view.label}. Device: {gpus}; dates: {dates}; file(s) read: {', '.join(view.files)}."
    others = sorted(set(df["run"].astype(str)) - set(view.files), key=natural_key)
    if others:
        desc += f" Other recorded files not shown here: {', '.join(others)} (notebook 04 can show any run)."
    if missing:
        desc += f" No records for: {', '.join(missing)}."
    figs = (bars_per_shape(view, series), bandwidth_figure(view, series))
    return Section(key, title, desc, figs, source="mlalab.records.timings.recorded_view, mlalab.plots.timing")


def section_layouts(opts: ReportOptions) -> Section:
    key, title = "layouts", "What each decode layout costs (recorded)"
    desc = (
        "Our default Triton time on a paged cache (pages of 64 or 16 tokens, random page table) or a token table "
        "(random slots of a pool 4× the batch) over our time on a contiguous cache, geomean of the 12 competition "
        "shapes, per precision and q_len (data/layouts and data/timings, not measured now). Each side is one run, the "
        "newest covering the 12 shapes; where the contiguous side is another run, two processes' times are compared."
    )
    try:
        df = load_recorded((str(opts.data_dir / "timings"), str(opts.data_dir / "layouts")))
    except FileNotFoundError as e:
        return _unavailable(key, title, desc, f"no timing CSV in data/timings or data/layouts ({type(e).__name__})")
    try:
        by_gpu = layout_costs_by_gpu(df)
    except ValueError as e:  # (a run with two default rows of one case and shape)
        return _unavailable(key, title, desc, f"the recorded layout runs do not read as one configuration each: {e}")
    if not by_gpu:
        return _unavailable(key, title, desc, "no GPU has a layout run and a contiguous run covering the 12 shapes")
    gpu, costs = next(iter(by_gpu.items()))  # the reference GPU where it has them
    desc += f" Device: {gpu}; runs: {', '.join(sorted(set(costs['run']) | set(costs['contiguous_run'])))}."
    table = costs.drop(columns=["shapes"]).round(3).to_html(index=False, na_rep="")
    src = "mlalab.records.timings.layout_costs, mlalab.plots.timing.layout_cost_figure"
    return Section(key, title, desc, (layout_cost_figure(costs, gpu),), table_html=table, source=src)


def section_ablations(opts: ReportOptions) -> Section:
    key, title = "ablations", "What if compute were free? (recorded ablations)"
    desc = (
        "Our whole call timed again with some of its compute skipped (`Decoder.ablation`: the outputs are wrong, every "
        "byte still moves), in one process with what it is compared to: the a8w8 decode without its score wgmma and "
        "without both wgmmas, over FlashMLA fp8; fp4 KV on fp8 wgmma (a8w4-mxfp4) without its fp4 → e4m3 "
        "conversion (the most a kernel converting on other warps could win) and, where recorded, also without its "
        "block scales' loads, over our a8w8. Where the last bar stays "
        "above the goal, that compute is not what keeps a shape from it. data/profiles, not measured now."
    )
    figs, runs, missing = [], [], []
    for kind in ABLATION_KINDS:
        try:
            prof = load_ablation_profile(kind=kind, profile_dir=str(opts.data_dir / "profiles"))
        except (FileNotFoundError, ValueError) as e:  # (the page names data/, never this machine's folders)
            missing.append(f"{kind}: " + str(e).replace(str(opts.data_dir), "data"))
            continue
        figs.append(ablation_figure(prof, kind=kind))
        runs.append(str(prof["run"].iloc[0]))
    if not figs:
        return _unavailable(key, title, desc, "no ablation profile in data/profiles (" + "; ".join(missing) + ")")
    desc += f" Files: {', '.join(runs)}." + (f" Not recorded: {'; '.join(missing)}." if missing else "")
    src = "mlalab.records.profiles.load_ablation_profile, mlalab.plots.timeline.ablation_figure"
    return Section(key, title, desc, tuple(figs), source=src)


def _experiment_tables(opts: ReportOptions) -> dict[str, object]:
    pdir = opts.data_dir / "ab"
    return {n: load_experiment(n, str(pdir)) for n in list_experiments(str(pdir))}


def _summary_table_html(summary: object) -> str:
    head = ("<tr><th>date</th><th>what was asked</th><th>compared with</th><th>fastest variant</th>"
            "<th>first variant</th><th>shapes</th></tr>")  # fmt: skip
    rows = "".join(
        f"<tr><td>{html.escape(str(r['date']))}</td><td>{html.escape(str(r['experiment']))}</td>"
        f"<td>{html.escape(str(r['compared with']))}</td><td>{r['fastest ratio']:.3f}×</td>"
        f"<td>{r['first ratio']:.3f}×</td><td>{int(r['shapes'])}</td></tr>"
        for r in summary.to_dict("records")  # type: ignore[attr-defined]
    )
    return f"<div class='scroll'><table class='summary'>{head}{rows}</table></div>"


def section_experiments(opts: ReportOptions) -> Section:
    key, title = "experiments", "Design experiments (recorded A/Bs), in one table"
    desc = (
        "Each row: one question about the kernel, answered by timing variants of it beside a reference in one process "
        "on the H200 (data/ab, not measured now). The ratios are time ÷ the reference's time, geomean over the shapes "
        "timed (lower is faster); 'first variant' is usually the code of the day, 'fastest' the best variant tried. "
        "What each variant changed and whether it was kept: docs/journal.md."
    )
    tables = _experiment_tables(opts)
    if not tables:
        return _unavailable(key, title, desc, "no A/B table (*.csv) in data/ab")
    summary = experiment_summary(tables, experiment_questions(str(opts.data_dir / "INDEX.csv")))
    fig = experiments_summary_figure(summary)
    if not opts.details:
        desc += " Each experiment's per-shape figure: `python -m mlalab report --details`, or notebook 04."
    return Section(key, title, desc, (fig,), source="mlalab.plots.experiments.experiments_summary_figure",
                   table_html=_summary_table_html(summary))  # fmt: skip


def section_experiment_details(opts: ReportOptions) -> Section:
    key, title = "experiment-details", "Design experiments, one figure each"
    desc = "Per shape, each variant's time over the reference's; the legend gives each variant's geomean ratio."
    tables = _experiment_tables(opts)
    if not tables:
        return _unavailable(key, title, desc, "no A/B table (*.csv) in data/ab")
    questions = experiment_questions(str(opts.data_dir / "INDEX.csv"))
    figs = tuple(experiment_figure(df, title=f"{questions.get(n, n)}<br><sub>{n}</sub>") for n, df in tables.items())
    return Section(key, title, desc, figs, source="mlalab.plots.experiments.experiment_figure")


def section_frontier(opts: ReportOptions) -> Section:
    key, title = "frontier", "Precision frontier: time vs accuracy per precision"
    desc = (
        f"Every precision the GPU kernels run at batch {opts.batch} × kv_len {opts.kv_len}: µs from the newest "
        "recorded run that times every precision (data/timings; the figure names its file and GPU) against the "
        "rel-L2 error computed now on the CPU (competition inputs, fp64 reference). "
        "Precisions the run did not time are open markers at their bandwidth floor (bytes per call / "
        "the run's copy bandwidth): not measured, a lower bound. Solid line: the frontier of the measured points."
    )
    try:
        df = frontier_table(opts.batch, opts.kv_len, data_dir=str(opts.data_dir / "timings"))
    except (FileNotFoundError, ValueError) as e:
        return _unavailable(key, title, desc, f"no recorded run to place the points: {e}")
    desc += f" Times: {df.attrs['run']}; accuracy case {df.attrs['accuracy_case']}."
    figs = (frontier_figure(df), bytes_floor_figure(df))
    return Section(key, title, desc, figs, source="mlalab.accuracy.frontier.frontier_table, mlalab.plots.frontier")


SectionBuilder = Callable[[ReportOptions], Section]

#: Sections built only with ReportOptions(details=True) (``--details``) or when named in `keys`.
DETAIL_SECTIONS = ("experiment-details",)

# Order of the page. Other topics register their section function here as they land.
SECTION_BUILDERS: dict[str, SectionBuilder] = {
    "timings": section_timings,
    "layouts": section_layouts,
    "ablations": section_ablations,
    "experiments": section_experiments,
    "accuracy": section_accuracy,
    "frontier": section_frontier,
    "floor": section_floor,
    "workmap": section_workmap,
    "experiment-details": section_experiment_details,
}


def build_sections(
    opts: ReportOptions | None = None,
    keys: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Section]:
    """Build the report's sections (all, or those named in `keys`, in page order). `progress(line)` is told
    when each section starts and how long it took (the accuracy sweep takes seconds)."""
    opts = ReportOptions() if opts is None else opts
    if not isinstance(opts, ReportOptions):
        raise TypeError(f"opts must be a ReportOptions, got {type(opts).__name__}")
    if keys is not None:
        unknown = [k for k in keys if k not in SECTION_BUILDERS]
        if unknown:
            raise ValueError(
                f"unknown report section(s) {unknown} (--sections / keys); known: {list(SECTION_BUILDERS)}"
            )
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable or None")
    out = []
    # the per-experiment figures are details: on the page only when asked for (opts.details or by name)
    todo = [(k, fn) for k, fn in SECTION_BUILDERS.items()
            if (k in keys if keys is not None else (opts.details or k not in DETAIL_SECTIONS))]  # fmt: skip
    for i, (k, fn) in enumerate(todo, 1):
        t0 = time.perf_counter()
        if progress:
            progress(f"[{i}/{len(todo)}] {k} ...")
        out.append(fn(opts))
        if progress:
            progress(f"[{i}/{len(todo)}] {k} done in {time.perf_counter() - t0:.1f} s")
    return out


# --- HTML ----------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 0.9em; } .src { color: #888; font-size: 0.8em; font-family: monospace; }
.unavailable { background: #fff4e5; border-left: 4px solid #e69500; padding: 0.6em 1em; }
.scroll { overflow-x: auto; max-height: 32em; overflow-y: auto; margin: 0.5em 0; }
table.summary { border-collapse: collapse; font-size: 0.88em; }
table.summary th, table.summary td { border-bottom: 1px solid #eee; padding: 0.25em 0.6em; text-align: left;
       vertical-align: top; } table.summary th { position: sticky; top: 0; background: #fafafa; }
#loading { color: #666; }
nav ul { columns: 2; }
"""

# plotly.js and the figures' JSON travel gzip-compressed in base 85 (Python's alphabet with '<' replaced by '.', so
# the text can never close or comment out its <script>); the page unpacks them with the browser's
# DecompressionStream, then draws every figure.
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_B85_SAFE = _B85.replace("<", ".")
_TO_SAFE = str.maketrans(_B85, _B85_SAFE)
_FROM_SAFE = str.maketrans(_B85_SAFE, _B85)

_LOADER = """
(async () => {
  const A = "ALPHABET", m = new Int16Array(128).fill(-1);
  for (let i = 0; i < 85; i++) m[A.charCodeAt(i)] = i;
  const unpack = async (id) => {
    const el = document.getElementById(id), s = el.textContent.trim(), out = new Uint8Array(s.length / 5 * 4);
    for (let i = 0, o = 0; i < s.length; i += 5) {
      let v = 0; for (let j = 0; j < 5; j++) v = v * 85 + m[s.charCodeAt(i + j)];
      out[o++] = v >>> 24; out[o++] = (v >>> 16) & 255; out[o++] = (v >>> 8) & 255; out[o++] = v & 255;
    }
    const z = new Blob([out.subarray(0, +el.dataset.bytes)]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(z).text();
  };
  const msg = document.getElementById("loading");
  if (typeof DecompressionStream === "undefined") { msg.textContent = "This browser cannot unpack the figures "
      + "(it lacks DecompressionStream; any browser from 2023 on has it)."; return; }
  const code = document.createElement("script"); code.textContent = await unpack("plotlyjs-gz");
  document.head.appendChild(code);
  const figs = JSON.parse(await unpack("figures-gz"));
  for (const div of document.querySelectorAll("div[data-figure]")) {
    const fig = figs[div.id];
    await Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
  }
  msg.remove();
})();
""".replace("ALPHABET", _B85_SAFE)


def pack_text(text: str) -> tuple[str, int]:
    """(`text` gzip-compressed, written in the page's base-85 alphabet; the compressed byte count)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    raw = gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)
    return base64.b85encode(raw, pad=True).decode("ascii").translate(_TO_SAFE), len(raw)


def unpack_text(packed: str, n_bytes: int) -> str:
    """The inverse of `pack_text` (what the page's loader does), for tests and for reading a page's figures."""
    raw = base64.b85decode(packed.strip().translate(_FROM_SAFE))[:n_bytes]
    return gzip.decompress(raw).decode("utf-8")


def page_payload(page: str) -> dict[str, str]:
    """``{"plotlyjs-gz": plotly.js, "figures-gz": the figures' JSON}`` unpacked from a page `render_html` wrote."""
    out = {}
    for m in re.finditer(r"<script type='text/plain' id='([a-z-]+)' data-bytes='(\d+)'>([^<]*)</script>", page):
        out[m.group(1)] = unpack_text(m.group(3), int(m.group(2)))
    return out


def render_html(sections: Sequence[Section], opts: ReportOptions | None = None) -> str:
    """The full page: plotly.js once (compressed, inline), every figure as JSON drawn by the page's loader."""
    opts = ReportOptions() if opts is None else opts
    if not all(isinstance(s, Section) for s in sections):
        raise TypeError("sections must be a sequence of Section")
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    meta = (
        f"mlalab {__version__} · plotly {plotly.__version__} · Python {platform.python_version()} · "
        f"generated {now} · batch {opts.batch}, kv_len {opts.kv_len}, target {html.escape(opts.target)}, "
        f"seed {opts.seed}"
    )
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(opts.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(opts.title)}</h1><p class='meta'>{meta}</p>",
        "<nav><ul>"
        + "".join(
            f"<li><a href='#{s.key}'>{html.escape(s.title)}</a>{' (unavailable)' if s.unavailable else ''}</li>"
            for s in sections
        )
        + "</ul></nav>",
    ]
    figures: dict[str, object] = {}
    for s in sections:
        parts.append(f"<section id='{html.escape(s.key)}' data-section='{html.escape(s.key)}'>")
        parts.append(f"<h2>{html.escape(s.title)}</h2><p>{html.escape(s.description)}</p>")
        if s.unavailable:
            parts.append(f"<p class='unavailable'><b>Section unavailable:</b> {html.escape(s.unavailable)}</p>")
        if s.table_html:
            parts.append(s.table_html)
        for i, fig in enumerate(s.figures):
            fid = f"fig-{s.key}-{i}"
            parts.append(f"<div id='{fid}' data-figure='{fid}'></div>")
            figures[fid] = fig.to_plotly_json()
        if s.source:
            parts.append(f"<p class='src'>figure: {html.escape(s.source)}</p>")
        parts.append("</section>")
    if figures:
        parts.insert(5, "<p id='loading'>drawing the figures …</p>")
        texts = {"plotlyjs-gz": plotly.offline.get_plotlyjs(), "figures-gz": json.dumps(figures, cls=PlotlyJSONEncoder)}
        for key, text in texts.items():
            packed, n_bytes = pack_text(text)
            parts.append(f"<script type='text/plain' id='{key}' data-bytes='{n_bytes}'>{packed}</script>")
        parts.append(f"<script>{_LOADER}</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    out: str | os.PathLike[str],
    opts: ReportOptions | None = None,
    keys: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    strict: bool = False,
) -> tuple[Path, list[Section]]:
    """Build the sections (all, or `keys`) and write the page atomically (temp file in the same directory, then
    os.replace), so a reader never sees half a page. With `strict`, an unavailable section raises ValueError and
    nothing is written."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a path, got {type(out).__name__}")
    path = Path(out)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"out must end in .html, got {str(path)!r}")
    if not path.parent.exists():
        raise ValueError(f"out: directory {str(path.parent)!r} does not exist")
    sections = build_sections(opts, keys, progress)
    missing = [f"{s.key}: {s.unavailable}" for s in sections if s.unavailable]
    if strict and missing:
        raise ValueError(f"strict: section(s) unavailable, {path} not written: " + "; ".join(missing))
    text = render_html(sections, opts)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared report should be readable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path, sections

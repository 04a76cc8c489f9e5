"""Split-KV work-map panel: target, planner, batch (one long request among short ones by default), splits, inputs ->
the plan on three GPUs side by side, a per-CU Gantt chart (with the measured per-CTA time line where one is
recorded), and a step-through of one request through stage 1 and the reduce (CPU emulator, float64) with its merge
written out in numbers."""

from __future__ import annotations

import dataclasses
import glob
import math
import os
from dataclasses import dataclass

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from ..config import GPU_TARGETS, DecodeCase, InputDist
from ..inputs import make_inputs, ragged_kv_lens
from ..plan import PLANNERS, EmulationResult, WorkPlan, emulate_plan, indptrs_for, make_plan
from ..plots.splitkv import gantt_figure, step_through_figure, targets_figure, work_map_figure
from ..reference import decode_inputs_reference
from .export import BusyIndicator, ExportBar, export_bar

__all__ = ["SplitKVPanel", "split_kv_panel", "STEP_THROUGH_MAX_TOKENS", "worked_merge", "latest_explore_recording",
           "recorded_timeline"]  # fmt: skip

STEP_THROUGH_MAX_TOKENS = 65536  # fp64 emulation of one request stays well under a second up to here
SIDE_BY_SIDE = ("h200", "mi300x", "mi355x")
_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")


def _replace(fw: go.FigureWidget, fig: go.Figure) -> None:
    with fw.batch_update():
        fw.data = []
        fw.add_traces(list(fig.data))
        fw.layout = fig.layout


def latest_explore_recording(folder: str | None = None) -> pd.DataFrame | None:
    """The newest ``data/explore/*_explore.csv`` (experiments/explore_h200.py), or None when none is recorded."""
    files = sorted(glob.glob(os.path.join(folder or os.path.join(_DATA, "explore"), "*_explore.csv")))
    if not files:
        return None
    return pd.read_csv(files[-1]).assign(file=os.path.basename(files[-1]))


def recorded_timeline(plan: WorkPlan, kv_lens: tuple[int, ...]) -> tuple[go.Figure | None, str]:
    """The measured per-CTA time line of this plan on the H200 when one is recorded (the simple plan of a uniform
    batch at a recorded shape), else ``(None, why not)``."""
    from ..plots.timeline import cta_timeline_figure
    from ..records.profiles import load_timelines

    try:
        ev = load_timelines()
    except (FileNotFoundError, ValueError) as e:
        return None, f"no per-CTA time line recorded ({e})"
    shapes = sorted({(int(b), int(n)) for b, n in zip(ev["B"], ev["L"])})
    have = ", ".join(f"{b}×{n}" for b, n in shapes)
    uniform = len(set(kv_lens)) == 1
    if plan.planner != "simple" or plan.num_cus != 132 or not uniform or (len(kv_lens), kv_lens[0]) not in shapes:
        return None, (f"measured per-CTA time lines are recorded for the <i>simple</i> plan on the H200 at {have} "
                      "(uniform batches): pick one of those to see it beside the model")  # fmt: skip
    return cta_timeline_figure(ev, len(kv_lens), kv_lens[0]), f"measured on the H200 ({ev['run'].iloc[0]})"


def worked_merge(result: EmulationResult, request: int = 0, head: int = 0, row: int = 0, limit: int = 6) -> str:
    """The LSE merge of one request's row and head written out: the formula, then its numbers (HTML)."""
    red = [r for r in result.trace["reduce"] if r.batch == request] if result.trace else []
    if not red:
        return f"Request {request} is not split: its one work writes the output directly (no merge)."
    L = [float(v) for v in red[0].lse_parts[:, row, head]]
    M = max(L)
    w = [math.exp(v - M) for v in L]
    S = sum(w)
    fmt = lambda xs: ", ".join(f"{x:.4f}" for x in xs[:limit]) + (f", … ({len(xs)} in all)" if len(xs) > limit else "")  # noqa: E731
    return (
        f"<b>The merge of request {request}</b> (q row {row}, head {head}), {len(L)} partials: "
        "M = max<sub>i</sub> L<sub>i</sub>, w<sub>i</sub> = exp(L<sub>i</sub> − M), "
        "O = Σ w<sub>i</sub> O<sub>i</sub> / Σ w<sub>i</sub>, L = M + ln Σ w<sub>i</sub>.<br>"
        f"L<sub>i</sub> = [{fmt(L)}] → M = {M:.4f}; w<sub>i</sub> = [{fmt(w)}]; Σ w<sub>i</sub> = {S:.4f}; "
        f"normalised weights [{fmt([x / S for x in w])}]; L = {M:.4f} + ln {S:.4f} = {M + math.log(S):.4f} "
        f"(the emulator's merged LSE: {float(red[0].lse[row, head]):.4f})."
        + (" L<sub>i</sub> = −∞: this q row sees none of that work's tokens (the causal mask), so its weight is 0."
           if any(math.isinf(v) for v in L) else "")
    )  # fmt: skip


@dataclass
class SplitKVPanel:
    """The panel (``.panel``) plus handles tests drive: controls, figure widgets, messages, current plan/emulation."""

    panel: W.Widget
    controls: dict[str, W.ValueWidget]
    figures: dict[str, go.FigureWidget]
    message: W.HTML
    summary: W.HTML
    merge: W.HTML
    timeline_note: W.HTML
    plan: WorkPlan | None = None
    result: EmulationResult | None = None
    rel_l2: float | None = None
    timeline_box: W.Box = dataclasses.field(default_factory=lambda: W.VBox(layout=W.Layout(width="600px")))
    busy: BusyIndicator = dataclasses.field(default_factory=BusyIndicator)
    export: ExportBar | None = None

    def kv_lens(self) -> tuple[int, ...]:
        """The batch's KV lengths; under the causal mask a non-empty request holds at least q_len tokens."""
        c = self.controls
        B, n = c["batch"].value, c["kv_len"].value
        if c["kv_mode"].value == "ragged":
            lens = ragged_kv_lens(B, n, seed=c["seed"].value, min_len=0)
        elif c["kv_mode"].value == "one long":
            lens = (c["long_len"].value,) + (n,) * (B - 1)
        else:
            lens = (n,) * B
        q = c["q_len"].value
        return tuple(max(k, q) if k and c["causal"].value else k for k in lens)

    def target(self) -> str | int:
        t = self.controls["target"].value
        return self.controls["cus"].value if t == "custom" else t

    def _plan(self, target: str | int, lens: tuple[int, ...]) -> WorkPlan:
        c = self.controls
        qo, kv = indptrs_for(lens, c["q_len"].value)
        knobs: dict[str, object] = {"kv_granularity": c["granularity"].value}
        if c["splits"].value > 0 and c["planner"].value != "aiter-cost-heap":
            knobs["max_split_per_batch"] = c["splits"].value
        if c["planner"].value == "balanced":
            knobs["overhead"] = c["overhead"].value
        return make_plan(c["planner"].value, qo, kv, target, **knobs).validate(qo, kv)

    def update(self, *_: object) -> None:
        """Re-plan and redraw; invalid combinations show a message instead of raising."""
        with self.busy("planning and drawing"):
            self._update()

    def _update(self) -> None:
        c = self.controls
        c["cus"].disabled = c["target"].value != "custom"
        c["long_len"].disabled = c["kv_mode"].value != "one long"
        try:
            lens = self.kv_lens()
            plan = self._plan(self.target(), lens)
            others = {GPU_TARGETS[t].name: self._plan(t, lens) for t in SIDE_BY_SIDE}
        except (ValueError, TypeError) as e:
            self.message.value = f"<b style='color:#b00'>Cannot plan this combination:</b> {e}"
            return
        self.plan = plan
        s = plan.summary()
        notes = []
        if c["planner"].value == "aiter-intra-batch" and plan.params.get("rule") == "gfx942":
            notes.append("gfx942 rule: 16 splits per request whatever <i>splits</i> says")
        if c["planner"].value == "aiter-cost-heap" and c["splits"].value > 0:
            notes.append("aiter's cost-heap planner ignores max_split_per_batch")
        short = [b for b, n in enumerate(lens) if n < 196]
        if c["planner"].value == "aiter-intra-batch" and plan.params.get("rule") == "gfx950" and short:
            notes.append(f"{len(short)} request(s) under 196 tokens: aiter divides by zero there; clamped to 1 split")
        self.message.value = "; ".join(notes)
        self.summary.value = (
            f"<b>{s['works']}</b> works, <b>{s['busy_cus']}</b> busy / <b>{s['idle_cus']}</b> idle CUs, "
            f"max {s['max_works_per_cu']} works per CU, {s['split_requests']} of {plan.batch} requests split, "
            f"CU load max {s['max_cu_load_tokens']} / min busy {s['min_busy_cu_load_tokens']} tokens, "
            f"{plan.n_partial_rows} partial rows. KV lengths: {list(lens[:12])}{' ...' if len(lens) > 12 else ''}"
        )
        ovh = c["overhead"].value
        _replace(self.figures["targets"], targets_figure(others, overhead=ovh))
        # 600 px each: the Gantt and the measured time line sit side by side on a wide screen, the row wraps otherwise
        _replace(self.figures["gantt"], gantt_figure(plan, overhead=ovh).update_layout(width=600))
        _replace(self.figures["work_map"], work_map_figure(plan))
        fig, why = recorded_timeline(plan, lens)
        self.timeline_note.value = why
        if fig is not None:
            fig.update_layout(width=600, title={"font": {"size": 12}})
            _replace(self.figures["timeline"], fig)
        self.timeline_box.children = (self.timeline_note,) + ((self.figures["timeline"],) if fig is not None else ())
        c["request"].max = plan.batch - 1
        self.update_inputs()

    def update_inputs(self, *_: object) -> None:
        """Emulate the chosen request's sub-plan in float64 on the chosen inputs; reset the step to the reduce."""
        if self.plan is None:
            return
        c = self.controls
        b = min(c["request"].value, self.plan.batch - 1)
        n = self.plan.kv_lens[b]
        self.result = None
        if n == 0 or n > STEP_THROUGH_MAX_TOKENS:
            why = (
                "has no KV: its one work writes output 0 and LSE −inf"
                if n == 0
                else f"has {n} tokens (> {STEP_THROUGH_MAX_TOKENS})"
            )
            self.merge.value = f"step-through skipped: request {b} {why}"
            _replace(self.figures["step"], go.Figure(layout={"title": f"request {b}: no step-through", "height": 120}))
            return
        sub = self.plan.for_request(b)
        q_len = c["q_len"].value
        c["row"].max = q_len - 1
        x = make_inputs(DecodeCase(kv_lens=(n,), q_len=q_len, seed=c["seed"].value, dist=c["dist"].value,
                                   causal=c["causal"].value))  # fmt: skip
        x = dataclasses.replace(x, q=x.q * c["q_scale"].value)
        self.result = emulate_plan(x, sub, trace=True)
        self.ref, _ = decode_inputs_reference(x)
        out, ref = self.result.out, self.ref.to(self.result.out.dtype)
        self.rel_l2 = float((out - ref).norm() / ref.norm())
        self.merge.value = worked_merge(self.result, 0, c["head"].value, min(c["row"].value, q_len - 1)) + (
            f" Whole request, all heads: rel-L2 vs the exact reference {self.rel_l2:.1e}."
        )
        works = sub.n_work
        c["step"].unobserve(self.update_step, names="value")
        c["step"].max = works + 1
        c["step"].value = works + 1
        c["step"].observe(self.update_step, names="value")
        self.update_step()

    def update_step(self, *_: object) -> None:
        """Redraw the step-through at the step control (stage 1's works one by one, then the reduce)."""
        if self.result is None or self.plan is None:
            return
        c = self.controls
        b = min(c["request"].value, self.plan.batch - 1)
        row = min(c["row"].value, c["q_len"].value - 1)
        fig = step_through_figure(self.result, self.ref, request=0, head=c["head"].value, row=row, step=c["step"].value)
        fig.update_layout(title_text=fig.layout.title.text.replace("Request 0", f"Request {b}", 1))
        _replace(self.figures["step"], fig)


def split_kv_panel(
    *,
    target: str = "h200",
    planner: str = "aiter-intra-batch",
    batch: int = 16,
    kv_len: int = 1024,
    long_len: int = 16384,
    kv_mode: str = "one long",
    splits: int = 32,
    granularity: int = 16,
    dist: str = "unit",
    q_scale: float = 3.0,
    q_len: int = 1,
    causal: bool = False,
) -> SplitKVPanel:
    """Build the panel with the given starting values; call ``display(p.panel)``."""
    style = {"description_width": "170px"}
    lay = W.Layout(width="400px")
    controls: dict[str, W.ValueWidget] = {
        "target": W.Dropdown(
            options=[(f"{t.name} ({t.arch}, {t.num_cus} CUs)", k) for k, t in GPU_TARGETS.items()]
            + [("custom CU count", "custom")],
            value=target, description="target GPU", style=style, layout=lay,
        ),
        "cus": W.BoundedIntText(value=64, min=-1000, max=4096, description="custom CUs", style=style, layout=lay),
        "planner": W.Dropdown(options=list(PLANNERS), value=planner, description="planner", style=style, layout=lay),
        "batch": W.IntSlider(value=batch, min=1, max=256, description="batch (requests)", style=style, layout=lay),
        "kv_mode": W.ToggleButtons(options=["one long", "uniform", "ragged"], value=kv_mode, description="KV lengths",
                                   style={"button_width": "80px"}),
        "kv_len": W.BoundedIntText(value=kv_len, min=0, max=1 << 20, description="KV length (tokens)", style=style,
                                   layout=lay),
        "long_len": W.BoundedIntText(value=long_len, min=0, max=1 << 20, description="the long request (tokens)",
                                     style=style, layout=lay),
        "seed": W.IntText(value=0, description="seed (ragged, data)", style=style, layout=lay),
        "splits": W.BoundedIntText(value=splits, min=0, max=1024, description="splits (0 = auto/-1)", style=style,
                                   layout=lay),
        "granularity": W.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=granularity,
                                  description="kv granularity (tokens)", style=style, layout=lay),
        "overhead": W.BoundedIntText(value=64, min=0, max=4096, description="overhead (tokens/work)", style=style,
                                     layout=lay),
        "dist": W.Dropdown(options=[d.value for d in InputDist], value=dist, description="inputs", style=style,
                           layout=lay),
        "q_scale": W.FloatSlider(value=q_scale, min=0.0, max=4.0, step=0.25, description="q × (temperature⁻¹)",
                                 style=style, layout=lay),
        "request": W.IntSlider(value=0, min=0, max=max(batch - 1, 0), description="step-through request", style=style,
                               layout=lay),
        "head": W.IntSlider(value=0, min=0, max=15, description="head", style=style, layout=lay),
        "q_len": W.Dropdown(options=[1, 2, 4], value=q_len, description="q rows a request (MTP)", style=style,
                            layout=lay),
        "causal": W.Checkbox(value=causal, description="causal mask (verification)", style=style, layout=lay),
        "row": W.IntSlider(value=0, min=0, max=max(q_len - 1, 0), description="q row (step-through)", style=style,
                           layout=lay),
        "step": W.IntSlider(value=0, min=0, max=1, description="step (works, then reduce)", style=style, layout=lay),
    }  # fmt: skip
    figures = {k: go.FigureWidget() for k in ("targets", "gantt", "timeline", "work_map", "step")}
    p = SplitKVPanel(W.VBox(), controls, figures, W.HTML(), W.HTML(), W.HTML(), W.HTML())
    left = W.VBox([controls[k] for k in ("target", "cus", "planner", "batch", "kv_mode", "kv_len", "long_len", "seed")])
    right = W.VBox([controls[k] for k in ("splits", "granularity", "overhead", "dist", "q_scale", "q_len", "causal",
                                          "request", "row", "head", "step")])  # fmt: skip
    p.export = exp = export_bar(
        lambda: f"plan_{p.controls['planner'].value}_{p.target()}",
        table=lambda: None if p.plan is None else p.plan.to_frame(),
        figures=lambda: {k: f for k, f in figures.items() if f.data},
    )
    p.panel = W.VBox(
        [
            W.HBox([left, right]),
            p.busy.widget,
            p.summary,
            p.message,
            figures["targets"],
            W.HBox([figures["gantt"], p.timeline_box], layout=W.Layout(flex_flow="row wrap")),
            figures["work_map"],
            W.HTML("<b>Step-through</b>: the chosen request's works run alone (float64), then the merge."),
            figures["step"],
            p.merge,
            exp.box,
        ]
    )
    for k, w in controls.items():
        if k == "step":
            continue
        w.observe(p.update_inputs if k in ("request", "head", "row", "dist", "q_scale") else p.update, names="value")
    controls["step"].observe(p.update_step, names="value")
    p.update()
    return p

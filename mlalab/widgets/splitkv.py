"""Split-KV work-map panel: target, planner, batch, KV lengths, splits, granularity -> plan figures and a
step-through of one request through stage 1 and the reduce (CPU emulator, float64)."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import plotly.graph_objects as go

from ..config import GPU_TARGETS, DecodeCase
from ..inputs import make_inputs, ragged_kv_lens
from ..plan import PLANNERS, WorkPlan, emulate_plan, indptrs_for, make_plan
from ..plots.splitkv import cu_load_figure, reduce_groups_figure, step_through_figure, work_map_figure
from ..reference import decode_inputs_reference

__all__ = ["SplitKVPanel", "split_kv_panel", "STEP_THROUGH_MAX_TOKENS"]

STEP_THROUGH_MAX_TOKENS = 65536  # fp64 emulation of one request stays well under a second up to here


def _replace(fw: go.FigureWidget, fig: go.Figure) -> None:
    with fw.batch_update():
        fw.data = []
        fw.add_traces(list(fig.data))
        fw.layout = fig.layout


@dataclass
class SplitKVPanel:
    """The panel (``.panel``) plus handles tests drive: controls, figure widgets, message, current plan."""

    panel: W.Widget
    controls: dict[str, W.ValueWidget]
    figures: dict[str, go.FigureWidget]
    message: W.HTML
    summary: W.HTML
    plan: WorkPlan | None = None

    def kv_lens(self) -> tuple[int, ...]:
        c = self.controls
        if c["kv_mode"].value == "ragged":
            return ragged_kv_lens(c["batch"].value, c["kv_len"].value, seed=c["seed"].value, min_len=0)
        return (c["kv_len"].value,) * c["batch"].value

    def target(self) -> str | int:
        t = self.controls["target"].value
        return self.controls["cus"].value if t == "custom" else t

    def update(self, *_: object) -> None:
        """Re-plan and redraw; invalid combinations show a message instead of raising."""
        c = self.controls
        c["cus"].disabled = c["target"].value != "custom"
        try:
            lens = self.kv_lens()
            qo, kv = indptrs_for(lens)
            knobs: dict[str, object] = {"kv_granularity": c["granularity"].value}
            if c["splits"].value > 0 and c["planner"].value != "aiter-cost-heap":
                knobs["max_split_per_batch"] = c["splits"].value
            if c["planner"].value == "balanced":
                knobs["overhead"] = c["overhead"].value
            plan = make_plan(c["planner"].value, qo, kv, self.target(), **knobs).validate(qo, kv)
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
        _replace(self.figures["work_map"], work_map_figure(plan))
        _replace(self.figures["load"], cu_load_figure(plan))
        _replace(self.figures["reduce"], reduce_groups_figure(plan))
        c["request"].max = plan.batch - 1
        self.update_step()

    def update_step(self, *_: object) -> None:
        """Emulate the chosen request's sub-plan in float64 and compare with the reference."""
        if self.plan is None:
            return
        b = min(self.controls["request"].value, self.plan.batch - 1)
        n = self.plan.kv_lens[b]
        if n == 0:
            self.message.value = f"request {b} has no KV: its one work writes output 0 and LSE −inf"
            _replace(self.figures["step"], go.Figure(layout={"title": f"request {b}: empty"}))
            return
        if n > STEP_THROUGH_MAX_TOKENS:
            self.message.value = f"step-through skipped: request {b} has {n} tokens (> {STEP_THROUGH_MAX_TOKENS})"
            return
        sub = self.plan.for_request(b)
        x = make_inputs(DecodeCase(kv_lens=(n,), seed=self.controls["seed"].value))
        res = emulate_plan(x, sub, trace=True)
        ref, _ = decode_inputs_reference(x)
        fig = step_through_figure(res, ref, request=0, head=self.controls["head"].value)
        fig.update_layout(title=fig.layout.title.text.replace("Request 0", f"Request {b}", 1))
        _replace(self.figures["step"], fig)


def split_kv_panel(
    *,
    target: str = "mi355x",
    planner: str = "aiter-intra-batch",
    batch: int = 4,
    kv_len: int = 1024,
    splits: int = 32,
    granularity: int = 16,
) -> SplitKVPanel:
    """Build the panel with the given starting values; call ``display(p.panel)``."""
    style = {"description_width": "200px"}  # wide enough for the longest label ("balanced: overhead (tokens/work)")
    lay = W.Layout(width="420px")
    controls: dict[str, W.ValueWidget] = {
        "target": W.Dropdown(
            options=[(f"{t.name} ({t.arch}, {t.num_cus} CUs)", k) for k, t in GPU_TARGETS.items()]
            + [("custom CU count", "custom")],
            value=target,
            description="target GPU",
            style=style,
            layout=lay,
        ),
        "cus": W.BoundedIntText(value=64, min=-1000, max=4096, description="custom CUs", style=style, layout=lay),
        "planner": W.Dropdown(options=list(PLANNERS), value=planner, description="planner", style=style, layout=lay),
        "batch": W.IntSlider(value=batch, min=1, max=256, description="batch (requests)", style=style, layout=lay),
        "kv_mode": W.ToggleButtons(options=["uniform", "ragged"], value="uniform", description="KV lengths"),
        "kv_len": W.BoundedIntText(
            value=kv_len, min=0, max=1 << 20, description="KV length (tokens, mean)", style=style, layout=lay
        ),
        "seed": W.IntText(value=0, description="seed (ragged, data)", style=style, layout=lay),
        "splits": W.BoundedIntText(
            value=splits, min=0, max=1024, description="splits (0 = auto/-1)", style=style, layout=lay
        ),
        "granularity": W.Dropdown(
            options=[1, 2, 4, 8, 16, 32, 64, 128, 256],
            value=granularity,
            description="kv granularity (tokens)",
            style=style,
            layout=lay,
        ),  # fmt: skip
        "overhead": W.BoundedIntText(
            value=64, min=0, max=4096, description="balanced: overhead (tokens/work)", style=style, layout=lay
        ),
        "request": W.IntSlider(value=0, min=0, max=max(batch - 1, 0), description="step-through request", style=style),
        "head": W.IntSlider(value=0, min=0, max=15, description="head", style=style),
    }
    figures = {k: go.FigureWidget() for k in ("work_map", "load", "reduce", "step")}
    message = W.HTML()
    summary = W.HTML()
    left = W.VBox([controls[k] for k in ("target", "cus", "planner", "batch", "kv_mode", "kv_len", "seed")])
    right = W.VBox([controls[k] for k in ("splits", "granularity", "overhead", "request", "head")])
    panel = W.VBox(
        [
            W.HBox([left, right]),
            summary,
            message,
            figures["work_map"],
            figures["load"],
            figures["reduce"],
            W.HTML("<b>Step-through</b>: the chosen request's works run alone (float64), then the merge."),
            figures["step"],
        ]
    )
    p = SplitKVPanel(panel, controls, figures, message, summary)
    for k, w in controls.items():
        w.observe(p.update_step if k in ("request", "head") else p.update, names="value")
    p.update()
    return p

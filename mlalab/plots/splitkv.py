"""Figures for split-KV work plans: work map, per-CU load, reduce groups, and a step-through of one request."""

from __future__ import annotations

import plotly.colors as pc
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..plan import EmulationResult, WorkPlan

__all__ = ["work_map_figure", "cu_load_figure", "reduce_groups_figure", "step_through_figure"]

_PALETTE = pc.qualitative.Plotly + pc.qualitative.D3 + pc.qualitative.Set3


def _check_plan(plan: object) -> WorkPlan:
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    return plan


def _discrete_colorscale(n: int) -> list[list[object]]:
    """A stepwise colorscale with one colour per request (0..n-1), so neighbours are distinguishable."""
    n = max(n, 1)
    scale: list[list[object]] = []
    for i in range(n):
        c = _PALETTE[i % len(_PALETTE)]
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def work_map_figure(plan: WorkPlan, *, title: str | None = None) -> go.Figure:
    """CU (x) × work slot on that CU (y), coloured by request; hover shows KV range, tokens and partial row."""
    _check_plan(plan)
    df = plan.to_frame()
    n_slots = int(df["slot"].max()) + 1 if len(df) else 1
    z = [[None] * plan.num_cus for _ in range(n_slots)]
    text = [[f"CU {c}: idle" if s == 0 else "" for c in range(plan.num_cus)] for s in range(n_slots)]
    for r in df.itertuples():
        z[r.slot][r.cu] = r.batch_idx
        where = "writes output directly" if r.partial_qo_loc < 0 else f"partial row {r.partial_qo_loc}"
        text[r.slot][r.cu] = (
            f"CU {r.cu}, slot {r.slot}: work {r.work}<br>request {r.batch_idx} fragment {r.fragment + 1}/"
            f"{r.n_fragments}<br>kv [{r.kv_start}, {r.kv_end}) = {r.kv_tokens} tokens<br>{where}"
        )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(plan.num_cus)),
            y=list(range(n_slots)),
            text=text,
            hoverinfo="text",
            colorscale=_discrete_colorscale(plan.batch),
            zmin=-0.5,
            zmax=plan.batch - 0.5,
            xgap=1 if plan.num_cus <= 140 else 0,
            ygap=2,
            colorbar={"title": "request"},
        )
    )
    s = plan.summary()
    fig.update_layout(
        title=title
        or f"{plan.planner}: {s['works']} works on {s['busy_cus']} of {plan.num_cus} CUs ({s['idle_cus']} idle)",
        xaxis_title="CU (persistent workgroup)",
        yaxis_title="work slot on the CU (run in order)",
        height=260 + 22 * n_slots,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return fig


def cu_load_figure(plan: WorkPlan) -> go.Figure:
    """KV tokens per CU as bars (stacked by request), idle CUs counted in the title."""
    _check_plan(plan)
    df = plan.to_frame()
    fig = go.Figure()
    for b, g in df.groupby("batch_idx"):
        fig.add_bar(
            x=g["cu"],
            y=g["kv_tokens"],
            name=f"request {b}",
            marker_color=_PALETTE[int(b) % len(_PALETTE)],
            hovertemplate="CU %{x}: %{y} tokens of request " + str(b) + "<extra></extra>",
            showlegend=plan.batch <= 16,
        )
    s = plan.summary()
    fig.update_layout(
        barmode="stack",
        title=f"KV tokens per CU: max {s['max_cu_load_tokens']}, min busy {s['min_busy_cu_load_tokens']}, "
        f"mean {s['mean_cu_load_tokens']:.1f}; {s['idle_cus']} of {plan.num_cus} CUs idle",
        xaxis={"title": "CU", "range": [-0.5, plan.num_cus - 0.5]},
        yaxis_title="KV tokens",
        height=320,
        bargap=0.05,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return fig


def reduce_groups_figure(plan: WorkPlan) -> go.Figure:
    """Partials merged per request (0 = written directly by its one work); hover lists the partial rows."""
    _check_plan(plan)
    rip = plan.reduce_indptr.tolist()
    pmap = plan.reduce_partial_map.tolist()
    fmap = plan.reduce_final_map.tolist()
    n, hover = [], []
    for t in range(plan.n_tiles):
        parts = pmap[rip[t] : rip[t + 1]]
        merged = len(parts) >= 2
        n.append(len(parts) if merged else 0)
        rows = ", ".join(map(str, parts[:24])) + (" ..." if len(parts) > 24 else "")
        hover.append(
            f"tile {t}: output rows {fmap[t]}<br>"
            + (f"merges {len(parts)} partial rows: {rows}" if merged else "not split: no reduce (tile skipped)")
        )
    fig = go.Figure(
        go.Bar(
            x=list(range(plan.n_tiles)),
            y=n,
            hovertext=hover,
            hoverinfo="text",
            marker_color=[_PALETTE[t % len(_PALETTE)] for t in range(plan.n_tiles)],
        )
    )
    merged_tiles = sum(1 for v in n if v)
    fig.update_layout(
        title=f"Reduce groups: {merged_tiles} of {plan.n_tiles} requests merged, {plan.n_partial_rows} float32 "
        f"partial rows ({plan.n_partial_rows * 16 * 512 * 4 / 2**20:.2f} MiB)",
        xaxis_title="request (reduce tile)",
        yaxis_title="partials merged",
        height=300,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return fig


def step_through_figure(
    result: EmulationResult, reference_out: torch.Tensor, *, request: int = 0, head: int = 0, row: int = 0
) -> go.Figure:
    """One request, one head: each partial's output norm and LSE, the merge weights, and the final error.

    `result` must come from ``emulate_plan(..., trace=True)``; `reference_out` is the reference output of the
    same inputs (the title reports the relative error of the merged row)."""
    if not isinstance(result, EmulationResult) or result.trace is None:
        raise ValueError("result must be an EmulationResult made with trace=True")
    works = sorted((w for w in result.trace["works"] if w.batch == request), key=lambda w: w.kv_start)
    if not works:
        raise ValueError(f"the trace has no work for request {request}")
    red = [r for r in result.trace["reduce"] if r.batch == request]
    labels = [f"tok {w.tokens[0]}-{w.tokens[1]}<br>CU {w.cu}" for w in works]
    lse = [float(w.lse[row, head]) for w in works]
    norm = [float(w.out_norm[row, head]) for w in works]
    weights = [float(v) for v in red[0].weights[:, row, head]] if red else [1.0]
    r = works[0].q_rows[0] + row
    out_row = result.out[r, head]
    ref_row = reference_out[r, head].to(out_row.dtype)
    err = float((out_row - ref_row).norm() / ref_row.norm()) if float(ref_row.norm()) > 0 else 0.0
    merged_lse = float(red[0].lse[row, head]) if red else lse[0]
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("partial output norm ‖O_i‖", "partial LSE L_i (natural log)", "merge weight exp(L_i − M)/Σ"),
    )
    fig.add_bar(x=labels, y=norm, row=1, col=1, marker_color="#636efa", showlegend=False)
    fig.add_bar(x=labels, y=lse, row=1, col=2, marker_color="#ef553b", showlegend=False)
    fig.add_scatter(
        x=labels, y=[merged_lse] * len(labels), mode="lines", name="merged LSE", row=1, col=2, line={"dash": "dash"}
    )
    fig.add_bar(x=labels, y=weights, row=1, col=3, marker_color="#00cc96", showlegend=False)
    how = f"{len(works)} partials merged" if red else "not split: one work wrote the output directly"
    fig.update_layout(
        title=f"Request {request}, head {head}: {how}; merged LSE {merged_lse:.4f}; rel-L2 vs reference {err:.1e}",
        height=360,
        margin={"l": 50, "r": 20, "t": 70, "b": 60},
    )
    return fig

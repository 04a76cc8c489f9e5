"""Figures for split-KV work plans: work map, per-CU load, reduce groups, and a step-through of one request."""

from __future__ import annotations

import math

import pandas as pd
import plotly.colors as pc
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..plan import EmulationResult, WorkPlan
from ..plan.explore import CostModel
from .palette import place_title

__all__ = [
    "work_map_figure",
    "cu_load_figure",
    "reduce_groups_figure",
    "step_through_figure",
    "gantt_figure",
    "targets_figure",
    "coverage_figure",
    "model_vs_measured_figure",
]

_PALETTE = pc.qualitative.Plotly + pc.qualitative.D3 + pc.qualitative.Set3


def _check_plan(plan: object) -> WorkPlan:
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    return plan


def _last_busy(plan: WorkPlan) -> int:
    """The highest CU with work (the figures zoom to CUs 0..this one)."""
    counts = (plan.work_indptr[1:] - plan.work_indptr[:-1]).to("cpu")
    busy = torch.nonzero(counts > 0).flatten()
    return int(busy[-1]) if busy.numel() else 0


def _cu_axis_title(plan: WorkPlan, last: int) -> str:
    hidden = plan.num_cus - 1 - last
    return "CU (persistent workgroup)" + (f"; CUs {last + 1}-{plan.num_cus - 1} idle, not drawn" if hidden else "")


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
    last = _last_busy(plan)
    fig.update_layout(
        title=title
        or f"{plan.planner}: {s['works']} works on {s['busy_cus']} of {plan.num_cus} CUs ({s['idle_cus']} idle)",
        xaxis={"title": _cu_axis_title(plan, last), "range": [-0.5, last + 0.5]},
        yaxis_title="work slot on the CU (run in order)",
        height=260 + 22 * n_slots,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return place_title(fig)


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
        xaxis={"title": _cu_axis_title(plan, _last_busy(plan)), "range": [-0.5, _last_busy(plan) + 0.5]},
        yaxis_title="KV tokens",
        height=320,
        bargap=0.05,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return place_title(fig)


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
    return place_title(fig)


def gantt_figure(plan: WorkPlan, *, overhead: int = 64, title: str | None = None) -> go.Figure:
    """Per-CU Gantt chart of the plan as the cost model sees it: each CU's works in execution order, each as long as
    its KV tokens plus `overhead` (tokens); zoomed to the busy CUs."""
    _check_plan(plan)
    if isinstance(overhead, bool) or not isinstance(overhead, int) or overhead < 0:
        raise ValueError(f"overhead must be an int >= 0, got {overhead!r}")
    df = plan.to_frame()
    df["cost"] = df["kv_tokens"] + overhead
    df["start"] = df.groupby("cu")["cost"].cumsum() - df["cost"]
    fig = go.Figure()
    for b, g in df.groupby("batch_idx"):
        fig.add_bar(
            y=g["cu"],
            x=g["cost"],
            base=g["start"],
            orientation="h",
            name=f"request {b}",
            marker_color=_PALETTE[int(b) % len(_PALETTE)],
            showlegend=plan.batch <= 16,
            customdata=g[["kv_start", "kv_end", "kv_tokens", "slot"]].to_numpy(),
            hovertemplate="CU %{y}, slot %{customdata[3]}: request "
            + str(b)
            + "<br>kv [%{customdata[0]}, %{customdata[1]}) = %{customdata[2]} tokens<extra></extra>",
        )
    span = int((df.groupby("cu")["cost"].sum()).max()) if len(df) else 0
    last = _last_busy(plan)
    fig.update_layout(
        title={
            "text": title
            or f"{plan.planner}: each CU's works in order<br>(tokens + {overhead} per work); "
            f"modelled makespan {span} tokens",
            "font": {"size": 14},
        },
        barmode="overlay",
        xaxis_title="modelled time (tokens)",
        yaxis={"title": "CU", "range": [last + 0.5, -0.5]},
        height=max(280, min(900, 120 + 9 * (last + 1))),
        bargap=0.15,
        margin={"l": 60, "r": 20, "t": 70, "b": 50},
        legend={"font": {"size": 10}},
    )
    return place_title(fig)


def targets_figure(plans: dict[str, WorkPlan], *, overhead: int = 64) -> go.Figure:
    """The same batch planned for several GPUs, side by side: modelled cost (tokens + `overhead` per work) per CU,
    each panel zoomed to its busy CUs."""
    if not isinstance(plans, dict) or not plans or not all(isinstance(p, WorkPlan) for p in plans.values()):
        raise TypeError("plans must be a non-empty dict name -> WorkPlan")
    titles = []
    for name, p in plans.items():
        s = p.summary()
        titles.append(f"{name}: {s['works']} works<br>{s['busy_cus']} of {p.num_cus} CUs busy")
    fig = make_subplots(rows=1, cols=len(plans), subplot_titles=titles, horizontal_spacing=0.08)
    for i, p in enumerate(plans.values(), start=1):
        counts = (p.work_indptr[1:] - p.work_indptr[:-1]).to(torch.int64)
        cost = (p.cu_loads() + overhead * counts).tolist()
        last = _last_busy(p)
        fig.add_bar(
            x=list(range(last + 1)),
            y=cost[: last + 1],
            row=1,
            col=i,
            showlegend=False,
            marker_color=_PALETTE[i - 1],
            hovertemplate="CU %{x}: %{y} tokens + overheads<extra></extra>",
        )
        fig.update_xaxes(title_text=f"CU (0-{last})", row=1, col=i)
    fig.update_yaxes(title_text="modelled cost (tokens)", row=1, col=1)
    fig.update_layout(
        height=340,
        margin={"l": 60, "r": 20, "t": 90, "b": 50},
        title={"text": "The same batch on each GPU (bars: modelled cost per busy CU)", "y": 0.98},
    )
    return place_title(fig, gap=52)  # (above the two-line subplot titles)


def step_through_figure(
    result: EmulationResult,
    reference_out: torch.Tensor,
    *,
    request: int = 0,
    head: int = 0,
    row: int = 0,
    step: int | None = None,
) -> go.Figure:
    """One request, one head: each partial's output norm and LSE, the merge weights, and the final error.

    `result` must come from ``emulate_plan(..., trace=True)``; `reference_out` is the reference output of the
    same inputs (the title reports the relative error of the merged row). `step` (0..works+1; default: all) shows
    stage 1 after that many works (the others greyed) and, at ``works + 1``, the reduce."""
    if not isinstance(result, EmulationResult) or result.trace is None:
        raise ValueError("result must be an EmulationResult made with trace=True")
    works = sorted((w for w in result.trace["works"] if w.batch == request), key=lambda w: w.kv_start)
    if not works:
        raise ValueError(f"the trace has no work for request {request}")
    n = len(works)
    nq = works[0].q_rows[1] - works[0].q_rows[0]
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < nq:
        raise ValueError(f"row must be an int in [0, {nq}) (the request's q rows), got {row!r}")
    who = f", q row {row} of {nq}" if nq > 1 else ""
    step = n + 1 if step is None else step
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= n + 1:
        raise ValueError(f"step must be an int in [0, {n + 1}], got {step!r}")
    red = [r for r in result.trace["reduce"] if r.batch == request]
    labels = [f"{w.tokens[0]}-{w.tokens[1]}" for w in works]
    lse_all = [float(w.lse[row, head]) for w in works]
    # a partial whose row saw none of its work's tokens (the causal mask) has L_i = -inf: merge weight 0, no bar
    lse = [v if math.isfinite(v) else None for v in lse_all]
    norm = [float(w.out_norm[row, head]) for w in works]
    weights = [float(v) for v in red[0].weights[:, row, head]] if red else [1.0]
    done = [i < step for i in range(n)]
    r = works[0].q_rows[0] + row
    out_row = result.out[r, head]
    ref_row = reference_out[r, head].to(out_row.dtype)
    err = float((out_row - ref_row).norm() / ref_row.norm()) if float(ref_row.norm()) > 0 else 0.0
    merged_lse = float(red[0].lse[row, head]) if red else lse_all[0]
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.09,
        subplot_titles=("partial output norm ‖O_i‖", "partial LSE L_i", "merge weight w_i"),
    )

    def colours(c: str) -> list[str]:
        return [c if d else "#d0d0d0" for d in done]

    fig.add_bar(
        x=labels,
        y=[v if d else 0 for v, d in zip(norm, done)],
        row=1,
        col=1,
        marker_color=colours("#636efa"),
        showlegend=False,
        name="partial norm",
    )
    fig.add_bar(
        x=labels,
        y=[v if d else None for v, d in zip(lse, done)],
        row=1,
        col=2,
        marker_color=colours("#ef553b"),
        showlegend=False,
        name="partial LSE",
    )
    finite = [v for v in lse if v is not None]
    lo = min((v for v, d in zip(lse, done) if d and v is not None), default=min(finite, default=0.0))
    empty = [i for i, (v, d) in enumerate(zip(lse, done)) if d and v is None]
    if empty:  # drawn at the axis' foot: this row sees none of these works' tokens
        fig.add_scatter(x=[labels[i] for i in empty], y=[lo - 0.3] * len(empty), mode="markers+text",
                        text=["−∞"] * len(empty), textposition="top center", marker={"symbol": "x", "color": "#ef553b"},
                        row=1, col=2, name="L_i = −∞ (no token visible: weight 0)", showlegend=False)  # fmt: skip
    at_reduce = step == n + 1
    if at_reduce:
        fig.add_scatter(
            x=labels, y=[merged_lse] * n, mode="lines", name="merged LSE", row=1, col=2, line={"dash": "dash"}
        )
        fig.add_bar(x=labels, y=weights, row=1, col=3, marker_color="#00cc96", showlegend=False, name="merge weight")
    top = max(finite + ([merged_lse] if math.isfinite(merged_lse) else []), default=lo)
    fig.update_yaxes(range=[lo - 0.5, top + 0.5], row=1, col=2)
    fig.update_xaxes(
        title_text="tokens of the work", tickangle=-45 if n > 6 else 0, tickfont={"size": 9}, nticks=min(n, 12)
    )
    if not red:
        how = "not split: one work wrote the output directly"
    elif at_reduce:
        how = f"{n} partials merged, merged LSE {merged_lse:.4f}, rel-L2 vs reference {err:.1e}"
    else:
        how = f"stage 1 after {step} of {n} works (the reduce runs at step {n + 1})"
    fig.update_layout(
        title={"text": f"Request {request}, head {head}{who}: {how}", "font": {"size": 14}},
        height=380,
        margin={"l": 50, "r": 20, "t": 80, "b": 90},
    )
    return place_title(fig, gap=34)  # (above the subplot titles)


def coverage_figure(plan: WorkPlan, kv_indptr: torch.Tensor, findings: list | None = None) -> go.Figure:
    """Each request's KV (y = request, x = position from its start) with the works that cover it, coloured by CU;
    the doctor's ``uncovered`` findings drawn as red bars and ``covered_twice`` ones as black bars beside."""
    _check_plan(plan)
    kvp = kv_indptr.to("cpu", torch.int64).tolist()
    df = plan.to_frame()
    df = df[(df.batch_idx >= 0) & (df.batch_idx < len(kvp) - 1)]
    start = [kvp[b] for b in df.batch_idx]
    fig = go.Figure()
    fig.add_bar(
        y=df.batch_idx,
        x=df.kv_end - df.kv_start,
        base=[k - s for k, s in zip(df.kv_start, start)],
        orientation="h",
        marker={"color": [_PALETTE[c % len(_PALETTE)] for c in df.cu], "line": {"width": 1, "color": "white"}},
        name="works (colour = CU)",
        customdata=df[["work", "cu"]].to_numpy(),
        width=0.6,
        hovertemplate="work %{customdata[0]} on CU %{customdata[1]}<extra></extra>",
    )
    for kind, colour, name, dy in (
        ("uncovered", "#d62728", "not covered", 0.35),
        ("covered_twice", "black", "covered twice", -0.35),
    ):
        hits = [f for f in (findings or []) if f.kind == kind and f.request is not None and f.first is not None]
        if hits:
            fig.add_bar(
                y=[f.request + dy for f in hits],
                x=[f.count for f in hits],
                width=0.25,
                base=[f.first - kvp[f.request] for f in hits],
                orientation="h",
                marker_color=colour,
                name=name,
                hovertext=[f.message for f in hits],
                hoverinfo="text",
            )
    fig.update_layout(
        barmode="overlay",
        height=max(260, 60 + 28 * (len(kvp) - 1)),
        title="KV coverage per request: works (colour = CU), holes in red, double cover in black",
        xaxis_title="KV position within the request",
        yaxis={"title": "request", "autorange": "reversed"},
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return place_title(fig)


def model_vs_measured_figure(df: pd.DataFrame, model: CostModel | None = None) -> go.Figure:
    """Measured µs (y) against the modelled cost (x: the recorded makespan plus `model`'s reduce term over the
    recorded ``reduce_reads``), one point per (batch, policy), one colour per batch; the title gives the Spearman
    correlation within batches (the model only ranks plans of one batch) of the cost and of the makespan alone.
    `model`: default `CostModel()`."""
    need = {"mix", "seed", "policy", "makespan", "reduce_reads", "us_median"}
    if not isinstance(df, pd.DataFrame) or not need <= set(df.columns):
        raise ValueError(f"df must be an explorer recording with columns {sorted(need)}")
    model = CostModel() if model is None else model
    if not isinstance(model, CostModel):
        raise TypeError(f"model must be a CostModel, got {type(model).__name__}")
    d = df.dropna(subset=["us_median"])
    d = d.assign(cost=[model.cost(m, r) for m, r in zip(d["makespan"], d["reduce_reads"])])
    fig = go.Figure()
    rhos, rhos_span = [], []
    for i, ((mix, seed), g) in enumerate(d.groupby(["mix", "seed"])):
        fig.add_scatter(
            x=g["cost"],
            y=g["us_median"],
            mode="markers",
            name=f"{mix} {seed}",
            text=g["policy"],
            marker={"color": _PALETTE[i % len(_PALETTE)], "size": 9},
            hovertemplate="%{text}: model %{x} tokens, measured %{y:.1f} µs<extra></extra>",
        )
        if len(g) >= 3:
            rhos.append(g["cost"].rank().corr(g["us_median"].rank()))
            rhos_span.append(g["makespan"].rank().corr(g["us_median"].rank()))
    rho = sum(rhos) / len(rhos) if rhos else float("nan")
    rho_span = sum(rhos_span) / len(rhos_span) if rhos_span else float("nan")
    fig.update_layout(
        title=f"Model vs measured: mean Spearman ρ within a batch {rho:.2f} (makespan alone {rho_span:.2f}; "
        f"{len(rhos)} batches)",
        xaxis={
            "title": f"modelled cost (tokens: makespan + {model.reduce_row} per reduced partial row)",
            "type": "log",
        },
        yaxis={"title": "measured µs per call", "type": "log"},
        height=420,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return place_title(fig)

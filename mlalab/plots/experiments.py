"""The figure of a recorded A/B experiment (`mlalab.records.ab`): kernel variants timed side by side with a peer in
one process on the H200.

    from mlalab.records.ab import list_experiments, load_experiment
    from mlalab.plots.experiments import experiment_figure
    experiment_figure(load_experiment(list_experiments()[-1]))
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from ..records.ab import case_labels, check_experiment, experiment_geomeans, peer_name, reference_column, variants
from ..records.schema import DATA_ROOT
from .palette import color_for, place_title
from .timeline import check_goal, finish_ratio_figure

__all__ = ["experiment_figure", "experiment_questions", "experiment_summary", "experiments_summary_figure"]


def experiment_figure(df: pd.DataFrame, goal: float = 0.65, *, title: str | None = None) -> go.Figure:
    """Per shape, each variant's time over the reference's (`peer_name`: FlashMLA fp8 for a8w8 files; lower is
    faster), the legend with
    each geomean ratio; diamonds: the copy floor (bytes / copy bandwidth) over FlashMLA's time, what no kernel reading
    every byte once can beat by much; the dashed line: the goal on the geomean (a8w8 files only: an a8w8 goal)."""
    check_experiment(df)
    check_goal(goal)
    peer = peer_name(df)
    d = df.sort_values([k for k in ("layout", "q_len", "L", "B") if k in df.columns])
    shapes = case_labels(d)
    geo = experiment_geomeans(d).set_index("variant")
    ref = reference_column(d)
    fig = go.Figure()
    for col in variants(d):
        ratio = d[col] / d[ref]
        hover = [f"{u:.2f} µs vs {peer} {f:.2f} µs" for u, f in zip(d[col], d[ref])]
        g = geo.loc[col]
        missing = "" if g["shapes"] == len(d) else f" ({int(g['shapes'])} of {len(d)} shapes)"
        fig.add_trace(go.Bar(x=shapes, y=ratio, name=f"{col}: {g['vs_reference']:.3f}×{missing}", hovertext=hover))
    if "floor" in d.columns:
        fig.add_trace(go.Scatter(x=shapes, y=d["floor"] / d[ref], mode="markers", name="copy floor",
                                 marker={"symbol": "diamond", "color": "black"}))  # fmt: skip
    run = f" — {d['run'].iloc[0]}" if "run" in d.columns else ""
    title = title or f"variants / {peer}, one process on the H200{run}"
    return finish_ratio_figure(fig, goal if peer == "FlashMLA fp8" else None, title, peer)


def experiment_questions(index_csv: str | None = None) -> dict[str, str]:
    """``{file name: the question it answers}`` for the A/B files listed in data/INDEX.csv (`index_csv` to read
    another index); empty when there is no index."""
    path = index_csv if index_csv is not None else os.path.join(DATA_ROOT, "INDEX.csv")
    if not isinstance(path, str):
        raise TypeError(f"index_csv must be a path (str) or None, got {type(path).__name__}")
    if not os.path.exists(path):
        return {}
    idx = pd.read_csv(path, dtype=str).fillna("")
    if not {"file", "question"} <= set(idx.columns):
        raise ValueError(f"{path} must have columns file and question")
    ab = idx[idx["file"].str.startswith("ab/")]
    return {f.removeprefix("ab/"): q for f, q in zip(ab["file"], ab["question"])}


def experiment_summary(tables: Mapping[str, pd.DataFrame], questions: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per experiment file (`tables`: ``{file name: load_experiment(...)}``): its date, the question it
    answers (`experiment_questions`; the file name where none is recorded), what it was timed against, the first
    variant (usually the code of the day) and the fastest variant, each as a geomean ratio to the reference over the
    shapes it ran (lower is faster)."""
    if not isinstance(tables, Mapping) or not tables:
        raise ValueError("tables must map at least one experiment file name to its table (load_experiment)")
    questions = experiment_questions() if questions is None else questions
    rows = []
    for name, df in tables.items():
        check_experiment(df)
        geo = experiment_geomeans(df).set_index("variant")
        var = [v for v in variants(df) if geo.loc[v, "shapes"] > 0]
        if not var:
            raise ValueError(f"{name}: no variant ran at any shape")
        first, best = var[0], min(var, key=lambda v: geo.loc[v, "vs_reference"])
        date = str(df["date"].iloc[0]) if "date" in df.columns else name.split("_")[1] if "_" in name else ""
        rows.append({
            "date": date,
            "experiment": questions.get(name) or name,
            "compared with": peer_name(df),
            "precision": str(df["precision"].iloc[0]) if "precision" in df.columns else "a8w8",
            "first variant": first,
            "first ratio": float(geo.loc[first, "vs_reference"]),
            "fastest variant": best,
            "fastest ratio": float(geo.loc[best, "vs_reference"]),
            "shapes": int(geo.loc[best, "shapes"]),
            "file": name,
        })  # fmt: skip
    return pd.DataFrame(rows)


def _short(text: str, width: int = 64) -> str:
    if len(text) <= width:
        return text
    cut = text[:width].rsplit(" ", 1)[0]
    return cut + " …"


def experiments_summary_figure(summary: pd.DataFrame) -> go.Figure:
    """All experiments in one figure: per experiment (y, oldest at the top), the fastest variant's time over what it
    was compared with (bar, coloured by precision) and the first variant's (black tick); 1 = as fast as the
    reference. Hover gives the whole question and the variant names."""
    need = {"experiment", "fastest ratio", "first ratio", "precision", "compared with", "fastest variant",
            "first variant", "date"}  # fmt: skip
    if not isinstance(summary, pd.DataFrame) or not need <= set(summary.columns) or summary.empty:
        raise ValueError(f"summary must be experiment_summary's table (columns {sorted(need)}) with rows")
    labels = [f"{d} · {_short(q)}" for d, q in zip(summary["date"], summary["experiment"])]
    fig = go.Figure()
    for prec, g in summary.groupby("precision", sort=False):
        lab = [labels[i] for i in g.index]
        hover = [f"{q}<br>fastest: {v} {r:.3f}× {c}<br>first: {fv} {fr:.3f}×" for q, v, r, c, fv, fr in
                 zip(g["experiment"], g["fastest variant"], g["fastest ratio"], g["compared with"],
                     g["first variant"], g["first ratio"])]  # fmt: skip
        fig.add_bar(y=lab, x=g["fastest ratio"], orientation="h", name=f"fastest variant ({prec})",
                    marker_color=color_for("precision", str(prec)), hovertext=hover, hoverinfo="text")  # fmt: skip
    fig.add_scatter(y=labels, x=summary["first ratio"], mode="markers", name="first variant (code of the day)",
                    marker={"symbol": "line-ns-open", "size": 14, "color": "black"})  # fmt: skip
    fig.add_vline(x=1.0, line_dash="dot", line_color="#888")
    fig.update_layout(
        title="Every recorded experiment: time over what it was compared with (geomean over its shapes)",
        xaxis_title="time ÷ the reference's time in the same process (lower is faster)",
        yaxis={"autorange": "reversed", "automargin": True, "tickfont": {"size": 11}},
        barmode="overlay",
        height=160 + 22 * len(summary),
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.06, "yanchor": "top", "x": 0},
    )
    return place_title(fig)

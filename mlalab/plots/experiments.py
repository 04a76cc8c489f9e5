"""The figure of a recorded A/B experiment (`mlalab.records.ab`): kernel variants timed side by side with a peer in
one process on the H200.

    from mlalab.records.ab import list_experiments, load_experiment
    from mlalab.plots.experiments import experiment_figure
    experiment_figure(load_experiment(list_experiments()[-1]))
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..records.ab import check_experiment, experiment_geomeans, peer_name, reference_column, variants
from .timeline import check_goal, finish_ratio_figure

__all__ = ["experiment_figure"]


def experiment_figure(df: pd.DataFrame, goal: float = 0.65) -> go.Figure:
    """Per shape, each variant's time over the reference's (`peer_name`: FlashMLA fp8 for a8w8 files; lower is
    faster), the legend with
    each geomean ratio; diamonds: the copy floor (bytes / copy bandwidth) over FlashMLA's time, what no kernel reading
    every byte once can beat by much; the dashed line: the goal on the geomean (a8w8 files only: an a8w8 goal)."""
    check_experiment(df)
    check_goal(goal)
    peer = peer_name(df)
    d = df.sort_values(["L", "B"])
    shapes = [f"B{b}·L{n}" for b, n in zip(d["B"], d["L"])]
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
    title = f"variants / {peer}, one process on the H200{run}"
    return finish_ratio_figure(fig, goal if peer == "FlashMLA fp8" else None, title, peer)

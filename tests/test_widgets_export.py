"""The panels' shared export bar and busy indicator (mlalab.widgets.export)."""

from __future__ import annotations

import importlib.util

import pandas as pd
import plotly.graph_objects as go
import pytest

from mlalab.widgets.export import BusyIndicator, export_bar, safe_stem, save_figure, save_table


def _fig() -> go.Figure:
    return go.Figure(go.Bar(x=["a", "b"], y=[1.5, 2.5], name="triton"), layout={"title": "t"})


def test_save_table_and_html_round_trip(tmp_path) -> None:
    df = pd.DataFrame({"shape": ["B4·L1024", "B8·L1024"], "us": [12.25, 13.5]})
    p = save_table(df, tmp_path / "t.csv")
    assert pd.read_csv(p).equals(df)
    h = save_figure(go.FigureWidget(_fig()), tmp_path / "f.html").read_text()
    assert "Plotly.newPlot" in h and '"triton"' in h and len(h) > 1_000_000  # plotly.js inline: works offline
    with pytest.raises(ValueError, match="path must end in .csv"):
        save_table(df, tmp_path / "t.txt")
    with pytest.raises(ValueError, match=r"path must end in .html or .png"):
        save_figure(_fig(), tmp_path / "f.svg")
    with pytest.raises(TypeError, match="df must be a pandas DataFrame"):
        save_table([1, 2], tmp_path / "t.csv")


@pytest.mark.skipif(importlib.util.find_spec("kaleido") is not None, reason="kaleido installed: PNG works")
def test_png_without_kaleido_says_what_to_do(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="kaleido.*camera button"):
        save_figure(_fig(), tmp_path / "f.png")


def test_export_bar_writes_what_the_panel_shows(tmp_path) -> None:
    shown = {"df": pd.DataFrame({"x": [1, 2]}), "stem": "run 1/a8w8"}
    bar = export_bar(lambda: shown["stem"], table=lambda: shown["df"], figures=lambda: {"bars": _fig()},
                     folder=tmp_path)  # fmt: skip
    p = bar.save_csv()
    assert p == tmp_path / "run_1_a8w8.csv" and pd.read_csv(p)["x"].tolist() == [1, 2]
    assert "download='run_1_a8w8.csv'" in bar.status.value
    shown["df"] = shown["df"].iloc[:0]
    assert bar.save_csv() is None and "no table" in bar.status.value
    (h,) = bar.save_figures("html")
    assert h.name == "run_1_a8w8_bars.html" and h.stat().st_size > 1000
    with pytest.raises(ValueError, match="export_bar needs a table or figures"):
        export_bar("x")
    with pytest.raises(ValueError, match="must contain a letter"):
        safe_stem("///")


def test_busy_indicator_shows_the_work_while_it_runs() -> None:
    busy = BusyIndicator()
    seen = []
    with busy("computing the sweep"):
        seen.append((busy.busy, busy.widget.value))
    assert seen[0][0] and "computing the sweep …" in seen[0][1]
    assert not busy.busy and "updated in" in busy.widget.value and busy.last_seconds >= 0
    with pytest.raises(RuntimeError), busy("failing"):
        raise RuntimeError("boom")
    assert not busy.busy  # a failure clears the busy state too

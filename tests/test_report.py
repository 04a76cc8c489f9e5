"""The HTML report without a browser: one inline plotly.js, every section present (or honestly unavailable),
figures from the library's builders, atomic write, clear errors on bad input."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest

from mlalab.__main__ import main as cli
from mlalab.config import DecodeCase
from mlalab.plots.basics import floor_by_target_figure
from mlalab.report import (
    SECTION_BUILDERS,
    ReportOptions,
    Section,
    build_sections,
    render_html,
    write_report,
)

PLOTLY_JS_BANNER = re.compile(r"\*\s*plotly\.js v\d+\.\d+\.\d+")
NEW_PLOT = re.compile(r"Plotly\.newPlot\(\s*\"([^\"]+)\"")

# The builder module each section draws from; once it exists the section must not be "unavailable".
SECTION_MODULES = {
    "floor": "mlalab.plots.basics",
    "accuracy": "mlalab.plots.accuracy",
    "workmap": "mlalab.plots.splitkv",
    "timings": "mlalab.plots.timing",
    "experiments": "mlalab.plots.experiments",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Section]]:
    out = tmp_path_factory.mktemp("report") / "report.html"
    path, sections = write_report(out, ReportOptions())
    return path.read_text(encoding="utf-8"), sections


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_plotly_js_is_inline_exactly_once_and_nothing_is_fetched(report: tuple[str, list[Section]]) -> None:
    text, sections = report
    assert len(PLOTLY_JS_BANNER.findall(text)) == 1
    assert not re.search(r"<script[^>]+src=", text), "the page must not load scripts from anywhere (offline)"
    n_figs = sum(len(s.figures) for s in sections)
    assert n_figs >= 1
    assert len(NEW_PLOT.findall(text)) == n_figs


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_every_section_is_on_the_page(report: tuple[str, list[Section]]) -> None:
    text, sections = report
    assert [s.key for s in sections] == list(SECTION_BUILDERS)
    for s in sections:
        assert f"data-section='{s.key}'" in text
        if s.unavailable:
            assert "Section unavailable" in text and s.unavailable.split(":")[0] in text
        else:
            ids = [i for i in NEW_PLOT.findall(text) if i.startswith(f"fig-{s.key}-")]
            assert len(ids) == len(s.figures), (s.key, ids)


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
@pytest.mark.parametrize("key", list(SECTION_MODULES))
def test_sections_with_a_builder_are_available(key: str, report: tuple[str, list[Section]]) -> None:
    """A section may only be 'unavailable' while its builder module does not exist (never hide a broken adapter)."""
    _, sections = report
    module = SECTION_MODULES[key]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} has not landed yet")
    assert key in SECTION_BUILDERS, f"{module} exists but the report has no '{key}' section"
    s = next(s for s in sections if s.key == key)
    if key == "timings" and s.unavailable and "no timing CSV" in s.unavailable:
        pytest.skip(s.unavailable)
    assert s.unavailable is None, f"{key}: {s.unavailable}"
    assert s.figures and all(len(f.data) > 0 for f in s.figures)


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_floor_figure_is_the_builders(report: tuple[str, list[Section]]) -> None:
    """The report shows the library's figure, not a re-computation: same trace values as the builder gives."""
    _, sections = report
    opts = ReportOptions()
    s = next(s for s in sections if s.key == "floor")
    want = floor_by_target_figure(DecodeCase.uniform(opts.batch, opts.kv_len))
    assert [list(t.y) for t in s.figures[0].data] == [list(t.y) for t in want.data]


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_timings_come_from_the_recorded_csvs(report: tuple[str, list[Section]]) -> None:
    """Every bar of the timing section is a recorded median from data/timings (nothing measured or invented)."""
    _, sections = report
    s = next(s for s in sections if s.key == "timings")
    if s.unavailable:
        pytest.skip(s.unavailable)
    import pandas as pd

    csvs = sorted((ReportOptions().data_dir / "timings").glob("*.csv"))
    recorded = set(pd.concat([pd.read_csv(f) for f in csvs])["us_median"].round(9))
    bars = [t for t in s.figures[0].data if t.type == "bar"]
    assert bars and all(round(float(y), 9) in recorded for t in bars for y in t.y)


def test_render_embeds_the_figure_data() -> None:
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1.25, 2.5]))
    text = render_html([Section("x", "X", "desc", (fig,)), Section("y", "Y", "d", unavailable="no data: test")])
    assert 'id="fig-x-0"' in text
    call = text[text.index('"fig-x-0"', text.index("Plotly.newPlot(")) :]
    assert '"y":[1.25,2.5]' in call.replace(" ", "")
    assert "Section unavailable:</b> no data: test" in text
    assert len(PLOTLY_JS_BANNER.findall(text)) == 1


def test_write_is_atomic_and_replaces(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")
    path, _ = write_report(out, ReportOptions(), keys=["floor"])
    assert path == out and out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"], "temp file left behind"
    assert out.stat().st_mode & 0o644 == 0o644


def test_cli_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.html"
    rc = cli(["report", "--out", str(out), "--kv-len", "2048", "--batch", "8", "--sections", "floor"])
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0 and out.exists()
    text = out.read_text(encoding="utf-8")
    assert "batch 8, kv_len 2048" in text and "floor" in printed
    assert "[1/1] floor done in" in captured.err  # progress per section on stderr
    labels = floor_by_target_figure(DecodeCase.uniform(8, 2048)).data[0].text  # bar labels of B8/L2048
    assert all(json.dumps(v) in text for v in labels)


def test_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", "--out", str(tmp_path / "r.txt")]) == 2
    assert "must end in .html" in capsys.readouterr().err
    assert cli(["report", "--out", str(tmp_path / "missing" / "r.html")]) == 2
    assert cli(["report", "--out", str(tmp_path / "r.html"), "--kv-len", "0"]) == 2
    assert "kv_len" in capsys.readouterr().err
    assert cli(["report", "--out", str(tmp_path / "r.html"), "--sections", "floor,nope"]) == 2
    assert "unknown report section" in capsys.readouterr().err
    assert cli(["report", "--out", str(tmp_path / "r.html"), "--sections", "workmap", "--planner", "nope"]) == 2
    assert "planner" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        (dict(kv_len=0), ValueError, "kv_len"),
        (dict(batch=-1), ValueError, "batch"),
        (dict(batch=True), ValueError, "batch"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(target="tpu"), ValueError, "target"),
        (dict(title=3), TypeError, "title"),
    ],
)
def test_options_validate(kwargs: dict, exc: type[Exception], word: str) -> None:
    with pytest.raises(exc, match=word):
        ReportOptions(**kwargs)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="figures or the reason"):
        Section("k", "t", "d")
    with pytest.raises(TypeError, match="go.Figure"):
        Section("k", "t", "d", figures=("not a figure",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keys"):
        build_sections(keys=["nope"])
    with pytest.raises(TypeError, match="opts"):
        build_sections(opts={"kv_len": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="progress"):
        build_sections(keys=["floor"], progress=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="out"):
        write_report(123)  # type: ignore[arg-type]

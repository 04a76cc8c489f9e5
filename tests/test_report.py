"""The HTML report without a browser: one inline plotly.js, every section present (or honestly unavailable),
figures from the library's builders, atomic write, clear errors on bad input."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import plotly
import plotly.graph_objects as go
import pytest

from mlalab.__main__ import main as cli
from mlalab.config import DecodeCase
from mlalab.plots.basics import floor_by_target_figure
from mlalab.report import (
    DETAIL_SECTIONS,
    SECTION_BUILDERS,
    SIZE_LIMIT_BYTES,
    ReportOptions,
    Section,
    build_sections,
    pack_text,
    page_payload,
    render_html,
    unpack_text,
    write_report,
)

PLOTLY_JS_BANNER = re.compile(r"\*\s*plotly\.js v\d+\.\d+\.\d+")
NEW_PLOT = re.compile(r"<div id='([^']+)' data-figure=")

# The builder module each section draws from; once it exists the section must not be "unavailable".
SECTION_MODULES = {
    "floor": "mlalab.plots.basics",
    "accuracy": "mlalab.plots.accuracy",
    "workmap": "mlalab.plots.splitkv",
    "timings": "mlalab.plots.timing",
    "layouts": "mlalab.plots.timing",
    "ablations": "mlalab.plots.timeline",
    "experiments": "mlalab.plots.experiments",
    "frontier": "mlalab.plots.frontier",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Section]]:
    out = tmp_path_factory.mktemp("report") / "report.html"
    path, sections = write_report(out, ReportOptions())
    return path.read_text(encoding="utf-8"), sections


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_plotly_js_is_inline_exactly_once_and_nothing_is_fetched(report: tuple[str, list[Section]]) -> None:
    text, sections = report
    payload = page_payload(text)
    assert len(PLOTLY_JS_BANNER.findall(payload["plotlyjs-gz"])) == 1
    assert payload["plotlyjs-gz"] == plotly.offline.get_plotlyjs()  # the whole library, unpacked as the page does
    assert not re.search(r"<script[^>]+src=", text), "the page must not load scripts from anywhere (offline)"
    n_figs = sum(len(s.figures) for s in sections)
    assert n_figs >= 1
    assert len(NEW_PLOT.findall(text)) == n_figs == len(json.loads(payload["figures-gz"]))


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_every_section_is_on_the_page(report: tuple[str, list[Section]]) -> None:
    text, sections = report
    assert [s.key for s in sections] == [k for k in SECTION_BUILDERS if k not in DETAIL_SECTIONS]
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
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1.25, 2.5]), layout={"title": "</script><!-- a title"})
    text = render_html([Section("x", "X", "desc", (fig,)), Section("y", "Y", "d", unavailable="no data: test")])
    assert "id='fig-x-0'" in text
    figs = json.loads(page_payload(text)["figures-gz"])
    assert figs["fig-x-0"]["data"][0]["y"] == [1.25, 2.5]
    assert figs["fig-x-0"]["layout"]["title"]["text"] == "</script><!-- a title"  # packed: cannot break the page
    assert text.count("</script>") == text.count("<script")
    assert "Section unavailable:</b> no data: test" in text
    assert len(PLOTLY_JS_BANNER.findall(page_payload(text)["plotlyjs-gz"])) == 1


def test_packing_round_trips_and_never_closes_its_script() -> None:
    text = "".join(chr(c) for c in range(32, 127)) * 50 + "ü µs </script>"
    packed, n = pack_text(text)
    assert unpack_text(packed, n) == text
    assert "<" not in packed and "/" not in packed and '"' not in packed and "\\" not in packed


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_report_is_small_and_holds_no_machine_path(report: tuple[str, list[Section]]) -> None:
    """Under 2 MB with plotly.js inside, and no path of the machine that wrote it (data/ files by their
    repository-relative names)."""
    text, sections = report
    assert len(text.encode("utf-8")) <= SIZE_LIMIT_BYTES == 2_000_000
    visible = text + page_payload(text)["figures-gz"]
    root = str(Path(__file__).resolve().parents[1])
    for where in (root, str(Path.home()), str(ReportOptions().data_dir), "/tmp/"):
        assert where not in visible, f"the page holds the local path {where!r}"
    assert not re.search(r"(?<![\w.])/(?:home|root|work|Users|tmp|var|mnt)/", visible)


@pytest.mark.slow  # builds every section once (the accuracy sweep: ~5-10 s on 2 cores)
def test_experiments_are_one_table_and_one_figure_in_plain_words(report: tuple[str, list[Section]]) -> None:
    from mlalab.records.ab import list_experiments

    text, sections = report
    s = next(s for s in sections if s.key == "experiments")
    names = list_experiments()
    assert len(s.figures) == 1 and s.table_html.count("<tr>") == len(names) + 1
    assert "Are two warpgroups streaming alternate 64-token tiles faster than one?" in s.table_html  # INDEX.csv
    assert not any(n in s.table_html for n in ("v2x2f", "pb128p16gr", ">p32<"))  # no variant codes in the table
    for sec in sections:  # every axis of every figure says what it shows, in words (no variant code)
        for fig in sec.figures:
            for ax in ("xaxis", "yaxis"):
                t = fig.layout[ax].title.text or ""
                if not (ax == "yaxis" and sec.key == "experiments"):  # (its y axis: the questions themselves)
                    assert re.search(r"[a-z]{4}", t), (sec.key, ax, t)
                assert "(baseline)" not in t, (sec.key, ax, t)


def test_ablations_section_draws_each_recorded_kind_or_says_which_is_missing(tmp_path: Path) -> None:
    """One figure per ablation kind recorded in data/profiles (the fp8 decode's wgmmas, the fp4 route's conversion),
    the files named; a kind without a profile is named as missing; none at all makes the section unavailable."""
    import shutil

    from mlalab.report import section_ablations

    s = section_ablations(ReportOptions())
    assert s.unavailable is None and len(s.figures) == 2
    assert "FlashMLA fp8" in s.figures[0].layout.yaxis.title.text and "a8w8" in s.figures[1].layout.yaxis.title.text
    fp4 = re.search(r"h100_[-0-9]+_fp4_convert(_scales)?_profile\.csv", s.description)
    assert fp4 and "_profile.csv, " in s.description
    (tmp_path / "profiles").mkdir()
    s = section_ablations(ReportOptions(data_dir=tmp_path))
    assert s.unavailable and "wgmma: no *_profile.csv" in s.unavailable and "fp4: no" in s.unavailable
    assert str(tmp_path) not in s.unavailable and "in data/profiles" in s.unavailable
    shutil.copy(ReportOptions().data_dir / "profiles" / fp4.group(0), tmp_path / "profiles")
    s = section_ablations(ReportOptions(data_dir=tmp_path))
    assert len(s.figures) == 1 and "Not recorded: wgmma" in s.description and fp4.group(0) in s.description


def test_details_add_one_figure_per_experiment_titled_by_its_question(tmp_path: Path) -> None:
    from mlalab.records.ab import list_experiments

    (s,) = build_sections(ReportOptions(details=True), keys=["experiment-details"])
    assert len(s.figures) == len(list_experiments())
    assert s.figures[1].layout.title.text.startswith("Are two warpgroups streaming")
    assert "experiment-details" not in [x.key for x in build_sections(ReportOptions(), keys=["floor"])]


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
    figures = page_payload(text)["figures-gz"]
    assert all(json.dumps(v) in figures for v in labels)


def test_cli_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["report", "--out", str(tmp_path / "r.txt")]) == 2
    assert "must end in .html" in capsys.readouterr().err
    assert cli(["report", "--out", str(tmp_path / "missing" / "r.html")]) == 2
    assert cli(["report", "--out", str(tmp_path / "r.html"), "--kv-len", "0"]) == 2
    assert "kv_len" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: exit 2 with the argument's name
        cli(["report", "--out", str(tmp_path / "r.html"), "--sections", "floor,nope"])
    assert "unknown section(s) nope" in capsys.readouterr().err
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
        (dict(details="yes"), TypeError, "details"),
    ],
)
def test_options_validate(kwargs: dict, exc: type[Exception], word: str) -> None:
    with pytest.raises(exc, match=word):
        ReportOptions(**kwargs)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="figures, a table or the reason"):
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

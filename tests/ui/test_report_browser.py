"""The standalone report opened in chromium from file://, with the network cut: every figure renders (SVG drawn,
title shown, traces present) and the page fetches nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlalab.report import ReportOptions, write_report

from .conftest import ARTIFACTS, PageProbe

PLOTS = """() => Array.from(document.querySelectorAll('section[data-section]')).map(sec => ({
  key: sec.dataset.section,
  unavailable: sec.querySelector('.unavailable')?.textContent ?? null,
  plots: Array.from(sec.querySelectorAll('.js-plotly-plot')).map(gd => ({
    id: gd.id,
    traces: (gd._fullData || []).length,
    svgs: gd.querySelectorAll('svg.main-svg').length,
    drawn: gd.querySelectorAll('g.trace, g.hm image, g.table, .barlayer path').length,
    height: gd.getBoundingClientRect().height,
    title: gd.querySelector('.gtitle')?.textContent ?? '',
  })),
}))"""


@pytest.mark.ui
@pytest.mark.slow
def test_report_renders_offline(tmp_path: Path, page: PageProbe) -> None:
    path, sections = write_report(tmp_path / "report.html", ReportOptions())
    pg = page.page
    fetched: list[str] = []

    def block(route: object) -> None:  # the page must work offline: refuse and record any network request
        fetched.append(route.request.url)  # type: ignore[attr-defined]
        route.abort()  # type: ignore[attr-defined]

    pg.route("http*://**", block)
    pg.goto(path.as_uri())
    n_figs = sum(len(s.figures) for s in sections)
    pg.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot svg.main-svg').length > 0 && "
        f"document.querySelectorAll('.js-plotly-plot').length === {n_figs}",
        timeout=60_000,
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "report-full.png"), full_page=True)

    shown = {s["key"]: s for s in pg.evaluate(PLOTS)}
    assert list(shown) == [s.key for s in sections]
    for s in sections:
        got = shown[s.key]
        if s.unavailable:
            assert got["unavailable"] and s.unavailable in got["unavailable"]
            continue
        assert len(got["plots"]) == len(s.figures), got
        for fig, plot in zip(s.figures, got["plots"]):
            assert plot["traces"] == len(fig.data) > 0, (s.key, plot)
            assert plot["svgs"] >= 1 and plot["drawn"] >= 1 and plot["height"] > 100, (s.key, plot)
            # plotly renders <br>/<sub> markup as separate text spans joined by zero-width spaces: compare the text.
            want_title = re.sub(r"<[^>]+>", "", fig.layout.title.text or "")
            got_title = plot["title"].replace("\u200b", "")
            assert " ".join(got_title.split()) == " ".join(want_title.split()), (s.key, plot["title"])
    assert not fetched, f"the report tried to fetch: {fetched[:5]}"
    assert not page.page_errors, page.page_errors[:5]

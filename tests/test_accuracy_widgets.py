"""The notebook-02 panel driven from Python, its figure builders, and the notebook executed headless."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from mlalab.accuracy import direct_cast_demo, vacuous_check_demo
from mlalab.plots.accuracy import (
    error_histogram,
    error_vs_kv_len,
    metrics_table,
    metrics_table_html,
    sqnr_heatmap,
    value_histogram,
)
from mlalab.widgets.accuracy import accuracy_panel

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def panel():  # type: ignore[no-untyped-def]
    return accuracy_panel(batch=1, kv_len=64, kv_schemes=("bf16", "fp8-tensor"))


def test_panel_first_state(panel) -> None:  # type: ignore[no-untyped-def]
    assert "⚠" not in panel.message.value
    hm = panel.heatmap.data[0]
    assert list(hm.x) == ["bf16", "fp8-tensor"] and len(hm.y) == 9
    assert len(panel.errors.data) == 2 and "<table" in panel.table.value and "overflow-x:auto" in panel.table.value
    # at randn*0.02 every Q scheme ties, and the panel says why and offers inputs that separate them
    assert "Why every Q scheme gives the same SQNR" in panel.tie_note.value


def test_panel_controls_change_figures(panel) -> None:  # type: ignore[no-untyped-def]
    before = tuple(panel.heatmap.data[0].x)
    panel.kv_schemes.value = ("bf16", "fp8-tensor", "mxfp4-aiter")
    assert tuple(panel.heatmap.data[0].x) != before and "mxfp4-aiter" in panel.heatmap.data[0].x
    cells = panel.table.value
    panel.tolerance.value = (1e-1, 5e-2)
    assert panel.table.value != cells and "mismatch@0.1,0.05" in panel.table.value.replace("<wbr>", "")
    t0 = panel.q_values.layout.title.text
    panel.q_scheme.value = "fp8-direct"
    assert panel.q_values.layout.title.text != t0


def test_panel_invalid_input_shows_message(panel) -> None:  # type: ignore[no-untyped-def]
    panel.kv_schemes.value = ()
    assert "⚠" in panel.message.value and "KV scheme" in panel.message.value
    panel.kv_schemes.value = ("bf16",)
    assert "⚠" not in panel.message.value
    panel.std.value = 100.0
    panel.fp8_format.value = "e4m3fnuz"
    panel.q_scheme.value = "fp8-direct"
    nan = panel.records[panel.records.q_scheme == "fp8-direct"].nan_count.iloc[0]
    assert nan > 0  # the overflow shows as NaN in the table, not as an exception


def test_demos() -> None:
    vac = vacuous_check_demo(batch=1, kv_len=256)
    assert vac[vac.dist == "competition"]["zeros passes"].all()
    assert not vac[vac.dist == "unit"]["zeros passes"].any()
    dc = direct_cast_demo(stds=(0.02, 100.0), batch=1, kv_len=64)
    row = dc[(dc["q std"] == 100.0) & (dc.fp8 == "e4m3fnuz")].iloc[0]
    assert row["NaN outputs"] > 0 and row.verdict.startswith("NaN")
    assert row["rel-L2 direct, clamped"] > 1.2 * row["rel-L2 per-tensor"]  # saturation costs accuracy
    assert dc[(dc["q std"] == 0.02) & (dc.fp8 == "e4m3fn")].iloc[0]["q subnormal (direct)"] > 0.5
    with pytest.raises(ValueError, match="stds"):
        direct_cast_demo(stds=(-1.0,))


def test_plot_builders_validate() -> None:
    with pytest.raises(ValueError, match="kv_scheme"):
        sqnr_heatmap(pd.DataFrame({"q_scheme": ["a"], "sqnr_db": [1.0]}))
    with pytest.raises(ValueError, match="columns"):
        metrics_table(pd.DataFrame({"a": [1]}), ["b"])
    with pytest.raises(ValueError):
        error_histogram({})
    with pytest.raises(ValueError, match="scale"):
        value_histogram(torch.ones(3), "e4m3fn", scale=0.0)
    fig = value_histogram(torch.tensor([1e-4, 1.0, 500.0]), "e4m3fn")
    assert "33.3% subnormal" in fig.layout.title.text and "33.33% overflow" in fig.layout.title.text


def test_progress_bar_counts_kv_schemes(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlalab.widgets.accuracy as wa

    seen: list[str] = []
    monkeypatch.setattr(wa, "PROGRESS_ABOVE_TOKENS", 0)  # treat every case as big
    p = accuracy_panel(batch=1, kv_len=64, kv_schemes=("bf16", "nvfp4"))
    p.progress.observe(lambda ch: seen.append(p.progress.layout.visibility), names="value")
    p.kv_len.value = 256
    assert p.progress.max == 2 and p.progress.value == 2 and "visible" in seen
    assert p.progress.layout.visibility == "hidden"  # hidden again once done


def test_the_separating_input_button_makes_q_schemes_differ() -> None:
    p = accuracy_panel(batch=1, kv_len=256, kv_schemes=("bf16",))
    assert p.tie_note.value  # tie at the competition's inputs
    tie = p.records.sqnr_db.max() - p.records.sqnr_db.min()
    p.separate.click()
    assert (p.dist.value, p.std.value) == ("heavy-tail", 1.0) and "⚠" not in p.message.value
    spread = p.records.sqnr_db.max() - p.records.sqnr_db.min()
    assert tie < 0.5 and spread > 10 and p.tie_note.value == ""  # bf16 q vs fp8 q: tens of dB apart


def test_figures_keep_titles_clear_of_the_toolbar_and_labels_apart() -> None:
    fig = value_histogram(torch.tensor([1e-4, 1.0, 500.0]), "e4m3fn", title="q")
    assert fig.layout.modebar.orientation == "v" and fig.layout.title.x < 0.1
    labels = [a for a in fig.layout.annotations if a.text in ("flushed to 0", "subnormal", "normal", "overflow")]
    assert len(labels) == 4
    for a, b in zip(labels, labels[1:]):  # neighbouring labels stand at different heights
        assert a.y != b.y
    html = metrics_table_html(
        pd.DataFrame({"q_scheme": ["fp8-token-head"], "rel_l2": [0.0557]}), ["q_scheme", "rel_l2"]
    )
    assert "fp8-token-head" in html and "0.0557" in html and "overflow-x:auto" in html
    study = pd.DataFrame(
        {"kv_len": [256, 256, 1024, 1024], "seed": [0, 1, 0, 1], "kv_scheme": ["a"] * 4, "rel_l2": [1.0, 3.0, 2.0, 4.0]}
    )
    fig = error_vs_kv_len(study)
    assert list(fig.data[0].y) == [2.0, 3.0] and list(fig.data[1].y) == [3.0, 4.0, 2.0, 1.0]  # mean, min-max band


def test_study_panel_slices_a_sweep_table() -> None:
    from mlalab.accuracy import sweep
    from mlalab.config import DecodeCase
    from mlalab.widgets.accuracy import study_panel

    cases = [
        DecodeCase.uniform(1, L, seed=s, dist=d) for d in ("competition", "unit") for L in (32, 64) for s in (0, 1)
    ]
    df = sweep(cases, ["bf16", "fp8-tensor"], ["bf16", "nvfp4"], progress=False)
    sp = study_panel(df, q_scheme="fp8-tensor")
    hm = sp.heatmap.data[0]
    assert list(hm.y) == ["bf16", "nvfp4"] and list(hm.x) == ["competition", "unit"]  # KV scheme x distribution
    assert "mean over kv_len, seed" in sp.heatmap.layout.title.text
    assert sp.message.value.startswith("16 rows of 32")
    # each cell is the mean over kv_len and seeds of the selected rows
    sel = df[(df.q_scheme == "fp8-tensor") & (df.kv_scheme == "nvfp4") & (df.dist == "unit")]
    assert hm.z[1][1] == pytest.approx(sel.sqnr_db.mean())
    assert len(sp.curves.data) == 4  # per KV scheme: the mean line and the seed band
    sp.columns.value = "kv_scheme"
    assert "⚠" in sp.message.value and "two different" in sp.message.value
    sp.columns.value = "kv_len"
    sp.filters["dist"].value = "unit"
    assert list(sp.heatmap.data[0].x) == [32, 64] and sp.message.value.startswith("8 rows")
    with pytest.raises(ValueError, match="not in the table"):
        study_panel(df, q_scheme="fp9")


def test_panels_export_their_table_and_show_a_busy_line(panel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    assert "updated in" in panel.status.value and panel.busy.last_seconds is not None
    path = panel.export.save_csv()
    assert path is not None and path.exists() and path.name.startswith("accuracy_B")
    back = pd.read_csv(path)
    assert len(back) == len(panel.records) and set(back.kv_scheme) == set(panel.records.kv_scheme)


def test_preset_sets_inputs_seed_and_check_and_a_changed_input_ends_it() -> None:
    from mlalab.accuracy import CHECKS
    from mlalab.widgets.accuracy import accuracy_panel

    p = accuracy_panel(kv_len=256)
    p.preset.value = "mixed-mla-2026"
    case = p.case()
    assert (case.dist.value, case.std, case.seed, case.kv_lens) == ("unit", 1.0, 4217, (1024,) * 4)
    assert p.tolerance.value == CHECKS["mixed-mla-2026"]
    table = p.table.value.replace("<wbr>", "")
    assert "passes@mixed-mla-2026" in table and "halfkv_passes@mixed-mla-2026" in table
    assert "half-KV cheat" in p.message.value  # it passes the 2026 check at these inputs (3.6 % mismatch)
    p.dist.value = "competition"  # not the preset's distribution: custom inputs, seed 0
    assert p.preset.value == "" and p.case().seed == 0

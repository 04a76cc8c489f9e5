"""Timing records, recorded-data figures, the panel and the bench CLI without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mlalab.plots.timing import bars_per_shape, best_per_shape, load_recorded, roofline_figure, speedup_table
from mlalab.timing import COMPETITION_SHAPES, CSV_COLUMNS, copy_bandwidth, rel_l2


def test_recorded_csvs_have_the_schema_and_the_competition_suite() -> None:
    df = load_recorded()
    assert list(df.columns[: len(CSV_COLUMNS)]) == CSV_COLUMNS
    for be, prec in [("triton", "a8w8"), ("flashmla", "a8w8"), ("flashinfer", "bf16")]:
        d = best_per_shape(df, be, prec)
        assert sorted(zip(d["batch"], d["kv_len"])) == sorted(COMPETITION_SHAPES)
        assert (d["us_median"] >= d["floor_us"] * 0.9).all()  # nothing faster than the copy bandwidth allows


def test_figures_and_speedups_from_recorded_data() -> None:
    df = load_recorded()
    f = bars_per_shape(df, [("triton", "a8w8"), ("flashmla", "a8w8")])
    assert len(f.data) == 3
    assert len(roofline_figure(df, [("triton", "bf16")]).data) == 2
    t = speedup_table(df, ("triton", "a8w8"), [("flashmla", "a8w8")])
    assert t.shape == (13, 1)
    with pytest.raises(ValueError, match="no records"):
        best_per_shape(df, "flashinfer", "a8w8")


def test_panel_controls_change_the_figure() -> None:
    from mlalab.widgets.timing import timing_panel

    p = timing_panel()
    before = [tuple(t.y) for t in p.bars.data]
    p.precision.value = "bf16"
    assert [tuple(t.y) for t in p.bars.data] != before
    p.precision.value = "a16w8"
    assert "flashmla" in p.message.value  # flashmla has no a16w8: message, not a traceback


def test_rel_l2_and_gpu_required() -> None:
    assert rel_l2(torch.ones(4), torch.ones(4)) == 0.0
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            copy_bandwidth()


def test_bench_cli_without_gpu_reads_recorded_data() -> None:
    r = subprocess.run([sys.executable, "-m", "mlalab", "bench", "--recorded"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "recorded data" in r.stdout and "flashmla" in r.stdout

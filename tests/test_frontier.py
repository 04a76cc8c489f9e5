"""The precision frontier: each precision's schemes emulate what its kernels read, times are recorded medians or
marked floors, the Pareto flags are right, and the figures say which points were not measured."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from mlalab.accuracy import PRESETS
from mlalab.accuracy.frontier import (
    PRECISION_SCHEMES,
    as_check,
    frontier_run,
    frontier_table,
    pareto_mask,
    precision_schemes,
    recorded_times,
)
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.plots.frontier import FLOOR_LABEL, bytes_floor_figure, frontier_figure
from mlalab.quant import get_kv_scheme, get_q_scheme
from mlalab.quant.precision import PRECISIONS
from mlalab.records.timings import load_recorded, recorded_view
from mlalab.timing import call_bytes


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return frontier_table(4, 1024)


@pytest.mark.parametrize("precision", [str(p) for p in PRECISIONS])
def test_schemes_emulate_the_kernels_inputs_bit_for_bit(precision: str) -> None:
    """fake_quant of the mapped Q / KV schemes == what `mlalab.kernels.prepare` hands the kernels, dequantised."""
    from mlalab.kernels import prepare

    x = make_inputs(DecodeCase.uniform(2, 64, seed=1, dist="unit"))
    q_deq, kv_deq = prepare(x, precision).dequantized()
    qs, ks = precision_schemes(precision)
    kv = x.kv_buffer.reshape(-1, 1, 576)
    # (the kernels' codes x scale, exact in fp64, rounded to fp32 as the schemes' fp32 dequantisation rounds it)
    assert torch.equal(get_q_scheme(qs).fake_quant(x.q).float(), q_deq.float())
    assert torch.equal(get_kv_scheme(ks).fake_quant(kv).float().reshape(kv_deq.shape), kv_deq.float())


def test_pareto_mask() -> None:
    assert pareto_mask([1, 2, 3], [3, 2, 1]) == [True, True, True]
    assert pareto_mask([1, 2, 3], [1, 2, 1]) == [True, False, False]  # (3, 1) is beaten by (1, 1)
    assert pareto_mask([1, 1], [2, 2]) == [True, True]  # ties dominate nothing
    assert pareto_mask([float("nan"), 2], [0, 1]) == [False, True]
    with pytest.raises(ValueError, match="same length"):
        pareto_mask([1], [1, 2])


FULL_RUN = "h100_2026-12-07_all_precisions.csv"  # the newest full run timing every precision (fp4 KV included)
OLD_RUN = "h200_2026-12-04_run18.csv"  # a full run without fp4 KV


@pytest.mark.parametrize(("run", "floors"), [(None, set()), (OLD_RUN, {p for p in PRECISION_SCHEMES if "w4" in p})])
def test_times_are_recorded_medians_or_marked_floors(run: str | None, floors: set[str]) -> None:
    df = load_recorded()
    assert frontier_run(df) == FULL_RUN
    t = recorded_times(128, 8192, run=run)
    view = recorded_view(df, run=run or FULL_RUN)
    rows = view.rows[(view.rows.backend == "triton") & (view.rows.batch == 128) & (view.rows.kv_len == 8192)]
    assert (t["run"] == (run or FULL_RUN)).all() and (t["gpu"] == rows["gpu"].iloc[0]).all()
    for _, r in t.iterrows():
        assert r["bytes"] == call_bytes(128, 8192, r["precision"])
        rec = rows[rows.precision == r["precision"]]
        if len(rec):
            assert r["time_kind"] == "measured" and r["us"] == float(rec.us_median.iloc[0])
            assert r["floor_us"] == pytest.approx(float(rec.floor_us.iloc[0]), rel=1e-6)  # the run's own floor
        else:
            assert r["time_kind"] == "floor" and r["us"] == r["floor_us"]
    assert set(t.loc[t.time_kind == "floor", "precision"]) == floors
    batch256 = recorded_times(256, 8192, run=run)  # not in the recorded run: every point is a floor
    assert (batch256.time_kind == "floor").all()


def test_table_frontier_and_figures(table: pd.DataFrame) -> None:
    measured = table[table.time_kind == "measured"]
    front = set(table.loc[table["on_frontier:rel_l2"], "precision"])
    assert front and front <= set(measured.precision)
    for _, r in measured.iterrows():
        beaten = ((measured.us <= r.us) & (measured.rel_l2 <= r.rel_l2)
                  & ((measured.us < r.us) | (measured.rel_l2 < r.rel_l2))).any()  # fmt: skip
        assert beaten != (r.precision in front)
    assert table.loc[table.precision == "bf16", "rel_l2"].iloc[0] < 0.005  # output rounding only
    mx = table.loc[table.precision == "a16w4-mxfp4", "rel_l2"].iloc[0]
    assert 0.08 < mx < 0.14  # mxfp4-aiter ~11 % at the competition inputs
    fig = frontier_figure(table)
    names = [t.name for t in fig.data if t.mode == "markers"]
    assert not [n for n in names if FLOOR_LABEL in n] and FULL_RUN in fig.layout.title.text  # every point measured
    old = frontier_table(4, 1024, run=OLD_RUN)
    names = [t.name for t in frontier_figure(old).data if t.mode == "markers"]
    assert sorted(n for n in names if FLOOR_LABEL in n) == sorted(f"{p} ({FLOOR_LABEL})" for p in PRECISION_SCHEMES
                                                                  if "w4" in p)  # fmt: skip
    assert not old.loc[old.time_kind == "floor", "on_frontier:rel_l2"].any()  # floors never on the measured frontier
    assert len(bytes_floor_figure(table).data[0].y) == len(PRECISIONS)
    with pytest.raises(ValueError, match="metric must be one of"):
        frontier_figure(table, "sqnr")


def test_tolerance_choices(table: pd.DataFrame) -> None:
    assert as_check((1e-2, 1e-2)).max_mismatch == 0.0
    assert as_check("mixed-mla-2026").max_mismatch == 0.05
    with pytest.raises(ValueError, match="unknown check"):
        as_check("strict")
    strict = frontier_table(4, 1024, tolerance=(1e-3, 1e-5))
    passes = (strict.set_index("precision").passes["a8w8"], table.set_index("precision").passes["a8w8"])
    assert passes == (False, True)


def test_panel_switches_preset_and_says_what_is_not_measured() -> None:
    from mlalab.widgets.frontier import frontier_panel

    p = frontier_panel()
    assert f"Times: {FULL_RUN} (recorded on NVIDIA H100 80GB HBM3" in p.message.value
    assert "Not measured, drawn at their bandwidth floor: none" in p.message.value
    p.preset.value = "mixed-mla-2026"
    assert [v for _, v in p.shape.options] == list(PRESETS["mixed-mla-2026"].shapes)
    assert p.df.attrs["accuracy_case"] == "B4-L1024-q1-unit-s4217" and "up to 5 %" in p.message.value
    with pytest.raises(ValueError, match="preset must be one of"):
        frontier_panel(preset="nope")

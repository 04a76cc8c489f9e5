"""Timing records, recorded-data figures, the panel and the bench CLI without a GPU."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mlalab.accuracy import output_metrics
from mlalab.config import COMPETITION_SHAPES
from mlalab.plan import indptrs_for, make_plan
from mlalab.plots.timing import bars_per_shape, plan_time_facts, roofline_figure
from mlalab.records.schema import CSV_COLUMNS, config_cell, parse_config
from mlalab.records.timings import (
    LAYOUTS_DIR,
    TIMINGS_DIR,
    best_per_shape,
    fastest_record,
    load_recorded,
    plan_of_record,
    record_for_shape,
    recorded_view,
    speedup_table,
)
from mlalab.timing import L2_BYTES, MAX_ROTATION, copy_bandwidth, kv_cache_bytes, rel_l2, rotation_copies

#: the newest full recorded run: what the views, the panel and the CLI show by default
DEFAULT_RUN = "h200_2026-12-04_run18.csv"


def test_recorded_csvs_have_the_schema_and_the_competition_suite() -> None:
    df = load_recorded()
    assert list(df.columns[: len(CSV_COLUMNS)]) == CSV_COLUMNS
    for be, prec in [("triton", "a8w8"), ("flashmla", "a8w8"), ("flashinfer", "bf16")]:
        d = best_per_shape(df, be, prec)
        assert set(COMPETITION_SHAPES) <= set(zip(d["batch"], d["kv_len"]))  # (and the 2026 grid's batch 256)
        assert (d["us_median"] >= d["floor_us"] * 0.9).all()  # nothing faster than the copy bandwidth allows


def test_rotation_copies_span_four_l2s_within_bounds() -> None:
    for kv_bytes in (1, 2_359_296, 37_748_736, 75_497_472, 603_979_776, 1_207_959_552):
        n = rotation_copies(kv_bytes)
        assert 2 <= n <= MAX_ROTATION and (n * kv_bytes > 4 * L2_BYTES or n == MAX_ROTATION or n == 2)
        assert n == 2 or n * kv_bytes <= max(1 << 30, 4 * L2_BYTES + kv_bytes)
    # the smallest competition shape (4 x 1024 fp8) rotates through > 4 L2s (107 copies; 16 up to run 12: 38 MB)
    assert rotation_copies(4 * 1024 * 576) == 107 and rotation_copies(603_979_776) == 2
    assert rotation_copies(1) == MAX_ROTATION
    # 150 MiB: 4 x 60 MiB / 150 MiB = 1.6 -> 2 copies (the floor of 2, not more); 100 MiB: 2.4 -> 3
    assert rotation_copies(150 << 20) == 2 and rotation_copies(100 << 20) == 3
    # the bytes of one rotated copy, per precision (one place: the bench and scripts/hopper_ab.py use it)
    assert kv_cache_bytes(4, 1024, "a8w8") == kv_cache_bytes(4, 1024, "a16w8") == 4 * 1024 * 576
    assert kv_cache_bytes(4, 1024, "bf16") == 2 * 4 * 1024 * 576
    with pytest.raises(ValueError, match="unknown precision 'fp4'; supported: a8w8, a16w8, bf16"):
        kv_cache_bytes(4, 1024, "fp4")
    for bad in (0, -5, 1.5, True, "8"):
        with pytest.raises(ValueError, match="kv_bytes"):
            rotation_copies(bad)


def test_figures_and_speedups_from_recorded_data() -> None:
    df = load_recorded()
    f = bars_per_shape(df, [("triton", "a8w8"), ("flashmla", "a8w8")])
    assert len(f.data) == 3
    assert len(roofline_figure(df, [("triton", "bf16")]).data) == 2
    t = speedup_table(df, ("triton", "a8w8"), [("flashmla", "a8w8")])
    assert t.shape == (13, 1) and DEFAULT_RUN.removesuffix(".csv").split("_")[-1] in t.attrs["view"]
    tb = speedup_table(df, ("triton", "a8w8"), [("flashmla", "a8w8")], best_of_all=True)
    assert tb.shape == (13, 3) and "best of" in tb.attrs["view"]  # ratios + which run/config won per series
    with pytest.raises(ValueError, match="no records"):
        best_per_shape(df, "flashinfer", "a8w8")


def test_panel_controls_change_the_figure() -> None:
    from mlalab.widgets.timing import timing_panel

    p = timing_panel()
    assert DEFAULT_RUN.removesuffix(".csv").split("_")[-1] in p.view.value and p.run.value == DEFAULT_RUN
    before = [tuple(t.y) for t in p.bars.data]
    p.precision.value = "bf16"
    assert [tuple(t.y) for t in p.bars.data] != before
    p.precision.value = "a16w8"
    assert "flashmla" in p.message.value  # flashmla has no a16w8: message, not a traceback
    p.precision.value = "a8w8"
    # µs per shape of each timed trace (the floor is per run); best of all may hold shapes the default run lacks
    timed = lambda: [dict(zip(t.x, t.y)) for t in p.bars.data if not t.name.startswith("floor")]
    default = timed()
    p.best_of_all.value = True  # best of N: faster bars, labelled, winners listed
    assert "best of" in p.view.value and "won each shape" in p.table.value and p.run.disabled
    best = timed()
    assert len(best) == len(default) and all(set(d) <= set(b) for b, d in zip(best, default))
    assert best != default and all(b[s] <= d[s] for b, d in zip(best, default) for s in d)
    p.best_of_all.value = False
    p.planner.value = "balanced"  # the default run has no balanced rows: message, empty figure
    assert "triton" in p.message.value and all(t.name != "triton a8w8" for t in p.bars.data)


def test_panel_reads_the_layout_runs_too(tmp_path) -> None:  # noqa: ANN001
    """The timing panel reads data/layouts beside data/timings: its decode-layout control offers the token tables and
    pages of 16 recorded there, and picking the token-table run with that layout shows its Triton bars. Loading
    refuses a non-path argument and two folders holding a file of the same name."""
    import shutil

    from mlalab.records.timings import LAYOUTS_DIR, TIMINGS_DIR, load_recorded
    from mlalab.widgets.timing import timing_panel

    p = timing_panel()
    cases = [v for _, v in p.layout.options]
    assert (1, "tokens", False) in cases and (1, "paged16", False) in cases and (2, "contiguous", False) in cases
    p.run.value = "h100_2026-12-06_tokens_q1.csv"
    p.layout.value = (1, "tokens", False)
    bars = [t for t in p.bars.data if t.name == "triton a8w8"]
    assert bars and len(bars[0].y) == 14 and "tokens" not in p.message.value
    # what the layout costs: its run against a contiguous run covering the 12 shapes (`layout_costs`), or why not
    assert "What tokens costs on NVIDIA H100 80GB HBM3:</b> our a8w8 time is" in p.table.value
    p.run.value = "h100_2026-12-07_suite_layouts_q4.csv"
    p.layout.value = (4, "tokens", False)
    assert "goal ≤ 1.25×" in p.table.value and "both from h100_2026-12-07_suite_layouts_q4.csv" in p.table.value
    # a layout run whose contiguous side is another run's says so (`layout_costs`' same_run)
    from mlalab.records.timings import layout_costs
    from mlalab.widgets.timing import _layout_cost_html

    t = layout_costs(load_recorded((TIMINGS_DIR, LAYOUTS_DIR)), gpu="NVIDIA H100 80GB HBM3")
    r = t[(t["precision"] == "a8w8") & (t["q_len"] == 4) & (t["layout"] == "tokens")].copy()
    r["contiguous_run"], r["same_run"] = "another_run.csv", False
    html = _layout_cost_html(r, "a8w8", (4, "tokens", False), "an H100")
    assert "h100_2026-12-07_suite_layouts_q4.csv against another_run.csv (two runs)" in html, html
    p.precision.value = "bf16"
    assert "no NVIDIA H100 80GB HBM3 runs of tokens and of the contiguous cache at bf16, q_len 4" in p.table.value
    p.layout.value = (1, "contiguous", False)
    assert "costs" not in p.table.value
    with pytest.raises(TypeError, match="data_dir must be a folder path"):
        load_recorded(3)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for d in (a, b):
        shutil.copy(f"{LAYOUTS_DIR}/h100_2026-12-06_tokens_q1.csv", d)
    with pytest.raises(ValueError, match="CSV of the same name"):
        load_recorded((str(a), str(b)))
    assert set(load_recorded((TIMINGS_DIR, LAYOUTS_DIR))["run"]) >= {"h100_2026-12-06_tokens_q1.csv"}


def test_rel_l2_and_gpu_required() -> None:
    assert rel_l2(torch.ones(4), torch.ones(4)) == 0.0
    assert math.isnan(rel_l2(torch.ones(4), torch.zeros(4)))  # accuracy.output_metrics's definition, one place
    x, ref = torch.randn(2, 16, 8), torch.randn(2, 16, 8)
    assert rel_l2(x, ref) == output_metrics(x, ref)["rel_l2"] and rel_l2(x.reshape(32, 8), ref) == rel_l2(x, ref)
    with pytest.raises(ValueError, match="elements"):
        rel_l2(torch.ones(3), torch.ones(4))
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            copy_bandwidth()


def test_bench_cli_without_gpu_reads_recorded_data() -> None:
    r = subprocess.run([sys.executable, "-m", "mlalab", "bench", "--recorded"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "recorded data" in r.stdout and "flashmla" in r.stdout
    assert f"files read: {DEFAULT_RUN}" in r.stdout and "139.26" in r.stdout  # one run, not min over all
    assert "477" not in r.stdout  # the d-chunk sweep's variant is not in the default view
    r = subprocess.run([sys.executable, "-m", "mlalab", "bench", "--recorded", "--best-of-all"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and "best of up to" in r.stdout and "sweep_dchunk" in r.stdout


def test_best_per_shape_keeps_whole_rows() -> None:
    # groupby().first() used to fill an empty config from a slower row: every returned row must exist as recorded
    df = load_recorded()
    d = best_per_shape(df, "triton", "a8w8")
    cols = ["run", "batch", "kv_len", "us_median"]
    for r in d.itertuples():
        src = df[(df.run == r.run) & (df.batch == r.batch) & (df.kv_len == r.kv_len) & (df.us_median == r.us_median)]
        assert len(src) == 1, r
        same = src.iloc[0]
        assert str(same["config"]) == str(r.config) and same["planner"] == r.planner, (r, same[cols])


def test_config_column_is_what_ran_and_old_cells_still_read() -> None:
    import dataclasses

    from mlalab.kernels import KernelConfig
    from mlalab.records.schema import is_default_config

    plan = make_plan("simple", *indptrs_for([1024] * 4), 264)
    record = {**dataclasses.asdict(KernelConfig(pdl=False)), "plan_block": 128, "num_cus": plan.num_cus,
              "plan": plan.digest(), "ran": "sm90:v-regs"}  # fmt: skip
    s = config_cell({"planner": "simple"}, record)
    d = parse_config(s)
    assert {k: d[k] for k in KernelConfig.knobs()} == {**dataclasses.asdict(KernelConfig()), "pdl": False}
    assert d["num_cus"] == 264 and d["plan_block"] == 128 and d["ran"] == "sm90:v-regs"
    assert not is_default_config(s, 264) and d["plan"]["hash"] == plan.digest()["hash"]
    assert parse_config("dc256_w8:" + s)["variant"] == "dc256_w8"
    assert config_cell({}) == "" and config_cell({"b": 1, "a": True}) == "a=True,b=1"  # backends that record none
    # every recorded cell parses (old k=v, an old sweep's "name:k=v", empty = that run's defaults)
    for c in load_recorded()["config"]:
        assert isinstance(parse_config(c), dict)
    assert parse_config("num_cus=264,num_warps=8,transposed=True") == {
        "num_cus": 264,
        "num_warps": 8,
        "transposed": True,
    }
    assert parse_config(float("nan")) == {} and parse_config("bmm") == {"variant": "bmm"}
    with pytest.raises(TypeError, match="config"):
        parse_config(3)
    with pytest.raises(ValueError, match="JSON"):
        parse_config("{bad")


def test_plan_of_record_rebuilds_the_recorded_plan() -> None:
    df = load_recorded()
    row = record_for_shape(df, 128, 8192)
    assert (
        row["run"] == DEFAULT_RUN
        and row["us_median"] == fastest_record(load_recorded().query("run == @DEFAULT_RUN"), 128, 8192)["us_median"]
    )
    plan = plan_of_record(row)
    cfg = parse_config(row["config"])
    assert plan.planner == row["planner"] and plan.num_cus == int(cfg.get("num_cus", row["sm_count"]))
    assert plan.batch == 128 and int(plan.cu_loads().sum()) == 128 * 8192
    f = plan_time_facts(row, plan)
    loads = plan.cu_loads()
    assert f["longest_tokens"] == int(loads.max()) and f["busy_slots"] == int((loads > 0).sum())
    assert f["us_median"] == row["us_median"] and str(f["busy_slots"]) in f["sentence"]
    assert f["plan_check"] == "same" and "same plan as measured" in f["sentence"].lower()  # run 4 has digests
    with pytest.raises(ValueError, match="no triton a8w8 records for B3"):
        fastest_record(df, 3, 1024)
    with pytest.raises(ValueError, match="only triton rows"):
        plan_of_record(fastest_record(df, 4, 1024, "flashmla"))


def test_plan_time_panel_dropdown_redraws_the_plan() -> None:
    from mlalab.widgets.timing import plan_time_panel

    p = plan_time_panel()
    assert [o[1] for o in p.shape.options] == COMPETITION_SHAPES
    before_map = [tuple(map(tuple, t.z)) for t in p.work_map.data]
    before_load = [tuple(t.y) for t in p.cu_load.data]
    before_facts = p.facts.value
    p.shape.value = (128, 8192)
    assert [tuple(map(tuple, t.z)) for t in p.work_map.data] != before_map
    assert [tuple(t.y) for t in p.cu_load.data] != before_load
    assert p.facts.value != before_facts and "µs" in p.facts.value and p.message.value == ""
    # a table without that shape: a message in the panel, empty figures, no traceback
    q = plan_time_panel(load_recorded().query("batch != 4"))
    assert "no full suite run" in q.message.value and len(q.work_map.data) == 0
    q = plan_time_panel(load_recorded().query("batch != 4"), best_of_all=True)
    assert "no triton a8w8 records for B4" in q.message.value and len(q.work_map.data) == 0


def test_speculative_decode_views_keep_rows_of_the_default_plan_on_fewer_slots() -> None:
    """At q_len 2 and 4 the default plan has SMs // q_len slots where a CTA runs one q row (every bf16 and a16w8 row,
    a8w8 on small batches): those rows are Triton's default and every view shows them, the 12 competition shapes in
    every precision (this run's a16w8 at 256 x 8192 ran out of the H100's memory)."""
    df = load_recorded((TIMINGS_DIR, LAYOUTS_DIR))
    run = "h100_2026-12-07_layouts_q24_tokens.csv"
    for q_len in (2, 4):
        rows = recorded_view(df, run=run, q_len=q_len, layout="tokens").rows
        ours = rows[rows["backend"] == "triton"]
        for prec in ("a8w8", "a16w8", "bf16"):
            shapes = set(
                zip(ours.loc[ours["precision"] == prec, "batch"], ours.loc[ours["precision"] == prec, "kv_len"])
            )
            assert set(COMPETITION_SHAPES) <= shapes, (q_len, prec)
        slots = {parse_config(c)["num_cus"] for c in ours["config"]}
        assert {132 // q_len, 132} <= slots, slots  # one row a CTA and rows side by side, both default


def test_layout_costs_are_the_recorded_runs_ratios() -> None:
    """`layout_costs` on data/: every a8w8 layout at q_len 1, 2 and 4 on the H100, each ratio the geomean of the two
    CSVs' Triton rows at the 12 shapes (computed here from the files), the goal only for a8w8."""
    import pandas as pd

    from mlalab.records.timings import LAYOUT_GOALS, layout_costs, layout_costs_by_gpu

    df = load_recorded((TIMINGS_DIR, LAYOUTS_DIR))
    t = layout_costs(df, gpu="NVIDIA H100 80GB HBM3")
    a8 = t[t["precision"] == "a8w8"]
    assert {(q, lay) for q, lay in zip(a8["q_len"], a8["layout"])} >= {
        (q, lay) for q in (1, 2, 4) for lay in ("paged64", "paged16", "tokens")
    }
    row = a8[(a8["q_len"] == 4) & (a8["layout"] == "tokens")].iloc[0]
    assert row["run"] == "h100_2026-12-07_suite_layouts_q4.csv" and row["same_run"]

    def us(name: str, layout: str) -> pd.Series:
        d = pd.read_csv(f"{LAYOUTS_DIR}/{name}")
        d = d[(d["backend"] == "triton") & (d["precision"] == "a8w8") & (d["q_len"] == 4) & (d["layout"] == layout)]
        return d.set_index(["batch", "kv_len"])["us_median"].loc[list(COMPETITION_SHAPES)]

    ratio = us(row["run"], "tokens").to_numpy() / us(row["contiguous_run"], "contiguous").to_numpy()
    assert row["vs_contiguous"] == pytest.approx(math.exp(sum(math.log(v) for v in ratio) / 12), rel=1e-12)
    assert row["max"] == pytest.approx(ratio.max(), rel=1e-12) and row["goal"] == LAYOUT_GOALS["tokens"]
    assert bool(row["met"]) == (row["vs_contiguous"] <= row["goal"])
    assert t.loc[t["precision"] != "a8w8", "goal"].isna().all()  # no goal for bf16 and a16w8
    # every GPU with a non-empty table (today the H100 alone), skipping GPUs that only peers ran on
    peer_only = pd.concat([df, df[df["backend"] == "flashmla"].iloc[:1].assign(gpu="a GPU of peers only")])
    by_gpu = layout_costs_by_gpu(peer_only)
    assert list(by_gpu) == ["NVIDIA H100 80GB HBM3"] and by_gpu["NVIDIA H100 80GB HBM3"].equals(t)


def test_layout_costs_pick_covering_runs_and_refuse_bad_input(tmp_path) -> None:  # noqa: ANN001
    """Each side is the newest run covering every shape asked for: a layout run short of a shape is left out, a
    contiguous side missing from the layout's run comes from another run (``same_run`` False)."""
    import pandas as pd

    from mlalab.records.schema import TimingRecord, write_csv
    from mlalab.records.timings import layout_costs

    env = {"gpu": "G", "sm_count": 132}
    shapes = [(4, 1024), (8, 1024)]

    def rec(layout: str, b: int, us: float, date: str) -> TimingRecord:
        return TimingRecord("triton", "simple", "a8w8", "", b, 1024, 1, False, layout, us_median=us,
                            env={**env, "date": date})  # fmt: skip

    write_csv([rec("contiguous", b, 10.0, "2026-01-01") for b, _ in shapes], tmp_path / "g_old.csv")
    write_csv([rec("paged64", b, 11.0 + b, "2026-01-02") for b, _ in shapes] + [rec("tokens", 4, 30.0, "2026-01-02")],
              tmp_path / "g_new.csv")  # fmt: skip
    df = load_recorded(str(tmp_path))
    t = layout_costs(df, gpu="G", shapes=shapes)
    assert list(t["layout"]) == ["paged64"]  # tokens covers 4 x 1024 only
    r = t.iloc[0]
    assert r["run"] == "g_new.csv" and r["contiguous_run"] == "g_old.csv" and not r["same_run"]
    assert r["vs_contiguous"] == pytest.approx(math.sqrt(1.5 * 1.9)) and r["worst_shape"] == "8x1024"
    assert layout_costs(df, gpu="G", shapes=[(4, 1024)])["layout"].tolist() == ["paged64", "tokens"]
    twice = pd.concat([df, df[(df["run"] == "g_new.csv") & (df["layout"] == "paged64")].iloc[:1]])
    with pytest.raises(ValueError, match=r"g_new.csv has several default Triton rows of one case at shape \(4, 1024\)"):
        layout_costs(twice, gpu="G", shapes=shapes)
    with pytest.raises(ValueError, match="gpu 'H' has no Triton records; recorded GPUs: G"):
        layout_costs(df, gpu="H")
    with pytest.raises(TypeError, match="gpu must be a str"):
        layout_costs(df, gpu=1)  # type: ignore[arg-type]
    for bad in ([], [(4,)], [(4, 0)], "4x1024"):
        with pytest.raises(ValueError, match="shapes must be a non-empty list"):
            layout_costs(df, gpu="G", shapes=bad)  # type: ignore[arg-type]


def test_layout_cost_figure_draws_the_table() -> None:
    """One bar per (precision, layout, q_len) at its geomean with whiskers to the best and worst shape, the goals as
    lines; an empty or foreign table is refused."""
    import pandas as pd

    from mlalab.plots.timing import layout_cost_figure
    from mlalab.records.timings import layout_costs

    gpu = "NVIDIA H100 80GB HBM3"
    costs = layout_costs(load_recorded((TIMINGS_DIR, LAYOUTS_DIR)), gpu=gpu)
    fig = layout_cost_figure(costs, gpu)
    a8 = next(t for t in fig.data if t.name == "a8w8")
    want = costs[costs["precision"] == "a8w8"].sort_values(["layout", "q_len", "causal"], kind="stable")
    assert list(a8.y) == list(want["vs_contiguous"]) and "tokens · q_len 4" in list(a8.x)
    assert list(a8.error_y.array) == pytest.approx(list(want["max"] - want["vs_contiguous"]))
    goals = {round(s.y0, 2) for s in fig.layout.shapes if s.line.dash == "dash"}
    assert goals == {1.05, 1.25} and gpu in fig.layout.title.text
    with pytest.raises(ValueError, match="costs is empty"):
        layout_cost_figure(costs.iloc[0:0], gpu)
    with pytest.raises(TypeError, match="costs must be the DataFrame of layout_costs"):
        layout_cost_figure(pd.DataFrame({"a": [1]}), gpu)

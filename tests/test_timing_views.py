"""Honest views of the recorded timings: one run by default (the numbers the README quotes), best-of-N only when
asked and then labelled; bench's argument checks; atomic CSVs; bytes/FLOPs from mlalab.traffic; plan digests."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from mlalab.__main__ import main as cli
from mlalab.config import COMPETITION_SHAPES, DecodeCase
from mlalab.io import atomic_write
from mlalab.kernels import KernelConfig
from mlalab.plan import WorkPlan, indptrs_for, make_plan
from mlalab.plots.timing import BF16_MATMUL_ROOF_TFLOPS, ROOF_SOURCE, bars_per_shape, roofline_figure
from mlalab.records.schema import (
    CSV_COLUMNS,
    TimingRecord,
    config_cell,
    default_slot_counts,
    is_default_config,
    parse_config,
    write_csv,
)
from mlalab.records.timings import (
    REFERENCE_GPU,
    default_run,
    full_runs,
    headline,
    load_recorded,
    plan_check,
    plan_of_record,
    record_for_shape,
    recorded_view,
)
from mlalab.report import ReportOptions, section_timings
from mlalab.timing import call_bytes, check_suite_args, run_suite
from mlalab.traffic import decode_traffic

ROOT = Path(__file__).resolve().parents[1]
RUN3 = "h200_2026-12-02_run3.csv"  # the portable kernel's last full run (no plan digests)
NEWEST_RUN = "h200_2026-12-04_run18.csv"  # the newest full run on the reference GPU: the default view
H100_RUN = "h100_2026-12-07_all_precisions.csv"  # a newer full run on another GPU


def _cell(plan: WorkPlan, **knobs: object) -> str:
    """The config cell a run of today's Triton backend records for `plan` (`mlalab.backends.triton`'s record)."""
    import dataclasses

    return config_cell({}, {**dataclasses.asdict(KernelConfig()), **knobs, "num_cus": plan.num_cus,
                            "plan": plan.digest(), "ran": "sm90:v-regs"})  # fmt: skip


def test_readme_numbers_are_what_the_default_views_show() -> None:
    """The README's headline (geomean, ratio to FlashMLA fp8, B128 x L8192 µs and % of copy BW) from data/timings."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"\*\*([\d.]+) µs — ([\d.]+)× FlashMLA fp8's ([\d.]+) µs\*\*", text)
    m2 = re.search(
        r"reaches \*\*(\d+) % of the measured copy bandwidth\*\* \(([\d.]+) µs vs FlashMLA fp8 (\d+) µs", text
    )
    assert m and m2, "README headline sentence not found"
    h = headline(load_recorded())
    assert h["files"] == (NEWEST_RUN,) and NEWEST_RUN in text
    assert f"{h['geomean_us']:.1f}" == m.group(1) and f"{h['ratio']:.2f}" == m.group(2)
    assert f"{h['peer_geomean_us']:.1f}" == m.group(3)
    assert f"{h['pct_copy_at_shape']:.0f}" == m2.group(1) and f"{h['us_at_shape']:.1f}" == m2.group(2)
    assert f"{h['peer_us_at_shape']:.0f}" == m2.group(3)
    # the default figure, the report and the plan panel's record show the same row at B128 x L8192
    bars = bars_per_shape(load_recorded(), [("triton", "a8w8")])
    y = dict(zip(bars.data[0].x, bars.data[0].y))
    assert f"{y['B128·L8192']:.1f}" == m2.group(2) and NEWEST_RUN in bars.layout.title.text
    s = section_timings(ReportOptions())
    assert s.unavailable is None and NEWEST_RUN in s.description
    ry = dict(zip(s.figures[0].data[0].x, s.figures[0].data[0].y))
    assert ry == y
    assert f"{record_for_shape(load_recorded(), 128, 8192)['us_median']:.1f}" == m2.group(2)


def test_default_view_is_one_run_one_config_per_shape() -> None:
    df = load_recorded()
    assert default_run(df) == NEWEST_RUN  # newest full suite run; sweeps and dev runs have no default Triton rows
    v = recorded_view(df)
    assert v.files == (NEWEST_RUN,) and not v.best_of_all and (v.rows["run"] == NEWEST_RUN).all()
    assert not v.rows.duplicated(["backend", "precision", "batch", "kv_len"]).any()
    tri = v.rows[(v.rows["backend"] == "triton") & (v.rows["precision"] == "a8w8")]
    assert sorted(zip(tri["batch"], tri["kv_len"])) == sorted(COMPETITION_SHAPES)
    # best of N over every file is faster somewhere (an older run at some shape: run noise), and says which run
    b = recorded_view(df, best_of_all=True)
    h200 = set(df.loc[df["gpu"] == REFERENCE_GPU, "run"])
    assert "best of" in b.label and set(b.files) == h200 and (b.rows["gpu"] == REFERENCE_GPU).all()
    bt = b.rows[(b.rows["backend"] == "triton") & (b.rows["precision"] == "a8w8")].set_index(["batch", "kv_len"])
    one = tri.set_index(["batch", "kv_len"])
    assert all((bt["us_median"] <= one.loc[bt.index, "us_median"]).tolist())  # never slower than the one run
    faster = [k for k in bt.index if bt.loc[k, "us_median"] < one.loc[k, "us_median"]]
    fig = bars_per_shape(df, [("triton", "a8w8")], best_of_all=True)
    assert "best of" in fig.layout.title.text and "best of" in fig.data[0].name
    for k in faster:  # where another run won, the row and the hover name it
        older = bt.loc[k, "source"].split(" · ")[0]
        assert older != NEWEST_RUN and any(older in h for h in fig.data[0].hovertext)
    # an older run can be picked explicitly; a run without default Triton rows gives a clear error downstream
    assert recorded_view(df, run="h200_2026-12-02_run1.csv").files == ("h200_2026-12-02_run1.csv",)
    with pytest.raises(ValueError, match="not recorded"):
        recorded_view(df, run="nope.csv")
    with pytest.raises(ValueError, match="exclude"):
        recorded_view(df, run=RUN3, best_of_all=True)
    with pytest.raises(ValueError, match="no full suite run"):
        default_run(df[df["run"] == "h200_2026-12-02_sweep_dchunk.csv"])
    with pytest.raises(TypeError, match="df"):
        recorded_view([1, 2])  # type: ignore[arg-type]


def test_views_never_mix_gpus() -> None:
    """A newer full run on another GPU (the H100's of 2026-12-07) is not the default view; it is shown when named;
    best of all reads one GPU's runs; a GPU without records is a clear error."""
    df = load_recorded()
    h100 = "NVIDIA H100 80GB HBM3"
    assert H100_RUN in [r for r, g in full_runs(df) if g == h100]  # a full run, and newer than run 18
    assert default_run(df) == NEWEST_RUN and default_run(df, h100) == H100_RUN
    assert recorded_view(df, gpu=h100).files == (H100_RUN,)
    assert recorded_view(df, run=H100_RUN).files == (H100_RUN,)  # a named run, whatever its GPU
    b = recorded_view(df, best_of_all=True, gpu=h100)
    assert (b.rows["gpu"] == h100).all() and all(f.startswith("h100_") for f in b.files) and h100 in b.label
    with pytest.raises(ValueError, match="gpu 'NVIDIA B200' has no records"):
        recorded_view(df, best_of_all=True, gpu="NVIDIA B200")
    with pytest.raises(ValueError, match="no full suite run on NVIDIA B200"):
        default_run(df, "NVIDIA B200")


def test_default_config_rule() -> None:
    plan = make_plan("simple", *indptrs_for([1024] * 4), 132)
    assert is_default_config(float("nan")) and is_default_config("")
    assert is_default_config(_cell(plan), 132)
    assert not is_default_config(_cell(plan), 264)  # 2 plan slots per SM is a variant
    # the default plan's slots: SMs x 1 or 2 CTAs an SM, over the CTAs a request's q rows take (1, 2 or 4 | q_len)
    for slots, q_len, default in ((264, 1, True), (528, 1, False), (66, 1, False), (66, 2, True), (132, 2, True),
                                  (33, 4, True), (33, 2, False), (66, 4, True), (264, 4, True)):  # fmt: skip
        cell = _cell(make_plan("simple", *indptrs_for([1024] * 4), slots))
        assert is_default_config(cell, 132, q_len) == default, (slots, q_len)
    assert default_slot_counts(132, 4) == {33, 66, 132, 264} and default_slot_counts(132, 3) == {44, 88}
    assert not is_default_config(_cell(plan, slots_given=True), 132)  # slots the caller chose
    for bad, arg in (((0, 1), "sm_count"), ((132, 0), "q_len"), ((132, True), "q_len")):
        with pytest.raises(ValueError, match=f"{arg} must be an int >= 1"):
            default_slot_counts(*bad)
    assert not is_default_config(_cell(plan, plan_block=128), 132)  # a plan option given is a variant
    assert not is_default_config(_cell(plan, p_fp8=False), 132)
    # retired knobs (recorded by runs before the experiments were deleted): the values that selected what the code
    # does now are defaults, any other value a variant; a knob nobody knows is not a default
    assert is_default_config('{"hopper_stages": 3}') and is_default_config('{"hopper_stages": null}')
    assert is_default_config('{"hopper_variant": "auto", "num_warps": 8, "kernel": "auto"}')
    assert not is_default_config('{"hopper_stages": 2}') and not is_default_config('{"hopper_block": 128}')
    assert not is_default_config('{"warp_size": 64}')
    assert not is_default_config("num_warps=8") and not is_default_config("f16_w8:num_warps=8")


def test_bytes_and_flops_come_from_traffic() -> None:
    df = load_recorded()
    want = [call_bytes(int(b), int(L), p) for b, L, p in zip(df["batch"], df["kv_len"], df["precision"])]
    assert (df["bytes"].astype(int).tolist()) == want  # every recorded bytes cell equals mlalab.traffic's count
    t = decode_traffic(DecodeCase.uniform(128, 8192), "fp8", 1.0)
    assert call_bytes(128, 8192, "a8w8") == t.total_bytes
    fig = roofline_figure(df, [("triton", "a8w8")])
    pts = dict(zip(fig.data[1].text, fig.data[1].x))
    assert pts["B128·L8192"] == pytest.approx(t.intensity)
    with pytest.raises(ValueError, match="precision"):
        call_bytes(4, 1024, "fp4")


def test_roof_is_labelled_with_its_source() -> None:
    fig = roofline_figure(load_recorded(), [("triton", "a8w8")])
    assert max(fig.data[0].y) == BF16_MATMUL_ROOF_TFLOPS
    assert f"{BF16_MATMUL_ROOF_TFLOPS:g} TFLOP/s" in ROOF_SOURCE and "bf16 dense matmul" in ROOF_SOURCE
    assert ROOF_SOURCE in fig.layout.title.text and ROOF_SOURCE in fig.data[0].hovertext[0]
    with pytest.raises(ValueError, match="peak_tflops"):
        roofline_figure(load_recorded(), [("triton", "a8w8")], peak_tflops=0)


def test_plan_digest_says_whether_the_map_is_the_measured_plan() -> None:
    new = record_for_shape(load_recorded(), 64, 8192)  # run 4 recorded its plans' digests: the rebuild is checked
    assert plan_check(new, plan_of_record(new))[0] == "same"
    row = record_for_shape(load_recorded(), 64, 8192, run=RUN3).copy()
    today = plan_of_record(row)
    assert plan_check(row, today)[0] == "unknown"  # run3 recorded no digest
    row["config"] = _cell(today)  # what a new run records for this plan
    status, text = plan_check(row, plan_of_record(row))
    assert status == "same" and "same plan as measured" in text.lower()
    other = make_plan("balanced", *indptrs_for([8192] * 64), 132)
    row["config"] = _cell(other)
    status, text = plan_check(row, today)
    assert status == "differs" and "differs from the measured one" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_validates_and_fails_without_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert cli(["bench", "--suite", "bogus", "--calls", "-5"]) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'bogus'" in err and "competition, smoke" in err
    assert cli(["bench", "--calls", "-5"]) == 2 and "--calls" in capsys.readouterr().err
    assert cli(["bench", "--precisions", "fp4"]) == 2 and "precisions" in capsys.readouterr().err
    assert cli(["bench", "--out", str(tmp_path / "no" / "t.csv")]) == 2 and "folder" in capsys.readouterr().err
    assert cli(["bench", "--suite", "smoke", "--out", str(out)]) == 2
    assert "needs a GPU" in capsys.readouterr().err and not out.exists()
    assert cli(["bench", "--recorded", "--out", str(out)]) == 2 and not out.exists()
    with pytest.raises(ValueError, match="replays"):
        check_suite_args(replays=2)


def test_causal_timings_are_their_own_rows(tmp_path: Path) -> None:
    """A causal run (`bench --causal`) records ``causal`` True; runs recorded before the column read as not causal;
    the views of a layout show one of the two, never both mixed."""
    from mlalab.records.timings import case_rows, with_case_columns
    from mlalab.timing import case_inputs

    p = tmp_path / "t.csv"
    recs = [TimingRecord("triton", "simple", "a8w8", "", 4, 1024, 4, causal, us_median=us) for causal, us in
            ((False, 10.0), (True, 9.0))]  # fmt: skip
    write_csv(recs, p)
    df = with_case_columns(pd.read_csv(p))
    assert list(case_rows(df, 4)["us_median"]) == [10.0] and list(case_rows(df, 4, causal=True)["us_median"]) == [9.0]
    old = with_case_columns(pd.read_csv(p).drop(columns=["causal", "q_len"]))  # a run of before both columns
    assert list(case_rows(old)["us_median"]) == [10.0, 9.0]
    with pytest.raises(TypeError, match="causal must be a bool"):
        case_rows(df, 4, causal="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"causal \(--causal\) must be True or False"):
        check_suite_args(causal=1)  # type: ignore[arg-type]
    assert case_inputs(2, 64, 4, "paged16", True).case.causal and not case_inputs(2, 64, 4).case.causal
    with pytest.raises(ValueError, match="shorter than q_len 4 with causal=True"):
        case_inputs(2, 3, 4, causal=True)


def test_write_csv_is_atomic(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    rec = TimingRecord("triton", "simple", "a8w8", "", 4, 1024, us_median=1.5)
    write_csv([rec], p)
    write_csv([rec, rec], p)  # replaces
    df = pd.read_csv(p)
    assert list(df.columns) == CSV_COLUMNS and len(df) == 2
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.csv"]

    def crash(tmp: str) -> None:  # a writer that dies half-way: the old file must survive, no temp left
        Path(tmp).write_text("date,gpu\n2026")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(p, crash)
    assert len(pd.read_csv(p)) == 2 and sorted(x.name for x in tmp_path.iterdir()) == ["t.csv"]
    with pytest.raises(TypeError, match="recs"):
        write_csv(["x"], p)  # type: ignore[list-item]


def test_script_tables_are_written_atomically_with_every_column(tmp_path: Path) -> None:
    from mlalab.io import write_rows_csv

    p = tmp_path / "sub" / "prof.csv"
    write_rows_csv(p, [{"B": 4, "L": 1024, "a": 1.5}, {"B": 8, "L": 1024, "b": "x"}])  # columns: union, first seen
    df = pd.read_csv(p)
    assert list(df.columns) == ["B", "L", "a", "b"] and df["a"].isna().tolist() == [False, True]
    assert sorted(x.name for x in p.parent.iterdir()) == ["prof.csv"]
    with pytest.raises(ValueError, match="empty"):
        write_rows_csv(p, [])
    with pytest.raises(TypeError, match="sequence of dicts"):
        write_rows_csv(p, {"B": 4})  # type: ignore[arg-type]
    assert len(pd.read_csv(p)) == 2  # the refused writes left the file alone


def test_fill_accuracy_fills_the_deferred_error_columns_and_refuses_mismatches() -> None:
    """The suite times first and computes the fp32 references afterwards (`fill_accuracy`): a record's errors come
    from its kept output against references on the same inputs; an output equal to the exact reference has error 0
    against it and the quantisation error against the a8w8 emulation. Wrong status or shape is refused."""
    from mlalab.inputs import make_inputs
    from mlalab.records.schema import ACCURACY_PENDING
    from mlalab.timing import bench_one, fill_accuracy, quantised_reference

    x = make_inputs(DecodeCase.uniform(2, 96))
    exact, emul = quantised_reference(x, "a8w8", {})
    rec = TimingRecord("triton", "simple", "a8w8", "{}", 2, 96, status=ACCURACY_PENDING)
    noisy = TimingRecord("flashmla", "-", "a8w8", "", 2, 96, status=ACCURACY_PENDING)
    fill_accuracy([(rec, exact.clone()), (noisy, emul.clone())], x)
    assert rec.status == noisy.status == "ok"
    # (the two differ only in the norm they divide by)
    assert rec.err_vs_exact == 0.0 and rec.err_vs_emulated == pytest.approx(noisy.err_vs_exact, rel=0.05)
    assert noisy.err_vs_emulated == 0.0 and 0.0 < rec.err_quant_emulated < 0.1  # fp8: a few % rel-L2
    with pytest.raises(ValueError, match="has status 'ok', not 'accuracy pending'"):
        fill_accuracy([(rec, exact)], x)
    other = TimingRecord("triton", "simple", "a8w8", "{}", 4, 96, status=ACCURACY_PENDING)
    with pytest.raises(ValueError, match="record of B=4 L=96, inputs of B=2 L=96"):
        fill_accuracy([(other, exact)], x)
    with pytest.raises(ValueError, match="give refs .* or outputs"):
        bench_one("triton", x, "a8w8", copy_tbps=4.0, env={}, refs=None)
    # an output that cannot be compared (a backend bug) is an error of its row, not a silent NaN
    bad = TimingRecord("triton", "simple", "a8w8", "{}", 2, 96, us_median=5.0, status=ACCURACY_PENDING)
    fill_accuracy([(bad, exact[:1].clone())], x)
    assert bad.status.startswith("error: accuracy: ValueError") and bad.us_median == 5.0


def test_every_layout_of_a_case_has_the_same_references() -> None:
    """`case_inputs` lays the same logical q and KV out in every layout (unused pool slots zero), so the exact and the
    emulated references agree bit for bit across layouts, per-tensor fp8 scales and fp4 block scales included: what
    lets the accuracy pass compute them once per logical case."""
    from mlalab.timing import LAYOUTS, case_inputs, quantised_reference

    for causal in (False, True):
        refs = {lay: {} for lay in LAYOUTS}
        for lay in LAYOUTS:
            x = case_inputs(2, 192, 2, lay, causal)
            for prec in ("a8w8", "bf16", "a8w4-mxfp4", "a16w4-nvfp4"):
                quantised_reference(x, prec, refs[lay])
        for lay in LAYOUTS:
            assert refs[lay].keys() == refs["contiguous"].keys()
            for k, ref in refs[lay].items():
                assert torch.equal(ref, refs["contiguous"][k]), (causal, lay, k)


def test_the_accuracy_pass_makes_each_logical_case_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fill_accuracy_by_shape` regenerates the inputs once per (batch, kv_len, q_len, mask), contiguously, for all its
    layouts; every row gets the errors its own layout's references give (0 against the exact one here)."""
    import mlalab.timing as timing
    from mlalab.records.schema import ACCURACY_PENDING

    made: list[tuple] = []
    original = timing.case_inputs

    def counted(*key: object) -> object:
        made.append(key)
        return original(*key)

    pending: dict[tuple, list] = {}
    for lay in timing.LAYOUTS:
        for q in (1, 2):
            key = (2, 128, q, lay, False)
            exact, _ = timing.quantised_reference(timing.case_inputs(*key), "a8w8", {})
            rec = TimingRecord("triton", "simple", "a8w8", "{}", 2, 128, q_len=q, layout=lay, status=ACCURACY_PENDING)
            pending[key] = [(rec, exact)]
    monkeypatch.setattr(timing, "case_inputs", counted)
    shapes_done: list[int] = []
    timing.fill_accuracy_by_shape(pending, log=lambda s: None, after_shape=lambda: shapes_done.append(1),
                                  device="cpu")  # fmt: skip
    assert made == [(2, 128, 1, "contiguous", False), (2, 128, 2, "contiguous", False)] and len(shapes_done) == 8
    with pytest.raises(TypeError, match="device must be a str"):
        timing.fill_accuracy_by_shape(pending, device=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="refs must be a dict"):
        timing.fill_accuracy([], None, refs=[])  # type: ignore[arg-type]
    for kept in pending.values():
        ((rec, _),) = kept
        assert rec.status == "ok" and rec.err_vs_exact == 0.0 and 0.0 < rec.err_quant_emulated < 0.1


def test_rows_timed_before_the_accuracy_pass_stay_in_the_views(tmp_path: Path) -> None:
    """A suite stopped between its passes leaves rows 'accuracy pending' (valid times, NaN errors): the views keep
    them; failed rows they drop."""
    from mlalab.records.schema import ACCURACY_PENDING

    recs = [TimingRecord("triton", "simple", "a8w8", "{}", 4, 1024, us_median=6.0, status=ACCURACY_PENDING),
            TimingRecord("flashmla", "-", "a8w8", "", 4, 1024, us_median=10.0),
            TimingRecord("flashinfer", "-", "a16w8", "", 4, 1024, status="error: RuntimeError: x")]  # fmt: skip
    write_csv(recs, tmp_path / "h200_2026-12-04_run99.csv")
    df = load_recorded(str(tmp_path))
    assert sorted(df["backend"]) == ["flashmla", "triton"] and df["err_vs_exact"].isna().all()


@pytest.mark.gpu
def test_suite_rewrites_the_csv_after_each_shape(tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    seen: list[int] = []

    def log(line: str) -> None:  # before each record of the second shape the first shape is already on disk
        if "B= 128" in line:
            seen.append(len(pd.read_csv(out)) if out.exists() else 0)

    recs = run_suite("smoke", backends=("reference-torch",), precisions=("bf16",), out=out, log=log, replays=3)
    assert seen and seen[0] == 1 and len(pd.read_csv(out)) == len(recs) == 2
    # the accuracy pass filled every row's errors afterwards (the timings came first)
    df = pd.read_csv(out)
    assert (df["status"] == "ok").all() and df["err_vs_exact"].notna().all() and (df["err_vs_exact"] < 1e-2).all()


def test_a8w8_only_run_is_shown_by_name_with_the_kernel_that_ran() -> None:
    """Run 5 (a8w8 + FlashMLA only) is not the default view (that needs every precision), but its rows are whole:
    both backends on all 12 shapes, each Triton row naming which sm_90 stage 1 ran."""
    df = load_recorded()
    run5 = "h200_2026-12-02_run5.csv"
    assert default_run(df) != run5
    v = recorded_view(df, run=run5)
    for backend in ("triton", "flashmla"):
        r = v.rows[(v.rows["backend"] == backend) & (v.rows["precision"] == "a8w8")]
        assert sorted(zip(r["batch"], r["kv_len"])) == sorted(COMPETITION_SHAPES)
    tri = v.rows[v.rows["backend"] == "triton"]
    ran = {(int(b), int(n)): parse_config(c)["ran"] for b, n, c in zip(tri["batch"], tri["kv_len"], tri["config"])}
    # then the long streams ran v-regs, the short ones vt-smem (a path deleted since: docs/journal.md); today every
    # shape runs v-regs, with fp16 partials and the Gluon reduce wherever the KV is fp8
    assert ran[(128, 8192)] == "hopper:v-regs" and ran[(4, 1024)] == "hopper:vt-smem"

    def a8w8_ran(run: str | None = None) -> dict[tuple[int, int], str]:
        rows = recorded_view(df, run=run).rows
        rows = rows[(rows["backend"] == "triton") & (rows["precision"] == "a8w8")]
        shapes = zip(rows["batch"], rows["kv_len"], rows["config"])
        return {(int(b), int(n)): parse_config(c)["ran"] for b, n, c in shapes}

    ran_now = a8w8_ran()
    assert set(ran_now.values()) == {"sm90:v-regs"} and len(ran_now) == 12  # (fp16 partials + Gluon reduce: fp8 KV)
    ran17 = a8w8_ran("h200_2026-12-04_run17.csv")  # the same kernels before the redesign, named as they were then
    assert set(ran17.values()) == {"hopper:v-regs+fp16-partials+gluon-reduce"}
    ran16 = a8w8_ran("h200_2026-12-04_run16.csv")
    assert ran16[(4, 1024)] == ran16[(4, 8192)] == "hopper:v-regs"  # 4 split requests: fp32 + Triton reduce
    assert ran16[(8, 1024)] == "hopper:v-regs+fp16-partials+gluon-reduce"


def test_newest_file_orders_run_numbers_by_value(tmp_path: Path) -> None:
    """run10 is newer than run9 (plain string order would pick run9), and profiles s10 newer than s9b."""
    from mlalab.io import natural_key

    names = ["h200_2026-12-03_run9.csv", "h200_2026-12-03_run10.csv", "h200_2026-12-02_run11.csv"]
    assert max(names, key=natural_key) == "h200_2026-12-03_run10.csv"  # (dates first: the same prefix up to them)
    profiles = ["h200_2026-12-03_profile.csv", "h200_2026-12-03_s9b_profile.csv", "h200_2026-12-03_s10_profile.csv"]
    assert sorted(profiles, key=natural_key)[-1] == "h200_2026-12-03_s10_profile.csv"
    with pytest.raises(TypeError, match="name must be a str"):
        natural_key(3)  # type: ignore[arg-type]
    # the default view: two full runs of the same date, the higher run number wins
    d = load_recorded()
    nine = d[d["run"] == NEWEST_RUN].assign(run="h200_2026-12-03_run9x.csv")
    assert default_run(pd.concat([nine, d[d["run"] == NEWEST_RUN]])) == NEWEST_RUN


def test_every_recorded_run_reads_whatever_knobs_its_config_cells_name() -> None:
    """Old runs recorded knobs that were deleted since (docs/journal.md): every file still loads, its cells parse, and
    each full run's default view keeps one row per (backend, precision, shape)."""
    df = load_recorded()
    for run in sorted(set(df["run"])):
        d = df[df["run"] == run]
        assert all(isinstance(parse_config(c), dict) for c in d["config"]), run
        try:
            v = recorded_view(df, run=run)
        except ValueError as e:  # a run of one shape per config (a sweep) says so: never a KeyError or TypeError
            assert "several default rows" in str(e), (run, e)
            continue
        assert not v.rows.duplicated(["backend", "precision", "batch", "kv_len"]).any(), run
    # the runs before the redesign show Triton at the default of their day: a full row set in run 17
    v17 = recorded_view(df, run="h200_2026-12-04_run17.csv")
    assert (v17.rows["backend"] == "triton").sum() == 36


def test_decode_layout_selector_filters_the_view() -> None:
    """The timing panel's decode-layout control lists the (q_len, layout, causal) triples recorded and the view shows
    only that layout's rows; old runs (no q_len / layout / causal columns) count as q_len 1 on a contiguous cache
    without the mask, and rows timed under the causal mask are a layout of their own (never mixed with the rest)."""
    import pandas as pd

    from mlalab.records.timings import load_recorded, recorded_view
    from mlalab.widgets.timing import timing_panel

    df = load_recorded()
    assert set(zip(df["q_len"], df["layout"])) >= {(1, "contiguous")}
    run = "h200_2026-12-04_run18.csv"
    extra = df[df["run"] == run].assign(q_len=2, layout="paged64", us_median=1e6)
    masked = extra.assign(causal=True, us_median=2e6)
    both = pd.concat([df, extra, masked], ignore_index=True)
    p = timing_panel(both)
    options = {v: label for label, v in p.layout.options}
    assert (2, "paged64", False) in options and not p.layout.disabled
    assert (
        options[(2, "paged64", True)] == "q_len 2 · paged64 · causal"
        and "causal" not in options[(1, "contiguous", False)]
    )
    plain = recorded_view(both, run=run)
    mtp = recorded_view(both, run=run, q_len=2, layout="paged64")
    causal = recorded_view(both, run=run, q_len=2, layout="paged64", causal=True)
    assert (plain.rows["us_median"] < 1e6).all() and (mtp.rows["us_median"] == 1e6).all()
    assert (causal.rows["us_median"] == 2e6).all() and len(causal.rows) == len(mtp.rows)
    assert causal.short.startswith("q_len 2 · paged64 · causal, ") and "causal" not in mtp.short
    assert "q_len" not in plain.short and "q_len" not in plain.label
    p.run.value = run
    p.layout.value = (2, "paged64", True)
    bars = [t for t in p.bars.data if t.name == "triton a8w8"]
    assert bars and all(y == pytest.approx(2e6) for y in bars[0].y)
    with pytest.raises(ValueError, match="no recorded rows for q_len 4 with the 'tokens' layout"):
        recorded_view(both, q_len=4, layout="tokens")
    with pytest.raises(ValueError, match="'contiguous' layout under the causal mask"):
        recorded_view(both, q_len=1, causal=True)

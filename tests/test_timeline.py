"""The per-CTA timeline of the sm_90 stage 1: conversion of the stamp table (CPU) and a real launch (GPU)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from mlalab.kernels.sm90.timeline import CtaTimeline, timeline_from_stamps

GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _table(max_events: int = 4) -> np.ndarray:
    # two CTAs at 2 GHz: CTA 0 starts at global 1000 ns (cycle 500), two tiles, one work; CTA 1 starts 40 ns later
    # (its own cycle counter at 90_000), one tile, one work; CTA 1's tile arrives 1 us after its start
    t = np.zeros((2, 8 + 4 * max_events), dtype=np.int64)
    m = max_events
    t[0, :5] = [1000, 4000, 500, 500 + 5600, 500 + 400]
    t[0, 8:10] = [500 + 2000, 500 + 3000]  # tiles arrived
    t[0, 8 + m : 10 + m] = [500 + 2400, 500 + 3500]  # scores done
    t[0, 8 + 2 * m : 10 + 2 * m] = [500 + 2600, 500 + 3700]  # PV issued
    t[0, 8 + 3 * m] = 500 + 5000  # work stored
    t[0, 5:7] = [500 + 3800, 500 + 4200]  # last PV completed, softmax sum reduced
    t[1, :5] = [1040, 3040, 90_000, 90_000 + 3900, 90_000 + 300]
    t[1, 5:7] = [90_000 + 2700, 90_000 + 3000]
    t[1, 8], t[1, 8 + m], t[1, 8 + 2 * m] = 90_000 + 2000, 90_000 + 2200, 90_000 + 2600
    t[1, 8 + 3 * m] = 90_000 + 3800
    return t


def test_stamps_become_ns_from_the_first_start() -> None:
    tl = timeline_from_stamps(_table(), np.array([2, 1]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=4)
    assert isinstance(tl, CtaTimeline) and tl.n_cu == 2
    np.testing.assert_allclose(tl.start_ns, [0, 40])
    np.testing.assert_allclose(tl.issued_ns, [200, 40 + 150])
    np.testing.assert_allclose(tl.tile_ready_ns[0], [1000, 1500])
    np.testing.assert_allclose(tl.tile_ready_ns[1], [40 + 1000])
    np.testing.assert_allclose(tl.qk_done_ns[0], [1200, 1750])
    np.testing.assert_allclose(tl.pv_issued_ns[1], [40 + 1300])
    np.testing.assert_allclose(tl.work_done_ns[0], [2500])
    np.testing.assert_allclose(tl.end_ns, [2800, 40 + 1950])
    s = tl.summary()
    assert s["span_ns"] == 2800 and s["start_skew_ns"] == 40 and s["tile_interval_ns"] == 500
    assert s["first_tile_ns"] == 1000 and s["header_ns"] == 175
    assert s["tile_qk_ns"] == 200 and s["tile_softmax_ns"] == 100  # medians of (200, 250, 100) and (100, 100, 200)
    assert s["epilogue_pv_wait_ns"] == 50 and s["epilogue_sum_ns"] == 175 and s["epilogue_store_ns"] == 575
    assert tl.clock_source == "given"
    kinds = [e["event"] for e in tl.events() if e["cta"] == 0]
    assert kinds == ["start", "issued", *["tile"] * 2, *["qk_done"] * 2, *["pv_issued"] * 2, "work_done", "pv_done",
                     "lse_done", "end"]  # fmt: skip


def test_the_clock_is_calibrated_on_the_launch_itself() -> None:
    from mlalab.kernels.sm90.timeline import launch_clock_ghz

    # CTA 0: 5600 cycles in 3000 ns of global time, CTA 1: 3900 in 2000 ns -> median of 1.867 and 1.95 GHz
    expect = (5600 / 3000 + 3900 / 2000) / 2
    assert launch_clock_ghz(_table()) == pytest.approx(expect)
    tl = timeline_from_stamps(_table(), np.array([2, 1]), np.array([1, 1]), kernel="k", max_events=4)
    assert tl.clock_source == "launch" and tl.clock_ghz == pytest.approx(expect)
    np.testing.assert_allclose(tl.end_ns, [5600 / expect, 40 + 3900 / expect])
    # a third CTA that ran 1 us of global time is left out (a median of all three, or a mean, would differ)
    three = np.concatenate([_table(), _table()[1:]])
    three[2, :4] = [1100, 2100, 0, 5000]
    assert launch_clock_ghz(three) == pytest.approx(expect)
    given = timeline_from_stamps(_table(), np.array([2, 1]), np.array([1, 1]), clock_ghz=1.5, kernel="k", max_events=4,
                                 clock_source="idle-spin")  # fmt: skip
    assert given.clock_source == "idle-spin" and given.clock_ghz == 1.5
    with pytest.raises(ValueError, match="clock_source"):
        timeline_from_stamps(_table(), np.array([2, 1]), np.array([1, 1]), clock_ghz=1.5, kernel="k", max_events=4,
                             clock_source="launch")  # fmt: skip
    short = _table()
    short[:, 1] = short[:, 0] + 1999  # no CTA ran 2 us of global time: too coarse to calibrate on
    assert launch_clock_ghz(short) is None
    with pytest.raises(ValueError, match="n_cu"):
        launch_clock_ghz(np.zeros(8, dtype=np.int64))
    bad = _table()
    bad[0, 3] = bad[0, 2] - 1
    with pytest.raises(ValueError, match="ended before it started"):
        launch_clock_ghz(bad)
    with pytest.raises(ValueError, match="too short to calibrate"):
        timeline_from_stamps(short, np.array([2, 1]), np.array([1, 1]), kernel="k", max_events=4)


def test_more_events_than_stamped_keep_the_first_ones() -> None:
    tl = timeline_from_stamps(_table(2), np.array([5, 1]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=2)
    assert len(tl.tile_ready_ns[0]) == 2
    # CTA 0's last stamped PV issue is not its last one: its PV wait is unknown, CTA 1's stays
    assert np.isnan(tl.pv_done_ns[0]) and np.isfinite(tl.pv_done_ns[1]) and np.isfinite(tl.lse_done_ns[0])


def test_bad_stamp_tables_are_refused() -> None:
    t = _table()
    with pytest.raises(ValueError, match="must be"):
        timeline_from_stamps(t[:, :-1], np.array([2, 1]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=4)
    with pytest.raises(ValueError, match="shape"):
        timeline_from_stamps(t, np.array([2]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=4)
    with pytest.raises(ValueError, match="clock_ghz"):
        timeline_from_stamps(t, np.array([2, 1]), np.array([1, 1]), clock_ghz=0.0, kernel="k", max_events=4)
    t[1, 1] = 0  # ended before it started: not one complete launch
    with pytest.raises(ValueError, match="ended before"):
        timeline_from_stamps(t, np.array([2, 1]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=4)
    empty = timeline_from_stamps(_table(), np.array([0, 0]), np.array([0, 0]), clock_ghz=2.0, kernel="k", max_events=4)
    with pytest.raises(ValueError, match="no CTA"):
        empty.summary()


def test_the_portable_kernel_has_no_timeline() -> None:
    """The refusal comes before any launch: the interpreter's decoder runs the portable kernel."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {root!r})
        from mlalab import DecodeCase, make_inputs
        from mlalab.kernels import Decoder, prepare
        from mlalab.plan import make_plan
        x = make_inputs(DecodeCase(kv_lens=(40, 70)))
        dec = Decoder(prepare(x, "a8w8"), make_plan("simple", x.qo_indptr, x.kv_indptr, 2))
        try:
            dec.stage1_timeline()
        except ValueError as e:
            print("REFUSED", e)
        """
    ).format(root=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "REFUSED the time line is a measurement hook of the sm_90 kernel; this decoder runs 'portable'" in r.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", ["a8w8", "bf16", "a16w8"])
def test_gpu_timeline_of_a_ragged_batch_is_ordered_and_complete(precision: str) -> None:
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs, ragged_kv_lens
    from mlalab.kernels import Decoder, prepare
    from mlalab.plan import make_plan

    x = make_inputs(DecodeCase(kv_lens=(*ragged_kv_lens(20, 3000, seed=2), 0), seed=3)).to("cuda")
    p = prepare(x, precision)
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    dec = Decoder(p, plan)
    ref = dec()[0].clone()
    tl = dec.stage1_timeline()
    assert tl.kernel == dec.ran and dec.ran.startswith("sm90:") and tl.n_cu == 132 and 1.0 < tl.clock_ghz < 2.5
    assert tl.clock_source == "launch"  # a 20-request batch of ~3000 tokens keeps CTAs busy for more than 2 us
    tiles = dec.sm90.tiles_per_cta.numpy()
    works = plan.work_indptr.diff().numpy()
    for c in range(132):
        assert len(tl.tile_ready_ns[c]) == tiles[c] and len(tl.work_done_ns[c]) == works[c]
        per_tile = [t for tile in zip(tl.tile_ready_ns[c], tl.qk_done_ns[c], tl.pv_issued_ns[c]) for t in tile]
        seq = [tl.start_ns[c], tl.issued_ns[c], *per_tile, tl.end_ns[c]]
        assert all(a <= b + 1.0 for a, b in zip(seq, seq[1:])), (c, seq)  # 1 ns: clock conversion rounding
        if works[c]:
            assert tl.work_done_ns[c][-1] <= tl.end_ns[c] + 1.0
        if works[c] and tiles[c]:  # (a CTA whose only work is an empty request streams no tile)
            epi = [tl.pv_issued_ns[c][-1], tl.pv_done_ns[c], tl.lse_done_ns[c], tl.work_done_ns[c][-1]]
            assert all(a <= b + 1.0 for a, b in zip(epi, epi[1:])), (c, epi)
    s = tl.summary()
    assert 0 < s["span_ns"] < 1e6 and s["tile_interval_ns"] > 0
    dec.reduce()  # stage 1 above wrote the same partials: the full output is unchanged by stamping
    assert torch.equal(dec.out, ref)


def _events() -> pd.DataFrame:
    tl = timeline_from_stamps(_table(), np.array([2, 1]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=4)
    return pd.DataFrame([{"B": 4, "L": 1024, **e} for e in tl.events()])


def test_gantt_segments_and_summary_from_events() -> None:
    from mlalab.plots.timeline import cta_timeline_figure
    from mlalab.records.profiles import timeline_summary

    ev = _events()
    s = timeline_summary(ev, 4, 1024)
    assert s["ctas busy"] == 2 and s["span"] == 2.8 and s["per tile"] == 0.5
    assert s["header"] == 0.175 and s["first tile arrives"] == 1.0
    fig = cta_timeline_figure(ev, 4, 1024)
    by_name = {t.name: t for t in fig.data}
    # CTA 0: two tiles, so one wait segment between PV(0) issued (1.3 us) and tile 1 (1.5 us)
    wait = [x for x in by_name["waiting for the next tile"].x if x is not None]
    assert wait == [1.3, 1.5]
    # the epilogue in two parts: last PV issued -> softmax sum reduced -> the CTA's end
    assert [x for x in by_name["last PV completes, softmax sum"].x if x is not None] == [1.85, 2.1, 1.34, 1.54]
    assert [x for x in by_name["normalise + output stores"].x if x is not None] == [2.1, 2.8, 1.54, 1.99]
    assert s["  last PV completes"] == 0.05 and s["  softmax sum"] == 0.175 and s["  normalise + stores"] == 0.575
    old = ev[~ev["event"].isin(["pv_done", "lse_done"])]  # files recorded before those stamps: one segment
    traces = {t.name: t for t in cta_timeline_figure(old, 4, 1024).data}
    epi = [x for x in traces["last PV + epilogue (output stores)"].x if x is not None]
    assert epi == [1.85, 2.8, 1.34, 1.99]  # from the last PV issue to each CTA's end
    assert "  softmax sum" not in timeline_summary(old, 4, 1024)
    assert list(by_name["work's output stored"].x) == [2.5, 1.94]
    with pytest.raises(ValueError, match="recorded shapes"):
        cta_timeline_figure(ev, 8, 1024)
    with pytest.raises(ValueError, match="lack columns"):
        timeline_summary(ev.drop(columns=["t_ns"]), 4, 1024)


def test_timeline_panel_switches_shapes() -> None:
    from mlalab.widgets.timing import timeline_panel

    ev = _events()
    ev2 = pd.concat([ev, ev.assign(B=8)])
    p = timeline_panel(ev2)
    assert p.shape.value == (4, 1024) and "B4" in p.figure.layout.title.text
    p.shape.value = (8, 1024)
    assert "B8" in p.figure.layout.title.text and "per tile" in p.summary.value
    with pytest.raises(ValueError, match="recorded shapes"):
        timeline_panel(ev2, shape=(16, 1024))


def test_recorded_timeline_file_loads_when_present() -> None:
    from mlalab.records.profiles import load_timelines, timeline_summary

    try:
        ev = load_timelines()
    except FileNotFoundError:
        pytest.skip("no recorded timeline in data/profiles")
    for (b, n), _ in ev.groupby(["B", "L"]):
        s = timeline_summary(ev, int(b), int(n))
        assert 0 < s["header"] < s["first tile arrives"] < s["span"]


def test_timeline_panel_says_when_nothing_is_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    from mlalab.records import profiles as T
    from mlalab.widgets.timing import timeline_panel

    monkeypatch.setattr(T, "PROFILE_DIR", str(tmp_path))
    p = timeline_panel()
    assert "no *_timeline.csv" in p.summary.value and not p.figure.data


def test_ablation_figure_shows_ratios_to_flashmla_and_their_geomeans(tmp_path) -> None:  # noqa: ANN001
    from mlalab.plots.timeline import ablation_figure
    from mlalab.records.profiles import load_ablation_profile

    prof = pd.DataFrame(
        {"B": [8, 4], "L": [1024, 1024], "flashmla_us": [10.0, 8.0], "full_us": [8.0, 4.0], "full_no_qk_us": [5.0, 4.0],
         "full_no_qk_pv_us": [2.5, 4.0], "stage1_us": [1.0, 1.0]}
    )  # fmt: skip
    path = tmp_path / "x_profile.csv"
    prof.to_csv(path, index=False)
    p = load_ablation_profile(str(path))
    assert p["run"].iloc[0] == "x_profile.csv"
    fig = ablation_figure(p)
    assert [list(t.x) for t in fig.data] == [["B4·L1024", "B8·L1024"]] * 3  # sorted by kv_len, then batch
    assert [list(t.y) for t in fig.data] == [[0.5, 0.8], [0.5, 0.5], [0.5, 0.25]]
    assert "geomean 0.632×" in fig.data[0].name and "geomean 0.354×" in fig.data[2].name  # sqrt(0.4), sqrt(0.125)
    assert fig.layout.shapes[0].y0 == 0.65 and "x_profile.csv" in fig.layout.title.text
    with pytest.raises(ValueError, match="ablation columns"):
        prof.drop(columns=["full_no_qk_us"]).to_csv(path, index=False)
        load_ablation_profile(str(path))
    with pytest.raises(ValueError, match="positive"):
        prof.assign(full_us=[0.0, 1.0]).to_csv(path, index=False)
        load_ablation_profile(str(path))
    with pytest.raises(ValueError, match="lacks columns"):
        ablation_figure(prof.drop(columns=["flashmla_us"]))
    with pytest.raises(ValueError, match="goal"):
        ablation_figure(prof, goal=0)
    with pytest.raises(ValueError, match="must have rows"):
        ablation_figure(prof.iloc[:0])
    with pytest.raises(ValueError, match="positive"):
        ablation_figure(prof.assign(full_no_qk_us=[-1.0, 2.0]))
    with pytest.raises(TypeError, match="DataFrame"):
        ablation_figure(prof.to_dict())


@pytest.mark.parametrize("kind", ["wgmma", "fp4"])
def test_recorded_ablation_profile_loads_when_present(kind: str) -> None:
    from mlalab.plots.timeline import ablation_figure
    from mlalab.records.profiles import ABLATION_KINDS, load_ablation_profile

    try:
        p = load_ablation_profile(kind=kind)
    except FileNotFoundError:
        pytest.skip(f"no recorded profile with {kind} ablations in data/profiles")
    k = ABLATION_KINDS[kind]
    # skipping compute never makes the call slower than the real one by more than run noise
    assert (p[k.bars[-1][0]] <= 1.05 * p["full_us"]).all()
    assert len(ablation_figure(p, kind=kind).data) == len(k.bars) + sum(c in p.columns for c, _ in k.extra)


def test_fp4_ablation_figure_is_over_our_a8w8_and_reads_only_fp4_profiles(tmp_path) -> None:  # noqa: ANN001
    """The "fp4" kind: a8w4-mxfp4 as measured and with its conversion skipped, each over our a8w8 in the same
    process, the fp4 issue's geomean goal; a wgmma profile is not an fp4 one (and the other way round)."""
    from mlalab.plots.timeline import ablation_figure
    from mlalab.records.profiles import load_ablation_profile

    prof = pd.DataFrame({"B": [128, 4], "L": [8192, 1024], "a8w8_us": [200.0, 6.0], "full_us": [190.0, 7.5],
                         "full_no_convert_us": [140.0, 6.6], "flashmla_us": [210.0, 11.0],
                         "gpu": ["NVIDIA H100 80GB HBM3"] * 2})  # fmt: skip
    path = tmp_path / "h100_x_fp4_profile.csv"
    prof.to_csv(path, index=False)
    p = load_ablation_profile(str(path), kind="fp4")
    fig = ablation_figure(p, kind="fp4")
    assert [list(t.x) for t in fig.data] == [["B4·L1024", "B128·L8192"]] * 2
    assert [v for t in fig.data for v in t.y] == pytest.approx([1.25, 0.95, 1.1, 0.7])
    assert "conversion skipped: geomean 0.877×" in fig.data[1].name  # sqrt(1.1 · 0.7)
    assert fig.layout.shapes[0].y0 == 0.85 and "our a8w8" in fig.layout.yaxis.title.text
    assert "NVIDIA H100 80GB HBM3" in fig.layout.title.text and "h100_x_fp4_profile.csv" in fig.layout.title.text
    three = ablation_figure(p.assign(full_no_convert_scales_us=[120.0, 6.0]), kind="fp4")  # a later ablation's bar
    assert len(three.data) == 3 and list(three.data[2].y) == pytest.approx([1.0, 0.6])
    assert "block scales' loads skipped" in three.data[2].name
    with pytest.raises(ValueError, match="no wgmma ablation columns .*'full_no_qk_us'"):
        load_ablation_profile(str(path))  # the default kind needs the wgmma columns
    with pytest.raises(ValueError, match="lacks columns .*'a8w8_us'.*--precision a8w4-mxfp4"):
        ablation_figure(p.drop(columns=["a8w8_us"]), kind="fp4")
    with pytest.raises(ValueError, match="kind must be one of 'wgmma', 'fp4'"):
        ablation_figure(p, kind="fp8")


def test_recorded_events_rebuild_the_live_timeline() -> None:
    """`CtaTimeline.from_events` inverts `events()`: a recorded launch is summarised by the live summary's code."""
    tl = timeline_from_stamps(_table(), np.array([2, 1]), np.array([1, 1]), clock_ghz=2.0, kernel="k", max_events=4)
    back = CtaTimeline.from_events(tl.events())
    assert back.clock_source == "recorded" and back.n_cu == tl.n_cu
    a, b = tl.summary(), back.summary()
    assert a.keys() == b.keys() and all(a[k] == b[k] or (np.isnan(a[k]) and np.isnan(b[k])) for k in a), (a, b)
    old = [e for e in tl.events() if e["event"] not in ("pv_done", "lse_done")]  # before the epilogue stamps
    assert np.isnan(CtaTimeline.from_events(old).summary()["epilogue_sum_ns"])
    with pytest.raises(ValueError, match="lack columns"):
        CtaTimeline.from_events([{"cta": 0, "event": "start", "index": 0}])
    with pytest.raises(ValueError, match="needs a 'end' event"):
        CtaTimeline.from_events([e for e in tl.events() if not (e["event"] == "end" and e["cta"] == 1)])
    with pytest.raises(ValueError, match="finite"):
        CtaTimeline.from_events([{**e, "t_ns": float("nan")} for e in tl.events()])
    with pytest.raises(ValueError, match="empty"):
        CtaTimeline.from_events([])
    ev = tl.events()
    with pytest.raises(ValueError, match="appears twice"):  # two launches in one table
        CtaTimeline.from_events(ev + ev)
    with pytest.raises(ValueError, match="cta must be integers >= 0"):
        CtaTimeline.from_events([{**e, "cta": e["cta"] - 1} for e in ev])
    with pytest.raises(ValueError, match="each tile needs all three"):
        CtaTimeline.from_events([e for e in ev if not (e["event"] == "qk_done" and e["index"] == 1)])
    with pytest.raises(ValueError, match="numbered 0 .. 1"):
        CtaTimeline.from_events([{**e, "index": 5} if e["event"] == "work_done" and e["cta"] == 0 else e for e in ev]
                                + [{"cta": 0, "event": "work_done", "index": 0, "t_ns": 1.0}])  # fmt: skip

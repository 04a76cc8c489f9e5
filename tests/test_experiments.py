"""Recorded design experiments (data/ab/*.csv): loading, geomeans, the figure, the notebook-04 panel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlalab.plots.experiments import experiment_figure
from mlalab.records.ab import (
    case_labels,
    experiment_geomeans,
    list_experiments,
    load_experiment,
    peer_name,
    reference_column,
)
from mlalab.records.schema import PROVENANCE_COLUMNS


def test_every_recorded_experiment_loads_and_its_geomeans_are_the_csv_s() -> None:
    names = list_experiments()
    assert "h200_2026-12-03_refill.csv" in names and len(names) >= 6
    for name in names:
        df = load_experiment(name)
        raw = pd.read_csv(Path(__file__).resolve().parent.parent / "data" / "ab" / name)
        g = experiment_geomeans(df).set_index("variant")
        # the reference: FlashMLA, else FlashInfer, else our portable kernel (a16w8 files without a peer), else the
        # first variant (an A/B of our variants alone)
        keys = ("B", "L", "q_len", "causal", "layout")  # the shape and the case keys (`CASE_KEYS`)
        timed = [c for c in raw.columns if c not in (*keys, "floor", "precision", *PROVENANCE_COLUMNS)]
        ref = next((c for c in ("flashmla", "flashinfer", "portable") if c in raw.columns), timed[0])
        assert reference_column(df) == ref
        for col in timed:
            ok = raw[col].notna()
            want = np.exp(np.log(raw.loc[ok, col]).mean()) / np.exp(np.log(raw.loc[ok, ref]).mean())
            assert g.loc[col, "vs_reference"] == pytest.approx(want, rel=1e-12), (name, col)
        assert g.loc[ref, "vs_reference"] == pytest.approx(1.0)
        fig = experiment_figure(df)
        bars = [t for t in fig.data if t.type == "bar"]
        assert len(bars) == len(g) - 2  # every variant; not the reference itself, not the floor (a marker trace)
        assert all(f"{g.loc[t.name.rpartition(': ')[0], 'vs_reference']:.3f}×" in t.name for t in bars)
        assert name in fig.layout.title.text
        a8w8_vs_flashmla = peer_name(df) == "FlashMLA fp8"
        assert bool(fig.layout.shapes) == a8w8_vs_flashmla  # #5's goal: an a8w8 goal against FlashMLA fp8
        assert not a8w8_vs_flashmla or fig.layout.shapes[0].y0 == 0.65
        cases = {tuple(r) for r in raw[[k for k in keys if k in raw.columns]].itertuples(index=False)}
        assert len(bars[0].x) == len(raw) and len(set(bars[0].x)) == len(cases)  # q_len and layout label cases apart
    mtp = load_experiment("h200_2026-12-06_mtp_two_rows_a_cta.csv")
    assert "B128·L8192·q4" in set(experiment_figure(mtp).data[0].x)
    fp4 = load_experiment("h200_2026-12-06_e4m3_route_tables.csv")
    assert peer_name(fp4) == "route_783c96b (baseline) a8w4-mxfp4"
    a16 = load_experiment("h200_2026-12-03_a16w8_v_conv.csv")
    assert peer_name(a16) == "FlashInfer a16w8"
    assert peer_name(load_experiment("h200_2026-12-03_a16w8_v_conv_fast.csv")) == "our portable kernel a16w8"


def test_a_failed_variant_cell_is_left_out_and_said(tmp_path: Path) -> None:
    df = pd.read_csv(Path(__file__).resolve().parent.parent / "data" / "ab" / "h200_2026-12-03_refill.csv")
    df.loc[0, "v1"] = float("nan")  # v1 failed at one shape
    df = df.assign(date="2026-12-03", gpu="NVIDIA H200", sm_count=132, driver="x", torch="y", triton="z")  # provenance
    p = tmp_path / "x_ab_y.csv"
    df.to_csv(p, index=False)
    e = load_experiment(str(p))
    g = experiment_geomeans(e).set_index("variant")
    assert g.loc["v1", "shapes"] == 11 and g.loc["v2", "shapes"] == 12
    assert set(g.index) == {"flashmla", "v1", "v2", "v2-early", "floor"}  # provenance columns are not variants
    fig = experiment_figure(e)
    assert any("(11 of 12 shapes)" in t.name for t in fig.data if t.type == "bar")


def test_a_causal_file_keeps_the_flag_out_of_the_variants_and_in_the_labels(tmp_path: Path) -> None:
    """``ab.py --q-len 4 --causal`` files: ``causal`` is a case key, not a column of µs."""
    p = tmp_path / "h200_x_causal.csv"
    pd.DataFrame({"B": [4, 128], "L": [1024, 8192], "q_len": [4, 4], "causal": [True, True], "flashmla": [12.0, 214.0],
                  "auto": [10.0, 250.0], "floor": [5.0, 120.0]}).to_csv(p, index=False)  # fmt: skip
    e = load_experiment(str(p))
    assert set(experiment_geomeans(e)["variant"]) == {"flashmla", "auto", "floor"}
    assert case_labels(e) == ["B4·L1024·q4·causal", "B128·L8192·q4·causal"]
    assert case_labels(e.assign(causal=False)) == ["B4·L1024·q4", "B128·L8192·q4"]


def test_a_bf16_file_names_flashmla_bf16_and_draws_no_a8w8_goal(tmp_path: Path) -> None:
    """``hopper_ab.py --precision bf16`` files: ``flashmla`` is FlashMLA bf16 there, and #5's 0.65x goal (an a8w8
    goal) is not drawn; ``precision`` is not a variant; one precision per file."""

    df = pd.read_csv(Path(__file__).resolve().parent.parent / "data" / "ab" / "h200_2026-12-03_refill.csv")
    p = tmp_path / "x_ab_bf16.csv"
    df.assign(precision="bf16").to_csv(p, index=False)
    e = load_experiment(str(p))
    assert peer_name(e) == "FlashMLA bf16" and "precision" not in set(experiment_geomeans(e)["variant"])
    fig = experiment_figure(e)
    assert "FlashMLA bf16" in fig.layout.title.text and "FlashMLA bf16" in fig.layout.yaxis.title.text
    assert not fig.layout.shapes  # no goal line
    assert peer_name(load_experiment("h200_2026-12-03_refill.csv")) == "FlashMLA fp8"  # no column: a8w8
    df.assign(precision="a8w8").to_csv(p, index=False)
    assert experiment_figure(load_experiment(str(p))).layout.shapes[0].y0 == 0.65
    for bad in (["bf16"] * (len(df) - 1) + ["a8w8"], ["fp4"] * len(df)):
        df.assign(precision=bad).to_csv(p, index=False)
        with pytest.raises(ValueError, match="column precision must hold one of a8w8, a16w8, bf16"):
            load_experiment(str(p))


def test_bad_experiment_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="recorded: .*_refill"):
        load_experiment("h200_1999-01-01_ab_none.csv")
    with pytest.raises(TypeError, match="file name or path"):
        load_experiment(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="columns B, L"):
        case_labels(pd.DataFrame({"q_len": [2]}))
    p = tmp_path / "bad_ab_1.csv"
    pd.DataFrame({"B": [4], "L": [1024], "v1": [5.0]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match="needs a reference column .* or two variant columns.*; got v1"):
        load_experiment(str(p))
    pd.DataFrame({"B": [4], "L": [1024], "v1": [5.0], "v2": [4.0]}).to_csv(p, index=False)
    base = load_experiment(str(p))  # our variants alone: the first is the baseline
    assert reference_column(base) == "v1" and peer_name(base) == "v1 (baseline) fp8"
    assert experiment_geomeans(base).set_index("variant").loc["v2", "vs_reference"] == pytest.approx(0.8)
    pd.DataFrame({"B": [4], "L": [1024], "flashmla": [9.0], "floor": [1.0]}).to_csv(p, index=False)
    with pytest.raises(ValueError, match="no variant column"):
        load_experiment(str(p))
    for bad in (-1.0, float("inf")):
        pd.DataFrame({"B": [4], "L": [1024], "flashmla": [9.0], "v1": [bad]}).to_csv(p, index=False)
        with pytest.raises(ValueError, match="finite positive number of µs"):
            load_experiment(str(p))
    good = load_experiment("h200_2026-12-03_refill.csv")
    with pytest.raises(ValueError, match="goal must be a positive ratio"):
        experiment_figure(good, goal=0)
    with pytest.raises(TypeError, match="pandas DataFrame"):
        experiment_figure(good.to_dict())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="experiment table with rows"):
        experiment_geomeans(good.iloc[0:0])


def test_a_bare_file_name_is_looked_up_in_the_ab_directory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A file of the same name in the working directory does not shadow the recorded one."""
    name = "h200_2026-12-03_refill.csv"
    pd.DataFrame({"B": [4], "L": [1024], "flashmla": [9.0], "impostor": [1.0]}).to_csv(tmp_path / name, index=False)
    monkeypatch.chdir(tmp_path)
    assert "impostor" not in load_experiment(name).columns
    assert "impostor" in load_experiment(str(tmp_path / name)).columns  # a path with a directory part is used as is
    assert "impostor" in load_experiment(name, directory=str(tmp_path)).columns


def test_experiments_panel_switches_files(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlalab.widgets import timing as T

    p = T.experiments_panel()
    assert p.experiment.value == list_experiments()[-1] and p.experiment.value in p.figure.layout.title.text
    p.experiment.value = "h200_2026-12-03_qfirst_stages.csv"
    assert "v2q" in p.table.value and "qfirst_stages" in p.figure.layout.title.text
    with pytest.raises(ValueError, match="one of the recorded experiments"):
        T.experiments_panel("nope.csv")
    monkeypatch.setattr(T, "list_experiments", lambda: [])
    assert "no recorded experiments" in T.experiments_panel().table.value


def test_gpu_scripts_provenance_needs_a_gpu() -> None:
    """The GPU scripts stamp device, versions and date on every row (`mlalab.timing.provenance`); without a GPU
    there is nothing to stamp and it says so."""
    import torch

    from mlalab.timing import provenance

    if torch.cuda.is_available():
        assert tuple(provenance()) == PROVENANCE_COLUMNS
    else:
        with pytest.raises(RuntimeError, match="needs a GPU"):
            provenance()


def test_experiments_are_listed_by_date_whatever_the_device(tmp_path: Path) -> None:
    for n in ("h200_2026-12-10_c.csv", "h100_2026-12-06_b.csv", "h200_2026-12-02_a10.csv", "h200_2026-12-02_a9.csv"):
        (tmp_path / n).write_text("B,L\n")
    assert list_experiments(str(tmp_path)) == [
        "h200_2026-12-02_a9.csv", "h200_2026-12-02_a10.csv", "h100_2026-12-06_b.csv", "h200_2026-12-10_c.csv"
    ]  # fmt: skip


def test_ab_variant_names_pick_the_code_and_refuse_bad_names() -> None:
    """experiments/ab.py: ``NAME:`` runs the package mlalab_NAME (``before:`` mlalab_before), ``@N`` a plan of N
    slots; a bad prefix, an unknown variant or bad slots stop it before anything runs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ab", Path(__file__).resolve().parent.parent / "experiments" / "ab.py"
    )
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)  # type: ignore[union-attr]
    assert ab.variant("auto") == (None, None, {})
    assert ab.variant("before:auto@132") == ("mlalab_before", 132, {})
    assert ab.variant("colmax:rows-off") == ("mlalab_colmax", None, {"side_by_side": "off"})
    for bad, msg in (("Col-max:auto", "bad prefix"), ("fast", "unknown variant"), ("auto@0", "bad plan slots"),
                     ("auto@x", "bad plan slots")):  # fmt: skip
        with pytest.raises(SystemExit, match=msg):
            ab.variant(bad)

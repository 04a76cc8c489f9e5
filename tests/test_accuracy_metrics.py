"""Accuracy records: the headline rel-L2 numbers (bf16 0.16 %, fp8 2.6 %, MXFP4 11 %), baselines, sweep, save, CLI."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from mlalab.__main__ import main as cli
from mlalab.accuracy import evaluate, mismatch_fraction, output_metrics, prepare, save_table, sweep
from mlalab.accuracy import evaluate_prepared as ev
from mlalab.config import DecodeCase
from mlalab.quant import KV_SCHEMES, concrete_names


@pytest.fixture(scope="module")
def comp() -> object:
    return prepare(DecodeCase.uniform(4, 1024, seed=0))


@pytest.mark.parametrize(
    "q,kv,expected",
    [("bf16", "bf16", 0.0016), ("fp8-tensor", "fp8-tensor", 0.026), ("bf16", "mxfp4-aiter", 0.11)],
)
def test_headline_numbers_within_10_percent(comp: object, q: str, kv: str, expected: float) -> None:
    r = ev(comp, q, kv, "e4m3fn")  # type: ignore[arg-type]
    assert abs(r["rel_l2"] / expected - 1) < 0.10, r["rel_l2"]
    assert r["sqnr_db"] == pytest.approx(-20 * math.log10(r["rel_l2"]))
    assert r["nan_count"] == 0


def test_zeros_pass_competition_tolerance_but_not_unit(comp: object) -> None:
    r = ev(comp, "fp8-tensor", "mxfp4-aiter")  # type: ignore[arg-type]
    assert r["zeros_mismatch@0.02,0.008"] == 0.0 and r["meanv_mismatch@0.01,0.01"] == 0.0
    assert r["mismatch@0.02,0.008"] == 0.0  # even 11 % error passes: the check is vacuous at randn*0.02
    unit = evaluate(DecodeCase.uniform(1, 256, dist="unit"), "bf16", "bf16")
    assert unit["zeros_mismatch@0.02,0.008"] > 0.5
    assert unit["mismatch@0.02,0.008"] < 0.01


def test_direct_cast_overflow_nan_on_fnuz_only() -> None:
    case = DecodeCase.uniform(1, 64, scale=100.0)
    fnuz = evaluate(case, "fp8-direct", "bf16", "e4m3fnuz")
    assert fnuz["nan_count"] > 0 and math.isnan(fnuz["rel_l2"]) and fnuz["q_direct_overflow_frac"] > 0
    assert fnuz["mismatch@0.02,0.008"] > 0  # NaN counts as a mismatch
    fn = evaluate(case, "fp8-direct", "bf16", "e4m3fn")
    assert fn["nan_count"] == 0 and fn["q_direct_overflow_frac"] == 0
    clamped = evaluate(case, "fp8-direct-sat", "bf16", "e4m3fnuz")
    assert clamped["nan_count"] == 0 and clamped["q_overflow_rule"] == "saturate"
    sat = evaluate(case, "fp8-tensor", "bf16", "e4m3fnuz")
    assert sat["nan_count"] == 0 and sat["q_overflow_frac"] == 0


def test_direct_cast_subnormal_fraction_at_competition_scale(comp: object) -> None:
    r = ev(comp, "fp8-direct", "bf16", "e4m3fn")  # type: ignore[arg-type]
    assert 0.5 < r["q_subnormal_frac"] < 0.62  # ~56 % of randn*0.02 are e4m3fn subnormals
    assert ev(comp, "fp8-tensor", "bf16", "e4m3fn")["q_subnormal_frac"] < 0.01  # type: ignore[arg-type]


def test_output_metrics_basics() -> None:
    ref = torch.randn(2, 16, 512, dtype=torch.float64)
    m = output_metrics(ref.clone(), ref)
    assert m["rel_l2"] == 0 and m["sqnr_db"] == math.inf and m["cosine"] == pytest.approx(1.0)
    m = output_metrics(ref * 1.01, ref)
    assert m["rel_l2"] == pytest.approx(0.01) and m["worst_row_cosine"] == pytest.approx(1.0)
    bad = ref.clone()
    bad[0, 0, 0] = math.nan
    assert mismatch_fraction(bad, ref, 1.0, 1.0) == pytest.approx(1 / ref.numel())
    with pytest.raises(ValueError, match="shape"):
        output_metrics(ref[:1], ref)
    with pytest.raises(ValueError, match="tolerances"):
        output_metrics(ref, ref, [(-1.0, 0.0)])


def test_sweep_grid_and_save(tmp_path: object) -> None:
    cases = [DecodeCase.uniform(2, 64), DecodeCase.uniform(2, 64, dist="unit")]
    df = sweep(cases, ["bf16", "fp8-tensor"], ["fp8-tensor", "nvfp4"], ["e4m3fn", "e4m3fnuz"], progress=False)
    assert len(df) == 2 * 2 * 2 * 2
    assert {"mlalab_version", "torch_version", "dist", "kv_len", "fp8_format", "kv_bytes_per_token"} <= set(df)
    # the shared-reference fast path equals a standalone evaluation
    one = evaluate(cases[1], "fp8-tensor", "nvfp4", "e4m3fnuz")
    row = df[(df.dist == "unit") & (df.q_scheme == "fp8-tensor") & (df.kv_scheme == "nvfp4")]
    row = row[row.fp8_format == "e4m3fnuz"].iloc[0]
    assert row["rel_l2"] == one["rel_l2"]
    path = save_table(df, tmp_path / "sub" / "t.csv")  # type: ignore[operator]
    back = pd.read_csv(path)
    assert len(back) == len(df) and list(back.columns) == list(df.columns)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError, match=".csv or .parquet"):
        save_table(df, tmp_path / "t.txt")  # type: ignore[operator]
    with pytest.raises(ValueError, match="unknown KV scheme"):
        sweep(cases, ["bf16"], ["fp9"], progress=False)


def test_cli_accuracy_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli(
        [
            "accuracy",
            "--batch",
            "2",
            "--kv-len",
            "128",
            "--q-scheme",
            "fp8-tensor",
            "--kv-scheme",
            "mxfp4-ocp",
            "--fp8-format",
            "e4m3fnuz",
            "--json",
        ]
    )
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["kv_scheme"] == "mxfp4-ocp" and rec["fp8_format"] == "e4m3fnuz" and rec["rel_l2"] > 0.05
    assert cli(["accuracy", "--kv-scheme", "nope"]) == 2
    assert "valid: bf16" in capsys.readouterr().err


def test_cli_sweep_writes_table(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.csv"  # type: ignore[operator]
    rc = cli(
        ["sweep", "--kv-len", "32,64", "--q-schemes", "bf16", "--kv-schemes", "all", "--no-progress", "--out", str(out)]
    )
    assert rc == 0
    df = pd.read_csv(out)
    assert len(df) == 2 * len(concrete_names(KV_SCHEMES)) and set(df.kv_len) == {32, 64}


def test_stacked_q_variants_equal_separate_decodes() -> None:
    from mlalab.accuracy import decode_q_variants
    from mlalab.quant import get_kv_scheme, get_q_scheme
    from mlalab.reference import decode_reference

    p = prepare(DecodeCase(kv_lens=(5, 40, 17), q_len=2))
    kd = get_kv_scheme("fp8-token").fake_quant(p.kv)
    qds = [get_q_scheme(n).fake_quant(p.inputs.q) for n in ("bf16", "fp8-direct", "fp8-block128")]
    for (out, lse), qd in zip(decode_q_variants(p, qds, kd), qds):
        o1, l1 = decode_reference(qd, kd, p.inputs.qo_indptr, p.kv_indptr)
        assert torch.allclose(out, o1, rtol=1e-12, atol=1e-15) and torch.allclose(lse, l1, rtol=1e-12)


def test_save_parquet_or_clear_error(tmp_path: object) -> None:
    df = pd.DataFrame({"a": [1.0]})
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pyarrow"):
            save_table(df, tmp_path / "t.parquet")  # type: ignore[operator]
        assert not list(tmp_path.iterdir())  # type: ignore[attr-defined]
    else:
        assert pd.read_parquet(save_table(df, tmp_path / "t.parquet")).equals(df)  # type: ignore[operator]


def test_mismatch_fraction_hand_counted_at_asymmetric_tolerances() -> None:
    """Pinned semantics: |out - ref| > atol + rtol*|ref|, NaN a mismatch. Each element is chosen so that swapping
    rtol and atol, or measuring the band against |out| instead of |ref|, changes the count."""
    ref = torch.tensor([10.0, 0.0, 100.0, 1.0, 1.0], dtype=torch.float64)
    out = torch.tensor([10.5, 0.05, 90.0, 1.0, math.nan], dtype=torch.float64)
    # rtol 0.1, atol 0.001; bands against ref: 1.001, 0.001, 10.001, 0.101, 0.101
    #   errors 0.5 (ok), 0.05 (miss), 10 (ok), 0 (ok), NaN (miss)                       -> 2 of 5
    # swapped (rtol 0.001, atol 0.1): bands 0.11, 0.1, 0.2, 0.101 -> 0.5 miss, 0.05 ok, 10 miss, NaN miss -> 3 of 5
    # band against |out|: 1.051, 0.006, 9.001, 0.101 -> 0.5 ok, 0.05 miss, 10 miss, NaN miss             -> 3 of 5
    assert mismatch_fraction(out, ref, 0.1, 0.001) == 2 / 5
    assert mismatch_fraction(out, ref, 0.001, 0.1) == 3 / 5
    # the band's edge is inside: error 0.75 against 0.25 + 0.5*1 (exact in binary)
    edge = torch.tensor([1.75, 1.7500001], dtype=torch.float64)
    assert mismatch_fraction(edge, torch.ones(2, dtype=torch.float64), 0.5, 0.25) == 1 / 2
    # infinities: an inf output is a mismatch even against an inf reference band
    assert mismatch_fraction(torch.tensor([math.inf, 2.0]), torch.tensor([1.0, 2.0]), 1.0, 1.0) == 1 / 2
    assert mismatch_fraction(torch.zeros(0), torch.zeros(0), 0.1, 0.1) == 0.0
    # either tolerance may be 0: a pure relative band (errors 0.6, 0, 3, 0 against 0.5, 1, 2, 4) and a pure absolute one
    r4 = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    o4 = torch.tensor([1.6, 2.0, 7.0, 8.0], dtype=torch.float64)
    assert mismatch_fraction(o4, r4, 0.5, 0.0) == 2 / 4 and mismatch_fraction(o4, r4, 0.0, 1.0) == 1 / 4
    for bad in ((-1.0, 0.0), (0.0, math.inf)):
        with pytest.raises(ValueError, match="rtol and atol"):
            mismatch_fraction(out, ref, *bad)
    with pytest.raises(TypeError, match="tensors"):
        mismatch_fraction(out.tolist(), ref, 0.1, 0.1)  # type: ignore[arg-type]


def test_evaluate_takes_inputs_or_case_and_checks_the_device() -> None:
    from mlalab.inputs import make_inputs

    case = DecodeCase.uniform(2, 64, seed=3)
    by_case = evaluate(case, "fp8-tensor", "nvfp4")
    by_inputs = evaluate(make_inputs(case), "fp8-tensor", "nvfp4")
    assert by_case["rel_l2"] == by_inputs["rel_l2"] and by_case["case"] == by_inputs["case"]
    assert by_case["device"] == "cpu"
    with pytest.raises(TypeError, match="DecodeCase or DecodeInputs"):
        evaluate("B2-L64", "bf16", "bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device must be"):
        evaluate(case, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            evaluate(case, device="cuda")
    with pytest.raises(ValueError, match="unknown KV scheme"):
        evaluate(DecodeCase.uniform(1, 10**9), "bf16", "fp9")  # names checked before any input is drawn


def test_output_metrics_hand_computed() -> None:
    """ref = 0.5 [[1, 0], [0, 1]], out = 0.5 [[1, 0], [1, 1]] (norms below 1): err = 0.5 at one element, so
    rel-L2 = 0.5 / (0.5 sqrt 2) = 1 / sqrt 2, SQNR = 10 log10 2 dB, max-abs 0.5 over ref RMS sqrt(0.5 / 4) = sqrt 2,
    cosine = 0.5 / (0.5 sqrt 3 x 0.5 sqrt 2) = 2 / sqrt 6, worst row (the second) 1 / sqrt 2."""
    ref = 0.5 * torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    out = 0.5 * torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    m = output_metrics(out, ref, [(0.0, 0.25)])
    want = {"rel_l2": 2**-0.5, "sqnr_db": 10 * math.log10(2), "max_abs": 0.5, "max_abs_over_ref_rms": 2**0.5,
            "cosine": 2 / 6**0.5, "worst_row_cosine": 2**-0.5, "nan_count": 0.0}  # fmt: skip
    for k, v in want.items():
        assert m[k] == pytest.approx(v, rel=1e-12), k
    assert [v for k, v in m.items() if k not in want] == [0.25]  # 1 of 4 elements beyond atol 0.25
    # a NaN and an inf output: counted, and max-abs / worst-row cosine are NaN; the global ratios too
    bad = out.clone()
    bad[0, 0, 0], bad[0, 1, 1] = math.nan, math.inf
    m = output_metrics(bad, ref)
    assert m["nan_count"] == 2.0 and math.isnan(m["max_abs"]) and math.isnan(m["worst_row_cosine"])
    # all-zero output: rel-L2 1 (SQNR 0 dB), cosine undefined; all-zero reference: the ratios are undefined
    m = output_metrics(torch.zeros_like(ref), ref)
    assert m["rel_l2"] == 1.0 and m["sqnr_db"] == 0.0 and math.isnan(m["cosine"])
    m = output_metrics(out, torch.zeros_like(ref))
    assert math.isnan(m["rel_l2"]) and math.isnan(m["sqnr_db"]) and math.isnan(m["max_abs_over_ref_rms"])
    assert m["max_abs"] == 0.5

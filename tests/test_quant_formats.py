"""Bit-exactness of the element codecs against ml_dtypes (independent oracle) and the naive code-table encoders."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlalab.quant import FP8_FORMATS, e2m1_decode, e2m1_encode, e8m0_to_float, encode_fp8, pack_e2m1, unpack_e2m1
from mlalab.quant.formats import e2m1_encode_naive, encode_fp8_naive, fp8_code_value, get_fp8_format

ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2": ml_dtypes.float8_e5m2}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@pytest.mark.parametrize("name", list(ML))
def test_all_256_codes_decode_like_ml_dtypes_and_torch(name: str) -> None:
    codes = np.arange(256, dtype=np.uint8)
    ml = codes.view(ML[name]).astype(np.float64)
    th = torch.from_numpy(codes.copy()).view(FP8_FORMATS[name].dtype).double().numpy()
    for c in range(256):
        spec = fp8_code_value(c, name)
        assert _same(spec, float(ml[c])), (name, hex(c), spec, ml[c])
        assert _same(spec, float(th[c])), (name, hex(c), spec, th[c])


def _all_finite_values_and_midpoints(name: str) -> np.ndarray:
    vals = sorted({fp8_code_value(c, name) for c in range(256)} - {math.nan})
    vals = [v for v in vals if math.isfinite(v)]
    mids = [(a + b) / 2 for a, b in zip(vals[:-1], vals[1:])]  # exact ties: RNE must pick the even code
    nudged = [m * (1 + 1e-6) for m in mids] + [m * (1 - 1e-6) for m in mids]
    return np.array(vals + mids + nudged, dtype=np.float32)


@pytest.mark.parametrize("name", list(ML))
def test_encode_in_range_matches_ml_dtypes_including_ties(name: str) -> None:
    x = _all_finite_values_and_midpoints(name)
    ours = encode_fp8(torch.from_numpy(x), name).view(torch.uint8).numpy()
    ref = x.astype(ML[name]).view(np.uint8)
    fnuz = FP8_FORMATS[name].fnuz
    if fnuz:  # ml_dtypes and torch agree: no negative zero
        pass
    assert (ours == ref).all(), x[ours != ref][:10]


@pytest.mark.parametrize("name", list(ML))
def test_nonsaturating_overflow_matches_ml_dtypes(name: str) -> None:
    f = FP8_FORMATS[name]
    big = np.array([f.max * k for k in (1.01, 1.03, 1.0345, 1.04, 1.05, 1.07, 1.1, 2.0, 1e6)], dtype=np.float32)
    big = np.concatenate([big, -big, np.array([np.inf, -np.inf, np.nan], np.float32)])
    rule = "inf" if name == "e5m2" else "nan"
    ours = encode_fp8(torch.from_numpy(big), name, rule).double().numpy()
    ref = big.astype(ML[name]).astype(np.float64)
    for a, b, x in zip(ours, ref, big):
        assert _same(float(a), float(b)) or (math.isnan(a) and math.isnan(b)), (x, a, b)


@pytest.mark.parametrize("name", list(FP8_FORMATS))
def test_saturation_is_explicit(name: str) -> None:
    f = FP8_FORMATS[name]
    y = encode_fp8(torch.tensor([1e9, -1e9, math.inf, -math.inf]), name).float()
    assert y.tolist() == [f.max, -f.max, f.max, -f.max]


def test_fnuz_224_clamps_to_224_but_stores_fnuz() -> None:
    f = get_fp8_format("e4m3fnuz-224")
    assert f.dtype == torch.float8_e4m3fnuz and f.max == 224.0
    assert encode_fp8(torch.tensor([230.0]), f).float().item() == 224.0


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-600, max_value=600, allow_nan=False, width=32), st.sampled_from(list(ML)))
def test_encode_matches_naive_code_table(v: float, name: str) -> None:
    for rule in ("saturate", "inf" if name == "e5m2" else "nan"):
        fast = int(encode_fp8(torch.tensor([v]), name, rule).view(torch.uint8).item())
        assert fast == encode_fp8_naive(v, name, rule), (v, name, rule)


def test_e2m1_encode_all_ties_and_ml_dtypes() -> None:
    grid = np.concatenate([np.arange(-8, 8, 0.125), np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 1e9])])
    x = grid.astype(np.float32)
    ours = e2m1_encode(torch.from_numpy(x)).numpy()
    ref = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    assert (ours == ref).all(), x[ours != ref]
    assert [e2m1_encode_naive(float(v)) for v in x] == ours.tolist()
    assert e2m1_decode(e2m1_encode(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]))).tolist() == [
        0.0,
        1.0,
        1.0,
        2.0,
        2.0,
        4.0,
        4.0,
    ]


def test_e2m1_ties_away_from_zero() -> None:
    """ties-away (aiter's element rounding) differs from ties-even exactly at the ties whose upper neighbour is odd:
    0.25, 1.25, 2.5 and 5 (0.75, 1.75, 3.5 round up either way); elsewhere both are the nearest value."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_decode(e2m1_encode(ties, "ties-away")).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert e2m1_decode(e2m1_encode(-ties, "ties-away")).tolist() == [-0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    grid = torch.from_numpy(np.concatenate([np.arange(-8, 8, 0.0625), [1e9, -1e9, -0.0, 0.1, -0.1]]).astype(np.float32))
    away, even = e2m1_encode(grid, "ties-away"), e2m1_encode(grid, "ties-even")
    assert away.tolist() == [e2m1_encode_naive(float(v), "ties-away") for v in grid]
    odd_tie = torch.isin(grid.abs(), torch.tensor([0.25, 1.25, 2.5, 5.0]))
    assert torch.equal(away != even, odd_tie)
    assert bool((e2m1_decode(away[odd_tie]).abs() > e2m1_decode(even[odd_tie]).abs()).all())
    with pytest.raises(ValueError, match="'rounding'"):
        e2m1_encode(grid, "nearest")


def test_e2m1_random_matches_ml_dtypes() -> None:
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 3).numpy()
    ours = e2m1_encode(torch.from_numpy(x)).numpy()
    ref = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    assert (ours == ref).all()


def test_e2m1_nan_raises() -> None:
    with pytest.raises(ValueError, match="NaN"):
        e2m1_encode(torch.tensor([1.0, math.nan]))


@pytest.mark.parametrize("rounding", ["ties-even", "ties-away"])
def test_e2m1_codec_in_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch, rounding: str) -> None:
    """A large cache is encoded and decoded CODEC_CHUNK values at a time (bounded temporaries): the codes and values
    equal those of one pass, whatever the chunk boundaries cut (ties and negative zeros included), and a NaN in a
    later chunk still raises."""
    import mlalab.quant.formats as fm

    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(897, generator=g) * 3, torch.tensor([0.25, 0.75, 2.5, 5.0, -0.25, -0.0, 7.0])])
    x = x[torch.randperm(x.numel(), generator=g)].reshape(8, 113)
    whole = fm.e2m1_encode(x, rounding)
    values = fm.e2m1_decode(whole)
    ref = torch.from_numpy(x.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F)
    if rounding == "ties-even":
        assert torch.equal(whole, ref)  # the one-pass result is itself right
    monkeypatch.setattr(fm, "CODEC_CHUNK", 7)
    assert torch.equal(fm.e2m1_encode(x, rounding), whole)
    assert torch.equal(fm.e2m1_decode(whole), values)
    x[7, 100] = math.nan  # (value 891: the 128th chunk of 7)
    with pytest.raises(ValueError, match="NaN"):
        fm.e2m1_encode(x, rounding)


def test_pack_low_nibble_is_even_index() -> None:
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0xF3]]
    assert torch.equal(unpack_e2m1(packed), codes)
    with pytest.raises(ValueError, match="even"):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))


def test_e8m0_all_codes_match_ml_dtypes() -> None:
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    ours = e8m0_to_float(torch.from_numpy(codes)).double().numpy()
    for c in range(256):
        assert _same(float(ours[c]), float(ref[c])), (c, ours[c], ref[c])


def test_unknown_format_lists_valid() -> None:
    with pytest.raises(ValueError, match="e4m3fnuz-224"):
        get_fp8_format("e4m3")


def test_float64_inputs_round_once() -> None:
    """float64 -> fp8 / E2M1 must not round twice (via float32): ml_dtypes rounds float64 directly."""
    import ml_dtypes
    import numpy as np

    from mlalab.quant.formats import decode_fp8, e2m1_decode, e2m1_encode, encode_fp8

    eps = 2.0**-40
    vals = torch.tensor(
        [1.0625 + eps, 1.0625 - eps, -1.0625 - eps, 0.25 + eps, 448.0, 1e-9, 0.0, -0.0], dtype=torch.float64
    )
    got = decode_fp8(encode_fp8(vals, "e4m3fn")).double()
    want = torch.from_numpy(vals.numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
    assert torch.equal(got, want), (got, want)
    assert float(got[0]) == 1.125 and float(got[1]) == 1.0
    g = torch.Generator().manual_seed(0)
    rnd = (torch.randn(20000, dtype=torch.float64, generator=g) * 3).clamp(-6, 6)
    got4 = e2m1_decode(e2m1_encode(rnd)).double()
    want4 = torch.from_numpy(rnd.numpy().astype(ml_dtypes.float4_e2m1fn).astype(np.float64))
    assert torch.equal(got4.abs(), want4.abs())  # ml_dtypes maps some -0 differently; magnitudes must agree
    assert float(e2m1_decode(e2m1_encode(torch.tensor([0.25 + eps], dtype=torch.float64)))[0]) == 0.5


def test_float64_exact_ties_stay_ties() -> None:
    """A float64 that is exactly an fp8 / E2M1 midpoint (or exactly representable in float32) gets no sticky bit:
    1.0625 (between e4m3's 1 and 1.125) -> 1.0 and 1.1875 -> 1.25 (ties to the even mantissa), E2M1 0.25 -> 0 and
    0.75 -> 1.0; the float32 conversion of such values is exact, bit for bit."""
    from mlalab.quant.formats import decode_fp8, to_float32_exact_for_rounding

    exact = torch.tensor([1.0625, 1.1875, -1.0625, 0.25, 0.75, 1.0, 0.0, 448.0], dtype=torch.float64)
    assert torch.equal(to_float32_exact_for_rounding(exact).view(torch.int32), exact.float().view(torch.int32))
    assert decode_fp8(encode_fp8(exact[:3], "e4m3fn")).tolist() == [1.0, 1.25, -1.0]
    assert e2m1_decode(e2m1_encode(exact[3:5])).tolist() == [0.0, 1.0]


# half an ulp above the largest finite value: e4m3fn 448 + 32 / 2, e4m3fnuz 240 + 16 / 2, e5m2 57344 + 8192 / 2
OVERFLOW_TIES = {"e4m3fn": 464.0, "e4m3fnuz": 248.0, "e5m2": 61440.0}


@pytest.mark.parametrize("name", list(ML))
def test_nonsaturating_overflow_at_the_exact_tie_matches_ml_dtypes(name: str) -> None:
    """At the tie RNE goes to the even neighbour: e4m3fn's 448 (mantissa 110) stays finite, e4m3fnuz's 240 and
    e5m2's 57344 (odd mantissas) round up past the range -> NaN / inf. Just above the tie it always overflows."""
    t = OVERFLOW_TIES[name]
    x = np.array([t, -t, np.nextafter(t, np.inf), np.nextafter(t, 0)], dtype=np.float32)
    ours = encode_fp8(torch.from_numpy(x), name, "inf" if name == "e5m2" else "nan").double().numpy()
    ref = x.astype(ML[name]).astype(np.float64)
    for a, b, v in zip(ours, ref, x):
        assert _same(float(a), float(b)), (v, a, b)
    assert math.isfinite(ours[0]) == (name == "e4m3fn")


def test_e2m1_decode_refuses_codes_past_15() -> None:
    assert e2m1_decode(torch.tensor([15, 8, 7], dtype=torch.uint8)).tolist() == [-6.0, -0.0, 6.0]
    for bad in (16, 0x23):  # 0x23: a packed byte passed unpacked
        with pytest.raises(ValueError, match=r"E2M1 codes must be in \[0, 15\]"):
            e2m1_decode(torch.tensor([1, bad], dtype=torch.uint8))


def test_e8m0_from_exponent_clamps_to_the_spec_range() -> None:
    """OCP MX: X = 2**(E - 127), exponents clamped to [-127, 127] (254 is the largest finite code, 0xFF is NaN)."""
    from mlalab.quant.formats import e8m0_from_exponent

    e = torch.tensor([-200, -128, -127, -1, 0, 1, 127, 128, 300], dtype=torch.int32)
    assert e8m0_from_exponent(e).tolist() == [0, 0, 0, 126, 127, 128, 254, 254, 254]


@pytest.mark.parametrize("name", list(ML))
def test_format_limits_match_ml_dtypes(name: str) -> None:
    f, fi = FP8_FORMATS[name], ml_dtypes.finfo(ML[name])
    assert f.min_normal == float(fi.smallest_normal) and f.min_subnormal == float(fi.smallest_subnormal)
    assert math.isnan(float(np.array([f.nan_code], np.uint8).view(ML[name])[0]))


def test_true_div_rounds_once_where_a_reciprocal_multiply_does_not() -> None:
    """`true_div` is the IEEE quotient (what the CPU's tensor division gives; PyTorch on CUDA would multiply a Python
    divisor's reciprocal in): on bf16 amaxes over 240, 448 and 6 the reciprocal product differs from it in the last
    bit for some inputs, which moves fp8 scales and codes between devices."""
    from mlalab.quant.formats import true_div

    x = torch.arange(1, 1 << 15, dtype=torch.int32).view(torch.bfloat16).float()
    x = x[torch.isfinite(x) & (x > 0)]
    for d in (240.0, 448.0, 6.0, 448.0 * 6.0):
        exact = (x.double() / d).float()  # the correctly rounded quotient (d's odd part is small: no double rounding)
        assert torch.equal(true_div(x, d), exact), d
        recip = x * torch.tensor(1.0 / d, dtype=torch.float32)
        assert not torch.equal(recip, exact), d  # the formulation true_div avoids is really different
    b = x.to(torch.bfloat16)
    assert torch.equal(true_div(b, 240.0), (b.double() / 240.0).to(torch.bfloat16))

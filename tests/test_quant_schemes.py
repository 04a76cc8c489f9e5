"""Schemes: MXFP4/NVFP4 vs torchao and hand-worked blocks (aiter's own quantiser: `test_mxfp4_aiter`), the
competition's bf16 quantize_fp8, granularities, and bad input (unknown names, amax = 0, NaN/inf, block sizes)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from mlalab.quant import (
    KV_SCHEMES,
    MXFP4_RECIPES,
    Q_SCHEMES,
    MxFp4Scheme,
    MxScaleRule,
    concrete_names,
    e2m1_decode,
    e8m0_to_float,
    fp8_dtype,
    get_kv_scheme,
    get_q_scheme,
    mx_scale_exponent,
    mxfp4_dequantize,
    mxfp4_quantize,
    nvfp4_quantize,
    quantize_fp8_per_tensor,
    unpack_e2m1,
)

G = torch.Generator().manual_seed(0)
Q = (torch.randn(3, 16, 576, generator=G, dtype=torch.bfloat16) * 0.02).bfloat16()
KV = (torch.randn(40, 1, 576, generator=G, dtype=torch.bfloat16) * 0.02).bfloat16()


def _torchao():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import to_mx
            from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as ao_nvfp4
            from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale
        except Exception as e:  # not installed, or its import fails on this torch
            pytest.skip(f"torchao MX reference unavailable: {type(e).__name__}: {e}")
    return to_mx, ScaleCalculationMode, ao_nvfp4, per_tensor_amax_to_scale


def _mx_test_data() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 576, generator=g)
    x = x * torch.logspace(-6, 4, 64).unsqueeze(1)  # many binades
    # blocks whose amax mantissa sits on and around the 1.5 / 1.75 boundaries
    for i, m in enumerate((1.5, 1.74, 1.75, 1.76, 1.99, 1.0, 6.0, 7.0)):
        x[i, :32] = torch.linspace(-1, 1, 32) * m
    return x


@pytest.mark.slow  # the first torchao import takes several seconds
@pytest.mark.parametrize(
    "scheme,mode", [("mxfp4-torchao-even", "EVEN"), ("mxfp4-ocp", "FLOOR"), ("mxfp4-rceil", "RCEIL")]
)
def test_mxfp4_matches_torchao(scheme: str, mode: str) -> None:
    to_mx, S, _, _ = _torchao()
    x = _mx_test_data()
    packed, scales = mxfp4_quantize(x, *MXFP4_RECIPES[scheme])
    ao_scale, ao_data = to_mx(x, torch.float4_e2m1fn_x2, 32, getattr(S, mode))
    assert torch.equal(scales, ao_scale.view(torch.uint8)), scheme
    assert torch.equal(packed, ao_data.view(torch.uint8)), scheme
    y = get_kv_scheme(scheme).fake_quant(x.unsqueeze(1)).squeeze(1)
    assert torch.equal(y, mxfp4_dequantize(packed, scales)), scheme


@pytest.mark.slow
def test_nvfp4_matches_torchao() -> None:
    _, _, ao_nvfp4, per_tensor_amax_to_scale = _torchao()
    x = _mx_test_data()[:, :512].contiguous()
    packed, s8, g = nvfp4_quantize(x)
    ag = per_tensor_amax_to_scale(x.abs().max())
    ao_s, ao_d = ao_nvfp4(x, 16, ag)
    assert torch.allclose(g, ag.reshape(1).float())
    assert torch.equal(s8.view(torch.uint8), ao_s.view(torch.uint8))
    assert torch.equal(packed, ao_d.view(torch.uint8))


def test_mx_scale_rules_hand_worked() -> None:
    # block max 1.8 has mantissa >= 1.75: "even" rounds amax up to 2 -> X = 2**-1; floor X = 2**-2; rceil 2**-1
    amax = torch.tensor([1.8, 1.7, 1.75, 1.5, 6.0, 0.0])
    assert mx_scale_exponent(amax, "even").tolist() == [-1, -2, -1, -2, 0, -127]
    assert mx_scale_exponent(amax, "floor").tolist() == [-2, -2, -2, -2, 0, -127]
    assert mx_scale_exponent(amax, "rceil").tolist() == [-1, -1, -1, -2, 0, -127]
    # floor clips the block max: 1.8 / 0.25 = 7.2 -> 6 -> 1.5 (17% error); even: 1.8 / 0.5 = 3.6 -> 4 -> 2.0
    x = torch.zeros(32)
    x[0] = 1.8
    x[1] = -0.3
    for rule, want0, want1 in (("floor", 1.5, -0.25), ("even", 2.0, -0.25), ("rceil", 2.0, -0.25)):
        packed, s = mxfp4_quantize(x, rule, "ties-even")
        y = mxfp4_dequantize(packed, s)
        assert y[0].item() == want0 and y[1].item() == want1, rule
        vals = e2m1_decode(unpack_e2m1(packed)) * e8m0_to_float(s)
        assert torch.equal(vals, y)


def test_even_scale_rule_at_the_ends_of_fp32() -> None:
    """An amax that rounds past fp32's range gets e = 127 (aiter: log2(inf) clamped); one that rounds to 0 (a subnormal
    below 0.75 * 2**-126) e = -127; the largest that stays finite 2**127 / 4."""
    big = torch.finfo(torch.float32).max
    amax = torch.tensor([big, 1.75 * 2.0**127, 1.7 * 2.0**127, 2.0**-130, 0.75 * 2.0**-126, 1e-45])
    assert mx_scale_exponent(amax, "even").tolist() == [127, 127, 125, -127, -127, -127]


def test_mxfp4_aiter_breaks_ties_away_from_zero() -> None:
    """The blocks aiter's dynamic_mxfp4_quant quantises differently from ties-to-even (value pairs, their block's
    E8M0, aiter's byte): 0.009765625 * 2**7 = 1.25 goes to 1.5, -1.25 * 4 = -5 to -6, 14 / 4 = 3.5 to 4."""
    cases = [((0.009765625, -0.0130615234375), 0.04, 120, 0xB3, 0xB2), ((-1.25, 1.4765625), 1.7, 125, 0x7F, 0x7E)]
    cases.append(((5.0, 14.0), 14.0, 129, 0x63, 0x62))
    for (a, b), top, e8m0, aiter_byte, even_byte in cases:
        x = torch.zeros(1, 32)
        x[0, :3] = torch.tensor([a, b, top])
        x = x.bfloat16()
        assert x[0, :2].float().tolist() == [a, b]
        packed, scales = mxfp4_quantize(x, *MXFP4_RECIPES["mxfp4-aiter"])
        assert int(scales[0, 0]) == e8m0 and int(packed[0, 0]) == aiter_byte, (a, b)
        packed_even, scales_even = mxfp4_quantize(x, *MXFP4_RECIPES["mxfp4-torchao-even"])
        assert torch.equal(scales_even, scales) and int(packed_even[0, 0]) == even_byte, (a, b)


def test_mx_rule_names_are_checked() -> None:
    with pytest.raises(ValueError, match="'rule'.*floor, even, rceil"):
        mxfp4_quantize(torch.zeros(1, 32), "nearest", "ties-even")
    with pytest.raises(ValueError, match="'rounding'.*ties-even, ties-away"):
        mxfp4_quantize(torch.zeros(1, 32), "even", "even")
    with pytest.raises(TypeError, match="rounding"):
        MxFp4Scheme("mxfp4-x", MxScaleRule.EVEN, "ties-away")  # type: ignore[arg-type]


def _competition_quantize_fp8(tensor: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # The competition reference's quantize_fp8, transcribed literally (runs in bf16 for bf16 input).
    finfo = torch.finfo(dtype)
    amax = tensor.abs().amax().clamp(min=1e-12)
    scale = amax / finfo.max
    fp8_tensor = (tensor / scale).clamp(min=finfo.min, max=finfo.max).to(dtype)
    return fp8_tensor, scale.to(torch.float32).reshape(1)


@pytest.mark.parametrize("math_mode", ["float32", "bf16"])
def test_per_tensor_of_an_empty_tensor_gets_the_floor_scale(math_mode: str) -> None:
    """The KV of a batch whose requests are all empty has 0 tokens: its per-tensor scale is the amax floor's, as for
    an all-zero tensor (torch refuses amax() of an empty tensor); the fp4 formats take it too."""
    empty = torch.zeros(0, 576, dtype=torch.bfloat16)
    codes, scale = quantize_fp8_per_tensor(empty, "e4m3fn", math=math_mode)
    zeros = torch.zeros(2, 576, dtype=torch.bfloat16)
    _, zero_scale = quantize_fp8_per_tensor(zeros, "e4m3fn", math=math_mode)
    assert codes.shape == (0, 576) and torch.equal(scale, zero_scale) and bool(torch.isfinite(scale).all())
    packed, block_scales, g = nvfp4_quantize(empty)
    assert packed.shape == (0, 288) and block_scales.shape == (0, 36) and float(g) == 1.0
    assert mxfp4_quantize(empty, "even", "ties-away")[0].shape == (0, 288)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("std", [0.02, 1.0])
def test_bf16math_is_bit_exact_with_competition_and_differs_from_fp32(fmt: str, std: float) -> None:
    x = (torch.randn(4096, 576, generator=torch.Generator().manual_seed(1), dtype=torch.bfloat16) * std).bfloat16()
    codes, scale = quantize_fp8_per_tensor(x, fmt, math="bf16")
    ref_codes, ref_scale = _competition_quantize_fp8(x, fp8_dtype(fmt))
    assert torch.equal(codes.view(torch.uint8), ref_codes.view(torch.uint8))
    assert torch.equal(scale, ref_scale)
    c32, _ = quantize_fp8_per_tensor(x, fmt, math="float32")
    frac = float((c32.view(torch.uint8) != codes.view(torch.uint8)).double().mean())
    assert 0.005 < frac < 0.10  # "a few % of codes"
    s = get_kv_scheme("fp8-tensor-bf16math", fmt)
    assert torch.equal(s.fake_quant(x), ref_codes.float() * ref_scale)


def test_per_tensor_contract_for_kernels() -> None:
    codes, scale = quantize_fp8_per_tensor(Q, "e4m3fnuz-224")
    assert codes.dtype == torch.float8_e4m3fnuz and codes.shape == Q.shape
    assert scale.shape == (1,) and scale.dtype == torch.float32
    assert float(codes.float().abs().max()) == 224.0
    assert torch.allclose(codes.float() * scale, Q.float(), rtol=0.07, atol=1e-6)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
def test_all_schemes_shapes_dtype_determinism(fmt: str) -> None:
    for n in concrete_names(Q_SCHEMES) + ("fp8-static:0.1",):
        s = get_q_scheme(n, fmt)
        y = s.fake_quant(Q)
        assert y.dtype == torch.float32 and y.shape == Q.shape, n
        assert torch.equal(y, s.fake_quant(Q)), n
    paged = KV.reshape(10, 4, 1, 576)
    for n in concrete_names(KV_SCHEMES) + ("fp8-static:0.1",):
        s = get_kv_scheme(n, fmt)
        y = s.fake_quant(KV)
        assert y.dtype == torch.float32 and y.shape == KV.shape, n
        if n not in ("nvfp4",):  # per-token/per-block/tensor give the same values in a paged view
            assert torch.equal(s.fake_quant(paged).reshape(KV.shape), y), n
        err = float((y - KV.float()).norm() / KV.float().norm())
        assert err < (0.13 if "fp4" in n else 0.035), (n, err)


def test_granularities_use_the_right_groups() -> None:
    x = Q.float().clone()
    x[0, 3, 7] = 5.0  # one big value: only its group's scale should change
    for name, affected in (
        ("fp8-token-head", lambda d: d[0, 3]),
        ("fp8-token", lambda d: d[0]),
        ("fp8-head", lambda d: d[:, 3]),
    ):
        s = get_q_scheme(name)
        base, big = s.scales(Q), s.scales(x)
        changed = (base.expand_as(x) != big.expand_as(x)).any(-1)
        mask = torch.zeros(x.shape[:-1], dtype=torch.bool)
        idx = affected(mask)
        idx.fill_(True)
        assert torch.equal(changed, mask), name


def test_block128_last_block_is_64_wide() -> None:
    s = get_kv_scheme("fp8-block128")
    x = KV.float().clone()
    x[:, 0, 520] = 3.0  # inside the last (64-wide) block
    sc = s.scales(x)
    assert sc.shape == (40, 1, 5, 1)
    assert torch.allclose(sc[:, 0, 4, 0], torch.full((40,), 3.0 / 448))
    assert s.bytes_per_token == 576 + 5 * 4


def test_block_size_not_dividing_576_gets_a_shorter_last_block() -> None:
    s = get_kv_scheme("fp8-block100")  # documented: 5 x 100 + one block of 76, not an error
    x = KV.float().clone()
    x[:, 0, 560] = 2.0
    sc = s.scales(x)
    assert sc.shape == (40, 1, 6, 1) and torch.allclose(sc[:, 0, 5, 0], torch.full((40,), 2.0 / 448))
    assert s.fake_quant(x).shape == x.shape and s.bytes_per_token == 576 + 6 * 4
    with pytest.raises(ValueError, match="fp8-block"):
        get_kv_scheme("fp8-blockX")


def test_flashmla_v32_keeps_rope_bf16_and_pow2_scales() -> None:
    s = get_kv_scheme("fp8-flashmla-v32")
    y = s.fake_quant(KV)
    assert torch.equal(y[..., 512:], KV[..., 512:].float())
    assert s.bytes_per_token == 656


def test_bytes_per_token() -> None:
    want = {"bf16": 1152, "fp8-tensor": 576, "fp8-token": 580, "nvfp4": 324} | dict.fromkeys(MXFP4_RECIPES, 306)
    for n, b in want.items():
        assert get_kv_scheme(n).bytes_per_token == b


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(ValueError, match="fp8-token-head"):
        get_q_scheme("fp8-per-token")
    with pytest.raises(ValueError, match="mxfp4-aiter"):
        get_kv_scheme("mxfp4")
    with pytest.raises(ValueError, match="e4m3fnuz"):
        get_kv_scheme("fp8-tensor", "fp8")
    with pytest.raises(ValueError, match="fp8-static"):
        get_q_scheme("fp8-static:abc")
    with pytest.raises(ValueError, match="positive"):
        get_q_scheme("fp8-static:0")
    with pytest.raises(TypeError):
        get_q_scheme(3)  # type: ignore[arg-type]


def test_amax_zero_gives_exact_zeros() -> None:
    for n in concrete_names(KV_SCHEMES):
        assert torch.equal(get_kv_scheme(n).fake_quant(torch.zeros(4, 1, 576)), torch.zeros(4, 1, 576)), n
    for n in concrete_names(Q_SCHEMES):
        assert torch.equal(get_q_scheme(n).fake_quant(torch.zeros(2, 16, 576)), torch.zeros(2, 16, 576)), n


def test_nonfinite_inputs() -> None:
    x = Q.float().clone()
    x[0, 0, 0] = math.nan
    x[1, 0, 0] = math.inf
    for n in ("fp8-tensor", "fp8-token", "fp8-block128", "fp8-tensor-bf16math"):
        with pytest.raises(ValueError, match="NaN/inf"):
            get_q_scheme(n).fake_quant(x)
    for n in ("mxfp4-aiter", "nvfp4", "fp8-flashmla-v32"):
        with pytest.raises(ValueError, match="non-finite|NaN/inf"):
            get_kv_scheme(n).fake_quant(x[:, :1])
    # Direct cast: NaN stays NaN; inf follows the format's cast rule, made explicit.
    fn = get_q_scheme("fp8-direct", "e4m3fn").fake_quant(x)
    fnuz = get_q_scheme("fp8-direct", "e4m3fnuz").fake_quant(x)
    assert math.isnan(fn[0, 0, 0]) and fn[1, 0, 0].item() == 448.0
    assert math.isnan(fnuz[0, 0, 0]) and math.isnan(fnuz[1, 0, 0])


def test_direct_cast_fnuz_overflow_is_nan_like_torch() -> None:
    x = torch.tensor([[[247.9, 248.0, 300.0, -500.0]]]).expand(1, 16, 4).contiguous()
    s = get_q_scheme("fp8-direct", "e4m3fnuz")
    assert s.overflow == "nan"
    y = s.fake_quant(x)[0, 0]
    assert y[0].item() == 240.0 and all(math.isnan(v) for v in y[1:].tolist())
    assert get_q_scheme("fp8-direct", "e4m3fn").fake_quant(x)[0, 0].tolist() == [240.0, 256.0, 288.0, -448.0]


def test_mx_block_must_divide() -> None:
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        mxfp4_quantize(torch.randn(4, 48), "even", "ties-away")
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        nvfp4_quantize(torch.randn(4, 40))


def test_range_stats_hand_counted() -> None:
    """fp8-direct (scale 1, e4m3fn: smallest normal 2**-6 = 0.015625, max 448) over 2 x 576 values: three 0.01
    (subnormal), 0.015625 (the smallest normal: not subnormal), 448 (the max: not beyond), two 500 (beyond), 1.0 and
    zeros (neither)."""
    from mlalab.quant import get_q_scheme

    x = torch.zeros(2, 576)
    x[0, :3] = 0.01
    x[0, 3], x[0, 4], x[1, 0], x[1, 1], x[1, 2] = 0.015625, 448.0, 500.0, -500.0, 1.0
    st = get_q_scheme("fp8-direct", "e4m3fn").range_stats(x)
    assert st == {"subnormal_frac": 3 / 1152, "overflow_frac": 2 / 1152}
    one = get_q_scheme("fp8-direct", "e4m3fn").range_stats(torch.tensor([[0.01]]))
    assert one == {"subnormal_frac": 1.0, "overflow_frac": 0.0}
    # fp8-tensor, amax 896: scale 2, so |x| / 2: 2^-7 -> 2^-8 (subnormal), 3 x 2^-6 -> 3 x 2^-7 (normal), 896 -> 448
    x = torch.zeros(2, 576)
    x[0, 0], x[0, 1], x[1, 7] = 2.0**-7, -3 * 2.0**-6, 896.0
    sch = get_q_scheme("fp8-tensor", "e4m3fn")
    v = sch.scaled_values(x)
    assert v.shape == (1152,) and (v[0].item(), v[1].item(), v[576 + 7].item()) == (2.0**-8, 3 * 2.0**-7, 448.0)
    assert sch.range_stats(x) == {"subnormal_frac": 1 / 1152, "overflow_frac": 0.0}


def test_block_scaled_values_drop_the_padding() -> None:
    """fp8-block128 over rows of 576 (blocks 128 x 4 + 64): |x / scale| per element, the last block's padding removed;
    block 0 has amax 448 (scale 1), the 64-wide last block amax 2240 (scale 5)."""
    from mlalab.quant import get_q_scheme

    for shape in ((2, 576), (1, 2, 576)):  # (rows, 576) and (tokens, heads, 576)
        x = torch.zeros(shape)
        x[..., 5], x[..., 6], x[..., 520], x[..., 521] = 448.0, -224.0, 2240.0, 1120.0
        v = get_q_scheme("fp8-block128", "e4m3fn").scaled_values(x)
        assert v.shape == (1152,)
        want = torch.zeros(shape)
        want[..., 5], want[..., 6], want[..., 520], want[..., 521] = 448.0, 224.0, 448.0, 224.0
        assert torch.equal(v, want.flatten()), shape

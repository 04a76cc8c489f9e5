"""Value oracles for every Q / KV quantisation scheme: each scheme's ``fake_quant`` equals, bit for bit, an
independent formulation written here (its groups, its scales, its element rounding through ml_dtypes or a
nearest-value table), plus hand-worked golden values. The inputs are chosen so that quantisation changes them: a
``fake_quant`` that returned its input unquantised, or used another group / scale rule, fails (each test asserts the
oracle differs from the input and, where it matters, from the neighbouring rule)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from mlalab.quant import KV_SCHEMES, MXFP4_RECIPES, Q_SCHEMES, concrete_names, get_kv_scheme, get_q_scheme

ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0, "e5m2": 57344.0}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _data(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Unit-std float32 with a few outlier channels, one all-zero row and one MX block of exact E2M1 ties:
    quantisation moves almost every value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., 7] *= 40.0
    x[..., 515] *= 9.0  # a RoPE channel
    x.reshape(-1, shape[-1])[1] = 0.0
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # a 32-block whose E2M1 scale is 1: exact ties
    x.reshape(-1, shape[-1])[2, 64:80] = torch.cat([ties, -ties])
    x.reshape(-1, shape[-1])[2, 80:96] = 0.0
    return x


Q = _data((3, 16, 576), 0)
KV = _data((12, 1, 576), 1)


# ---------------------------------------------------------------- independent formulations
def fp8_round(v: np.ndarray, fmt: str) -> np.ndarray:
    """Round to the fp8 flavour with ml_dtypes (RNE), after clamping to ± its clamp bound (saturating schemes)."""
    m = FP8_MAX[fmt]
    return np.clip(v, -m, m).astype(np.float32).astype(ML[fmt]).astype(np.float64)


def fp8_grouped(x: torch.Tensor, fmt: str, group_dims: tuple[int, ...], block: int | None = None) -> torch.Tensor:
    """Dynamic fp8 with one scale per group: amax over `group_dims` (block: per `block` channels of each row),
    scale = max(amax, 1e-12) / fp8_max in float32, value = fp8(x / scale) * scale."""
    a = x.double().numpy()
    if block is not None:
        out = np.empty_like(a)
        for s in range(0, a.shape[-1], block):
            out[..., s : s + block] = fp8_grouped(x[..., s : s + block], fmt, (-1,)).double().numpy()
        return torch.from_numpy(out).float()
    amax = np.abs(a).max(axis=group_dims, keepdims=True) if group_dims else np.abs(a).max(keepdims=True)
    scale = (np.maximum(amax, 1e-12).astype(np.float32) / np.float32(FP8_MAX[fmt])).astype(np.float32)
    v = (a.astype(np.float32) / scale).astype(np.float32)
    return torch.from_numpy((fp8_round(v, fmt) * scale).astype(np.float32))


def e2m1_round(v: np.ndarray, ties: str) -> np.ndarray:
    """Nearest E2M1 value by a table search (saturating at 6); a tie goes to the even code or away from zero."""
    a = np.minimum(np.abs(v), 6.0)
    d = np.abs(a[..., None] - E2M1)
    best = d.min(-1, keepdims=True)
    cand = d == best
    codes = np.arange(8)
    if ties == "even":
        pick = np.where((cand & (codes % 2 == 0)).any(-1), np.argmax(cand & (codes % 2 == 0), -1), np.argmax(cand, -1))
    else:  # away: the largest candidate
        pick = 7 - np.argmax(cand[..., ::-1], -1)
    return np.sign(v) * E2M1[pick]


def mx_oracle(x: torch.Tensor, rule: str, ties: str) -> torch.Tensor:
    """MXFP4, one block of 32 at a time in Python floats: the block's power-of-two scale by `rule`, E2M1 elements."""
    a = x.double().numpy().reshape(-1, 32)
    out = np.zeros_like(a)
    for i, blk in enumerate(a):
        amax = float(np.abs(blk).max())
        if amax == 0:
            continue
        mant, ex = math.frexp(amax)  # amax = mant * 2**ex, mant in [0.5, 1)
        if rule == "floor":  # OCP: floor(log2 amax) - 2
            e = (ex - 1) - 2
        elif rule == "even":  # amax rounded to a power of two, up iff its mantissa (in [1, 2)) is >= 1.75
            e = (ex - 1) + (1 if 2 * mant >= 1.75 else 0) - 2
        else:  # rceil: ceil(log2(amax / 6))
            e = math.ceil(math.log2(float(np.float32(amax) / np.float32(6.0))))
        out[i] = e2m1_round(blk / 2.0**e, ties) * 2.0**e
    return torch.from_numpy(out.reshape(x.shape)).float()


def nvfp4_oracle(x: torch.Tensor) -> torch.Tensor:
    """NVFP4: global fp32 scale amax / (448 * 6); per 16 values an e4m3 scale of (block amax / 6) / global, rounded
    by ml_dtypes; elements E2M1 (ties to even) of x / (e4m3 scale * global)."""
    a = x.float().numpy().reshape(-1, 16).astype(np.float32)
    amax = np.float32(np.abs(a).max())
    g = np.float32(amax / np.float32(448.0 * 6.0)) if amax > 0 else np.float32(1.0)
    bs = (np.abs(a).max(-1) / np.float32(6.0) / g).astype(np.float32)
    tiny = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).smallest_normal)
    s8 = np.clip(bs, tiny, 448.0).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    total = (s8 * g).astype(np.float32)
    v = (a / total[:, None]).astype(np.float32)
    return torch.from_numpy((e2m1_round(v, "even") * total[:, None]).astype(np.float32).reshape(x.shape))


def v32_oracle(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """FlashMLA V3.2: per 128 of the 512 NoPE dims a scale 2**ceil(log2(max(amax / fp8_max, 1e-4))) (math.log2 on
    Python floats), fp8 elements; the 64 RoPE dims rounded to bf16."""
    a = x.double().numpy().reshape(-1, 576)
    out = np.empty_like(a)
    for r, row in enumerate(a):
        for s in range(0, 512, 128):
            blk = row[s : s + 128].astype(np.float32).astype(np.float64)
            ratio = max(float(np.float32(np.abs(blk).max()) / np.float32(FP8_MAX[fmt])), 1e-4)
            scale = 2.0 ** math.ceil(math.log2(ratio))
            out[r, s : s + 128] = fp8_round(blk / scale, fmt) * scale
    out[:, 512:] = x.reshape(-1, 576)[:, 512:].bfloat16().double().numpy()
    return torch.from_numpy(out.reshape(x.shape)).float()


def oracle(kind: str, name: str, x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The independent value of scheme `name` (a q scheme when `kind` == "q") on `x`."""
    tok = (-2, -1)  # a token: its (16 heads, 576) for q, its (1, 576) row for KV (flat or paged)
    if name == "bf16":
        return x.bfloat16().float()
    if name in ("fp8-direct", "fp8-direct-sat"):
        return torch.from_numpy(fp8_round(x.double().numpy(), fmt).astype(np.float32))  # |x| < max here
    if name == "fp8-tensor":
        return fp8_grouped(x, fmt, ())
    if name == "fp8-tensor-bf16math":  # the competition's quantize_fp8: amax, scale and x / scale in bf16
        xb = x.bfloat16()
        scale = (xb.abs().amax().clamp(min=1e-12) / FP8_MAX[fmt]).bfloat16()
        v = (xb / scale).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).float().numpy()
        return torch.from_numpy(fp8_round(v, fmt).astype(np.float32)) * scale.float()
    if name == "fp8-token":
        return fp8_grouped(x, fmt, tok)
    if name == "fp8-head":
        return fp8_grouped(x, fmt, tuple(i for i in range(x.dim()) if i != x.dim() - 2))
    if name == "fp8-token-head":
        return fp8_grouped(x, fmt, (-1,))
    if name == "fp8-block128":
        return fp8_grouped(x, fmt, (-1,), block=128)
    if name.startswith("fp8-static:"):
        s = np.float32(float(name.split(":")[1]) / FP8_MAX[fmt])
        v = (x.numpy().astype(np.float32) / s).astype(np.float32)
        return torch.from_numpy((fp8_round(v, fmt) * s).astype(np.float32))
    if name == "fp8-flashmla-v32":
        return v32_oracle(x, fmt)
    if name in MXFP4_RECIPES:
        rule, ties = MXFP4_RECIPES[name]
        return mx_oracle(x, rule.value, "even" if ties.value == "ties-even" else "away")
    if name == "nvfp4":
        return nvfp4_oracle(x)
    raise AssertionError(f"no oracle for {kind} scheme {name}")


Q_NAMES = concrete_names(Q_SCHEMES) + ("fp8-static:3.0",)
KV_NAMES = concrete_names(KV_SCHEMES) + ("fp8-static:3.0",)


def _check(kind: str, name: str, fmt: str, x: torch.Tensor) -> None:
    s = (get_q_scheme if kind == "q" else get_kv_scheme)(name, fmt)
    got = s.fake_quant(x)
    want = oracle(kind, name, x, fmt)
    # the check can fail: the unquantised input differs from the oracle in most places
    assert float((want != x).float().mean()) > 0.5, (name, "the oracle is the identity on these inputs")
    bad = got != want
    assert not bool(bad.any()), (name, fmt, int(bad.sum()), got[bad][:4].tolist(), want[bad][:4].tolist())


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("name", Q_NAMES)
def test_q_scheme_equals_its_independent_formulation(name: str, fmt: str) -> None:
    x = Q if not name.startswith("fp8-direct") else Q / 2  # the direct cast: keep |x| below 240 (no overflow rule)
    _check("q", name, fmt, x)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("name", KV_NAMES)
def test_kv_scheme_equals_its_independent_formulation(name: str, fmt: str) -> None:
    _check("kv", name, fmt, KV)
    if name not in ("nvfp4", "fp8-tensor", "fp8-tensor-bf16math", "fp8-static:3.0"):
        paged = KV.reshape(3, 4, 1, 576)  # per-token / per-block scales do not depend on the page layout
        _check("kv", name, fmt, paged)


def test_groupings_differ_on_these_inputs() -> None:
    """The grouping oracles give different answers here, so a scheme using its neighbour's groups cannot pass."""
    f = "e4m3fn"
    outs = {n: oracle("q", n, Q, f) for n in ("fp8-tensor", "fp8-token", "fp8-head", "fp8-token-head", "fp8-block128")}
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.equal(outs[a], outs[b]), (a, b)
    kv = {n: oracle("kv", n, KV, f) for n in ("fp8-tensor", "fp8-token", "fp8-block128", "fp8-flashmla-v32")}
    assert len({tuple(v.flatten()[:2000].tolist()) for v in kv.values()}) == 4
    mx = {n: mx_oracle(KV, *r) for n, r in (("floor", ("floor", "even")), ("even", ("even", "even")),
                                             ("rceil", ("rceil", "even")), ("away", ("even", "away")))}  # fmt: skip
    assert len({tuple(v.flatten().tolist()) for v in mx.values()}) == 4


def test_flashmla_v32_golden_values() -> None:
    """Hand-worked: a block with amax 1.0 has amax / 448 = 2^-8.81, so scale 2^-8; 0.3 / 2^-8 = 76.8 rounds to 80 in
    e4m3 (step 8 in [64, 128)), i.e. 0.3125; with the unrounded scale 1/448 it would read 134.4 -> 128 -> 0.2857.
    A block of tiny values gets the 1e-4 floor: scale 2^-13 (2^ceil(log2 1e-4)); its 1.1e-6 reads back as
    1.1e-6 / 2^-13 = 0.00901 -> the e4m3 subnormal 5 * 2^-9 -> 5 * 2^-22, and its 3e-7 (0.00246) as 1 * 2^-9 -> 2^-22
    (without the floor the scale would be 2^-28 and they would read 288 * 2^-28 and 80 * 2^-28). RoPE dims: bf16."""
    x = torch.zeros(1, 1, 576)
    x[0, 0, 0], x[0, 0, 1] = 1.0, 0.3
    x[0, 0, 128], x[0, 0, 129] = 1.1e-6, 3e-7
    x[0, 0, 600 - 64] = 1.0 + 2.0**-10  # RoPE: bf16 keeps 8 bits, so 1 + 2^-10 -> 1.0
    y = get_kv_scheme("fp8-flashmla-v32").fake_quant(x)[0, 0]
    assert y[0].item() == 1.0 and y[1].item() == 0.3125
    assert y[128].item() == 5 * 2.0**-22 and y[129].item() == 2.0**-22
    assert y[536].item() == 1.0


def test_flashmla_v32_power_of_two_ratio_keeps_its_scale() -> None:
    """amax 448 = 448 x 2^0: the ratio is exactly 1, so the scale is 2^ceil(log2 1) = 1 (not 2); 0.01 then reads back
    as the e4m3 subnormal 5 x 2^-9 = 0.009765625 (0.01 / 2^-9 = 5.12); with scale 2 it would be 3 x 2^-8. Same at
    amax 56 = 448 x 2^-3 (scale 2^-3): 0.00125 / 2^-3 / 2^-9 = 5.12 -> 5 x 2^-12 (with scale 2^-2: 6 x 2^-12)."""
    x = torch.zeros(1, 1, 576)
    x[0, 0, 0], x[0, 0, 1] = 448.0, 0.01
    x[0, 0, 128], x[0, 0, 129] = 56.0, 0.00125
    y = get_kv_scheme("fp8-flashmla-v32").fake_quant(x)[0, 0]
    assert y[:2].tolist() == [448.0, 5 * 2.0**-9] and y[128:130].tolist() == [56.0, 5 * 2.0**-12]


def test_fp8_token_golden_values() -> None:
    """Hand-worked per-token scales on q: token 0's amax is 448 (in head 5), so its scale is 1 and 1.1 reads back as
    the e4m3 neighbour 1.125; token 1's amax is 0.5 (scale 0.5 / 448) so 0.3 reads back as 0.3 * 448 / 0.5 = 268.8
    -> 256 (step 32 in [256, 448]) -> 0.2857; per-tensor (amax 448) would give token 1 the scale 1: 0.3 -> 0.3125."""
    q = torch.zeros(2, 16, 576)
    q[0, 5, 0], q[0, 0, 1] = 448.0, 1.1
    q[1, 0, 0], q[1, 3, 1] = 0.5, 0.3
    tok = get_q_scheme("fp8-token").fake_quant(q)
    assert tok[0, 0, 1].item() == 1.125
    assert tok[1, 3, 1].item() == float(torch.tensor(256.0) * (torch.tensor(0.5) / 448))  # (float32 scale)
    assert get_q_scheme("fp8-tensor").fake_quant(q)[1, 3, 1].item() == 0.3125
    assert get_kv_scheme("fp8-token").bytes_per_token == 580 and get_q_scheme("fp8-token").bytes_per_token == 576.25


def test_nvfp4_golden_values() -> None:
    """Hand-worked two-level scales: tensor amax 6 * 448 = 2688 gives global scale 1; a block with amax 6 gets e4m3
    scale 1 and its 2.6 reads back as 3 (nearest E2M1); a block with amax 12 gets scale 2 and 5.0 -> 2.5 is an exact
    E2M1 tie between 2 and 3: ties to even -> 2 (code 4) -> 4.0."""
    x = torch.zeros(1, 1, 576)
    x[0, 0, 0] = 2688.0
    x[0, 0, 16], x[0, 0, 17] = 6.0, 2.6
    x[0, 0, 32], x[0, 0, 33] = 12.0, 5.0
    y = get_kv_scheme("nvfp4").fake_quant(x)[0, 0]
    assert y[0].item() == 2688.0 and y[16].item() == 6.0 and y[17].item() == 3.0
    assert y[32].item() == 12.0 and y[33].item() == 4.0


def test_bytes_per_token_of_every_scheme_hand_computed() -> None:
    """576 values per row: 2 B each in bf16, 1 B in fp8, plus fp32 scales (a q token's one scale is shared by its 16
    rows: 4/16 B per row; block128: 5 scales), V3.2 512 fp8 + 4 fp32 + 64 bf16, MXFP4 288 + 18 E8M0, NVFP4 288 + 36
    E4M3."""
    q = {
        "bf16": 1152,
        "fp8-direct": 576,
        "fp8-direct-sat": 576,
        "fp8-tensor": 576,
        "fp8-tensor-bf16math": 576,
        "fp8-token": 576.25,
        "fp8-head": 576,
        "fp8-token-head": 580,
        "fp8-block128": 596,
        "fp8-static:3.0": 576,
    }
    kv = {"bf16": 1152, "fp8-tensor": 576, "fp8-tensor-bf16math": 576, "fp8-token": 580, "fp8-block128": 596,
          "fp8-static:3.0": 576, "fp8-flashmla-v32": 656, "nvfp4": 324} | dict.fromkeys(MXFP4_RECIPES, 306)  # fmt: skip
    assert set(q) == set(Q_NAMES) and set(kv) == set(KV_NAMES)
    for n, b in q.items():
        assert get_q_scheme(n).bytes_per_token == b, n
    for n, b in kv.items():
        assert get_kv_scheme(n).bytes_per_token == b, n


def test_mx_even_rule_at_the_exact_rounding_edge() -> None:
    """The even rule rounds amax up to the next power of two iff its mantissa is >= 1.75 (add 0x200000 to the fp32
    bits): 1.75 * 2^k goes up, the fp32 value just below it does not. Exponents by hand: e = log2(rounded) - 2."""
    import torch

    from mlalab.quant.mx import mx_scale_exponent

    below = torch.nextafter(torch.tensor(1.75), torch.tensor(0.0))
    amax = torch.stack([torch.tensor(1.75), below, torch.tensor(7.0), torch.nextafter(torch.tensor(7.0),
                        torch.tensor(0.0)), torch.tensor(1.0), torch.tensor(0.0)]).float()  # fmt: skip
    assert mx_scale_exponent(amax, "even").tolist() == [-1, -2, 1, 0, -2, -127]
    for bad in (torch.tensor([-1.0]), torch.tensor([float("inf")]), torch.tensor([float("nan")])):
        with pytest.raises(ValueError, match="amax must be non-negative and finite"):
            mx_scale_exponent(bad, "even")

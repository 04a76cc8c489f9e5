"""fp4 KV caches for the GPU: `Fp4Cache` (what the decode kernels read) and `quantize_kv_fp4`, a Triton kernel that
writes it from the bf16 cache bit for bit as `mlalab.quant.mx` does on the CPU.

One token row holds 576 values. Its E2M1 codes are packed two per byte, the even index in the low nibble (aiter's and
the GPU MODE problem's layout): 288 bytes. Its block scales follow in their own tensor:

* MXFP4 (`mlalab.quant.mx.mxfp4_quantize`): one E8M0 byte per 32 values, 18 per token (306 bytes in all). The
  scale rule and the E2M1 tie rule come from the recipe (`mlalab.quant.MXFP4_RECIPES`: ``mxfp4-aiter`` = rule
  ``even`` + ties away from zero, aiter's ``dynamic_mxfp4_quant``; ``mxfp4-ocp``, ``mxfp4-rceil``,
  ``mxfp4-torchao-even``).
* NVFP4 (`mlalab.quant.mx.nvfp4_quantize`): one E4M3 scale per 16 values, 36 per token (324 bytes), and one fp32
  scale for the whole cache (``amax / (448·6)``); elements rounded ties-to-even.

The kernel reproduces the CPU arithmetic step by step: block amax in fp32 (exact); MXFP4's exponent from the amax's
bits (``even``: the amax rounded to a power of two, ``floor``: its floor log2, ``rceil``: ceil log2 of amax / 6, an
fp32 division rounded to nearest), ``x · 2^-e`` as one fp32 multiply; NVFP4's block scale ``amax / 6 / g`` (fp32
divisions rounded to nearest) clamped to E4M3's normal range and rounded to E4M3 (nearest, ties even), ``x / (s·g)``
in fp32; E2M1 by
comparing the magnitude with the midpoints between its values (ties by the recipe's rule), the sign from the sign
bit (so -0 and negatives that round to 0 keep it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..checks import check_tensor
from ..quant import MXFP4_RECIPES
from ..quant.mx import MX_BLOCK, NVFP4_BLOCK, mxfp4_dequantize, nvfp4_dequantize

__all__ = ["FP4_FORMATS", "FP4_RECIPES", "DEFAULT_RECIPES", "Fp4Cache", "quantize_kv_fp4", "to_fp4_cache",
           "E4M3_SHIFT", "E4M3_WINDOW", "E4M3_MIN_SCALE", "e4m3_residuals"]  # fmt: skip

#: Block size of each fp4 KV format.
FP4_FORMATS = {"mxfp4": MX_BLOCK, "nvfp4": NVFP4_BLOCK}

#: The recipes `quantize_kv_fp4` writes: every MXFP4 recipe of `mlalab.quant` and ``nvfp4``.
FP4_RECIPES = (*MXFP4_RECIPES, "nvfp4")

#: The recipe a precision's fp4 KV is written with unless told otherwise: aiter's MXFP4 (the GPU MODE 2026 problem's
#: cache, bit for bit) and NVFP4's one recipe.
DEFAULT_RECIPES = {"mxfp4": "mxfp4-aiter", "nvfp4": "nvfp4"}

_DIM = 576  # values per token
_RULES = {"floor": 0, "even": 1, "rceil": 2}


@dataclass(frozen=True)
class Fp4Cache:
    """A KV cache in a block-scaled fp4 format, rows of 576 values.

    Attributes:
        codes: ``(rows, 288)`` uint8, two E2M1 codes per byte (even index in the low nibble).
        scales: ``(rows, 18)`` uint8 E8M0 (MXFP4) or ``(rows, 36)`` float8_e4m3fn (NVFP4).
        global_scale: ``(1,)`` float32: NVFP4's per-cache scale; 1.0 for MXFP4.
        recipe: the `mlalab.quant` KV scheme it was written with (`FP4_RECIPES`).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    recipe: str

    def __post_init__(self) -> None:
        if self.recipe not in FP4_RECIPES:
            raise ValueError(f"Fp4Cache.recipe must be one of {', '.join(FP4_RECIPES)}, got {self.recipe!r}")
        check_tensor("Fp4Cache.codes", self.codes, ndim=2, dtypes=(torch.uint8,))
        if self.codes.shape[1] != _DIM // 2:
            raise ValueError(f"Fp4Cache.codes must have {_DIM // 2} bytes per row (576 packed E2M1 codes), got "
                             f"{self.codes.shape[1]}")  # fmt: skip
        rows, block = self.codes.shape[0], self.block
        dtype = torch.uint8 if self.fmt == "mxfp4" else torch.float8_e4m3fn
        check_tensor("Fp4Cache.scales", self.scales, dtypes=(dtype,))
        if tuple(self.scales.shape) != (rows, _DIM // block):
            raise ValueError(f"Fp4Cache.scales must be ({rows}, {_DIM // block}): one {self.fmt} scale per {block} "
                             f"values of each of the {rows} rows, got {tuple(self.scales.shape)}")  # fmt: skip
        check_tensor("Fp4Cache.global_scale", self.global_scale, shape=(1,), dtypes=(torch.float32,))
        if len({self.codes.device, self.scales.device, self.global_scale.device}) != 1:
            raise ValueError("Fp4Cache tensors must be on one device")

    @property
    def fmt(self) -> str:
        """``"mxfp4"`` or ``"nvfp4"``."""
        return "nvfp4" if self.recipe == "nvfp4" else "mxfp4"

    @property
    def block(self) -> int:
        return FP4_FORMATS[self.fmt]

    @property
    def rows(self) -> int:
        return int(self.codes.shape[0])

    def dequantize(self) -> torch.Tensor:
        """The values the cache holds, ``(rows, 576)`` float32 on the CPU (`mlalab.quant.mx`'s decoders)."""
        codes, scales = self.codes.cpu(), self.scales.cpu()
        if self.fmt == "mxfp4":
            return mxfp4_dequantize(codes, scales)
        return nvfp4_dequantize(codes, scales, self.global_scale.cpu())


@triton.jit
def _pow2(p):
    """2^p as fp32 for integer p in [-127, 127] (2^-127 is fp32's subnormal 0x00400000)."""
    bits = tl.where(p >= -126, (p + 127) << 23, 0x00400000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _floor_log2(a):
    """floor(log2 a) of positive finite fp32 `a`, from its bits (subnormals scaled by 2^64 first: exact)."""
    sub = a < 1.1754943508222875e-38
    a = tl.where(sub, tl.where(sub, a, 1.0) * 18446744073709551616.0, a)
    return ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127 - tl.where(sub, 64, 0)


@triton.jit
def _ceil_log2(y):
    """ceil(log2 y) of positive finite fp32 `y`: floor, plus one unless y is a power of two."""
    sub = y < 1.1754943508222875e-38
    ys = tl.where(sub, tl.where(sub, y, 1.0) * 18446744073709551616.0, y)
    mant = ys.to(tl.int32, bitcast=True) & 0x7FFFFF
    return _floor_log2(y) + tl.where(mant != 0, 1, 0)


@triton.jit
def _mx_exponent(amax, RULE: tl.constexpr):
    """The MXFP4 scale exponent of blocks with amax `amax` (fp32 >= 0) under `RULE` (0 floor, 1 even, 2 rceil),
    clamped to [-127, 127]; -127 for an all-zero block (`mlalab.quant.mx.mx_scale_exponent`)."""
    zero = amax == 0.0
    a = tl.where(zero, 1.0, amax)
    if RULE == 0:
        e = _floor_log2(a) - 2
    elif RULE == 1:
        biased = ((a.to(tl.int32, bitcast=True) + 0x200000) >> 23) & 0xFF
        e = tl.where(biased == 0xFF, 127, tl.where(biased == 0, -127, biased - 129))
    else:
        e = _ceil_log2(tl.math.div_rn(a, 6.0))
    e = tl.where(zero, -127, e)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def _e2m1_code(v, TIES_AWAY: tl.constexpr):
    """E2M1 code (0..15, bit 3 the sign) of fp32 `v`: nearest value, saturating at 6, ties away from zero or to the
    even code (`mlalab.quant.formats.e2m1_encode`)."""
    a = tl.minimum(tl.abs(v), 6.0)
    up = ((a >= 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a >= 1.25).to(tl.int32) + (a >= 1.75).to(tl.int32)
          + (a >= 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a >= 5.0).to(tl.int32))  # fmt: skip
    if TIES_AWAY:
        code = up
    else:
        tie = (a == 0.25) | (a == 0.75) | (a == 1.25) | (a == 1.75) | (a == 2.5) | (a == 3.5) | (a == 5.0)
        code = tl.where(tie & ((up & 1) == 1), up - 1, up)
    return code | (((v.to(tl.int32, bitcast=True) >> 31) & 1) << 3)


@triton.jit
def _e4m3_rne(s):
    """Round fp32 `s` in [2^-6, 448] (E4M3's normal range) to the nearest E4M3 value, ties to even: ``(value as
    fp32, E4M3 byte)``."""
    bits = s.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & ~0xFFFFF  # keep 3 mantissa bits
    code = ((((bits >> 23) & 0xFF) - 120) << 3) | ((bits >> 20) & 7)
    return bits.to(tl.float32, bitcast=True), code


@triton.jit
def _quantize_fp4_kernel(X, CODES, SCALES, GSCALE, stride_x, NB: tl.constexpr, NB_P2: tl.constexpr,
                         BLOCK: tl.constexpr, NVFP4: tl.constexpr, RULE: tl.constexpr,
                         TIES_AWAY: tl.constexpr):  # fmt: skip
    """One token row per program: its NB blocks of BLOCK values (NB_P2 >= NB, a power of two, masked)."""
    row = tl.program_id(0).to(tl.int64)
    offs_b = tl.arange(0, NB_P2)
    offs_v = tl.arange(0, BLOCK)
    live = offs_b < NB
    x = tl.load(X + row * stride_x + offs_b[:, None] * BLOCK + offs_v[None, :], mask=live[:, None], other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    if NVFP4:
        g = tl.load(GSCALE)
        bs = tl.math.div_rn(tl.math.div_rn(amax, 6.0), g)
        s8, s_code = _e4m3_rne(tl.minimum(tl.maximum(bs, 0.015625), 448.0))
        total = s8 * g
        v = tl.math.div_rn(x, total[:, None])
        v = tl.minimum(tl.maximum(v, -6.0), 6.0)
        codes = _e2m1_code(v, False)
        tl.store(SCALES + row * NB + offs_b, s_code.to(tl.uint8), mask=live)
    else:
        e = _mx_exponent(amax, RULE)
        codes = _e2m1_code(x * _pow2(-e)[:, None], TIES_AWAY)
        tl.store(SCALES + row * NB + offs_b, (e + 127).to(tl.uint8), mask=live)
    lo, hi = tl.split(tl.reshape(codes, [NB_P2, BLOCK // 2, 2]))
    packed = (lo | (hi << 4)).to(tl.uint8)
    offs_p = tl.arange(0, BLOCK // 2)
    tl.store(CODES + row * (NB * BLOCK // 2) + offs_b[:, None] * (BLOCK // 2) + offs_p[None, :], packed,
             mask=live[:, None])  # fmt: skip


def _check_rows(kv: torch.Tensor, recipe: str) -> None:
    """What both quantisers need: a known recipe and finite bf16 / fp32 rows of 576 values."""
    if recipe not in FP4_RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(FP4_RECIPES)}, got {recipe!r}")
    check_tensor("kv", kv, ndim=2, dtypes=(torch.bfloat16, torch.float32))
    if kv.shape[1] != _DIM:
        raise ValueError(f"kv must have {_DIM} values per row (rows, 576), got {kv.shape[1]}")
    if kv.numel() and not bool(torch.isfinite(kv).all()):
        raise ValueError("kv contains non-finite values; block scales would be undefined")


def quantize_kv_fp4(kv: torch.Tensor, recipe: str = "mxfp4-aiter") -> Fp4Cache:
    """Quantise KV rows ``(rows, 576)`` (bf16 or fp32, finite; on the GPU, or on the CPU under
    ``TRITON_INTERPRET=1``) to `recipe` (`FP4_RECIPES`) with the Triton kernel: bit for bit `mlalab.quant.mx`'s
    ``mxfp4_quantize`` / ``nvfp4_quantize`` of the same rows."""
    _check_rows(kv, recipe)
    kv = kv.contiguous()
    nvfp4 = recipe == "nvfp4"
    block = NVFP4_BLOCK if nvfp4 else MX_BLOCK
    nb = _DIM // block
    rows, dev = kv.shape[0], kv.device
    codes = torch.empty((rows, _DIM // 2), dtype=torch.uint8, device=dev)
    scales = torch.empty((rows, nb), dtype=torch.uint8, device=dev)
    if nvfp4:  # the per-cache scale, as `nvfp4_quantize` computes it: amax / (448 * 6) in float64, then fp32
        amax = kv.abs().amax().double() if rows else torch.zeros((), dtype=torch.float64, device=dev)
        g = torch.where(amax > 0, amax / (448.0 * 6.0), torch.ones_like(amax)).float().reshape(1)
    else:
        g = torch.ones(1, dtype=torch.float32, device=dev)
    if rows:
        rule, ties_away = 0, False
        if not nvfp4:
            rule, rounding = MXFP4_RECIPES[recipe]
            rule, ties_away = _RULES[rule.value], rounding.value == "ties-away"
        _quantize_fp4_kernel[(rows,)](
            kv, codes, scales, g, kv.stride(0), NB=nb, NB_P2=triton.next_power_of_2(nb), BLOCK=block, NVFP4=nvfp4,
            RULE=rule, TIES_AWAY=ties_away,
        )  # fmt: skip
    return Fp4Cache(codes, scales.view(torch.float8_e4m3fn) if nvfp4 else scales, g, recipe)


def to_fp4_cache(kv: torch.Tensor, recipe: str = "mxfp4-aiter") -> Fp4Cache:
    """`kv` rows ``(rows, 576)`` as an `Fp4Cache` of `recipe`, on `kv`'s device: the Triton quantiser on a GPU (and
    under ``TRITON_INTERPRET=1``), `mlalab.quant.mx`'s on the CPU (the same bits)."""
    from ..quant.mx import mxfp4_quantize, nvfp4_quantize

    if kv.device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1":
        return quantize_kv_fp4(kv, recipe)
    _check_rows(kv, recipe)
    if recipe == "nvfp4":
        return Fp4Cache(*nvfp4_quantize(kv), recipe)
    codes, scales = mxfp4_quantize(kv, *MXFP4_RECIPES[recipe])
    return Fp4Cache(codes, scales, torch.ones(1), recipe)


#: The e4m3 route of the sm_90 kernel (fp8 q with MXFP4 KV, `mlalab.kernels.sm90.fp4tiles`): each token's values are
#: ``2^F`` times e4m3 codes, so both products run on fp8 wgmma. A token's largest block scale 2^(E-127) becomes
#: ``2^E4M3_SHIFT`` in the residual (its E2M1 values up to 6 · 2^6 = 384, e4m3fn's largest being 448) ...
E4M3_SHIFT = 6
#: ... and a block whose scale is at most `E4M3_WINDOW` binades below the token's largest keeps every E2M1 value
#: exactly (E2M1 × 2^j is a normal e4m3 for j = -5 .. 6: its code is a table entry plus j in the exponent field);
#: blocks further down are flushed to zero (their values are below 6 · 2^-11 of the largest block's scale, i.e. under
#: 2^-9.4 of that block's own rounding step).
E4M3_WINDOW = 11
#: E8M0 floor of the token exponent: F >= E4M3_MIN_SCALE - 127 - E4M3_SHIFT = -100, so that 2^-F (a token's weight in
#: the softmax sum) stays a normal fp32 below 2^100. Tokens whose largest block scale is under 2^-94 are treated as if
#: it were 2^-94 (their blocks below 2^-105 are flushed).
E4M3_MIN_SCALE = 33


def e4m3_residuals(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 rows as the sm_90 e4m3 route holds them, computed on the CPU: ``(residuals, exponents)``, residuals
    ``(rows, 576)`` e4m3fn codes as uint8 and exponents ``(rows,)`` int32, with each value equal to
    ``e4m3(residual) · 2^F`` exactly, except blocks more than `E4M3_WINDOW` binades below the token's largest scale,
    which are ±0 (signs kept). ``F = max(E, E4M3_MIN_SCALE) - 127 - E4M3_SHIFT`` where E is the token's largest E8M0
    byte; F = 122 (E = 255) marks a token with a NaN block scale, which the kernel decodes as NaN scores.

    `codes`: ``(rows, 288)`` uint8, two E2M1 codes per byte (even index in the low nibble); `scales`: ``(rows, 18)``
    uint8 E8M0 (`Fp4Cache` of an MXFP4 recipe)."""
    check_tensor("codes", codes, ndim=2, dtypes=(torch.uint8,))
    check_tensor("scales", scales, ndim=2, dtypes=(torch.uint8,))
    if codes.shape[1] != _DIM // 2 or tuple(scales.shape) != (codes.shape[0], _DIM // MX_BLOCK):
        raise ValueError(f"codes must be (rows, {_DIM // 2}) and scales (rows, {_DIM // MX_BLOCK}) (MXFP4), got "
                         f"{tuple(codes.shape)} and {tuple(scales.shape)}")  # fmt: skip
    c = codes.cpu().to(torch.int64)
    nib = torch.stack([c & 15, c >> 4], -1).reshape(c.shape[0], _DIM)
    s = scales.cpu().to(torch.int64)
    e = torch.clamp(s.amax(1, keepdim=True) if s.shape[0] else s[:, :1], min=E4M3_MIN_SCALE)
    j = (s - e + E4M3_SHIFT).repeat_interleave(MX_BLOCK, dim=1)  # the block's binade in the residual
    # E2M1 magnitude m (1..7) at j = -5: e4m3 codes 0x08, 0x10, 0x14, 0x18, 0x1C, 0x20, 0x24; j adds to the exponent
    base = torch.tensor([0x00, 0x08, 0x10, 0x14, 0x18, 0x1C, 0x20, 0x24], dtype=torch.int64)[nib & 7]
    keep = (j >= E4M3_SHIFT - E4M3_WINDOW) & (base > 0)
    mag = torch.where(keep, base + ((j - (E4M3_SHIFT - E4M3_WINDOW)) << 3), 0)
    res = (mag | ((nib & 8) << 4)).to(torch.uint8)
    return res, (e[:, 0] - 127 - E4M3_SHIFT).to(torch.int32)

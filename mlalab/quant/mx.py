"""Block-scaled fp4: MXFP4 (E2M1 elements, one E8M0 power-of-two scale per 32) and NVFP4 (E2M1, one E4M3
scale per 16, one fp32 scale per tensor).

An MXFP4 recipe is two independent choices: the block's *scale rule* (`MxScaleRule`, which power of two X = 2**e
the block is divided by) and the *element rounding* (`mlalab.quant.formats.E2M1Rounding`, which E2M1 value an
exact tie of v / X goes to). `mxfp4_quantize` takes both; the KV schemes of `mlalab.quant.schemes` name the
combinations systems use (``mxfp4-aiter`` = scale rule ``even`` + elements ties away from zero, aiter's
``dynamic_mxfp4_quant`` bit for bit).

An all-zero block gets e = -127 (E8M0 0x00) and codes 0, so it dequantizes to exact zeros.
"""

from __future__ import annotations

import enum

import torch

from ..checks import check_tensor
from .formats import (
    E2M1_MAX,
    E2M1Rounding,
    e2m1_decode,
    e2m1_encode,
    e8m0_from_exponent,
    e8m0_to_float,
    pack_e2m1,
    tensor_amax,
    to_float32_exact_for_rounding,
    true_div,
    unpack_e2m1,
)

__all__ = [
    "MxScaleRule",
    "mx_scale_exponent",
    "mxfp4_quantize",
    "mxfp4_dequantize",
    "mxfp4_fake_quant",
    "nvfp4_quantize",
    "nvfp4_dequantize",
    "nvfp4_fake_quant",
    "MX_BLOCK",
    "NVFP4_BLOCK",
]

MX_BLOCK = 32
NVFP4_BLOCK = 16
_E2M1_EMAX = 2  # exponent of E2M1's largest normal (6 = 1.5 * 2**2)
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class MxScaleRule(enum.Enum):
    """How an MX block's power-of-two scale X = 2**e is chosen from its amax (elements are then E2M1(v / X)). These
    rules pick the *scale*; how a tie between two E2M1 values is broken is `E2M1Rounding`, a separate choice.

    * ``FLOOR`` ("floor"; OCP MX v1.0 §6.3, torchao ``ScaleCalculationMode.FLOOR``): e = floor(log2 amax) - 2.
      amax / X lands in [4, 8): values in (6, 8) saturate to 6 (up to 25 % error on the block max).
    * ``EVEN`` ("even"; aiter's ``dynamic_mxfp4_quant`` ``scaling_mode="even"``, AMD Quark's ``even_round``,
      torchao ``ScaleCalculationMode.EVEN``): amax is first rounded to a power of two — up iff its mantissa is
      >= 1.75 (add 0x200000 to the fp32 bits, clear the mantissa) — then e = log2 of that - 2, clamped to
      [-127, 127]. amax / X lands in [3.5, 7). An amax that rounds past fp32's range (>= 1.75 * 2**127) gets
      e = 127 and one that rounds to 0 (a subnormal below 0.75 * 2**-126) e = -127, as aiter's kernel computes them
      (log2 of inf and of 0, clamped). The name says how amax is rounded; it is not a rule for element ties.
    * ``RCEIL`` ("rceil"; NVIDIA's MX hardware recipe, aiter RoundUp, torchao ``ScaleCalculationMode.RCEIL``):
      e = ceil(log2(amax / 6)). Never clips, may waste a binade.
    """

    FLOOR = "floor"  # OCP MX spec, torchao FLOOR
    EVEN = "even"  # aiter dynamic_mxfp4_quant, AMD Quark even_round, torchao EVEN
    RCEIL = "rceil"  # NVIDIA, aiter RoundUp, torchao RCEIL

    @classmethod
    def parse(cls, rule: str | MxScaleRule) -> MxScaleRule:
        """The member named `rule` (its value, e.g. "even"); a member is returned as is."""
        if isinstance(rule, MxScaleRule):
            return rule
        try:
            return cls(rule)
        except ValueError:
            valid = ", ".join(r.value for r in cls)
            raise ValueError(f"unknown MX scale rule {rule!r} for 'rule'; valid: {valid}") from None


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """Exact floor(log2 a) for positive finite fp32 (frexp: a = m * 2**k, m in [0.5, 1))."""
    _, k = torch.frexp(a)
    return k.to(torch.int32) - 1


def mx_scale_exponent(amax: torch.Tensor, rule: str | MxScaleRule) -> torch.Tensor:
    """Block amax (fp32, >= 0, finite) -> scale exponent e (int32, clamped to [-127, 127]) under `rule`."""
    r = MxScaleRule.parse(rule)
    check_tensor("amax", amax, dtypes=(torch.float32,))
    if bool((amax < 0).any()) or not bool(torch.isfinite(amax).all()):
        raise ValueError("amax must be non-negative and finite")
    zero = amax == 0
    a = torch.where(zero, torch.ones_like(amax), amax)
    if r is MxScaleRule.FLOOR:
        e = _floor_log2(a) - _E2M1_EMAX
    elif r is MxScaleRule.EVEN:
        bits = a.view(torch.int32)
        biased = ((bits + 0x200000) >> 23) & 0xFF  # exponent field of amax rounded to a power of two
        e = biased - 127 - _E2M1_EMAX
        e = torch.where(biased == 0xFF, 127, torch.where(biased == 0, -127, e))  # log2(inf) / log2(0), clamped
    else:
        y = true_div(a, E2M1_MAX)  # fp32 division, as the kernels do
        m, k = torch.frexp(y)
        e = torch.where(m == 0.5, k - 1, k).to(torch.int32)  # ceil(log2 y), exact
    e = torch.where(zero, torch.full_like(e, -127), e)
    return e.clamp(-127, 127)


def _blocks(name: str, x: torch.Tensor, block: int) -> torch.Tensor:
    check_tensor(name, x, dtypes=_FLOATS)
    if x.dim() < 1 or x.shape[-1] % block:
        raise ValueError(
            f"{name}'s last dim ({x.shape[-1] if x.dim() else 'scalar'}) must be a multiple of the block size {block}"
        )
    xf = to_float32_exact_for_rounding(x)  # float64: no double rounding (MX scales are powers of two: exact)
    if not bool(torch.isfinite(xf).all()):
        n = int((~torch.isfinite(xf)).sum())
        raise ValueError(f"{name} contains {n} non-finite values; block scales would be undefined")
    return xf.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def mxfp4_quantize(
    x: torch.Tensor, rule: str | MxScaleRule, rounding: str | E2M1Rounding
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 along the last dim with scale rule `rule` and E2M1 element rounding `rounding`: returns (packed uint8
    (..., N/2), E8M0 scales uint8 (..., N/32)). The elements are E2M1(x * 2**-e) of the fp32 value (float64 input is
    narrowed to fp32 by round-to-odd first, so the result is that of rounding x itself)."""
    r = MxScaleRule.parse(rule)
    rnd = E2M1Rounding.parse(rounding)
    xb = _blocks("x", x, MX_BLOCK)
    e = mx_scale_exponent(xb.abs().amax(-1), r)
    v = torch.ldexp(xb, -e.unsqueeze(-1))  # x * 2**-e in fp32: exact unless it falls below fp32's normals
    codes = e2m1_encode(v, rnd).reshape(x.shape)
    return pack_e2m1(codes), e8m0_from_exponent(e)


def mxfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of `mxfp4_quantize` (float32)."""
    check_tensor("packed", packed, dtypes=(torch.uint8,))
    check_tensor("scales", scales, dtypes=(torch.uint8,))
    vals = e2m1_decode(unpack_e2m1(packed))
    n = vals.shape[-1]
    if scales.shape != (*vals.shape[:-1], n // MX_BLOCK):
        raise ValueError(f"scales must have shape {(*vals.shape[:-1], n // MX_BLOCK)}, got {tuple(scales.shape)}")
    vb = vals.reshape(*vals.shape[:-1], n // MX_BLOCK, MX_BLOCK) * e8m0_to_float(scales).unsqueeze(-1)
    return vb.reshape(vals.shape)


def mxfp4_fake_quant(x: torch.Tensor, rule: str | MxScaleRule, rounding: str | E2M1Rounding) -> torch.Tensor:
    """`mxfp4_quantize` then `mxfp4_dequantize`: x as MXFP4 reads it back (float32)."""
    return mxfp4_dequantize(*mxfp4_quantize(x, rule, rounding))


def nvfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 along the last dim (torchao's two-level recipe): returns (packed uint8 (..., N/2), E4M3 block
    scales (..., N/16), fp32 global scale (1,)). Global scale = amax / (448 * 6); an all-zero tensor gets
    global scale 1 and zero codes."""
    xb = _blocks("x", x, NVFP4_BLOCK)
    amax = tensor_amax(xb)  # (an empty tensor: 0, like an all-zero one)
    g = true_div(amax, 448.0 * E2M1_MAX) if float(amax) > 0 else torch.ones((), device=x.device)
    g = g.reshape(1).float()
    block_scale = true_div(xb.abs().amax(-1), E2M1_MAX) / g
    s8 = block_scale.clamp(min=torch.finfo(torch.float8_e4m3fn).tiny, max=448.0).to(torch.float8_e4m3fn)
    total = s8.float() * g
    v = (xb / total.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)
    codes = e2m1_encode(v).reshape(x.shape)
    return pack_e2m1(codes), s8, g


def nvfp4_dequantize(packed: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `nvfp4_quantize` (float32)."""
    check_tensor("packed", packed, dtypes=(torch.uint8,))
    check_tensor("block_scales", block_scales, dtypes=(torch.float8_e4m3fn,))
    check_tensor("global_scale", global_scale, shape=(1,), dtypes=(torch.float32,))
    vals = e2m1_decode(unpack_e2m1(packed))
    n = vals.shape[-1]
    vb = vals.reshape(*vals.shape[:-1], n // NVFP4_BLOCK, NVFP4_BLOCK)
    vb = vb * (block_scales.float() * global_scale).unsqueeze(-1)
    return vb.reshape(vals.shape)


def nvfp4_fake_quant(x: torch.Tensor) -> torch.Tensor:
    """`nvfp4_quantize` then `nvfp4_dequantize` (float32)."""
    return nvfp4_dequantize(*nvfp4_quantize(x))

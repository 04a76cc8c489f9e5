"""Quantization schemes for Q and the KV cache: a format plus a scaling rule, each a frozen dataclass.

Every scheme has ``.name``, ``.fake_quant(x) -> float32`` (quantize, then dequantize; pure and deterministic)
and ``.bytes_per_token`` (bytes for one 576-dim row including scale storage; for KV this is bytes per KV
token, for Q per (token, head) row).

Granularities of the fp8 schemes, for q ``(total_q, 16, 576)``, kv ``(total_kv, 1, 576)`` or paged kv
``(pages, page, 1, 576)``:

* ``tensor``: one scale; ``token``: one per token (q: all 16 heads of a query token; kv: one row of 576);
  ``head``: one per head across all tokens; ``token-head``: one per row of 576; ``block128``: one per
  128 channels of each row — 576 = 4 x 128 + 64, the last block is 64 wide (DeepSeek-V3's 1x128 tiles; any
  block size that does not divide the row gets a shorter last block, documented here, not an error).

Scales are amax / fp8_max in float32, with amax floored at 1e-12 so an all-zero group quantizes to exact zeros
(the competition's ``clamp(min=1e-12)``). Dynamic-scale schemes refuse NaN/inf inputs (ValueError): the amax,
hence every scale, would be meaningless. ``fp8-direct`` (scale 1) and ``fp8-static:<amax>`` do not look at the
data: NaN stays NaN and out-of-range values follow the scheme's ``overflow`` rule, which is reported.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Literal

import torch

from ..checks import check_tensor
from ..config import MLA
from .formats import E2M1Rounding, Fp8Format, Overflow, encode_fp8, get_fp8_format, tensor_amax, true_div
from .mx import MxScaleRule, mxfp4_fake_quant, nvfp4_fake_quant

__all__ = [
    "Granularity",
    "Bf16Scheme",
    "Fp8Scheme",
    "FlashMLAV32Scheme",
    "MxFp4Scheme",
    "MXFP4_RECIPES",
    "NvFp4Scheme",
    "QScheme",
    "KVScheme",
    "Q_SCHEMES",
    "KV_SCHEMES",
    "get_q_scheme",
    "get_kv_scheme",
    "quantize_fp8_per_tensor",
    "fp8_scale",
]

D = 576  # one latent row
AMAX_FLOOR = 1e-12
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class Granularity(enum.Enum):
    DIRECT = "direct"  # scale 1: the seeds' q.to(fp8) shortcut
    TENSOR = "tensor"
    TOKEN = "token"
    HEAD = "head"
    TOKEN_HEAD = "token-head"
    BLOCK = "block"
    STATIC = "static"


def _check_x(x: object) -> torch.Tensor:
    t = check_tensor("x", x, dtypes=_FLOATS)
    if t.dim() < 2:
        raise ValueError(f"x must have at least 2 dims (..., heads, {D}); got shape {tuple(t.shape)}")
    return t


def _check_finite_for_scale(x: torch.Tensor, scheme: str) -> None:
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        raise ValueError(
            f"{scheme}: x contains {int(bad.sum())} NaN/inf values; a data-dependent scale would be undefined "
            "(use fp8-direct or fp8-static:<amax> to study overflow)"
        )


def _group_amax(xf: torch.Tensor, g: Granularity, block: int) -> torch.Tensor:
    """amax broadcastable to xf (block granularity: shape (..., nblocks, 1) of the padded view)."""
    a = xf.abs()
    if g is Granularity.TENSOR:
        return a.amax().reshape([1] * xf.dim())
    if g is Granularity.TOKEN:
        return a.amax(dim=(-2, -1), keepdim=True)
    if g is Granularity.HEAD:
        dims = tuple(i for i in range(xf.dim()) if i != xf.dim() - 2)
        return a.amax(dim=dims, keepdim=True)
    if g is Granularity.TOKEN_HEAD:
        return a.amax(dim=-1, keepdim=True)
    raise AssertionError(g)  # pragma: no cover


def fp8_scale(amax: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """amax / fp8_max in float32 with the amax floor (the scale that maps the group's amax onto fp8_max)."""
    return true_div(amax.float().clamp(min=AMAX_FLOOR), fmt.max)


@dataclass(frozen=True)
class Bf16Scheme:
    """No quantization beyond rounding to bf16 (the inputs are bf16 already, so this is exact for them)."""

    name: str = "bf16"

    @property
    def bytes_per_token(self) -> float:
        return 2.0 * D

    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        return _check_x(x).to(torch.bfloat16).float()

    def range_stats(self, x: torch.Tensor) -> dict[str, float]:
        return {"subnormal_frac": math.nan, "overflow_frac": math.nan}


@dataclass(frozen=True)
class Fp8Scheme:
    """fp8 with a scaling granularity. `math="bf16"` reproduces the competition's ``quantize_fp8`` (amax,
    scale and x/scale all computed in bf16; per-tensor only)."""

    name: str
    fmt: Fp8Format
    granularity: Granularity
    block: int = 128
    static_amax: float | None = None
    math: Literal["float32", "bf16"] = "float32"
    overflow: Overflow = "saturate"
    rows_per_token: int = 1  # 576-value rows that share a "token" scale: 16 heads for q, 1 latent head for KV

    def __post_init__(self) -> None:
        if self.math not in ("float32", "bf16"):
            raise ValueError(f"math must be 'float32' or 'bf16', got {self.math!r}")
        if self.math == "bf16" and self.granularity is not Granularity.TENSOR:
            raise ValueError("math='bf16' is defined for per-tensor scaling only (the competition's quantize_fp8)")
        if self.granularity is Granularity.BLOCK and not (isinstance(self.block, int) and self.block >= 1):
            raise ValueError(f"block must be a positive int, got {self.block!r}")
        if self.granularity is Granularity.STATIC and not (
            self.static_amax is not None and math.isfinite(self.static_amax) and self.static_amax > 0
        ):
            raise ValueError(f"fp8-static needs a positive finite amax, got {self.static_amax!r}")

    @property
    def bytes_per_token(self) -> float:
        if self.granularity is Granularity.TOKEN:
            return D + 4.0 / self.rows_per_token  # one fp32 scale per token, shared by its rows (q: 16 heads)
        if self.granularity is Granularity.TOKEN_HEAD:
            return D + 4.0  # one fp32 scale per row
        if self.granularity is Granularity.BLOCK:
            return D + 4.0 * math.ceil(D / self.block)
        return float(D)  # per-tensor / per-head / static / direct: scale storage amortizes to ~0

    def scales(self, x: torch.Tensor) -> torch.Tensor:
        """The float32 scale(s), broadcastable to x (block: to the (…, nblocks, block) padded view)."""
        xf = _check_x(x).float()
        g = self.granularity
        if g is Granularity.DIRECT:
            return torch.ones([1] * xf.dim(), device=xf.device)
        if g is Granularity.STATIC:
            return torch.full([1] * xf.dim(), float(self.static_amax) / self.fmt.max, device=xf.device)
        _check_finite_for_scale(xf, self.name)
        if self.math == "bf16":
            return _bf16_scale(x, self.fmt).reshape([1] * xf.dim())
        if g is Granularity.BLOCK:
            return fp8_scale(_padded_blocks(xf, self.block).abs().amax(-1, keepdim=True), self.fmt)
        return fp8_scale(_group_amax(xf, g, self.block), self.fmt)

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes of x's shape in the fp8 dtype, float32 scales). Dequant: see `fake_quant`."""
        xf = _check_x(x).float()
        s = self.scales(x)
        if self.math == "bf16":
            codes, _ = quantize_fp8_per_tensor(x, self.fmt, math="bf16")
            return codes, s
        if self.granularity is Granularity.BLOCK:
            v = (_padded_blocks(xf, self.block) / s).flatten(-2)[..., : xf.shape[-1]]
        else:
            v = xf / s
        return encode_fp8(v, self.fmt, self.overflow), s

    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        codes, s = self.quantize(x)
        if self.granularity is Granularity.BLOCK:
            n = codes.shape[-1]
            return (_padded_blocks(codes.float(), self.block) * s).flatten(-2)[..., :n]
        return codes.float() * s

    def scaled_values(self, x: torch.Tensor) -> torch.Tensor:
        """|x / scale| as the fp8 cast sees it, flattened (block padding removed)."""
        xf = _check_x(x).float()
        s = self.scales(x)
        if self.granularity is Granularity.BLOCK:
            return (_padded_blocks(xf, self.block) / s).flatten(-2)[..., : xf.shape[-1]].abs().flatten()
        return (xf / s).abs().flatten()

    def range_stats(self, x: torch.Tensor) -> dict[str, float]:
        """Fractions of nonzero |x / scale| below fp8's smallest normal (subnormal or flushed) and beyond its max."""
        v = self.scaled_values(x)
        n = max(v.numel(), 1)
        sub = ((v > 0) & (v < self.fmt.min_normal)).sum()
        over = (v > self.fmt.max).sum()
        return {"subnormal_frac": float(sub) / n, "overflow_frac": float(over) / n}


def _padded_blocks(xf: torch.Tensor, block: int) -> torch.Tensor:
    """(..., n) -> (..., ceil(n/block), block), zero-padded: zeros never change a block's amax."""
    n = xf.shape[-1]
    nb = -(-n // block)
    pad = nb * block - n
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.reshape(*xf.shape[:-1], nb, block)


def _bf16_scale(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    xb = x.to(torch.bfloat16)
    amax = tensor_amax(xb).clamp(min=AMAX_FLOOR)  # bf16
    return true_div(amax, fmt.max).to(torch.float32).reshape(1)  # bf16 division, then exact widening


def quantize_fp8_per_tensor(
    x: torch.Tensor, fp8_format: str | Fp8Format, *, math: Literal["float32", "bf16"] = "float32"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor fp8: returns (codes in the fp8 dtype, scale float32 (1,)); dequant = codes.float() * scale.

    ``math="float32"`` is sglang's ``scaled_fp8_quant`` (fp32 amax, scale and division). ``math="bf16"`` is the
    competition's ``quantize_fp8`` bit for bit: with bf16 x, ``amax``, ``amax / fp8_max`` and ``x / scale`` are
    all bf16 (depending on whether bf16(amax / fp8_max) equals the fp32 scale, it changes 0 to ~4 % of the
    codes). Both clamp to ±fp8_max before the cast.
    """
    f = get_fp8_format(fp8_format)
    check_tensor("x", x, dtypes=_FLOATS)
    if math not in ("float32", "bf16"):
        raise ValueError(f"math must be 'float32' or 'bf16', got {math!r}")
    _check_finite_for_scale(x.float(), f"quantize_fp8_per_tensor({f.name})")
    if math == "bf16":
        xb = x.to(torch.bfloat16)
        amax = tensor_amax(xb).clamp(min=AMAX_FLOOR)
        scale = true_div(amax, f.max)  # bf16
        v = (xb / scale).clamp(min=-f.max, max=f.max)  # bf16 division and clamp, as the reference does
        return encode_fp8(v, f, "saturate"), scale.to(torch.float32).reshape(1)
    scale = fp8_scale(tensor_amax(x.float()), f).reshape(1)
    return encode_fp8(x.float() / scale, f, "saturate"), scale


@dataclass(frozen=True)
class FlashMLAV32Scheme:
    """DeepSeek-V3.2 / FlashMLA V32_FP8Sparse: 512 NoPE dims in fp8 with one power-of-two fp32 scale per 128
    (2**ceil(log2(max(amax/fp8_max, 1e-4)))), the 64 RoPE dims kept in bf16. 656 B per token."""

    fmt: Fp8Format
    name: str = "fp8-flashmla-v32"
    nope: int = 512
    tile: int = 128
    amax_floor: float = 1e-4  # FlashMLA's margin on amax / fp8_max

    @property
    def bytes_per_token(self) -> float:
        return self.nope + 4.0 * (self.nope // self.tile) + 2.0 * (D - self.nope)

    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        xf = _check_x(x).float()
        if xf.shape[-1] != D:
            raise ValueError(f"{self.name} needs rows of {D} dims (512 NoPE + 64 RoPE), got {xf.shape[-1]}")
        _check_finite_for_scale(xf, self.name)
        nope = xf[..., : self.nope].reshape(*xf.shape[:-1], self.nope // self.tile, self.tile)
        r = true_div(nope.abs().amax(-1, keepdim=True), self.fmt.max).clamp(min=self.amax_floor)
        m, k = torch.frexp(r)
        s = torch.ldexp(torch.ones_like(r), torch.where(m == 0.5, k - 1, k))  # 2**ceil(log2 r), exact
        deq = (encode_fp8(nope / s, self.fmt).float() * s).flatten(-2)
        rope = xf[..., self.nope :].to(torch.bfloat16).float()
        return torch.cat([deq, rope], -1)


@dataclass(frozen=True)
class MxFp4Scheme:
    """MXFP4 KV: E2M1 elements, one E8M0 scale per 32 along the row (576 = 18 blocks). 306 B per token.

    `rule` picks each block's power-of-two scale, `rounding` how E2M1 ties are broken; `MXFP4_RECIPES` lists the
    named combinations."""

    name: str
    rule: MxScaleRule
    rounding: E2M1Rounding

    def __post_init__(self) -> None:
        if not isinstance(self.rule, MxScaleRule):
            raise TypeError(f"rule must be an MxScaleRule, got {self.rule!r}")
        if not isinstance(self.rounding, E2M1Rounding):
            raise TypeError(f"rounding must be an E2M1Rounding, got {self.rounding!r}")

    @property
    def bytes_per_token(self) -> float:
        return D / 2 + D / 32

    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        return mxfp4_fake_quant(_check_x(x), self.rule, self.rounding)


#: The MXFP4 KV schemes: name -> (scale rule, E2M1 rounding), each what one system computes.
MXFP4_RECIPES: dict[str, tuple[MxScaleRule, E2M1Rounding]] = {
    # aiter's dynamic_mxfp4_quant (what the GPU MODE problem quantises its KV with), bit for bit
    "mxfp4-aiter": (MxScaleRule.EVEN, E2M1Rounding.TIES_AWAY),
    # torchao to_mx(..., ScaleCalculationMode.EVEN): aiter's scales, E2M1 ties to even
    "mxfp4-torchao-even": (MxScaleRule.EVEN, E2M1Rounding.TIES_EVEN),
    # OCP MX v1.0 scale rule, as torchao's FLOOR mode computes it
    "mxfp4-ocp": (MxScaleRule.FLOOR, E2M1Rounding.TIES_EVEN),
    # NVIDIA's rule (torchao RCEIL)
    "mxfp4-rceil": (MxScaleRule.RCEIL, E2M1Rounding.TIES_EVEN),
}


@dataclass(frozen=True)
class NvFp4Scheme:
    """NVFP4 KV: E2M1 elements, E4M3 scale per 16, fp32 scale per tensor. 324 B per token (+4 B per tensor)."""

    name: str = "nvfp4"

    @property
    def bytes_per_token(self) -> float:
        return D / 2 + D / 16

    def fake_quant(self, x: torch.Tensor) -> torch.Tensor:
        return nvfp4_fake_quant(_check_x(x))


QScheme = Bf16Scheme | Fp8Scheme
KVScheme = Bf16Scheme | Fp8Scheme | FlashMLAV32Scheme | MxFp4Scheme | NvFp4Scheme

Q_SCHEMES: tuple[str, ...] = (
    "bf16",
    "fp8-direct",
    "fp8-direct-sat",  # the same shortcut with an explicit clamp to ±fp8_max first
    "fp8-tensor",
    "fp8-tensor-bf16math",
    "fp8-token",
    "fp8-head",
    "fp8-token-head",
    "fp8-block128",
    "fp8-static:<amax>",
)
KV_SCHEMES: tuple[str, ...] = (
    "bf16",
    "fp8-tensor",
    "fp8-tensor-bf16math",  # the competition quantizes its fp8 KV with the same bf16-arithmetic quantize_fp8
    "fp8-token",
    "fp8-block128",
    "fp8-static:<amax>",
    "fp8-flashmla-v32",
    *MXFP4_RECIPES,
    "nvfp4",
)

_FP8_GRAN = {
    "fp8-direct": Granularity.DIRECT,
    "fp8-tensor": Granularity.TENSOR,
    "fp8-token": Granularity.TOKEN,
    "fp8-head": Granularity.HEAD,
    "fp8-token-head": Granularity.TOKEN_HEAD,
}


def _parse_fp8(name: str, fmt: Fp8Format) -> Fp8Scheme | None:
    if name in _FP8_GRAN:
        g = _FP8_GRAN[name]
        # The direct cast reproduces torch's own .to(): e4m3fn saturates, fnuz -> NaN, e5m2 -> inf.
        return Fp8Scheme(name, fmt, g, overflow=fmt.cast_overflow if g is Granularity.DIRECT else "saturate")
    if name == "fp8-direct-sat":
        return Fp8Scheme(name, fmt, Granularity.DIRECT, overflow="saturate")
    if name == "fp8-tensor-bf16math":
        return Fp8Scheme(name, fmt, Granularity.TENSOR, math="bf16")
    if name.startswith("fp8-block"):
        try:
            b = int(name[len("fp8-block") :])
        except ValueError:
            raise ValueError(f"bad block scheme {name!r}; expected fp8-block<N>, e.g. fp8-block128") from None
        return Fp8Scheme(name, fmt, Granularity.BLOCK, block=b)
    if name.startswith("fp8-static:"):
        txt = name.split(":", 1)[1]
        try:
            amax = float(txt)
        except ValueError:
            raise ValueError(f"bad static scheme {name!r}; expected fp8-static:<amax>, e.g. fp8-static:0.1") from None
        return Fp8Scheme(f"fp8-static:{amax:g}", fmt, Granularity.STATIC, static_amax=amax)
    return None


def _unknown(kind: str, name: object, valid: tuple[str, ...]) -> ValueError:
    return ValueError(f"unknown {kind} scheme {name!r}; valid: {', '.join(valid)}")


def get_q_scheme(name: str, fp8_format: str = "e4m3fn") -> QScheme:
    """A Q scheme by name (see `Q_SCHEMES`); `fp8_format` in e4m3fn, e4m3fnuz, e4m3fnuz-224, e5m2."""
    if not isinstance(name, str):
        raise TypeError(f"q scheme name must be a str, got {type(name).__name__}")
    fmt = get_fp8_format(fp8_format)
    n = name.strip()
    if n == "bf16":
        return Bf16Scheme()
    if n in Q_SCHEMES or n.startswith("fp8-static:") or (n.startswith("fp8-block") and n[9:].isdigit()):
        s = _parse_fp8(n, fmt)
        if s is not None:
            # bytes_per_token is per 576-value row; a q token's scale is shared by its 16 head rows
            return dataclasses.replace(s, rows_per_token=MLA.num_heads) if s.granularity is Granularity.TOKEN else s
    raise _unknown("Q", name, Q_SCHEMES)


def get_kv_scheme(name: str, fp8_format: str = "e4m3fn") -> KVScheme:
    """A KV scheme by name (see `KV_SCHEMES`)."""
    if not isinstance(name, str):
        raise TypeError(f"kv scheme name must be a str, got {type(name).__name__}")
    fmt = get_fp8_format(fp8_format)
    n = name.strip()
    if n == "bf16":
        return Bf16Scheme()
    if n == "fp8-flashmla-v32":
        return FlashMLAV32Scheme(fmt)
    if n in MXFP4_RECIPES:
        return MxFp4Scheme(n, *MXFP4_RECIPES[n])
    if n == "nvfp4":
        return NvFp4Scheme()
    if n in KV_SCHEMES or n.startswith("fp8-static:") or (n.startswith("fp8-block") and n[9:].isdigit()):
        s = _parse_fp8(n, fmt)
        if s is not None:
            return s
    raise _unknown("KV", name, KV_SCHEMES)


def concrete_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names that need no parameter (drops the ``fp8-static:<amax>`` template)."""
    return tuple(n for n in names if "<" not in n)

"""Element formats: fp8 (e4m3fn, e4m3fnuz, e5m2), E2M1 (fp4) and E8M0 (MX scales), encoded bit-exactly.

fp8 rounds to nearest, ties to even. E2M1 rounds to nearest with the tie rule named by `E2M1Rounding` (ties to even,
or ties away from zero as aiter's MXFP4 quantiser does). Overflow is never left to a cast: torch 2.13 saturates e4m3fn,
returns NaN for e4m3fnuz and inf for e5m2, and older torch / ml_dtypes differ again. `encode_fp8` therefore
clamps first and then, if the caller asked for non-saturating behaviour, writes the NaN/inf code itself.

Each fast (torch) encoder has a readable naive twin (`*_naive`, pure Python over the code table) used as an
independent check in the tests, next to `ml_dtypes`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal

import torch

from ..checks import check_tensor

__all__ = [
    "tensor_amax",
    "true_div",
    "to_float32_exact_for_rounding",
    "Fp8Format",
    "FP8_FORMATS",
    "Overflow",
    "get_fp8_format",
    "fp8_dtype",
    "fp8_code_value",
    "encode_fp8",
    "encode_fp8_naive",
    "decode_fp8",
    "E2M1_VALUES",
    "E2M1_MAX",
    "E2M1Rounding",
    "e2m1_encode",
    "e2m1_encode_naive",
    "e2m1_decode",
    "pack_e2m1",
    "unpack_e2m1",
    "E8M0_NAN",
    "e8m0_from_exponent",
    "e8m0_to_float",
]

Overflow = Literal["saturate", "nan", "inf"]
_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Fp8Format:
    """An fp8 flavour as used for quantization.

    `max` is the clamp bound used by scaling (448, 240, or sglang/vLLM's 224 on fnuz); `dtype_max` is the
    largest finite value of the storage dtype. `cast_overflow` records what torch 2.13's ``.to(dtype)`` does
    with values beyond `dtype_max` (we reproduce it explicitly, we never rely on it).
    """

    name: str
    dtype: torch.dtype
    ebits: int
    mbits: int
    bias: int
    max: float
    dtype_max: float
    fnuz: bool  # one NaN code (0x80), no negative zero, no inf
    cast_overflow: Overflow

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mbits)

    @property
    def nan_code(self) -> int:
        return 0x80 if self.fnuz else 0x7F  # fnuz: the "-0" pattern; e4m3fn S.1111.111; e5m2 S.11111.11

    def __str__(self) -> str:
        return self.name


FP8_FORMATS: dict[str, Fp8Format] = {
    "e4m3fn": Fp8Format("e4m3fn", torch.float8_e4m3fn, 4, 3, 7, 448.0, 448.0, False, "saturate"),
    "e4m3fnuz": Fp8Format("e4m3fnuz", torch.float8_e4m3fnuz, 4, 3, 8, 240.0, 240.0, True, "nan"),
    # sglang / vLLM clamp to 224 on fnuz for dynamic quantization (same storage dtype, smaller clamp bound).
    "e4m3fnuz-224": Fp8Format("e4m3fnuz-224", torch.float8_e4m3fnuz, 4, 3, 8, 224.0, 240.0, True, "nan"),
    "e5m2": Fp8Format("e5m2", torch.float8_e5m2, 5, 2, 15, 57344.0, 57344.0, False, "inf"),
}


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the whole tensor (0-d, x's dtype); 0 for an empty one (e.g. the KV of a batch whose requests are
    all empty), so a scale computed from it is the amax floor's, like an all-zero tensor's, instead of torch's error
    on an empty reduction."""
    return x.abs().amax() if x.numel() else torch.zeros((), dtype=x.dtype, device=x.device)


def true_div(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor, one IEEE rounding in x's dtype on every device. (PyTorch on CUDA divides by a Python number by
    multiplying with its rounded reciprocal: a second rounding that moves a scale like amax / 240 by one ulp, so the
    GPU's fp8 codes would differ from the CPU's. A tensor divisor keeps the true division.)"""
    return x / torch.tensor(divisor, dtype=x.dtype, device=x.device)


def to_float32_exact_for_rounding(x: torch.Tensor) -> torch.Tensor:
    """x as float32 such that a later round-to-nearest to a narrower format (fp8, E2M1) gives the same result as
    rounding x directly. bf16/fp16/fp32 convert exactly. float64 is rounded to float32 *to odd* (truncate toward
    zero, set the last bit when inexact): a plain RNE cast would round twice (1.0625 + 2^-40 would become 1.0625, a
    tie, and then 1.0 in e4m3 instead of 1.125). Round-to-odd with 29 spare bits makes the second rounding exact."""
    if x.dtype != torch.float64:
        return x.float()
    r = x.float()
    rd = r.double()
    inexact = (rd != x) & torch.isfinite(x)
    away = inexact & (rd.abs() > x.abs())
    r = torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r)  # truncate toward zero
    bits = r.view(torch.int32) | inexact.to(torch.int32)  # ... and make the last bit sticky
    return bits.view(torch.float32)


def get_fp8_format(fp8_format: str | Fp8Format) -> Fp8Format:
    """Look up an fp8 flavour by name (e4m3fn, e4m3fnuz, e4m3fnuz-224, e5m2)."""
    if isinstance(fp8_format, Fp8Format):
        return fp8_format
    if not isinstance(fp8_format, str):
        raise TypeError(f"fp8_format must be a str, got {type(fp8_format).__name__}")
    try:
        return FP8_FORMATS[fp8_format.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown fp8_format {fp8_format!r}; valid: {', '.join(FP8_FORMATS)}") from None


def fp8_dtype(fp8_format: str | Fp8Format) -> torch.dtype:
    """The torch storage dtype of an fp8 flavour."""
    return get_fp8_format(fp8_format).dtype


def fp8_code_value(code: int, fp8_format: str | Fp8Format) -> float:
    """Decode one 8-bit code from its bit fields (the spec, written out; used as an oracle in tests)."""
    f = get_fp8_format(fp8_format)
    if not isinstance(code, int) or not 0 <= code <= 255:
        raise ValueError(f"code must be an int in [0, 255], got {code!r}")
    s = code >> 7
    e = (code >> f.mbits) & ((1 << f.ebits) - 1)
    m = code & ((1 << f.mbits) - 1)
    if f.fnuz and code == 0x80:
        return math.nan
    if not f.fnuz:
        if f.ebits == 4 and e == 15 and m == 7:
            return math.nan  # e4m3fn: only S.1111.111 is NaN; exponent 1111 is otherwise a normal binade
        if f.ebits == 5 and e == 31:
            return math.nan if m else (-math.inf if s else math.inf)
    if e == 0:
        mag = m * 2.0 ** (1 - f.bias - f.mbits)
    else:
        mag = (1 + m / (1 << f.mbits)) * 2.0 ** (e - f.bias)
    return -mag if s else mag


def _overflow_mask(a: torch.Tensor, f: Fp8Format) -> torch.Tensor:
    """|x| that a non-saturating RNE cast would send beyond the dtype's largest finite value."""
    ulp = 2.0 ** (math.floor(math.log2(f.dtype_max)) - f.mbits)
    boundary = f.dtype_max + ulp / 2
    max_mant_odd = int(round(f.dtype_max / ulp)) % 2 == 1  # at a tie RNE goes to the even neighbour
    return (a >= boundary) if max_mant_odd else (a > boundary)


def encode_fp8(x: torch.Tensor, fp8_format: str | Fp8Format, overflow: Overflow = "saturate") -> torch.Tensor:
    """Round `x` to fp8 (RNE) with explicit overflow handling; returns a tensor of the fp8 dtype.

    overflow="saturate" clamps to ±`fmt.max` first (±inf too). "nan" / "inf" reproduce a non-saturating cast:
    values that round past the dtype's largest finite become NaN (or ±inf for e5m2; "inf" is only valid there).
    NaN inputs always give the NaN code.
    """
    f = get_fp8_format(fp8_format)
    check_tensor("x", x, dtypes=_FLOATS)
    if overflow not in ("saturate", "nan", "inf"):
        raise ValueError(f"overflow must be 'saturate', 'nan' or 'inf', got {overflow!r}")
    if overflow == "inf" and f.ebits != 5:
        raise ValueError(f"overflow='inf' needs a format with inf (e5m2); {f.name} has none")
    xf = to_float32_exact_for_rounding(x)
    bound = f.max if overflow == "saturate" else f.dtype_max
    codes = xf.clamp(-bound, bound).to(f.dtype)  # in range: the cast only rounds (RNE), never overflows
    if overflow != "saturate":
        over = _overflow_mask(xf.abs(), f)
        if bool(over.any()):
            u = codes.view(torch.uint8).clone()
            if overflow == "nan":
                special = torch.full_like(u, f.nan_code)
                if not f.fnuz:
                    special |= (xf < 0).to(torch.uint8) << 7
            else:  # inf, e5m2
                special = torch.where(xf < 0, 0xFC, 0x7C).to(torch.uint8)
            codes = torch.where(over, special, u).view(f.dtype)
    return codes


def _code_table(f: Fp8Format) -> list[tuple[float, int]]:
    return sorted((v, c) for c in range(256) if math.isfinite(v := fp8_code_value(c, f)) and not (v == 0 and c & 0x80))


def encode_fp8_naive(value: float, fp8_format: str | Fp8Format, overflow: Overflow = "saturate") -> int:
    """Readable reference for one value: nearest finite code, ties to the even code, then the overflow rule."""
    f = get_fp8_format(fp8_format)
    if math.isnan(value):
        return f.nan_code
    neg = value < 0 or (value == 0 and math.copysign(1, value) < 0)
    a = abs(value)
    sign_bit = 0x80 if neg else 0
    if overflow == "saturate":
        a = min(a, f.max)
    elif a > f.dtype_max:
        ulp = 2.0 ** (math.floor(math.log2(f.dtype_max)) - f.mbits)
        if a > f.dtype_max + ulp / 2 or (a == f.dtype_max + ulp / 2 and round(f.dtype_max / ulp) % 2 == 1):
            if overflow == "inf":
                return 0xFC if neg else 0x7C
            return f.nan_code if f.fnuz else f.nan_code | sign_bit
        a = f.dtype_max
    table = [(v, c) for v, c in _code_table(f) if v >= 0]
    best = min(table, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))  # nearest, then even mantissa
    code = best[1]
    if code == 0 and f.fnuz:
        return 0
    return code | sign_bit


def decode_fp8(codes: torch.Tensor) -> torch.Tensor:
    """fp8 tensor -> float32 (exact)."""
    check_tensor("codes", codes)
    if codes.dtype not in {f.dtype for f in FP8_FORMATS.values()}:
        raise TypeError(f"codes must be an fp8 tensor, got {codes.dtype}")
    return codes.float()


# ---------------------------------------------------------------- E2M1 (fp4) ---------------------------------

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; bit 3 is the sign
E2M1_MAX = 6.0
_E2M1_MIDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


class E2M1Rounding(enum.Enum):
    """How a value is rounded to E2M1 (element rounding; the MX *scale* rules are `mlalab.quant.mx.MxScaleRule`).

    Both rules round to the nearest E2M1 value and saturate at ±6; they differ only at an exact tie, a magnitude of
    0.25, 0.75, 1.25, 1.75, 2.5, 3.5 or 5:

    * ``TIES_EVEN`` ("ties-even", IEEE 754 roundTiesToEven): the neighbour with the even code (mantissa bit 0).
      Used by torchao's MX casts, ml_dtypes' ``float4_e2m1fn`` and NVIDIA's ``cvt.rn`` E2M1 conversions.
    * ``TIES_AWAY`` ("ties-away", roundTiesToAway): the neighbour of larger magnitude. Used by aiter's
      ``dynamic_mxfp4_quant`` (its Triton kernel adds one at the first dropped bit of the fp32 value and shifts).
    """

    TIES_EVEN = "ties-even"  # torchao, ml_dtypes, NVIDIA cvt.rn
    TIES_AWAY = "ties-away"  # aiter dynamic_mxfp4_quant

    @classmethod
    def parse(cls, rounding: str | E2M1Rounding) -> E2M1Rounding:
        """The member named `rounding` (its value, e.g. "ties-away"); a member is returned as is."""
        if isinstance(rounding, E2M1Rounding):
            return rounding
        try:
            return cls(rounding)
        except ValueError:
            valid = ", ".join(r.value for r in cls)
            raise ValueError(f"unknown E2M1 rounding {rounding!r} for 'rounding'; valid: {valid}") from None


#: Values encoded or decoded per pass: bounds the temporaries (integer codes, masks) of a large cache, e.g. a
#: 128 x 8192 KV of 604M values, to a few hundred MB instead of ~30 bytes a value.
CODEC_CHUNK = 1 << 24


def e2m1_encode(x: torch.Tensor, rounding: str | E2M1Rounding = E2M1Rounding.TIES_EVEN) -> torch.Tensor:
    """Round to E2M1 codes (uint8 in 0..15; bit 3 is the sign, so -0 and negatives that round to 0 give 8),
    nearest with `rounding`'s tie rule, saturating at ±6. NaN raises (E2M1 has no NaN)."""
    r = E2M1Rounding.parse(rounding)
    check_tensor("x", x, dtypes=_FLOATS)
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    mids = _E2M1_MIDS.to(x.device)
    for i in range(0, flat.numel(), CODEC_CHUNK):
        xf = to_float32_exact_for_rounding(flat[i : i + CODEC_CHUNK])
        if bool(torch.isnan(xf).any()):
            raise ValueError("x contains NaN; E2M1 has no NaN encoding")
        a = xf.abs().clamp(max=E2M1_MAX)
        code = torch.bucketize(a, mids, right=True, out_int32=True)  # ties go up (away from zero) here...
        if r is E2M1Rounding.TIES_EVEN:
            tie = (code > 0) & (a == mids[(code - 1).clamp(min=0)])
            code = torch.where(tie & (code % 2 == 1), code - 1, code)  # ...and back down when the upper code is odd
        out[i : i + CODEC_CHUNK] = (code | (torch.signbit(xf).to(torch.int32) << 3)).to(torch.uint8)
    return out.reshape(x.shape)


def e2m1_encode_naive(value: float, rounding: str | E2M1Rounding = E2M1Rounding.TIES_EVEN) -> int:
    """One value: the nearest E2M1 magnitude (saturating at 6); a tie goes to the even code or, for ties-away, to
    the larger magnitude."""
    r = E2M1Rounding.parse(rounding)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"value must be a float, got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError("E2M1 has no NaN encoding")
    a = min(abs(value), E2M1_MAX)
    if r is E2M1Rounding.TIES_EVEN:
        code = min(range(8), key=lambda c: (abs(E2M1_VALUES[c] - a), c & 1))
    else:
        code = min(range(8), key=lambda c: (abs(E2M1_VALUES[c] - a), -c))
    return code | (8 if math.copysign(1.0, value) < 0 else 0)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes (0..15) -> float32."""
    check_tensor("codes", codes, dtypes=(torch.uint8,))
    if bool((codes > 15).any()):
        raise ValueError("E2M1 codes must be in [0, 15]; unpack packed bytes first")
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    flat = codes.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float32, device=codes.device)
    for i in range(0, flat.numel(), CODEC_CHUNK):
        out[i : i + CODEC_CHUNK] = lut[flat[i : i + CODEC_CHUNK].long()]
    return out.reshape(codes.shape)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dim: even index in the low nibble (aiter / competition layout)."""
    check_tensor("codes", codes, dtypes=(torch.uint8,))
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dim must be even to pack two E2M1 codes per byte, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_e2m1`."""
    check_tensor("packed", packed, dtypes=(torch.uint8,))
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2)


# ---------------------------------------------------------------- E8M0 (MX scale) ----------------------------

E8M0_NAN = 0xFF


def e8m0_from_exponent(e: torch.Tensor) -> torch.Tensor:
    """Scale exponents (ints, X = 2**e) -> E8M0 bytes; e is clamped to [-127, 127] as in the OCP MX spec."""
    check_tensor("e", e, dtypes=(torch.int32, torch.int64, torch.int16))
    return (e.clamp(-127, 127) + 127).to(torch.uint8)


def e8m0_to_float(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32: 2**(E-127); 0x00 is the fp32 subnormal 2**-127, 0xFF is NaN."""
    check_tensor("codes", codes, dtypes=(torch.uint8,))
    out = torch.ldexp(torch.ones(codes.shape, dtype=torch.float32, device=codes.device), codes.to(torch.int32) - 127)
    return torch.where(codes == E8M0_NAN, torch.full_like(out, math.nan), out)

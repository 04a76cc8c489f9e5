"""Low-precision formats (fp8, E2M1, E8M0, NVFP4) and Q / KV quantization schemes with explicit overflow rules.

Entry points: `get_q_scheme`, `get_kv_scheme` (``.fake_quant``, ``.bytes_per_token``), `quantize_fp8_per_tensor`
(for kernels), `fp8_dtype`. See ``formats`` (bit-exact element codecs), ``mx`` (MXFP4 / NVFP4), ``schemes``.
"""

from __future__ import annotations

from .formats import (
    E2M1_VALUES,
    FP8_FORMATS,
    E2M1Rounding,
    Fp8Format,
    decode_fp8,
    e2m1_decode,
    e2m1_encode,
    e8m0_from_exponent,
    e8m0_to_float,
    encode_fp8,
    fp8_dtype,
    get_fp8_format,
    pack_e2m1,
    unpack_e2m1,
)
from .mx import MxScaleRule, mx_scale_exponent, mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize, nvfp4_quantize
from .schemes import (
    KV_SCHEMES,
    MXFP4_RECIPES,
    Q_SCHEMES,
    Bf16Scheme,
    FlashMLAV32Scheme,
    Fp8Scheme,
    Granularity,
    KVScheme,
    MxFp4Scheme,
    NvFp4Scheme,
    QScheme,
    concrete_names,
    get_kv_scheme,
    get_q_scheme,
    quantize_fp8_per_tensor,
)

__all__ = [
    "E2M1_VALUES",
    "E2M1Rounding",
    "FP8_FORMATS",
    "Fp8Format",
    "decode_fp8",
    "e2m1_decode",
    "e2m1_encode",
    "e8m0_from_exponent",
    "e8m0_to_float",
    "encode_fp8",
    "fp8_dtype",
    "get_fp8_format",
    "pack_e2m1",
    "unpack_e2m1",
    "MxScaleRule",
    "mx_scale_exponent",
    "mxfp4_quantize",
    "mxfp4_dequantize",
    "nvfp4_quantize",
    "nvfp4_dequantize",
    "KV_SCHEMES",
    "MXFP4_RECIPES",
    "Q_SCHEMES",
    "Bf16Scheme",
    "FlashMLAV32Scheme",
    "Fp8Scheme",
    "Granularity",
    "KVScheme",
    "MxFp4Scheme",
    "NvFp4Scheme",
    "QScheme",
    "concrete_names",
    "get_kv_scheme",
    "get_q_scheme",
    "quantize_fp8_per_tensor",
]

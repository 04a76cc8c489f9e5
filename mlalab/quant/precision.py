"""The precision table: what "a8w8", "a16w8", "bf16" and the fp4-KV precisions mean, defined once for every layer.

A *precision* names the operand types a decode kernel reads: q (the absorbed query) and the KV cache. fp8 operands
carry one per-tensor fp32 dequantisation scale (``amax / fp8_max``, `mlalab.quant.quantize_fp8_per_tensor`); fp4 KV
is block-scaled (``mxfp4``: E2M1 codes packed two per byte, one E8M0 scale per 32 values, 306 bytes per token;
``nvfp4``: one E4M3 scale per 16 values and an fp32 scale per tensor, 324 bytes); the output is always bf16.
Kernels (`mlalab.kernels.prepare`), the timing harness (bytes per call), the traffic model,
the backends (which precisions each peer supports) and the plots all read this table.

The accuracy studies (`mlalab.quant` schemes such as ``fp8-token`` or ``mxfp4-aiter``) are a wider family; a
precision here is what the GPU kernels execute.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Precision", "PrecisionSpec", "PRECISIONS", "CORE_PRECISIONS", "KV_TOKEN_BYTES", "get_precision"]

#: Bytes of one KV token (576 values) per storage format, block scales included: mxfp4 one E8M0 byte per 32 values,
#: nvfp4 one E4M3 byte per 16 (+ an fp32 per tensor, negligible), per-tensor fp8 one fp32 scale (negligible);
#: FlashMLA's V3.2 layout 512 fp8 + 4 fp32 scales (16 B) + 64 bf16 RoPE values (128 B). `mlalab.traffic.KV_STORAGE`
#: is this table.
KV_TOKEN_BYTES: dict[str, float] = {
    "bf16": 576 * 2,
    "fp8": 576 * 1,
    "fp8-flashmla-v32": 512 + 4 * 4 + 64 * 2,
    "mxfp4": 576 / 2 + 576 / 32,
    "nvfp4": 576 / 2 + 576 / 16,
}


class Precision(enum.StrEnum):
    """The operand types of one decode call: ``a<q bits>w<KV bits>``."""

    A8W8 = "a8w8"  # fp8 q, fp8 KV: the competition reference's numerics (aiter's, FlashMLA fp8's)
    A16W8 = "a16w8"  # bf16 q, fp8 KV (FlashInfer's fp8-KV path)
    BF16 = "bf16"  # bf16 q, bf16 KV
    A16W4_MXFP4 = "a16w4-mxfp4"  # bf16 q, MXFP4 KV (the GPU MODE 2026 problem's fp4 cache)
    A8W4_MXFP4 = "a8w4-mxfp4"  # fp8 q, MXFP4 KV
    A16W4_NVFP4 = "a16w4-nvfp4"  # bf16 q, NVFP4 KV
    A8W4_NVFP4 = "a8w4-nvfp4"  # fp8 q, NVFP4 KV


@dataclass(frozen=True)
class PrecisionSpec:
    """One row of the precision table.

    Attributes:
        precision: the name.
        q_format: ``"fp8"`` (per-tensor scale) or ``"bf16"``.
        kv_format: ``"fp8"``, ``"bf16"``, ``"mxfp4"`` or ``"nvfp4"`` (the names of `mlalab.traffic.KV_STORAGE`).
        label: the human name shown in figures.
    """

    precision: Precision
    q_format: str
    kv_format: str
    label: str

    @property
    def q_fp8(self) -> bool:
        return self.q_format == "fp8"

    @property
    def kv_fp8(self) -> bool:
        return self.kv_format == "fp8"

    @property
    def kv_fp4(self) -> bool:
        return self.kv_format in ("mxfp4", "nvfp4")

    @property
    def q_bytes(self) -> int:
        """Bytes of one q element."""
        return 1 if self.q_fp8 else 2

    @property
    def kv_token_bytes(self) -> float:
        """Bytes of one KV token (576 values), block scales included (`KV_TOKEN_BYTES`)."""
        return float(KV_TOKEN_BYTES[self.kv_format])


PRECISIONS: dict[Precision, PrecisionSpec] = {
    Precision.A8W8: PrecisionSpec(Precision.A8W8, "fp8", "fp8", "fp8 q · fp8 KV"),
    Precision.A16W8: PrecisionSpec(Precision.A16W8, "bf16", "fp8", "bf16 q · fp8 KV"),
    Precision.BF16: PrecisionSpec(Precision.BF16, "bf16", "bf16", "bf16 q · bf16 KV"),
    Precision.A16W4_MXFP4: PrecisionSpec(Precision.A16W4_MXFP4, "bf16", "mxfp4", "bf16 q · mxfp4 KV"),
    Precision.A8W4_MXFP4: PrecisionSpec(Precision.A8W4_MXFP4, "fp8", "mxfp4", "fp8 q · mxfp4 KV"),
    Precision.A16W4_NVFP4: PrecisionSpec(Precision.A16W4_NVFP4, "bf16", "nvfp4", "bf16 q · nvfp4 KV"),
    Precision.A8W4_NVFP4: PrecisionSpec(Precision.A8W4_NVFP4, "fp8", "nvfp4", "fp8 q · nvfp4 KV"),
}

#: The precisions every full recorded suite run covers (`mlalab.records.timings.full_runs`); runs since 2026-12-05
#: also time the fp4-KV ones.
CORE_PRECISIONS: tuple[Precision, ...] = (Precision.A8W8, Precision.A16W8, Precision.BF16)


def get_precision(name: str | Precision | PrecisionSpec) -> PrecisionSpec:
    """The table row of `name` (``"a8w8"``, ``"a16w8"``, ``"bf16"``, case-insensitive); ValueError naming the valid
    ones otherwise."""
    if isinstance(name, PrecisionSpec):
        return name
    if not isinstance(name, str):
        raise TypeError(f"precision must be a name ({', '.join(PRECISIONS)}), got {type(name).__name__}")
    try:
        return PRECISIONS[Precision(name.strip().lower())]
    except ValueError:
        raise ValueError(f"unknown precision {name!r}; supported: {', '.join(PRECISIONS)}") from None

"""The precision table: what "a8w8", "a16w8" and "bf16" mean, defined once for every layer.

A *precision* names the operand types a decode kernel reads: q (the absorbed query) and the KV cache. fp8 operands
carry one per-tensor fp32 dequantisation scale (``amax / fp8_max``, `mlalab.quant.quantize_fp8_per_tensor`); the
output is always bf16. Kernels (`mlalab.kernels.prepare`), the timing harness (bytes per call), the traffic model,
the backends (which precisions each peer supports) and the plots all read this table.

The accuracy studies (`mlalab.quant` schemes such as ``fp8-token`` or ``mxfp4-aiter``) are a wider family; a
precision here is what the GPU kernels execute.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Precision", "PrecisionSpec", "PRECISIONS", "get_precision"]


class Precision(enum.StrEnum):
    """The operand types of one decode call: ``a<q bits>w<KV bits>``."""

    A8W8 = "a8w8"  # fp8 q, fp8 KV: the competition reference's numerics (aiter's, FlashMLA fp8's)
    A16W8 = "a16w8"  # bf16 q, fp8 KV (FlashInfer's fp8-KV path)
    BF16 = "bf16"  # bf16 q, bf16 KV


@dataclass(frozen=True)
class PrecisionSpec:
    """One row of the precision table.

    Attributes:
        precision: the name.
        q_format, kv_format: ``"fp8"`` (per-tensor scale) or ``"bf16"``.
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
    def q_bytes(self) -> int:
        """Bytes of one q element."""
        return 1 if self.q_fp8 else 2

    @property
    def kv_bytes(self) -> int:
        """Bytes of one KV element (a token is 576 of them)."""
        return 1 if self.kv_fp8 else 2


PRECISIONS: dict[Precision, PrecisionSpec] = {
    Precision.A8W8: PrecisionSpec(Precision.A8W8, "fp8", "fp8", "fp8 q · fp8 KV"),
    Precision.A16W8: PrecisionSpec(Precision.A16W8, "bf16", "fp8", "bf16 q · fp8 KV"),
    Precision.BF16: PrecisionSpec(Precision.BF16, "bf16", "bf16", "bf16 q · bf16 KV"),
}


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

"""Bytes moved, FLOPs and the bandwidth floor of one decode call.

Decode is memory-bound: every KV byte is read once (one latent head shared by all 16 query heads), while each
KV token costs only ``2 · q_len · 16 · (576 + 512)`` FLOPs. The floor is ``bytes / bandwidth``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import MLA, DecodeCase, GpuTarget, MLAConfig, get_target
from .quant.precision import KV_TOKEN_BYTES

__all__ = ["KV_STORAGE", "kv_bytes_per_token", "DecodeTraffic", "decode_traffic"]

#: Storage of one KV token (576 values) per format, in bytes, block scales included: the precision table's
#: `mlalab.quant.precision.KV_TOKEN_BYTES` (one definition).
KV_STORAGE: dict[str, float] = KV_TOKEN_BYTES


def kv_bytes_per_token(kv_format: str | float, config: MLAConfig = MLA) -> float:
    """Bytes per KV token for a storage name (see `KV_STORAGE`), a quantization scheme name from
    ``mlalab.quant`` (uses its own `bytes_per_token`), or a number of bytes."""
    if isinstance(kv_format, (int, float)) and not isinstance(kv_format, bool):
        if kv_format <= 0:
            raise ValueError(f"bytes per token must be positive, got {kv_format}")
        return float(kv_format)
    if not isinstance(kv_format, str):
        raise TypeError(f"kv_format must be a name or a number, got {type(kv_format).__name__}")
    if kv_format in KV_STORAGE:
        return KV_STORAGE[kv_format] * config.qk_dim / 576
    try:
        from .quant import KV_SCHEMES, get_kv_scheme
    except ImportError:
        KV_SCHEMES = ()
    if kv_format in KV_SCHEMES or kv_format.startswith("fp8-static:"):
        return float(get_kv_scheme(kv_format).bytes_per_token)
    valid = ", ".join(list(KV_STORAGE) + list(KV_SCHEMES))
    raise ValueError(f"unknown KV format {kv_format!r}; valid: {valid}, or a number of bytes")


@dataclass(frozen=True)
class DecodeTraffic:
    kv_bytes: float
    q_bytes: float
    out_bytes: float
    flops: float

    @property
    def total_bytes(self) -> float:
        return self.kv_bytes + self.q_bytes + self.out_bytes

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.total_bytes

    def floor_us(self, target: str | int | GpuTarget, *, tbps: float | None = None) -> float:
        """Bandwidth floor in µs on `target` (its measured copy bandwidth where we have one, else datasheet)."""
        bw = get_target(target).bandwidth_tbps if tbps is None else float(tbps)
        if not bw > 0:
            raise ValueError(f"target {target!r} has no known bandwidth; pass tbps=")
        return self.total_bytes / (bw * 1e12) * 1e6


def decode_traffic(case: DecodeCase, kv_format: str | float = "bf16", q_bytes_per_elem: float = 2.0) -> DecodeTraffic:
    """Minimum bytes (KV read once, q read once, bf16 output written once) and FLOPs (QK^T over 576 dims and
    PV over 512 dims, 2 FLOPs per multiply-add) of one decode call."""
    if not isinstance(case, DecodeCase):
        raise TypeError(f"case must be a DecodeCase, got {type(case).__name__}")
    if q_bytes_per_elem <= 0:
        raise ValueError("q_bytes_per_elem must be positive")
    cfg = case.config
    kv = case.total_kv * kv_bytes_per_token(kv_format, cfg)
    q = case.total_q * cfg.num_heads * cfg.qk_dim * q_bytes_per_elem
    out = case.total_q * cfg.num_heads * cfg.v_dim * 2
    flops = 2.0 * case.q_len * cfg.num_heads * (cfg.qk_dim + cfg.v_dim) * case.total_kv
    return DecodeTraffic(kv, q, out, flops)

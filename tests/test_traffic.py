"""Bytes and FLOPs of a decode (`mlalab.traffic`): every number by hand, so a changed constant or operator fails."""

from __future__ import annotations

import pytest

from mlalab.config import DecodeCase
from mlalab.quant.precision import PRECISIONS, get_precision
from mlalab.traffic import KV_STORAGE, decode_traffic, kv_bytes_per_token


def test_kv_bytes_per_token_of_every_storage_format() -> None:
    # bf16 2 B x 576; fp8 1 B x 576; FlashMLA V3.2: 512 fp8 + 4 fp32 scales + 64 bf16 RoPE = 512 + 16 + 128;
    # mxfp4: 288 B of codes + 18 E8M0 (one per 32); nvfp4: 288 + 36 E4M3 (one per 16)
    assert KV_STORAGE == {"bf16": 1152, "fp8": 576, "fp8-flashmla-v32": 656, "mxfp4": 306, "nvfp4": 324}
    for name, nbytes in KV_STORAGE.items():
        assert kv_bytes_per_token(name) == nbytes
    # the precision table reads the same numbers (one definition)
    assert {str(p): s.kv_token_bytes for p, s in PRECISIONS.items()} == {
        "a8w8": 576, "a16w8": 576, "bf16": 1152, "a16w4-mxfp4": 306, "a8w4-mxfp4": 306, "a16w4-nvfp4": 324,
        "a8w4-nvfp4": 324,
    }  # fmt: skip
    assert get_precision("a8w4-nvfp4").q_bytes == 1 and get_precision("a16w4-mxfp4").q_bytes == 2


def test_kv_bytes_per_token_of_schemes_numbers_and_bad_input() -> None:
    assert kv_bytes_per_token("mxfp4-aiter") == 306 and kv_bytes_per_token("nvfp4") == 324
    assert kv_bytes_per_token(300) == 300.0 and kv_bytes_per_token(0.5) == 0.5
    for bad, err in ((0, ValueError), (-1.0, ValueError), (True, TypeError), (None, TypeError), ("fp7", ValueError)):
        with pytest.raises(err):
            kv_bytes_per_token(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown KV format 'fp7'; valid: bf16, fp8"):
        kv_bytes_per_token("fp7")


def test_decode_traffic_by_hand() -> None:
    """Requests of 100 and 300 tokens, q_len 2, fp8 KV and fp8 q: KV 400 x 576 B, q 4 rows x 16 heads x 576 x 1 B,
    bf16 output 4 x 16 x 512 x 2 B, FLOPs 2 x q_len x 16 x (576 + 512) x 400."""
    t = decode_traffic(DecodeCase(kv_lens=(100, 300), q_len=2), "fp8", 1.0)
    assert t.kv_bytes == 400 * 576
    assert t.q_bytes == 4 * 16 * 576
    assert t.out_bytes == 4 * 16 * 512 * 2
    assert t.total_bytes == 400 * 576 + 4 * 16 * 576 + 4 * 16 * 512 * 2
    assert t.flops == 2 * 2 * 16 * (576 + 512) * 400
    b = decode_traffic(DecodeCase(kv_lens=(64,)), "bf16")  # q in bf16 by default
    assert (b.kv_bytes, b.q_bytes, b.out_bytes) == (64 * 1152, 16 * 576 * 2, 16 * 512 * 2)
    with pytest.raises(ValueError, match="q_bytes_per_elem must be positive"):
        decode_traffic(DecodeCase(kv_lens=(64,)), "bf16", 0.0)


def test_bandwidth_floor_by_hand() -> None:
    """floor = total bytes / bandwidth: 1 MB at 4 TB/s is 0.25 µs; a target's own bandwidth when none is given; a
    bandwidth that is not positive is refused."""
    from mlalab.config import get_target

    t = decode_traffic(DecodeCase(kv_lens=(64,)), "fp8", 1.0)
    assert t.floor_us("h200", tbps=4.0) == pytest.approx(t.total_bytes / 4e12 * 1e6, rel=1e-15)
    one_mb = type(t)(1e6, 0.0, 0.0, 0.0)
    assert one_mb.floor_us("h200", tbps=4.0) == pytest.approx(0.25, rel=1e-15)
    assert one_mb.floor_us("h200", tbps=0.5) == pytest.approx(2.0, rel=1e-15)  # a slow part: below 1 TB/s is fine
    bw = get_target("h200").bandwidth_tbps
    assert one_mb.floor_us("h200") == pytest.approx(1e6 / (bw * 1e12) * 1e6, rel=1e-15)
    assert one_mb.intensity == 0.0 and t.intensity == pytest.approx(t.flops / t.total_bytes)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="has no known bandwidth; pass tbps="):
            one_mb.floor_us("h200", tbps=bad)

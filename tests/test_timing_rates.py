"""The rate columns of a timed row (bytes, TB/s, % of copy bandwidth, floor) from hand-computed figures, and every
recorded row of data/timings against them: a TB/s off by 1000x, or bytes counted twice, cannot pass."""

from __future__ import annotations

import math

import pytest

from mlalab.records.timings import TIMINGS_DIR, load_recorded
from mlalab.timing import call_bytes, rate_columns


def test_call_bytes_hand_computed() -> None:
    # a8w8, B=4, L=1024: KV 4*1024*576 B (fp8) + q 4*16*576 B (fp8) + out 4*16*512*2 B (bf16)
    assert call_bytes(4, 1024, "a8w8") == 2_359_296 + 36_864 + 65_536 == 2_461_696
    # a16w8: q in bf16 (2 B); bf16: KV and q in bf16
    assert call_bytes(4, 1024, "a16w8") == 2_359_296 + 2 * 36_864 + 65_536
    assert call_bytes(4, 1024, "bf16") == 2 * 2_359_296 + 2 * 36_864 + 65_536
    # B=128, L=8192, a8w8: 603,979,776 + 1,179,648 + 2,097,152
    assert call_bytes(128, 8192, "a8w8") == 607_256_576


def test_rate_columns_hand_computed() -> None:
    """2,461,696 bytes in 2.0 us = 1.230848 TB/s; at a copy bandwidth of 4.0 TB/s that is 30.7712 % of copy and the
    floor is 2,461,696 / 4e12 s = 0.615424 us."""
    r = rate_columns(2_461_696, 4.0, 2.0)
    assert r["tbps"] == pytest.approx(1.230848, rel=1e-12)
    assert r["pct_copy"] == pytest.approx(30.7712, rel=1e-12)
    assert r["floor_us"] == pytest.approx(0.615424, rel=1e-12)
    # small but valid: 1 byte at 0.5 TB/s copy bandwidth in 0.5 us -> floor 2e-6 us, 2e-6 TB/s, 4e-4 % of copy
    r = rate_columns(1, 0.5, 0.5)
    assert (r["floor_us"], r["tbps"], r["pct_copy"]) == pytest.approx((2e-6, 2e-6, 4e-4), rel=1e-12)
    # 607,256,576 bytes in 150 us on a 4.2 TB/s copy: 4.048377 TB/s, 96.39 % of copy, floor 144.5849 us
    r = rate_columns(607_256_576, 4.2, 150.0)
    assert r["tbps"] == pytest.approx(4.04837717333, rel=1e-10)
    assert r["pct_copy"] == pytest.approx(96.3899327, rel=1e-8)
    assert r["floor_us"] == pytest.approx(144.584899, rel=1e-8)
    # not timed yet: the floor only
    r = rate_columns(1_000_000, 4.0)
    assert r["floor_us"] == 0.25 and math.isnan(r["tbps"]) and math.isnan(r["pct_copy"])


@pytest.mark.parametrize(
    ("args", "name"),
    [((0, 4.0, 1.0), "nbytes"), ((1.5, 4.0, 1.0), "nbytes"), ((True, 4.0, 1.0), "nbytes"), ((10, 0.0, 1.0), "copy"),
     ((10, math.nan, 1.0), "copy"), ((10, math.inf, 1.0), "copy"), ((10, 4.0, 0.0), "us_median"),
     ((10, 4.0, -1.0), "us_median"), ((10, 4.0, "1"), "us_median")],
)  # fmt: skip
def test_rate_columns_refuse_bad_input(args: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        rate_columns(*args)


def test_every_recorded_row_has_consistent_rates() -> None:
    """Every timed row of every recorded run: its bytes are `call_bytes`' count and its TB/s, % of copy and floor
    are `rate_columns` of its bytes, time and copy bandwidth (the recorded numbers a user sees)."""
    df = load_recorded()
    assert df["run"].nunique() >= 10, TIMINGS_DIR
    timed = df[df["us_median"].notna() & (df["us_median"] > 0)]
    assert len(timed) > 100
    for row in timed.itertuples():
        want = rate_columns(int(row.bytes), float(row.copy_tbps), float(row.us_median))
        got = {"tbps": row.tbps, "pct_copy": row.pct_copy, "floor_us": row.floor_us}
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-9), (k, row.run, row.backend, row.batch, row.kv_len)
        assert 0.5 < float(row.copy_tbps) < 10  # TB/s, not GB/s or B/s
        assert float(row.tbps) < 1.2 * float(row.copy_tbps)  # nothing faster than the copy


@pytest.mark.gpu
def test_gpu_bench_one_fills_the_rate_columns_from_its_own_figures() -> None:
    """On the GPU: a timed row's columns are `rate_columns` of its own bytes, copy bandwidth and median time."""
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.timing import bench_one

    x = make_inputs(DecodeCase.uniform(4, 1024)).to("cuda")
    rec = bench_one("reference-torch", x, "bf16", copy_tbps=4.0, env={}, refs={}, replays=3)
    assert rec.status == "ok", rec.status
    assert rec.bytes == call_bytes(4, 1024, "bf16")
    want = rate_columns(rec.bytes, 4.0, rec.us_median)
    assert (rec.tbps, rec.pct_copy, rec.floor_us) == (want["tbps"], want["pct_copy"], want["floor_us"])

"""Question: what does reading KV rows from random slots of a token pool cost against reading them in order, on
this GPU, whatever the decode kernel does with them? (GPU only.)

A Triton kernel reads 576-byte rows (one fp8 KV token) 64 at a time, each program summing its 64 rows' words (so
nothing but the reads costs), once in order (rows 0, 1, 2, ...) and once through a token table of random slots of a
pool 4x the rows (the `tokens` layout of `mlalab.timing.LAYOUTS`). The ratio is the floor of a token-table decode's
time over a contiguous one's where both are bandwidth-bound.

    python experiments/gather_bandwidth.py --tokens 1048576,262144
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton
import triton.language as tl

from mlalab.timing import time_callable

ROW_WORDS = 144  # 576 bytes as int32


@triton.jit
def _read_rows(src, idx, out, BLOCK: tl.constexpr, WORDS: tl.constexpr, WPAD: tl.constexpr):
    pid = tl.program_id(0)
    rows = tl.load(idx + pid * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    w = tl.arange(0, WPAD)
    v = tl.load(src + rows[:, None] * WORDS + w[None, :], mask=(w < WORDS)[None, :], other=0)
    tl.store(out + pid, tl.sum(tl.sum(v, axis=1), axis=0))


def _launch(pool: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, i: int) -> None:
    """One read of the rows `idx` names (64 a program); `i` (the timing harness's call number) is unused."""
    _read_rows[(idx.numel() // 64,)](pool, idx, out, BLOCK=64, WORDS=ROW_WORDS, WPAD=256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tokens", default="1048576,262144", help="rows read per call (past the L2; multiples of 64), comma list"
    )
    ap.add_argument("--pool", type=int, default=4, help="pool size in multiples of the rows (default 4)")
    a = ap.parse_args()
    try:
        rows = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        raise SystemExit(f"--tokens must be a comma list of ints, got {a.tokens!r}") from None
    if not rows or any(n < 64 or n % 64 for n in rows):  # (64 rows a program: no row left out)
        raise SystemExit(f"--tokens must be multiples of 64, got {a.tokens!r}")
    if a.pool < 1:
        raise SystemExit(f"--pool must be >= 1, got {a.pool}")
    if not torch.cuda.is_available():
        raise SystemExit("gather_bandwidth.py needs a CUDA GPU")
    g = torch.Generator().manual_seed(0)
    for n in rows:
        pool = torch.randint(-(2**31), 2**31 - 1, (a.pool * n, ROW_WORDS), dtype=torch.int32, device="cuda")
        orders = {"in order": torch.arange(n), "random slots": torch.randperm(a.pool * n, generator=g)[:n]}
        out = torch.empty(n // 64, dtype=torch.int32, device="cuda")
        us = {}
        for name, idx in orders.items():
            idx = idx.to(torch.int32).cuda()

            call = functools.partial(_launch, pool, idx, out)
            us[name] = time_callable(call, 1)["us_median"]
        tbps = {k: n * 576 / (v * 1e-6) / 1e12 for k, v in us.items()}
        print(f"{n} rows of 576 B: in order {us['in order']:.1f} us ({tbps['in order']:.2f} TB/s), random slots of a "
              f"pool {a.pool}x {us['random slots']:.1f} us ({tbps['random slots']:.2f} TB/s): ratio "
              f"{us['random slots'] / us['in order']:.3f}", flush=True)  # fmt: skip
        del pool


if __name__ == "__main__":
    main()

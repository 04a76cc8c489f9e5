"""Sweep Triton a8w8 kernel/plan variants over the 12 competition shapes on the GPU, FlashMLA fp8 side by side.

Usage (device machine): ``python scripts/perf_sweep.py --out $OUT/sweep.csv [--variants name,...]``.
Prints one line per record and, at the end, the geomean µs per variant and its ratio to FlashMLA fp8's geomean.
Every Triton variant runs the ``simple`` planner of `mlalab.splitkv` (``plan_block`` / ``num_cus`` set its block and
plan slots); the CSV's `config` is ``variant:`` + the full KernelConfig as JSON (`mlalab.timing.parse_config`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: name -> triton backend options (KernelConfig knobs + plan knobs); the previous best first, as the baseline.
VARIANTS: dict[str, dict] = {
    "base_fp8_w8": dict(mma_fp16=False, contiguous=False, num_warps=8),
    "f16_w8": dict(num_warps=8),
    "f16_w8_s3": dict(num_warps=8, num_stages=3),
    "f16_w8_s4": dict(num_warps=8, num_stages=4),
    "f16_w8_n32_s4": dict(num_warps=8, block_n=32, num_stages=4),
    "f16_w16": dict(num_warps=16),
    "f16_w8_qktm": dict(num_warps=8, qk_tokens_m=True),
    "fp8_tr_w8": dict(mma_fp16=False, transposed=True, num_warps=8),
    "f16_tr_w8": dict(transposed=True, num_warps=8),
    "f16_w8_p16": dict(num_warps=8, p_fp8=False),
    "f16_w8_cu264": dict(num_warps=8, num_cus=264),
    "f16_w8_pb256": dict(num_warps=8, plan_block=256),
    # D-chunked heads-major path (KernelConfig.d_chunk): regs/spills from the sm_90 compile on the CPU machine;
    # H200 geomeans (data/timings/h200_2026-12-02_sweep_dchunk.csv): f16_w8 53.7 µs, dc256_w8 55.7, dc128_w8 60.1,
    # dc256_w8_s3 53.1, dc256_w8_n32 75.1, dc128_w8_pv1 53.9, w4 x 264 slots 58.1-85.4: none beats the default.
    "dc256_w8": dict(num_warps=8, d_chunk=256),  # 197 regs, no spill (default: 255 + 24 B stack)
    "dc128_w8": dict(num_warps=8, d_chunk=128),  # 254 regs, no spill
    "dc256_w8_s3": dict(num_warps=8, d_chunk=256, num_stages=3),  # 200 regs
    "dc256_w8_n32": dict(num_warps=8, d_chunk=256, block_n=32),  # 176 regs
    "dc128_w8_pv1": dict(num_warps=8, d_chunk=128, chunk_pv=False),  # one (16, 512) acc: 255 + 88 B stack
    "dc128_w4_n32_cu264": dict(num_warps=4, d_chunk=128, block_n=32, num_cus=264),  # 4 warps x 255: 2 CTAs/SM
    "dc256_w4_n32_cu264": dict(num_warps=4, d_chunk=256, block_n=32, num_cus=264),
    "dc128_w4_n16_cu264": dict(num_warps=4, d_chunk=128, block_n=16, num_cus=264),  # 234 regs, no spill
}


def main() -> None:
    import torch

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.timing import COMPETITION_SHAPES, bench_one, copy_bandwidth, fill_accuracy_by_shape, gpu_info, write_csv

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sweep.csv")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shapes", default="", help="e.g. 4x1024,128x8192 (default: the 12 competition shapes)")
    a = ap.parse_args()
    names = [v for v in a.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise ValueError(f"unknown variants {bad}; valid: {', '.join(VARIANTS)}")
    shapes = [tuple(int(t) for t in s.split("x")) for s in a.shapes.split(",") if s] or COMPETITION_SHAPES
    env, bw = gpu_info(), copy_bandwidth()
    print(f"# {env} copy {bw:.3f} TB/s", flush=True)
    recs, times = [], {}
    pending: dict = {}  # shape -> [(record, output)]: the errors after every timing (no references between timings)
    for B, L in shapes:
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        kept = pending.setdefault((B, L), [])
        runs = [("flashmla", "-", {})] + [("triton", n, VARIANTS[n]) for n in names]
        for be, name, opts in runs:
            r = bench_one(be, x, "a8w8", planner="simple" if be == "triton" else "-", copy_tbps=bw, env=env,
                          refs=None, outputs=kept, **opts)  # fmt: skip
            r.config = f"{name}:{r.config}" if be == "triton" else r.config
            recs.append(r)
            times.setdefault(name if be == "triton" else "flashmla", []).append(r.us_median)
            print(f"{name:16s} B={B:4d} L={L:5d} {r.us_median:8.2f} us {r.pct_copy:5.1f}% {r.status}", flush=True)
        del x
        torch.cuda.empty_cache()
        write_csv(recs, a.out)
    fill_accuracy_by_shape(pending, after_shape=lambda: write_csv(recs, a.out))
    ref = math.exp(sum(math.log(t) for t in times["flashmla"]) / len(times["flashmla"]))
    print(f"\n{'variant':16s} geomean_us  /flashmla  " + " ".join(f"{B}x{L}" for B, L in shapes))
    for k, ts in times.items():
        ok = [t for t in ts if t == t]
        g = math.exp(sum(math.log(t) for t in ok) / len(ok)) if len(ok) == len(ts) else float("nan")
        print(f"{k:16s} {g:9.2f} {g / ref:9.3f}  " + " ".join(f"{t:.1f}" for t in ts))


if __name__ == "__main__":
    main()

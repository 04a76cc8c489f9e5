"""Question: where does an accuracy sweep spend its time per row on a GPU (and on the CPU)?

A serial GPU sweep computed 58 rows/s on an H100 at the small competition shapes, far below what its fp64 work needs:
each row is a few hundred small tensor operations and a few dozen host syncs. This runs one case's rows (every Q and
KV scheme, one fp8 format) under `torch.profiler`, after a warm-up run of the same case, and prints rows/s, the
operator count and the host syncs per row, and the operators that take the most time on the host and on the device.

    python experiments/sweep_profile.py                          # 4 x 1024, competition inputs, cuda
    python experiments/sweep_profile.py --shape 32x8192 --device cpu --top 15
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mlalab.accuracy import sweep
from mlalab.config import DecodeCase
from mlalab.quant import KV_SCHEMES, Q_SCHEMES, concrete_names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4x1024", help="BxL of the case (default 4x1024)")
    ap.add_argument("--dist", default="competition", help="input distribution (default competition)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--top", type=int, default=20, help="operators listed (default 20)")
    a = ap.parse_args()
    try:
        b, n = (int(v) for v in a.shape.split("x"))
    except ValueError:
        raise SystemExit(f"--shape must be BxL, e.g. 4x1024; got {a.shape!r}") from None
    if a.top < 1:
        raise SystemExit(f"--top must be >= 1, got {a.top}")
    case = DecodeCase.uniform(b, n, dist=a.dist)
    qs, kvs = concrete_names(Q_SCHEMES), concrete_names(KV_SCHEMES)  # (as --q-schemes all / --kv-schemes all)
    sweep(case, qs, kvs, "e4m3fn", progress=False, device=a.device)  # warm-up: CUDA context, kernels, caches
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        df = sweep(case, qs, kvs, "e4m3fn", progress=False, device=a.device)
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    events = prof.key_averages()
    ops = sum(e.count for e in events if e.key.startswith("aten::"))
    syncs = sum(e.count for e in events if e.key == "aten::_local_scalar_dense")
    rows = len(df)
    print(f"{case.short_str()} on {a.device}: {rows} rows in {dt:.2f} s under the profiler ({rows / dt:.1f} rows/s); "
          f"{ops / rows:.0f} aten operators and {syncs / rows:.1f} host syncs per row")  # fmt: skip
    print(events.table(sort_by="self_cpu_time_total", row_limit=a.top))
    if a.device.startswith("cuda"):
        print(events.table(sort_by="self_cuda_time_total", row_limit=a.top))


if __name__ == "__main__":
    main()

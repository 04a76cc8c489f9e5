"""Where one Hopper decode call's time goes (GPU only): the whole call, stage 1 alone, the reduce alone, and one /
two empty kernels (the launch floor of a graph node), each timed like `python -m mlalab bench` (CUDA-graph
replays of 20 calls, KV copies rotated past the L2). Prints one table; ``--out`` also writes it as CSV.

    python scripts/profile_hopper.py --shapes 4x1024,128x8192 --plan-blocks 64,128
"""

from __future__ import annotations

import argparse
import math

import torch
import triton

from mlalab.backends.triton import make_callable
from mlalab.config import MLA, DecodeCase
from mlalab.inputs import make_inputs
from mlalab.timing import L2_BYTES, time_callable


@triton.jit
def _empty_kernel(x_ptr):
    pass


def _shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, _, L = part.partition("x")
        out.append((int(b), int(L)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=_shapes, default=_shapes("4x1024,4x8192,16x1024,32x1024,64x1024,128x8192"))
    ap.add_argument("--plan-blocks", default="64,128,256")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dummy = torch.zeros(1, device="cuda")
    empty1 = time_callable(lambda i: _empty_kernel[(132,)](dummy), 1)["us_median"]

    def two(i: int) -> None:
        _empty_kernel[(132,)](dummy)
        _empty_kernel[(132,)](dummy)

    empty2 = time_callable(two, 1)["us_median"]
    print(f"empty kernel: {empty1:.2f} us per graph node; two in a row: {empty2:.2f} us")
    rows = []
    for B, L in a.shapes:
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        kv_bytes = B * L * MLA.qk_dim
        n = int(min(16, max(2, math.ceil(4 * L2_BYTES / kv_bytes)), max(2, (1 << 30) // kv_bytes)))
        for blk in (int(v) for v in a.plan_blocks.split(",")):
            call, info = make_callable(x, precision="a8w8", n_copies=1, kernel="hopper", hopper_stages=a.stages,
                                       plan_block=blk)  # fmt: skip
            dec, plan = info["decoder"], info["plan"]
            copies = [dec.p.kv] + [dec.p.kv.clone() for _ in range(n - 1)]
            full = time_callable(lambda i: dec(kv=copies[i % n]), n)["us_median"]  # noqa: B023
            st1 = time_callable(lambda i: dec._stage1_hopper(dec.p.q, copies[i % n]), n)["us_median"]  # noqa: B023
            red = time_callable(lambda i: dec._reduce(), 1)["us_median"]  # noqa: B023
            tiles = (dec.tile_indptr[1:] - dec.tile_indptr[:-1]).cpu()
            s = plan.summary()
            row = dict(B=B, L=L, plan_block=blk, works=int(plan.work_info.shape[0]), split=s["split_requests"],
                       partial_rows=plan.n_partial_rows, max_tiles_per_cta=int(tiles.max()),
                       full_us=round(full, 2), stage1_us=round(st1, 2), reduce_us=round(red, 2))  # fmt: skip
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        del x
        torch.cuda.empty_cache()
    if a.out:
        import pandas as pd

        pd.DataFrame(rows).to_csv(a.out, index=False)


if __name__ == "__main__":
    main()

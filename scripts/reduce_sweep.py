"""Choose the reduce's launch shape (GPU only): per competition shape with split requests, µs per whole decode call
(stage 1 + reduce, CUDA-graph replays over rotated KV copies like `python -m mlalab bench`) for every
(num_warps, BLOCK_DV) the reduce accepts, one process. The rule in `TritonDecoder` (`reduce_warps`,
`reduce_block_dv`) was read off this table (data/profiles/*_reduce_sweep.csv).

    python scripts/reduce_sweep.py --out /tmp/reduce_sweep.csv
"""

from __future__ import annotations

import argparse

import torch

from mlalab.backends.triton import make_callable
from mlalab.config import MLA, DecodeCase
from mlalab.inputs import make_inputs
from mlalab.io import write_rows_csv
from mlalab.timing import provenance, rotation_copies, time_callable

SHAPES = [(4, 1024), (8, 1024), (16, 1024), (32, 1024), (64, 1024), (4, 8192), (16, 8192), (64, 8192)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="CSV of every (shape, warps, block_dv) timed")
    ap.add_argument("--warps", default="1,2,4", help="warps per reduce program to try, e.g. 1,2,4,8,16")
    a = ap.parse_args()
    rows = []
    for B, L in SHAPES:
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        kv_bytes = B * L * MLA.qk_dim
        n = rotation_copies(kv_bytes)
        call, info = make_callable(x, precision="a8w8", n_copies=n)
        dec = info["decoder"]
        if not dec.split_tiles.numel():
            continue
        bp, default = dec.reduce_block_p, (dec.reduce_warps, dec.reduce_block_dv)
        ref = call(0).clone()
        for warps in [int(w) for w in a.warps.split(",")]:
            for bdv in (4, 8, 16, 32, 64, 128, 256):
                per_thread = bp * bdv * MLA.num_heads // (32 * warps)
                if per_thread > 128 or per_thread < 2:
                    continue
                dec.reduce_warps, dec.reduce_block_dv = warps, bdv
                out = call(0)
                diff = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
                us = time_callable(call, n)["us_median"]
                rows.append({"B": B, "L": L, "block_p": bp, "warps": warps, "block_dv": bdv,
                             "floats_per_thread": per_thread, "full_us": round(us, 2), "max_diff_vs_default": diff,
                             "default": (warps, bdv) == default})  # fmt: skip
                print(rows[-1], flush=True)
        dec.reduce_warps, dec.reduce_block_dv = default
        del x
        torch.cuda.empty_cache()
    if a.out and rows:
        prov = provenance()  # device, versions, date in every row
        write_rows_csv(a.out, [{**r, **prov} for r in rows])
    best: dict[tuple[int, int], dict] = {}
    for r in rows:
        k = (r["B"], r["L"])
        if k not in best or r["full_us"] < best[k]["full_us"]:
            best[k] = r
    for k, r in best.items():
        print("best", k, "block_p", r["block_p"], "warps", r["warps"], "block_dv", r["block_dv"], r["full_us"])


if __name__ == "__main__":
    main()

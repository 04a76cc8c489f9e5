"""Where the reduce's time goes (GPU only): per competition shape with split requests, µs per call (CUDA-graph
replays over rotated KV copies, like `python -m mlalab bench`) of stage 1 alone, stage 1 + an EMPTY dependent kernel
(one CTA, or the reduce's grid; launched as a programmatic dependent that waits for stage 1, or plainly), and the
whole decode. The differences split the reduce's cost into the kernel boundary and the merge itself.

    python scripts/reduce_probe.py --out /tmp/reduce_probe.csv
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from mlalab.backends.triton import make_callable
from mlalab.config import MLA, DecodeCase
from mlalab.inputs import make_inputs
from mlalab.io import write_rows_csv
from mlalab.splitkv.triton_decode import gdc_wait
from mlalab.timing import provenance, rotation_copies, time_callable

SHAPES = [(4, 1024), (8, 1024), (16, 1024), (32, 1024), (64, 1024), (4, 8192), (16, 8192), (64, 8192)]


@triton.jit
def _empty(X, USE_PDL: tl.constexpr):
    if USE_PDL:
        gdc_wait()
    if tl.program_id(0) < 0:  # never: keeps X an argument
        tl.store(X, 0)


def probe(B: int, L: int) -> dict | None:
    """One shape's row (None when no request splits)."""
    x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
    n = rotation_copies(B * L * MLA.qk_dim)
    call, info = make_callable(x, precision="a8w8", n_copies=n)
    dec = info["decoder"]
    if not dec.split_tiles.numel():
        return None
    copies = info["kv_copies"]  # the ones `call` rotates through
    grid = (dec.split_tiles.numel(), MLA.v_dim // dec.reduce_block_dv)
    sink = torch.zeros(1, device="cuda")

    def s1(i: int) -> None:
        dec._stage1_hopper(dec.p.q, copies[i % n])

    def s1_empty(i: int, g: tuple, pdl: bool) -> None:
        s1(i)
        _empty[g](sink, USE_PDL=pdl, **({"launch_pdl": True} if pdl else {}))

    line = {"B": B, "L": L, "split_requests": int(dec.split_tiles.numel()), "reduce_grid": grid[0] * grid[1],
            "full": time_callable(call, n)["us_median"], "stage1": time_callable(s1, n)["us_median"]}  # fmt: skip
    for name, g, pdl in (("empty1_pdl", (1,), True), ("emptygrid_pdl", grid, True), ("empty1_plain", (1,), False)):
        line[name] = time_callable(lambda i, g=g, pdl=pdl: s1_empty(i, g, pdl), n)["us_median"]
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for B, L in SHAPES:
        line = probe(B, L)
        torch.cuda.empty_cache()
        if line is None:
            continue
        rows.append(line)
        print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in line.items()), flush=True)
    if a.out and rows:
        prov = provenance()  # device, versions, date in every row
        write_rows_csv(a.out, [{**r, **prov} for r in rows])


if __name__ == "__main__":
    main()

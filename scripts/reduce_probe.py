"""Where the reduce's time goes (GPU only): per competition shape with split requests, µs per call (CUDA-graph
replays over rotated KV copies, like `python -m mlalab bench`) of stage 1 alone, stage 1 + an EMPTY dependent kernel
(one CTA, or the reduce's grid; launched as a programmatic dependent that waits for stage 1, or plainly), and the
whole decode. The differences split the reduce's cost into the kernel boundary and the merge itself.

With ``--anatomy``, also stage 1 + a copy of the reduce's memory traffic with parts switched off (`_anatomy`: the
plan loads before the wait, ``plan``; each block's LSEs and partials after it, ``loads``; the output stores,
``store``; outputs meaningless): columns ``anat_plan``, ``anat_plan_loads_store`` and ``anat_loads_store`` (the
partial rows computed instead of loaded from the plan) split the merge's cost further. (Loads without the store are
not a column: the compiler drops loads whose result is never stored. The copy's stores are strided, so the
``..._store`` columns run slower than the real reduce; data/profiles/h200_2026-12-04_reduce_anatomy.csv still has
the dropped column.)

The decoder runs fp32 partials and the Triton reduce here (`KernelConfig.hopper_partials` / ``hopper_reduce``
pinned), the reduce `_anatomy` copies and the empty grid matches.

    python scripts/reduce_probe.py --out /tmp/reduce_probe.csv
    python scripts/reduce_probe.py --anatomy --out /tmp/reduce_anatomy.csv
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


@triton.jit
def _anatomy(PART_O, PART_LSE, REDUCE_INDPTR, REDUCE_PARTIAL_MAP, SPLIT_TILES, SINK, n_rows, H: tl.constexpr,
             DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_P: tl.constexpr, PLAN: tl.constexpr, LOADS: tl.constexpr,
             STORE: tl.constexpr, USE_PDL: tl.constexpr):  # fmt: skip
    """The production reduce's memory traffic (`triton_decode._reduce_kernel`: same grid, head-minor partials, the
    first block of partials of each split tile), its parts switched on one by one; the values are not a merge."""
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_h = tl.arange(0, H)
    if PLAN:  # the reduce's chain: split tile -> its partials' range -> their rows (all before the wait)
        t = tl.load(SPLIT_TILES + tl.program_id(0))
        s = tl.load(REDUCE_INDPTR + t)
        n = tl.load(REDUCE_INDPTR + t + 1) - s
        prow = tl.load(REDUCE_PARTIAL_MAP + s + offs_p, mask=offs_p < n, other=0)
    else:  # rows computed: as many bytes, no plan round trips
        n = BLOCK_P
        prow = (tl.program_id(0) * BLOCK_P + offs_p) % n_rows
    if USE_PDL:
        gdc_wait()
    acc = tl.zeros([BLOCK_DV, H], tl.float32)
    if LOADS:
        pm = offs_p < n
        rows = prow.to(tl.int64)
        lp = tl.load(PART_LSE + rows[:, None] * H + offs_h[None, :], mask=pm[:, None], other=float("-inf"))
        o_p = tl.load(PART_O + rows[:, None, None] * (H * DV) + (offs_d[:, None] * H + offs_h[None, :])[None, :, :],
                      mask=pm[:, None, None], other=0.0)  # fmt: skip
        w = tl.where(pm[:, None], tl.exp(lp - tl.max(lp, 0)[None, :]), 0.0)
        acc = tl.sum(w[:, None, :] * o_p, 0)
    if STORE:
        out = SINK + tl.program_id(0).to(tl.int64) * (H * DV)
        tl.store(out + offs_h[None, :] * DV + offs_d[:, None], acc.to(SINK.dtype.element_ty))


#: `--anatomy` columns: (PLAN, LOADS, STORE) of `_anatomy`
ANATOMY = {"anat_plan": (True, False, False), "anat_plan_loads_store": (True, True, True),
           "anat_loads_store": (False, True, True)}  # fmt: skip


def probe(B: int, L: int, anatomy: bool = False) -> dict | None:
    """One shape's row (None when no request splits)."""
    x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
    n = rotation_copies(B * L * MLA.qk_dim)
    call, info = make_callable(x, precision="a8w8", n_copies=n, hopper_partials="fp32", hopper_reduce="triton")
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
    if anatomy:
        plan = dec.plan
        out = torch.zeros(grid[0], MLA.num_heads, MLA.v_dim, dtype=torch.bfloat16, device="cuda")

        def s1_anatomy(i: int, flags: tuple) -> None:
            s1(i)
            _anatomy[grid](dec.part_o, dec.part_lse, plan.reduce_indptr, plan.reduce_partial_map, dec.split_tiles, out,
                           dec.part_o.shape[0], H=MLA.num_heads, DV=MLA.v_dim, BLOCK_DV=dec.reduce_block_dv,
                           BLOCK_P=dec.reduce_block_p, PLAN=flags[0], LOADS=flags[1], STORE=flags[2], USE_PDL=True,
                           num_warps=dec.reduce_warps, launch_pdl=True)  # fmt: skip

        for name, flags in ANATOMY.items():
            line[name] = time_callable(lambda i, f=flags: s1_anatomy(i, f), n)["us_median"]
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--anatomy", action="store_true", help="also the reduce's traffic part by part (`_anatomy`)")
    a = ap.parse_args()
    rows = []
    for B, L in SHAPES:
        line = probe(B, L, a.anatomy)
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

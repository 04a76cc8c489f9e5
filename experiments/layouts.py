"""Question: what does each decode layout cost on the H200 — speculative decode (q_len 2, 4), paged KV (page 64 or
16 with a random page table), page size 1 with a random token table — against q_len 1 on a contiguous cache and
against FlashMLA fp8 on the same tensors? And for q_len > 1: do a plan slot's q rows run better side by side on
q_len SMs (the default plan: SMs // q_len slots) than as q_len waves of a 132-slot plan?

Times every case with `mlalab.timing.run_suite` (CUDA-graph replays over KV copies rotated past the L2, errors
against the fp64-on-fp32 references filled in a second pass) and writes one timing CSV (q_len and layout columns).
The Triton rows carry what ran in their config cell (``ran``: ``sm90:v-regs`` or ``portable``; ``num_cus``).

    python experiments/layouts.py --out data/timings/h200_DATE_layouts.csv
    python experiments/layouts.py --shapes 4x1024,128x8192 --q-lens 2 --layouts contiguous --slots 132
"""

from __future__ import annotations

import argparse

from mlalab.config import COMPETITION_SHAPES
from mlalab.timing import LAYOUTS, run_suite


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shapes are BxL[,BxL...], got {text!r}") from None
    if not out or any(len(s) != 2 for s in out):
        raise argparse.ArgumentTypeError(f"shapes are BxL[,BxL...], got {text!r}")
    return out  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=_shapes, default=list(COMPETITION_SHAPES), help="BxL list (default: the 12)")
    ap.add_argument("--q-lens", default="1,2,4", help="comma list (default 1,2,4)")
    ap.add_argument("--layouts", default="contiguous,paged64", help=f"comma list of {', '.join(LAYOUTS)}")
    ap.add_argument("--precisions", default="a8w8", help="comma list (default a8w8)")
    ap.add_argument("--backends", default="triton,flashmla", help="comma list (default triton,flashmla)")
    ap.add_argument("--slots", default="", help="comma list of extra plan slot counts to time beside the default")
    ap.add_argument("--out", required=True, help="timing CSV to write (atomically, after each case)")
    a = ap.parse_args()
    configs = ({},) + tuple({"num_cus": int(s)} for s in a.slots.split(",") if s)
    run_suite(
        shapes=a.shapes,
        q_lens=tuple(int(q) for q in a.q_lens.split(",")),
        layouts=tuple(a.layouts.split(",")),
        precisions=tuple(a.precisions.split(",")),
        backends=tuple(a.backends.split(",")),
        triton_configs=configs,
        out=a.out,
    )


if __name__ == "__main__":
    main()

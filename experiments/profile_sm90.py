"""Question: where does one decode call's time go on the H200, shape by shape?

Per shape, in one process beside FlashMLA fp8 (GPU only):

* µs per call (CUDA-graph replays of 20 calls over KV copies rotated past the L2, like `python -m mlalab bench`) of
  FlashMLA, our whole call, stage 1 alone (`Decoder.stage1`) and the reduce alone (`Decoder.reduce`), and one / two
  empty kernels (the launch floor of a graph node: ``graph_node_us`` / ``two_nodes_us``, the same in every row);
* stage 1's per-CTA time line (`Decoder.stage1_timeline`): launch skew, the plan header's round trip, the first
  tile's arrival, the per-tile interval and its parts, the epilogue and the spread of the CTAs' ends;
* with ``--ablations``, the whole call again with the score wgmma skipped and with both wgmmas skipped, or with
  ``--precision a8w4-mxfp4`` (the e4m3 route) with the fp4 -> e4m3 conversion skipped, and with its block scales'
  loads skipped too (`Decoder.ablation`: outputs wrong, timing only): what the call would take if that work were
  free — for fp4, where a kernel that converted on other warps could at best arrive. With fp4 our a8w8 decode is
  timed beside (``a8w8_us``), FlashMLA in fp8.

``--out-dir`` writes ``profile.csv`` (one row per shape; data/profiles/*_profile.csv) and ``timeline_events.csv`` (the
events of every shape's stamped launch; data/profiles/*_timeline.csv).

    python experiments/profile_sm90.py --out-dir /tmp/prof --ablations
    python experiments/profile_sm90.py --shapes 4x1024,128x8192 --precision bf16
    python experiments/profile_sm90.py --shapes 32x8192,128x8192 --q-len 4 --ablations   # speculative decode
    python experiments/profile_sm90.py --precision a8w4-mxfp4 --ablations   # fp4 with its conversion free
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import triton

from mlalab.backends import get_backend
from mlalab.backends.triton import make_callable
from mlalab.config import COMPETITION_SHAPES, DecodeCase
from mlalab.inputs import make_inputs
from mlalab.io import write_rows_csv
from mlalab.timing import copy_bandwidth, kv_cache_bytes, provenance, rotation_copies, time_callable


@triton.jit
def _empty_kernel(x_ptr):
    pass


def _shapes(text: str) -> list[tuple[int, int]]:
    return [(int(b), int(n)) for b, _, n in (p.partition("x") for p in text.split(","))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=_shapes, default=sorted(COMPETITION_SHAPES, key=lambda s: (s[1], s[0])))
    ap.add_argument("--plan-block", type=int, default=None, help="the simple planner's block (default: the backend's)")
    ap.add_argument("--q-len", type=int, default=1, help="query rows a request (speculative decode; default 1)")
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--precision", default="a8w8", choices=("a8w8", "a16w8", "bf16", "a8w4-mxfp4"))
    ap.add_argument("--ablations", action="store_true", help="also time the call with the QK / QK+PV compute skipped")
    ap.add_argument("--out-dir", default=None, help="writes profile.csv and timeline_events.csv there")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_sm90.py needs an sm_90 GPU")
    dummy = torch.zeros(1, device="cuda")
    empty1 = time_callable(lambda i: _empty_kernel[(132,)](dummy), 1)["us_median"]

    def two(i: int) -> None:
        _empty_kernel[(132,)](dummy)
        _empty_kernel[(132,)](dummy)

    empty2 = time_callable(two, 1)["us_median"]
    bw = copy_bandwidth()
    print(f"empty kernel: {empty1:.2f} us per graph node, two in a row {empty2:.2f} us; copy {bw:.3f} TB/s", flush=True)
    rows, events = [], []
    for B, L in a.shapes:
        x = make_inputs(DecodeCase.uniform(B, L, q_len=a.q_len)).to("cuda")
        n = rotation_copies(kv_cache_bytes(B, L, a.precision))
        row: dict[str, object] = {"B": B, "L": L, "q_len": a.q_len, "precision": a.precision,
                                  "graph_node_us": round(empty1, 2), "two_nodes_us": round(empty2, 2)}  # fmt: skip
        fp4 = a.precision == "a8w4-mxfp4"
        if not a.no_flashmla and a.precision != "a16w8":  # (FlashMLA has no bf16-q / fp8-KV path, no fp4: fp8)
            fcall, _ = get_backend("flashmla").make_callable(x, precision="a8w8" if fp4 else a.precision, n_copies=n)
            row["flashmla_us"] = round(time_callable(fcall, n)["us_median"], 2)
        if fp4:  # our fp8 decode on the same case, the ratio the fp4 goal is stated in
            n8 = rotation_copies(kv_cache_bytes(B, L, "a8w8"))
            call8, _ = make_callable(x, precision="a8w8", n_copies=n8, kernel="sm90", plan_block=a.plan_block)
            row["a8w8_us"] = round(time_callable(call8, n8)["us_median"], 2)
            del call8
        _, info = make_callable(x, precision=a.precision, n_copies=n, kernel="sm90", plan_block=a.plan_block)
        dec, plan, copies = info["decoder"], info["plan"], info["kv_copies"]
        row["ran"] = dec.ran
        row["full_us"] = round(time_callable(lambda i: dec(kv=copies[i % n]), n)["us_median"], 2)  # noqa: B023
        row["stage1_us"] = round(time_callable(lambda i: dec.stage1(kv=copies[i % n]), n)["us_median"], 2)  # noqa: B023
        row["reduce_us"] = round(time_callable(lambda i: dec.reduce(), 1)["us_median"], 2)  # noqa: B023
        if a.ablations:
            skips = [("qk", "full_no_qk_us"), ("qk+pv", "full_no_qk_pv_us")]
            if fp4:
                skips = [("convert", "full_no_convert_us"), ("convert+scales", "full_no_convert_scales_us")]
            for skip, col in skips:
                ablated = dec.ablation(skip)
                row[col] = round(time_callable(lambda i: ablated(kv=copies[i % n]), n)["us_median"], 2)  # noqa: B023
        tiles = dec.sm90.tiles_per_cta
        row.update(works=int(plan.work_info.shape[0]), partial_rows=plan.n_partial_rows,
                   max_tiles_per_cta=int(tiles.max()))  # fmt: skip
        for _ in range(3):  # the last of three launches (the first may include the stamping kernel's compile)
            tl = dec.stage1_timeline(kv=copies[1 % n])
        row.update({k: round(v, 1) for k, v in tl.summary().items()})
        row["clock_ghz"] = round(tl.clock_ghz, 3)
        row["clock_source"] = tl.clock_source
        events += [{"B": B, "L": L, **e} for e in tl.events()]
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        torch.cuda.empty_cache()
    if a.out_dir:
        for name, data in (("profile.csv", rows), ("timeline_events.csv", events)):
            if data:
                # device, versions and date in every profile row (not in the long events table: same run)
                prov = provenance() if name == "profile.csv" else {}
                write_rows_csv(os.path.join(a.out_dir, name), [{**r, **prov} for r in data])
    for base in ("flashmla_us", "a8w8_us"):
        if rows and base in rows[0]:
            for col in ("full_us", "full_no_qk_us", "full_no_qk_pv_us", "full_no_convert_us",
                        "full_no_convert_scales_us"):  # fmt: skip
                if col in rows[0]:
                    g = math.exp(sum(math.log(r[col] / r[base]) for r in rows) / len(rows))
                    print(f"geomean {col} / {base}: {g:.3f}")


if __name__ == "__main__":
    main()

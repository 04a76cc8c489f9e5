"""Where one Hopper decode call's time goes (GPU only), per shape, in one process beside FlashMLA fp8:

* µs per call (CUDA-graph replays of 20 calls over KV copies rotated past the L2, like `python -m mlalab bench`)
  of FlashMLA fp8, our whole call, stage 1 alone and the reduce alone, and one / two empty kernels (the launch
  floor of a graph node: columns ``graph_node_us`` / ``two_nodes_us``, the same in every row);
* stage 1's per-CTA timeline (`TritonDecoder.stage1_timeline`): launch skew, the plan header's round trip, the
  first tile's arrival, the per-tile interval, the epilogue and the spread of the CTAs' ends;
* with ``--reduce-before FILE`` (a module with an older ``reduce_kernel``), that reduce too, for an A/B;
* with ``--ablations``, the whole call again with the score wgmma skipped (``hopper_ablate="qk"``) and with both
  wgmmas skipped (``"qk+pv"``): what the call would take if that compute were free (outputs wrong; timing only).

    python scripts/profile_hopper.py --out-dir /tmp/prof            # the 12 competition shapes, default config
    python scripts/profile_hopper.py --shapes 4x1024,128x8192 --knobs '{"hopper_variant": "v-regs"}'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import types

import torch
import triton

from mlalab.backends.triton import make_callable
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.io import write_rows_csv
from mlalab.timing import copy_bandwidth, kv_cache_bytes, provenance, rotation_copies, time_callable

SHAPES = [(b, n) for n in (1024, 8192) for b in (4, 8, 16, 32, 64, 128)]


@triton.jit
def _empty_kernel(x_ptr):
    pass


def _shapes(text: str) -> list[tuple[int, int]]:
    return [(int(b), int(n)) for b, _, n in (p.partition("x") for p in text.split(","))]


def _load_reduce(path: str) -> object:
    spec = importlib.util.spec_from_file_location("reduce_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.reduce_kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=_shapes, default=SHAPES)
    ap.add_argument("--knobs", default="{}", help="KernelConfig fields as JSON (default: the defaults)")
    ap.add_argument("--reduce-before", default=None)
    ap.add_argument("--plan-block", type=int, default=None, help="the simple planner's block (default: the backend's)")
    ap.add_argument("--no-flashmla", action="store_true")
    ap.add_argument("--precision", default="a8w8", choices=("a8w8", "a16w8", "bf16"),
                    help="a8w8 (v-regs), a16w8 (v-conv) or bf16 (v-tile); FlashMLA beside a8w8 and bf16")  # fmt: skip
    ap.add_argument("--ablations", action="store_true", help="also time the call with the QK / QK+PV compute skipped")
    ap.add_argument("--out-dir", default=None, help="writes profile.csv and timeline_events.csv there")
    a = ap.parse_args()
    knobs = json.loads(a.knobs)
    old_reduce = _load_reduce(a.reduce_before) if a.reduce_before else None
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
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        n = rotation_copies(kv_cache_bytes(B, L, a.precision))
        row: dict[str, object] = {"B": B, "L": L, "precision": a.precision, "graph_node_us": round(empty1, 2),
                                  "two_nodes_us": round(empty2, 2)}  # fmt: skip
        if not a.no_flashmla and a.precision != "a16w8":  # (FlashMLA has no bf16-q / fp8-KV path)
            from mlalab.backends import get_backend

            fcall, _ = get_backend("flashmla").make_callable(x, precision=a.precision, n_copies=n)
            row["flashmla_us"] = round(time_callable(fcall, n)["us_median"], 2)
        call, info = make_callable(x, precision=a.precision, n_copies=n, kernel="hopper", plan_block=a.plan_block,
                                   **knobs)  # fmt: skip
        dec, plan = info["decoder"], info["plan"]
        copies = info["kv_copies"]  # the ones `call` rotates through
        row["ran"] = dec.ran
        row["full_us"] = round(time_callable(lambda i: dec(kv=copies[i % n]), n)["us_median"], 2)  # noqa: B023
        st1 = time_callable(lambda i: dec._stage1_hopper(dec.p.q, copies[i % n]), n)["us_median"]  # noqa: B023
        row["stage1_us"] = round(st1, 2)
        row["reduce_us"] = round(time_callable(lambda i: dec._reduce(), 1)["us_median"], 2)  # noqa: B023
        if old_reduce is not None:
            new_k = dec.K
            dec.K = types.SimpleNamespace(reduce_kernel=old_reduce)
            row["full_old_reduce_us"] = round(time_callable(lambda i: dec(kv=copies[i % n]), n)["us_median"], 2)  # noqa: B023
            row["reduce_old_us"] = round(time_callable(lambda i: dec._reduce(), 1)["us_median"], 2)  # noqa: B023
            dec.K = new_k
        if a.ablations:
            for ablate, col in (("qk", "full_no_qk_us"), ("qk+pv", "full_no_qk_pv_us")):
                acall, _ = make_callable(x, precision=a.precision, n_copies=n, kernel="hopper", plan_block=a.plan_block,
                                         **{**knobs, "hopper_ablate": ablate})  # fmt: skip
                acall(0)
                row[col] = round(time_callable(acall, n)["us_median"], 2)
                del acall
        tiles = dec.tile_indptr.diff().cpu()
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
        del x
        torch.cuda.empty_cache()
    if a.out_dir:
        for name, data in (("profile.csv", rows), ("timeline_events.csv", events)):
            if data:
                # device, versions and date in every profile row (not in the long events table: same run)
                prov = provenance() if name == "profile.csv" else {}
                write_rows_csv(os.path.join(a.out_dir, name), [{**r, **prov} for r in data])
    if rows and "flashmla_us" in rows[0]:
        for col in ("full_us", "full_old_reduce_us", "full_no_qk_us", "full_no_qk_pv_us"):
            if col in rows[0]:
                g = math.exp(sum(math.log(r[col] / r["flashmla_us"]) for r in rows) / len(rows))
                print(f"geomean {col} / flashmla: {g:.3f}")


if __name__ == "__main__":
    main()

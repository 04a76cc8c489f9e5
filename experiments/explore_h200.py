"""Question: how long does each split policy's plan take on our sm_90 kernel for ragged batches, and how well does the
explorer's cost model (makespan = the most loaded SM's tokens + a per-work overhead) predict that order?

For each ragged batch (the explorer's length mixes, `mlalab.plan.explore.MIXES`, seeds 0..S-1) and each policy
(`mlalab.plan.explore.POLICIES`: aiter's three planners, balanced, simple, fixed-16, FlashMLA's rule, the oracle),
the plan is built for this GPU's SM count, run once and checked against the fp64 reference on the dequantised codes
(rel-L2 recorded; a plan whose output is off by more than 5e-3 is flagged in the log), then timed as `python -m
mlalab bench` times (CUDA-graph replays of 20 calls over KV copies rotated past the L2). One row per (batch,
policy): the model's metrics beside the measured µs, with device, versions, date and commit in every row.
Written atomically after every batch to ``data/explore/<gpu>_<date>_explore.csv`` (or ``--out``); the notebook 03
panel and `mlalab.widgets.splitkv.model_vs_measured` read it.

    python experiments/explore_h200.py                       # 6 mixes x 1 seed x 8 policies, a8w8
    python experiments/explore_h200.py --seeds 2 --policies aiter-fast,balanced,simple,flashmla,oracle
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from mlalab.backends.triton import make_callable
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.io import write_rows_csv
from mlalab.kernels import naive_decode
from mlalab.plan import indptrs_for
from mlalab.plan.explore import MIXES, POLICIES, CostModel, mix_lengths, plan_oracle, plan_policy, score
from mlalab.timing import kv_cache_bytes, provenance, rotation_copies, time_callable

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The checkout's short commit (``MLALAB_COMMIT`` when the copy has no .git)."""
    env = os.environ.get("MLALAB_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "mlalab", "experiments"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def names(text: str, valid: dict, what: str) -> list[str]:
    got = [t for t in text.split(",") if t]
    bad = [t for t in got if t not in valid]
    if bad or not got:
        raise SystemExit(f"unknown {what} {bad or text!r}; valid: {', '.join(valid)}")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", type=int, default=1, help="batches per mix (default %(default)s)")
    ap.add_argument("--precision", default="a8w8", choices=("a8w8", "bf16"))
    ap.add_argument("--overhead", type=int, default=64, help="cost model: tokens per work (default %(default)s)")
    ap.add_argument("--out", default=None, help="default data/explore/<gpu>_<date>_explore.csv")
    a = ap.parse_args()
    mixes, policies = names(a.mixes, MIXES, "mix"), names(a.policies, POLICIES, "policy")
    if a.seeds < 1:
        raise SystemExit("--seeds must be >= 1")
    if len(mixes) * a.seeds < 6 or len(policies) < 5:
        print("note: fewer than 6 batches x 5 policies: not enough for the recorded comparison", flush=True)
    if not torch.cuda.is_available():
        raise SystemExit("explore_h200.py needs a CUDA GPU (it times the kernel)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    model = CostModel(overhead=a.overhead)
    prov = {**provenance(), "commit": commit()}
    found = re.search(r"[A-Z]\d{3}", torch.cuda.get_device_name())  # H100, H200, ...
    tag = found.group(0).lower() if found else "gpu"
    out = Path(a.out) if a.out else ROOT / "data" / "explore" / f"{tag}_{datetime.date.today().isoformat()}_explore.csv"
    rows, t0 = [], time.time()
    for mix in mixes:
        for seed in range(a.seeds):
            lens = mix_lengths(mix, seed)
            x = make_inputs(DecodeCase(kv_lens=tuple(lens), seed=seed)).to("cuda")
            plans = {p: plan_policy(p, lens, sms, model=model) for p in POLICIES if p != "oracle"}
            qo, kv = indptrs_for(lens)
            plans["oracle"] = plan_oracle(qo, kv, sms, model=model, candidates=tuple(plans.values()))
            n = rotation_copies(kv_cache_bytes(1, sum(lens), a.precision))
            ref = None
            for pol in policies:
                plan = plans[pol]
                row = {"mix": mix, "seed": seed, "batch": len(lens), "tokens": sum(lens), "longest": max(lens),
                       "policy": pol, **score(plan, model, oracle=plans["oracle"]), "overhead_model": a.overhead,
                       "precision": a.precision, "plan_hash": plan.digest()["hash"]}  # fmt: skip
                try:
                    call, info = make_callable(x, precision=a.precision, plan=plan.to("cpu"), n_copies=n)
                    got = call(0).double()
                    if ref is None:
                        ref = naive_decode(info["prepared"])[0].to(got.device)
                    live = ref.norm(dim=-1) > 0
                    row["rel_l2"] = float((got[live] - ref[live]).norm() / ref[live].norm())
                    row["kernel"] = info["decoder"].kernel
                    row.update(time_callable(call, n))
                except Exception as e:  # noqa: BLE001 (a failing policy is recorded, the others still run)
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    print(f"FAIL {mix}/{seed} {pol}: {row['error']}", flush=True)
                flag = " CHECK FAILED" if row.get("rel_l2", 0) > 5e-3 else ""
                us, err = row.get("us_median", float("nan")), row.get("rel_l2", float("nan"))
                print(f"{mix:>11} s{seed} {pol:>17}: model {row['makespan']:>8} tok, measured {us:8.2f} us, "
                      f"rel-L2 {err:.1e}{flag}", flush=True)  # fmt: skip
                rows.append({**row, **prov})
                torch.cuda.empty_cache()
            del x
            write_rows_csv(out, rows)  # atomically, after every batch: a run cut short keeps what it measured
    print(f"wrote {out} ({len(rows)} rows) in {time.time() - t0:.0f} s; add a row to data/INDEX.csv", file=sys.stderr)


if __name__ == "__main__":
    main()

"""A/B of Hopper stage-1 variants on the H200 (GPU only), side by side with FlashMLA in one run.

First every variant is checked against the fp64 reference on the dequantised codes (ragged, long, empty and
40-request batches, two planners): rel-L2 <= 5e-3, |dLSE| <= 2e-3, every element written (outputs poisoned with
NaN first). Then each variant and FlashMLA fp8 are timed like `python -m mlalab bench` (CUDA-graph replays of 20
calls over KV copies rotated past the L2) on the competition shapes. Prints one table; ``--out`` writes a CSV.

    python scripts/hopper_ab.py --variants v1,v2,auto --out /tmp/ab.csv
    python scripts/hopper_ab.py --precision bf16 --variants portable,v-tile   # bf16: FlashMLA bf16 beside
    python scripts/hopper_ab.py --precision a16w8 --peers flashinfer --variants portable,v-conv
    python scripts/hopper_ab.py --no-check --variants auto,auto@64,auto@96   # plans of 64 / 96 slots (CTAs)
    python scripts/hopper_ab.py --variants p16gr,p16gr~half   # the Gluon reduce with half the values per thread

A variant's knobs run the sm_90 kernel (``kernel="hopper"``) unless they name another ``kernel``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Callable, Iterator

import torch

from mlalab.backends.triton import build_plan, make_callable
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs, ragged_kv_lens
from mlalab.io import write_rows_csv
from mlalab.splitkv.triton_mla import KernelConfig, TritonDecoder, naive_decode, prepare
from mlalab.timing import call_bytes, copy_bandwidth, kv_cache_bytes, provenance, rotation_copies, time_callable

#: name -> (plan slots per SM, KernelConfig knobs). v1 / v2: the two sm_90 paths (`hopper_variant` vt-smem / v-regs)
#: with q fetched after the ring, the code of run 9 (the A/Bs of 2026-12-02/03 that name them); v2x2: v-regs with
#: two CTAs per SM (264 plan slots, 2 stages).
VARIANTS: dict[str, tuple[int, dict]] = {
    "v1": (1, dict(hopper_variant="vt-smem", hopper_stages=3, hopper_q_first=False)),
    "v2": (1, dict(hopper_variant="v-regs", hopper_stages=3, hopper_q_first=False)),
    "v2x2": (2, dict(hopper_variant="v-regs", hopper_stages=2, hopper_q_first=False)),
    "auto": (1, dict()),
    # the ring refill issued before the PV (the code up to 2026-12-03's run 8) instead of after it
    "v1-early": (1, dict(hopper_variant="vt-smem", hopper_refill_after_pv=False, hopper_q_first=False)),
    "v2-early": (1, dict(hopper_variant="v-regs", hopper_refill_after_pv=False, hopper_q_first=False)),
    # the first work's q fetched before the ring's tiles (v2q; the default since 2026-12-03's session 7; v2 fetches it
    # after them), and deeper rings (v2s4, v2s4q, v2s5q: 4 or 5 stages, q last or first)
    "v2q": (1, dict(hopper_variant="v-regs", hopper_stages=3, hopper_q_first=True)),
    "v2s4": (1, dict(hopper_variant="v-regs", hopper_stages=4, hopper_q_first=False)),
    "v2s4q": (1, dict(hopper_variant="v-regs", hopper_stages=4, hopper_q_first=True)),
    "v2s5q": (1, dict(hopper_variant="v-regs", hopper_stages=5, hopper_q_first=True)),
    # maxima and softmax sums across the 4 warps with one barrier instead of Triton 3.6's two
    # (`gluon_hopper._across_warps`): compare v2mx with v2q (both q first), v1mx with v1 (both q last)
    "v2mx": (1, dict(hopper_variant="v-regs", hopper_warp_exchange=True)),
    "v1mx": (1, dict(hopper_variant="vt-smem", hopper_warp_exchange=True, hopper_q_first=False)),  # (beside v1)
    # requests split in <= 2 / 4 / 8 merged inside stage 1 by their last CTA (then batch 64 / 32-64 / 16-64 need no
    # reduce)
    "v2m2": (1, dict(hopper_variant="v-regs", hopper_merge_splits=2)),
    "v2m4": (1, dict(hopper_variant="v-regs", hopper_merge_splits=4)),
    "v2m8": (1, dict(hopper_variant="v-regs", hopper_merge_splits=8)),
    # two warpgroups (8 warps) on 128-token tiles, rings of 2 / 1 such tiles (plans cut on 128 tokens)
    "v2w": (1, dict(hopper_block=128, hopper_stages=2)),
    "v2w1": (1, dict(hopper_block=128, hopper_stages=1)),
    # two warpgroups on alternate 64-token tiles sharing a ring of 4 / 3 / 2 tiles, merged per work
    # (`gluon_hopper_2wg`); -nopdl: the reduce launched after stage 1, not as its programmatic dependent (beside
    # auto-nopdl: does the reduce lose its early launch when stage 1 holds the whole register file?)
    "v2g4": (1, dict(hopper_warpgroups=2, hopper_stages=4)),
    "v2g3": (1, dict(hopper_warpgroups=2, hopper_stages=3)),
    "v2g2": (1, dict(hopper_warpgroups=2, hopper_stages=2)),
    "v2g4-nopdl": (1, dict(hopper_warpgroups=2, hopper_stages=4, pdl=False)),
    "auto-nopdl": (1, dict(pdl=False)),
    # only the ring's first 1 / 2 tiles issued at the start, the rest once the CTA's first tile has arrived (3 stages;
    # v2s4b2: 4 stages, 2 at the start)
    "v2b1": (1, dict(hopper_variant="v-regs", hopper_first_burst=1)),
    "v2b2": (1, dict(hopper_variant="v-regs", hopper_first_burst=2)),
    "v2s4b2": (1, dict(hopper_variant="v-regs", hopper_stages=4, hopper_first_burst=2)),
    # bf16 / a16w8 (--precision): the portable kernel, and the sm_90 v-tile path (bf16; Vᵀ read from the K tile) and
    # v-conv path (a16w8: fp8 tiles converted to bf16), each its precision's default ("auto")
    "portable": (1, dict(kernel="portable")),
    "v-tile": (1, dict(hopper_variant="v-tile")),
    "v-tile-b1": (1, dict(hopper_variant="v-tile", hopper_first_burst=1)),
    # v-tile with the previous tile's stage refilled right after this tile's wait (one more barrier), not after softmax
    "v-tile-early": (1, dict(hopper_variant="v-tile", hopper_refill_after_pv=False)),
    "v-conv": (1, dict(hopper_variant="v-conv")),
    "v-conv-1": (1, dict(hopper_variant="v-conv", hopper_stages=1)),
    # the simple planner cutting works of at least 128 / 256 tokens (`make_callable`'s plan_block; default 64): fewer
    # busy CTAs, each with more tiles, spread over the grid of one CTA per SM
    "pb128": (1, dict(plan_block=128)),
    "pb256": (1, dict(plan_block=256)),
    # 128-token works with fp16 partials and the Gluon reduce (auto takes them on 64-token tiles only): at batch
    # 4 x 1024 tokens 8 partials per request, all in each thread's registers in the Gluon reduce
    "pb128p16gr": (1, dict(plan_block=128, hopper_partials="fp16", hopper_reduce="gluon")),
    # fp16 partials in KV code units (`KernelConfig.hopper_partials`): half the bytes stored and merged; with the
    # Triton reduce (p16, as in session 14's first A/Bs) and with the Gluon reduce (p16gr, what "auto" picks)
    "p16": (1, dict(hopper_partials="fp16", hopper_reduce="triton")),
    "v-conv-p16": (1, dict(hopper_variant="v-conv", hopper_partials="fp16", hopper_reduce="triton")),
    # fp32 partials and the Triton reduce everywhere: the kernels of run 14 (before "auto" picked fp16)
    "p32": (1, dict(hopper_partials="fp32", hopper_reduce="triton")),
    # the reduce in Gluon (partials in registers, from 16 on across 2 lanes and the warps), fp32 / fp16 partials
    "gr": (1, dict(hopper_partials="fp32", hopper_reduce="gluon")),
    # both reduces launched after stage 1 (not as its programmatic dependent): is the Gluon reduce's extra time on fp32
    # partials (~0.8 us at 16 partials, session 15) lost in the early launch?
    "p32-nopdl": (1, dict(hopper_partials="fp32", hopper_reduce="triton", pdl=False)),
    "gr-nopdl": (1, dict(hopper_partials="fp32", hopper_reduce="gluon", pdl=False)),
    "p16gr": (1, dict(hopper_partials="fp16", hopper_reduce="gluon")),
    "v-conv-p16gr": (1, dict(hopper_variant="v-conv", hopper_partials="fp16", hopper_reduce="gluon")),
}


SHAPES = [(b, n) for n in (1024, 8192) for b in (4, 8, 16, 32, 64, 128)]

#: ``variant~NAME``: the Gluon reduce with its launch shape (`gluon_reduce.launch_shape`) rewritten for the experiment.
#: half / double: up to 8 partials, half / twice the value dims per thread (a shorter chain of dependent instructions
#: per warp and twice the programs, or the reverse). ``double`` is the shape up to session 15 (64 values per thread;
#: ``half`` of it, 32, won the A/B of 2026-12-04 and became the default).
REDUCE_SHAPES: dict[str, Callable[[dict], dict]] = {
    "half": lambda s: {**s, "DPT": max(1, s["DPT"] // 2)} if s["LP"] == 1 else s,
    "double": lambda s: {**s, "DPT": s["DPT"] * 2} if s["LP"] == 1 else s,
}


@contextlib.contextmanager
def reduce_shape(name: str) -> Iterator[None]:
    """While a ``variant~NAME`` builds its decoders: `gluon_reduce.launch_shape` rewritten by `REDUCE_SHAPES`."""
    from mlalab.splitkv import gluon_reduce

    key = name.partition("~")[2]  # (checked by `variant`, which every caller runs first)
    if not key:
        yield
        return
    original = gluon_reduce.launch_shape
    gluon_reduce.launch_shape = lambda n: REDUCE_SHAPES[key](original(n))
    try:
        yield
    finally:
        gluon_reduce.launch_shape = original


def variant(name: str, sms: int) -> tuple[int, dict]:
    """``(plan slots, knobs)`` of a variant name: one of `VARIANTS`, optionally ``@N`` for a plan of N slots (CTAs)
    instead of the variant's slots per SM times the SMs, e.g. ``auto@64``: the default kernel on 64 slots, and
    optionally ``~NAME`` for a Gluon reduce launch shape of `REDUCE_SHAPES` (applied by `reduce_shape`)."""
    name, _, shape = name.partition("~")
    base, _, slots = name.partition("@")
    if base not in VARIANTS:
        raise SystemExit(f"unknown variant {base!r}; valid: {', '.join(VARIANTS)} (each optionally @slots)")
    if shape and shape not in REDUCE_SHAPES:
        raise SystemExit(f"unknown reduce shape {shape!r}; valid: {', '.join(REDUCE_SHAPES)}")
    per_sm, knobs = VARIANTS[base]
    return (int(slots) if slots else sms * per_sm), knobs


def _refs_before(x, on: bool, precision: str = "a8w8") -> None:  # noqa: ANN001
    """With ``--refs-before``: the shape's fp32 references (exact and a8w8-emulated), as the bench computed them
    right before its first timing of a shape up to session 8, then wait for them."""
    if on:
        from mlalab.timing import _refs

        _refs(x, precision, {})
        torch.cuda.synchronize()


def check(name: str, sms: int, precision: str = "a8w8") -> bool:
    slots, knobs = variant(name, sms)
    knobs = {"kernel": "hopper", **knobs}
    block = knobs.pop("plan_block", 128)  # (the checks' simple plans cut on 128 tokens unless the variant says)
    ok = True
    cases = [ragged_kv_lens(9, 700, seed=3), (1024,) * 4, (1, 64, 8192), (0, 130, 5, 4096), (1000,) * 40,
             (8192,) * 4, (100,) * 150]  # fmt: skip
    for lens in cases:
        x = make_inputs(DecodeCase(kv_lens=tuple(lens), seed=4)).to("cuda")
        p = prepare(x, precision)
        ref, ref_lse = naive_decode(p)
        live = ref.norm(dim=-1) > 0
        for planner in ("simple", "balanced"):
            plan = build_plan(x, planner, slots, **({"block": block} if planner == "simple" else {}))
            try:
                with reduce_shape(name):
                    dec = TritonDecoder(p, plan, config=KernelConfig(**knobs))
                for rep in range(2):  # twice: a second call on the same decoder must give the same result
                    dec.out.fill_(float("nan"))
                    dec.lse.fill_(float("nan"))
                    dec.part_o.fill_(float("nan"))
                    out, lse = dec()
                    torch.cuda.synchronize()
                    o, lo = out.cpu().double(), lse.cpu().double()
                    nan = bool(torch.isnan(o).any() or torch.isnan(lo).any())
                    err = float((o[live] - ref[live]).norm() / ref[live].norm())
                    dl = float((lo - ref_lse)[live.all(-1)].abs().max())
                    dead = ~live.all(-1)
                    dead_ok = bool(torch.isinf(lo[dead]).all() and (o[dead] == 0).all())
                    good = (not nan) and err <= 5e-3 and dl <= 2e-3 and dead_ok
                    if not good:
                        print(f"FAIL {name} {planner} lens={str(lens)[:40]} rep={rep} nan={nan} err={err:.2e} "
                              f"dlse={dl:.2e} dead_ok={dead_ok}", flush=True)  # fmt: skip
                        ok = False
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {name} {planner} lens={str(lens)[:40]}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                ok = False
    print(f"check {name}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--peers", default="flashmla", help="peer backends timed beside, comma-separated; 'none': none")
    ap.add_argument("--shapes", default=None, help="e.g. 4x1024,128x8192 (default: the 12 competition shapes)")
    ap.add_argument("--precision", default="a8w8", choices=("a8w8", "a16w8", "bf16"),
                    help="a8w8 (FlashMLA fp8 beside), bf16 (FlashMLA bf16 beside) or a16w8 (no FlashMLA path: name "
                         "--peers flashinfer)")  # fmt: skip
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--refs-before", action="store_true",
                    help="compute the fp32 references of the shape right before each timing (what the bench did up to "
                         "session 8: does it slow the next timed kernel?)")  # fmt: skip
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    names = [v for v in a.variants.split(",") if v]
    shapes = SHAPES if not a.shapes else [tuple(int(t) for t in s.split("x")) for s in a.shapes.split(",")]
    for n in names:  # unknown names fail first, on any machine (the SM count only scales the plan slots)
        variant(n, 1)
    if not torch.cuda.is_available():
        raise SystemExit("hopper_ab.py needs a CUDA GPU (it times the sm_90 kernels)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()
    good = dict.fromkeys(names, True)
    if not a.no_check:
        for n in names:
            good[n] = check(n, sms, a.precision)
    print(f"checks done in {time.time() - t0:.0f} s", flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.3f} TB/s", flush=True)
    rows = []
    peers = [p for p in a.peers.split(",") if p and p != "none"]
    for B, L in shapes:
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        n = rotation_copies(kv_cache_bytes(B, L, a.precision))
        line = {"B": B, "L": L}
        for peer in peers:
            try:
                from mlalab.backends import get_backend

                call, _ = get_backend(peer).make_callable(x, precision=a.precision, n_copies=n)
                _refs_before(x, a.refs_before, a.precision)
                line[peer] = time_callable(call, n)["us_median"]
            except Exception as e:  # noqa: BLE001
                print(f"{peer} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                line[peer] = float("nan")
        for name in names:
            slots, knobs = variant(name, sms)
            try:
                with reduce_shape(name):
                    call, info = make_callable(x, precision=a.precision, n_copies=n, num_cus=slots,
                                               **{"kernel": "hopper", **knobs})  # fmt: skip
                call(0)
                _refs_before(x, a.refs_before, a.precision)
                line[name] = time_callable(call, n)["us_median"]
            except Exception as e:  # noqa: BLE001
                print(f"{name} failed at {B}x{L}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                line[name] = float("nan")
        floor = call_bytes(B, L, a.precision) / (bw * 1e12) * 1e6  # (the bench's floor_us)
        line["floor"] = floor
        rows.append(line)
        print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in line.items()), flush=True)
        del x
        torch.cuda.empty_cache()
    cols = peers + names
    print("\nshape      " + " ".join(f"{c:>9}" for c in cols) + "     floor")
    for r in rows:
        print(f"{r['B']:>4}x{r['L']:<5} " + " ".join(f"{r[c]:9.2f}" for c in cols) + f" {r['floor']:9.2f}")
    geo = {c: math.exp(sum(math.log(r[c]) for r in rows) / len(rows)) for c in cols}
    print("geomean    " + " ".join(f"{geo[c]:9.2f}" for c in cols))
    for peer in peers:
        print(f"vs {peer:<8}" + " ".join(f"{geo[c] / geo[peer]:9.3f}" for c in cols))
    print("checks: " + ", ".join(f"{n}={'PASS' if good[n] else 'FAIL'}" for n in names))
    if a.out and rows:
        prov = provenance()  # device, versions, date in every row
        write_rows_csv(a.out, [{**{k: r.get(k) for k in ("B", "L", *cols, "floor")}, "precision": a.precision, **prov}
                               for r in rows])  # fmt: skip


if __name__ == "__main__":
    main()

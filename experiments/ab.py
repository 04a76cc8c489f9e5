"""Question: is one kernel configuration faster than another, measured side by side with a peer in one process?

A/B of our decode's configurations on the H200 (GPU only). First every variant is checked against the fp64 reference
on the dequantised codes (ragged, long, empty and 150-request batches, two planners; rel-L2 <= 5e-3, |dLSE| <= 2e-3,
every element written: outputs poisoned with NaN first). Then each variant and the peers are timed as `python -m
mlalab bench` times (CUDA-graph replays of 20 calls over KV copies rotated past the L2) on the competition shapes.
Prints one table; ``--out`` writes it (data/ab/ schema: B, L, a column of µs per peer and variant, floor, precision,
provenance).

Variants: a name of `VARIANTS` (the options a user can choose today), optionally ``@N`` for a plan of N slots (CTAs;
without it, the backend's default plan), optionally prefixed ``NAME:`` to run the same options on the code of
another commit, the package ``mlalab_NAME`` in the folder given with ``--before DIR`` (``before:`` is
``mlalab_before``; e.g. for the tag before the redesign:
``git archive experiments-2026-12 mlalab | tar -x -C DIR && mv DIR/mlalab DIR/mlalab_before``). Several such
packages in DIR let one call time several commits (``--variants auto,before:auto,other:auto``); the codes share the
process, the GPU and the inputs (the same seeded generator). Only this tree's variants are checked.

    python experiments/ab.py --variants auto,portable --out /tmp/ab.csv
    python experiments/ab.py --before .before --variants auto,before:auto --no-check   # same speed as the old code?
    python experiments/ab.py --precision bf16 --variants auto,portable                 # FlashMLA bf16 beside
    python experiments/ab.py --precision a16w8 --peers flashinfer --variants auto,portable
    python experiments/ab.py --precision a8w4-mxfp4 --peers none --variants auto,p-bf16   # e4m3 vs bf16 fp4 route
    python experiments/ab.py --precision a8w4-mxfp4 --peers none --variants auto,auto@264 # 2 CTAs an SM
    python experiments/ab.py --q-len 4 --before .n32 --variants auto,before:auto         # speculative decode

``--q-len`` (default 1) times speculative decode: q_len query rows a request, every one seeing the whole KV (FlashMLA
with s_q = q_len); the table then has a ``q_len`` column. ``--causal`` masks as speculative verification does (q row i
sees all but the q_len - 1 - i newest tokens; FlashMLA's ``causal``); the table then has a ``causal`` column.
``--layout`` (default contiguous) gives our variants, and the check's batches, the KV in another layout of
`mlalab.timing.LAYOUTS` (paged64, paged16, tokens: the same logical KV); the peers keep a contiguous cache. The
table then has a ``layout`` column.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import re
import sys
import time
from typing import Any

import torch

from mlalab.backends import get_backend
from mlalab.backends.triton import build_plan, make_callable
from mlalab.config import COMPETITION_SHAPES, DecodeCase
from mlalab.inputs import make_inputs, ragged_kv_lens
from mlalab.io import write_rows_csv
from mlalab.kernels import Decoder, KernelConfig, naive_decode, prepare
from mlalab.quant.precision import PRECISIONS
from mlalab.timing import (
    LAYOUTS,
    call_bytes,
    case_inputs,
    copy_bandwidth,
    kv_cache_bytes,
    provenance,
    rotation_copies,
    time_callable,
)

#: name -> the options of `mlalab.backends.triton.make_callable` it sets (plan options and `KernelConfig` knobs)
VARIANTS: dict[str, dict[str, Any]] = {
    "auto": {},
    "portable": {"kernel": "portable"},
    "sm90": {"kernel": "sm90"},
    "p-bf16": {"p_fp8": False},  # (a8w4-mxfp4: the bf16 route instead of the e4m3 one; a8w8: the portable kernel)
    "nopdl": {"pdl": False},
    "rows-on": {"side_by_side": "on"},  # (speculative decode: q rows side by side at every batch)
    "rows-off": {"side_by_side": "off"},  # (one q row a CTA)
    "pb128": {"plan_block": 128},
    "pb256": {"plan_block": 256},
}

#: the options of `VARIANTS` as the code before the redesign (no ``kernels.sm90`` package) named them
_BEFORE_NAMES = {"kernel": {"sm90": "hopper"}}


def variant(name: str) -> tuple[str | None, int | None, dict[str, Any]]:
    """``(package, plan slots, options)`` of a variant name (see the module docstring): package None for this tree's
    code, else ``mlalab_NAME`` of a ``NAME:`` prefix; slots None: the backend's default plan (its code's own rule:
    e.g. SMs // q_len slots where a CTA runs one q row)."""
    prefix, _, rest = name.rpartition(":")
    if prefix and not re.fullmatch(r"[a-z][a-z0-9_]*", prefix):
        raise SystemExit(f"bad prefix {prefix!r} in {name!r}: NAME: of a package mlalab_NAME (lower case, digits, _)")
    base, _, slots = rest.partition("@")
    if base not in VARIANTS:
        raise SystemExit(f"unknown variant {base!r}; valid: {', '.join(VARIANTS)} (each optionally @slots, NAME:)")
    if slots and not (slots.isdigit() and int(slots) >= 1):
        raise SystemExit(f"bad plan slots {slots!r} in {name!r}: @N with N >= 1")
    return (f"mlalab_{prefix}" if prefix else None), (int(slots) if slots else None), dict(VARIANTS[base])


def _other_module(package: str, name: str) -> Any:
    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError as e:
        raise SystemExit(f"a {package[len('mlalab_') :]}: variant needs --before DIR holding {package}: {e}") from None


def _callable(name: str, B: int, L: int, q_len: int, precision: str, n: int, causal: bool = False,
              layout: str = "contiguous") -> Any:  # fmt: skip
    """``call(i)`` of variant `name` at B x L x q_len with the KV in `layout` (its own inputs: the same seeded
    generator in either code)."""
    package, slots, opts = variant(name)
    if package is None:
        x = case_inputs(B, L, q_len, layout, causal).to("cuda")
        return make_callable(x, precision=precision, n_copies=n, num_cus=slots, **opts)[0]
    old_triton = _other_module(package, "backends.triton")
    if layout == "contiguous":  # (any commit's inputs; case_inputs exists from the layouts work on)
        old_inputs, old_config = _other_module(package, "inputs"), _other_module(package, "config")
        x = old_inputs.make_inputs(old_config.DecodeCase.uniform(B, L, q_len=q_len)).to("cuda")
    else:
        x = _other_module(package, "timing").case_inputs(B, L, q_len, layout).to("cuda")
    try:
        redesigned = importlib.util.find_spec(f"{package}.kernels.sm90") is not None
    except ModuleNotFoundError:  # (no kernels package at all)
        redesigned = False
    if not redesigned:  # a commit before the redesign: its option names
        opts = {k: _BEFORE_NAMES.get(k, {}).get(v, v) for k, v in opts.items()}
    return old_triton.make_callable(x, precision=precision, n_copies=n, num_cus=slots, **opts)[0]


def check(name: str, sms: int, precision: str, q_len: int = 1, causal: bool = False,
          layout: str = "contiguous") -> bool:  # fmt: skip
    package, slots, opts = variant(name)
    slots = slots or sms
    if package is not None:  # (another commit's code is checked by its own tests at its commit; here only timed)
        return True
    block = opts.pop("plan_block", None)
    ok = True
    cases = [ragged_kv_lens(9, 700, seed=3), (1024,) * 4, (1, 64, 8192), (0, 130, 5, 4096), (1000,) * 40,
             (8192,) * 4, (100,) * 150]  # fmt: skip
    page_size, permute, pool = LAYOUTS[layout]
    for lens in cases:
        lens = [max(n, q_len) if n and causal else n for n in lens]  # causal: a request holds >= q_len tokens
        x = make_inputs(DecodeCase(kv_lens=tuple(lens), q_len=q_len, seed=4, causal=causal, page_size=page_size,
                                   permute_pages=permute, pool_factor=pool)).to("cuda")  # fmt: skip
        p = prepare(x, precision)
        ref, ref_lse = naive_decode(p)
        live = ref.norm(dim=-1) > 0
        for planner in ("simple", "balanced"):
            knobs = {"block": block} if planner == "simple" and block else {}
            try:
                dec = Decoder(p, build_plan(x, planner, slots, **knobs), config=KernelConfig(**opts))
                for rep in range(2):  # twice: a second call on the same decoder must give the same result
                    for t in (dec.out, dec.lse, dec.part_o):
                        t.fill_(float("nan"))
                    out, lse = dec()
                    o, lo = out.cpu().double(), lse.cpu().double()
                    nan = bool(torch.isnan(o).any() or torch.isnan(lo).any())
                    err = float((o[live] - ref[live]).norm() / ref[live].norm())
                    dl = float((lo - ref_lse)[live.all(-1)].abs().max())
                    dead = ~live.all(-1)
                    dead_ok = bool(torch.isinf(lo[dead]).all() and (o[dead] == 0).all())
                    if nan or err > 5e-3 or dl > 2e-3 or not dead_ok:
                        print(f"FAIL {name} {planner} lens={str(lens)[:40]} rep={rep} nan={nan} err={err:.2e} "
                              f"dlse={dl:.2e} dead_ok={dead_ok}", flush=True)  # fmt: skip
                        ok = False
            except Exception as e:  # noqa: BLE001 (a failing variant is reported, the others still run)
                print(f"FAIL {name} {planner} lens={str(lens)[:40]}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                ok = False
    print(f"check {name}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="auto,portable")
    ap.add_argument("--peers", default="flashmla", help="peer backends timed beside, comma-separated; 'none': none")
    ap.add_argument("--shapes", default=None, help="e.g. 4x1024,128x8192 (default: the 12 competition shapes)")
    ap.add_argument("--precision", default="a8w8", choices=[p.value for p in PRECISIONS])
    ap.add_argument("--before", default=None, help="a folder holding other commits' packages as mlalab_NAME")
    ap.add_argument("--q-len", type=int, default=1, help="query rows a request (speculative decode; default 1)")
    ap.add_argument("--causal", action="store_true", help="speculative verification's causal mask (with --q-len)")
    ap.add_argument(
        "--layout", default="contiguous", choices=list(LAYOUTS), help="our variants' KV layout (peers: contiguous)"
    )
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    names = [v for v in a.variants.split(",") if v]
    if not 1 <= a.q_len <= 16:
        raise SystemExit(f"--q-len must be in [1, 16], got {a.q_len}")
    shapes = COMPETITION_SHAPES if not a.shapes else [tuple(int(t) for t in s.split("x")) for s in a.shapes.split(",")]
    shapes = sorted(shapes, key=lambda s: (s[1], s[0]))
    for n in names:  # unknown names fail first, on any machine
        if variant(n)[0] is not None and a.causal:
            raise SystemExit(f"--causal: {n} runs another commit's code, which may not know the causal mask")
    if a.before:
        sys.path.insert(0, a.before)
    if not torch.cuda.is_available():
        raise SystemExit("ab.py needs a CUDA GPU (it times the kernels)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()
    good = {n: a.no_check or check(n, sms, a.precision, a.q_len, a.causal, a.layout) for n in names}
    print(f"checks done in {time.time() - t0:.0f} s", flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.3f} TB/s", flush=True)
    rows = []
    peers = [p for p in a.peers.split(",") if p and p != "none"]
    for B, L in shapes:
        n = rotation_copies(kv_cache_bytes(B, L, a.precision))
        line: dict[str, Any] = {"B": B, "L": L, "q_len": a.q_len, "causal": a.causal, "layout": a.layout}
        for peer in peers:
            try:
                x = make_inputs(DecodeCase.uniform(B, L, q_len=a.q_len, causal=a.causal)).to("cuda")
                call, _ = get_backend(peer).make_callable(x, precision=a.precision, n_copies=n)
                line[peer] = time_callable(call, n)["us_median"]
            except Exception as e:  # noqa: BLE001
                print(f"{peer} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                line[peer] = float("nan")
        for name in names:
            try:
                call = _callable(name, B, L, a.q_len, a.precision, n, a.causal, a.layout)
                call(0)
                line[name] = time_callable(call, n)["us_median"]
            except Exception as e:  # noqa: BLE001
                print(f"{name} failed at {B}x{L}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                line[name] = float("nan")
            torch.cuda.empty_cache()
        line["floor"] = call_bytes(B, L, a.precision, a.q_len) / (bw * 1e12) * 1e6  # (the bench's floor_us)
        rows.append(line)
        print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in line.items()), flush=True)
    cols = peers + names
    print("\nshape      " + " ".join(f"{c:>12}" for c in cols) + "     floor")
    for r in rows:
        print(f"{r['B']:>4}x{r['L']:<5} " + " ".join(f"{r[c]:12.2f}" for c in cols) + f" {r['floor']:9.2f}")
    geo = {c: math.exp(sum(math.log(r[c]) for r in rows) / len(rows)) for c in cols}
    print("geomean    " + " ".join(f"{geo[c]:12.2f}" for c in cols))
    for ref in cols:
        print(f"vs {ref[:8]:<8}" + " ".join(f"{geo[c] / geo[ref]:12.3f}" for c in cols))
    print("checks: " + ", ".join(f"{n}={'PASS' if good[n] else 'FAIL'}" for n in names))
    if a.out and rows:
        prov = provenance()  # device, versions, date in every row
        keys = ("B", "L", *(("q_len",) if a.q_len > 1 else ()), *(("causal",) if a.causal else ()),
                *(("layout",) if a.layout != "contiguous" else ()), *cols, "floor")  # fmt: skip
        write_rows_csv(a.out, [{**{k: r.get(k) for k in keys}, "precision": a.precision, **prov} for r in rows])


if __name__ == "__main__":
    main()

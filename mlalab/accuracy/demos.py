"""The two teaching tables of notebook 02: why the competition's check is vacuous at randn*0.02, and when the
seeds' direct ``q.to(fp8)`` cast is safe."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd
import torch

from ..config import DecodeCase
from ..inputs import DecodeInputs
from ..quant import get_fp8_format
from ..reference import decode_reference
from .metrics import DEFAULT_TOLERANCES, Prepared, check_tolerances, evaluate_prepared, mismatch_key, prepare

__all__ = ["vacuous_check_demo", "direct_cast_demo"]


def vacuous_check_demo(
    batch: int = 4, kv_len: int = 1024, seed: int = 0, tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES
) -> pd.DataFrame:
    """Why randn*0.02 cannot fail: per distribution, the reference's size against the tolerance band, and the
    mismatch fractions of the zeros and mean(V) baselines next to a real fp8 and an MXFP4 variant."""
    tols = check_tolerances(tolerances)
    rows = []
    for dist in ("competition", "unit"):
        p = prepare(DecodeCase.uniform(batch, kv_len, seed=seed, dist=dist))
        fp8 = evaluate_prepared(p, "fp8-tensor", "fp8-tensor", tolerances=tols)
        mx = evaluate_prepared(p, "bf16", "mxfp4-aiter", tolerances=tols)
        for rt, at in tols:
            rows.append(
                {
                    "dist": dist,
                    "rtol, atol": f"{rt:g}, {at:g}",
                    "ref max |o|": fp8["ref_max_abs"],
                    "smallest band atol+rtol|ref|": at,
                    "zeros mismatch": fp8[mismatch_key(rt, at, "zeros_")],
                    "mean(V) mismatch": fp8[mismatch_key(rt, at, "meanv_")],
                    "fp8 Q+KV mismatch": fp8[mismatch_key(rt, at)],
                    "mxfp4 KV mismatch": mx[mismatch_key(rt, at)],
                    "zeros passes": fp8[mismatch_key(rt, at, "zeros_")] == 0.0,
                }
            )
    return pd.DataFrame(rows)


def direct_cast_demo(
    stds: Sequence[float] = (0.02, 1.0, 30.0, 100.0),
    fp8_formats: Sequence[str] = ("e4m3fn", "e4m3fnuz"),
    batch: int = 2,
    kv_len: int = 256,
    seed: int = 0,
) -> pd.DataFrame:
    """When is the seeds' ``q.to(fp8)`` (scale 1) safe? Per q std (kv keeps the competition's 0.02) and fp8
    flavour: q amax, the share of q in fp8's subnormal range and beyond its max, and the output error of the
    direct cast (as torch casts: NaN on fnuz overflow), of the direct cast with a clamp, and of per-tensor
    scaling (all with per-tensor fp8 KV)."""
    if not stds or any(not (isinstance(s, (int, float)) and s > 0) for s in stds):
        raise ValueError(f"stds must be positive numbers, got {stds!r}")
    rows = []
    for std in stds:
        p = prepare(DecodeCase.uniform(batch, kv_len, seed=seed))
        q = (p.inputs.q.float() * (std / 0.02)).to(torch.bfloat16)  # rescale q only; kv stays randn*0.02
        x = p.inputs
        out, lse = decode_reference(q, p.kv, x.qo_indptr, p.kv_indptr)
        mv = p.mean_v
        pq = Prepared(
            p.case,
            DecodeInputs(q, x.kv_buffer, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len, p.case),
            p.kv,
            p.kv_indptr,
            out,
            lse,
            mv,
        )
        for f in fp8_formats:
            d = evaluate_prepared(pq, "fp8-direct", "fp8-tensor", f)
            ds = evaluate_prepared(pq, "fp8-direct-sat", "fp8-tensor", f)
            t = evaluate_prepared(pq, "fp8-tensor", "fp8-tensor", f)
            if d["nan_count"] > 0:
                verdict = "NaN: values past the max become NaN (torch's cast on this format)"
            elif d["q_direct_overflow_frac"] > 0:
                verdict = "saturates: values past the max are clipped"
            elif d["q_direct_subnormal_frac"] > 0.05:
                verdict = "loses precision: many q values are fp8 subnormals"
            else:
                verdict = "safe: q sits in fp8's normal range"
            rows.append(
                {
                    "q std": std,
                    "fp8": f,
                    "q amax": float(q.float().abs().max()),
                    "fp8 max": get_fp8_format(f).max,
                    "q subnormal (direct)": d["q_direct_subnormal_frac"],
                    "q overflow (direct)": d["q_direct_overflow_frac"],
                    "rel-L2 direct": d["rel_l2"],
                    "rel-L2 direct, clamped": ds["rel_l2"],
                    "rel-L2 per-tensor": t["rel_l2"],
                    "NaN outputs": d["nan_count"],
                    "verdict": verdict,
                }
            )
    return pd.DataFrame(rows)

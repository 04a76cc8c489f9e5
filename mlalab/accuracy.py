"""Accuracy of quantized MLA decode against the exact fp64 reference: one metrics record per configuration,
and grids of them as pandas DataFrames.

Method: the reference is `decode_reference` (fp64) on the original bf16 inputs.
A variant fake-quantizes Q and KV with the named schemes, runs the same fp64 decode on the dequantized values
and rounds its output to bf16, as every kernel returns bf16. So the "bf16" variant measures output rounding
alone (~0.16 % rel-L2), and everything else measures quantization plus that rounding.

Two trivial baselines sit in every record: an all-zeros output, and mean(V) (the mean of each request's
values, ignoring q). If they pass a tolerance, that tolerance cannot see errors at this input scale.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from . import __version__
from .config import DecodeCase, MLAConfig
from .inputs import DecodeInputs, make_inputs
from .io import atomic_write
from .quant import get_fp8_format, get_kv_scheme, get_q_scheme
from .reference import decode_reference

__all__ = [
    "DEFAULT_TOLERANCES",
    "Prepared",
    "prepare",
    "evaluate",
    "evaluate_prepared",
    "decode_q_variants",
    "output_metrics",
    "mismatch_fraction",
    "mismatch_key",
    "sweep",
    "save_table",
    "vacuous_check_demo",
    "direct_cast_demo",
]

# (rtol, atol): the competition's bf16 check, its fp8 a8w8 check, and its fp8 / mxfp4 tolerances.
DEFAULT_TOLERANCES: tuple[tuple[float, float], ...] = ((2e-2, 8e-3), (1e-2, 1e-2), (5e-2, 1e-2), (1e-1, 5e-2))


@dataclass(frozen=True)
class Prepared:
    """A case's inputs in token layout plus its fp64 reference, computed once and shared by many variants."""

    case: DecodeCase
    inputs: DecodeInputs
    kv: torch.Tensor  # (total_kv, 1, 576) bf16, request order
    kv_indptr: torch.Tensor  # token indptr
    ref_out: torch.Tensor  # (total_q, 16, 512) fp64
    ref_lse: torch.Tensor  # (total_q, 16) fp64
    mean_v: torch.Tensor  # (total_q, 16, 512) fp64: the mean(V) baseline, rounded to bf16


def prepare(case: DecodeCase) -> Prepared:
    """Draw the inputs of `case` and run the fp64 reference once."""
    if not isinstance(case, DecodeCase):
        raise TypeError(f"case must be a DecodeCase, got {type(case).__name__}")
    x = make_inputs(case)
    kv, indptr = x.token_kv()
    out, lse = decode_reference(x.q, kv, x.qo_indptr, indptr)
    dv = case.config.v_dim
    mv = torch.zeros_like(out)
    for b in range(case.batch):
        k0, k1 = int(indptr[b]), int(indptr[b + 1])
        q0, q1 = int(x.qo_indptr[b]), int(x.qo_indptr[b + 1])
        if k1 > k0:
            mv[q0:q1] = kv[k0:k1, 0, :dv].double().mean(0)
    mv = mv.to(torch.bfloat16).double()
    return Prepared(case, x, kv, indptr, out, lse, mv)


def mismatch_key(rtol: float, atol: float, prefix: str = "") -> str:
    return f"{prefix}mismatch@{rtol:g},{atol:g}"


def mismatch_fraction(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> float:
    """Fraction of elements with |out - ref| > atol + rtol |ref| (torch.allclose's rule); NaN counts as a mismatch."""
    if out.shape != ref.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != ref shape {tuple(ref.shape)}")
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"rtol and atol must be >= 0, got {rtol}, {atol}")
    err = (out.double() - ref.double()).abs()
    ok = err <= atol + rtol * ref.double().abs()  # NaN compares False
    return 1.0 - float(ok.double().mean()) if ok.numel() else 0.0


def _check_tolerances(tolerances: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    tols = tuple((float(r), float(a)) for r, a in tolerances)
    if not tols:
        raise ValueError("tolerances must name at least one (rtol, atol) pair")
    for r, a in tols:
        if not (r >= 0 and a >= 0 and math.isfinite(r) and math.isfinite(a)):
            raise ValueError(f"tolerances must be finite non-negative (rtol, atol) pairs, got {(r, a)}")
    return tols


def output_metrics(
    out: torch.Tensor, ref: torch.Tensor, tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES
) -> dict[str, float]:
    """rel-L2, SQNR (dB), max-abs, max-abs / ref RMS, cosine (global, worst row), NaN count, mismatch fractions."""
    tols = _check_tolerances(tolerances)
    o, r = out.double(), ref.double()
    if o.shape != r.shape:
        raise ValueError(f"out shape {tuple(o.shape)} != ref shape {tuple(r.shape)}")
    nonfinite = int((~torch.isfinite(o)).sum())
    err = o - r
    ref_norm = float(r.norm())
    rel = float(err.norm()) / ref_norm if ref_norm > 0 else math.nan
    rows_o, rows_r = o.reshape(-1, o.shape[-1]), r.reshape(-1, r.shape[-1])
    den = rows_o.norm(dim=-1) * rows_r.norm(dim=-1)
    row_cos = (rows_o * rows_r).sum(-1) / den
    ref_rms = float(r.pow(2).mean().sqrt())
    max_abs = float(err.abs().max()) if nonfinite == 0 else math.nan
    m: dict[str, float] = {
        "rel_l2": rel,
        "sqnr_db": (-20 * math.log10(rel) if rel > 0 else math.inf) if math.isfinite(rel) else math.nan,
        "max_abs": max_abs,
        "max_abs_over_ref_rms": max_abs / ref_rms if ref_rms > 0 else math.nan,
        "cosine": float((o * r).sum() / (o.norm() * r.norm())) if float(o.norm()) > 0 else math.nan,
        "worst_row_cosine": float(row_cos.min()) if bool(torch.isfinite(row_cos).all()) else math.nan,
        "nan_count": float(nonfinite),
    }
    for rt, at in tols:
        m[mismatch_key(rt, at)] = mismatch_fraction(o, r, rt, at)
    return m


def _fake_quant_kv(p: Prepared, kv_scheme: str, fp8_format: str) -> torch.Tensor:
    return get_kv_scheme(kv_scheme, fp8_format).fake_quant(p.kv)


def evaluate_prepared(
    p: Prepared,
    q_scheme: str = "bf16",
    kv_scheme: str = "bf16",
    fp8_format: str = "e4m3fn",
    *,
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    kv_deq: torch.Tensor | None = None,
    q_deq: torch.Tensor | None = None,
    q_stats: dict[str, float] | None = None,
    decoded: tuple[torch.Tensor, torch.Tensor] | None = None,
    return_tensors: bool = False,
) -> dict[str, Any]:
    """`evaluate` on a prepared case; `kv_deq` / `q_deq` / `q_stats` (the Q scheme's ``range_stats``) and
    `decoded` (the fp64 ``(out, lse)`` of the dequantized inputs) let a sweep or a panel reuse work."""
    tols = _check_tolerances(tolerances)
    fmt = get_fp8_format(fp8_format)
    qs, ks = get_q_scheme(q_scheme, fmt.name), get_kv_scheme(kv_scheme, fmt.name)
    x = p.inputs
    qd = qs.fake_quant(x.q) if q_deq is None else q_deq
    kd = ks.fake_quant(p.kv) if kv_deq is None else kv_deq
    if decoded is None:
        out, lse = decode_reference(qd, kd, x.qo_indptr, p.kv_indptr, allow_nonfinite=True)
    else:
        out, lse = decoded
        if out.shape != p.ref_out.shape or lse.shape != p.ref_lse.shape:
            raise ValueError("decoded (out, lse) must have the reference's shapes")
    out_bf16 = out.to(torch.bfloat16).double()  # kernels return bf16
    case = p.case
    rec: dict[str, Any] = {
        "case": case.short_str(),
        "batch": case.batch,
        "kv_len": case.kv_lens[0] if len(set(case.kv_lens)) == 1 else -1,
        "kv_lens": ",".join(map(str, case.kv_lens)) if len(set(case.kv_lens)) > 1 else str(case.kv_lens[0]),
        "q_len": case.q_len,
        "seed": case.seed,
        "dist": case.dist.value,
        "std": case.std,
        "q_scheme": qs.name,
        "kv_scheme": ks.name,
        "fp8_format": fmt.name,
        "q_overflow_rule": getattr(qs, "overflow", "none"),
        "kv_bytes_per_token": ks.bytes_per_token,
        "ref_rms": float(p.ref_out.pow(2).mean().sqrt()),
        "ref_max_abs": float(p.ref_out.abs().max()),
    }
    rec.update(output_metrics(out_bf16, p.ref_out, tols))
    lse_err = (lse - p.ref_lse).abs()
    rec["lse_max_abs_err"] = float(lse_err.max()) if bool(torch.isfinite(lse_err).all()) else math.nan
    stats = qs.range_stats(x.q) if q_stats is None else q_stats
    rec["q_subnormal_frac"] = stats["subnormal_frac"]
    rec["q_overflow_frac"] = stats["overflow_frac"]
    qf = x.q.float().abs()
    rec["q_direct_subnormal_frac"] = float(((qf > 0) & (qf < fmt.min_normal)).double().mean())
    rec["q_direct_overflow_frac"] = float((qf > fmt.max).double().mean())
    zeros = torch.zeros_like(p.ref_out)
    for rt, at in tols:
        rec[mismatch_key(rt, at, "zeros_")] = mismatch_fraction(zeros, p.ref_out, rt, at)
        rec[mismatch_key(rt, at, "meanv_")] = mismatch_fraction(p.mean_v, p.ref_out, rt, at)
    rec["meanv_rel_l2"] = float((p.mean_v - p.ref_out).norm() / p.ref_out.norm())
    rec["mlalab_version"] = __version__
    rec["torch_version"] = torch.__version__
    if return_tensors:
        rec["_tensors"] = {"out": out_bf16, "ref": p.ref_out, "q_deq": qd, "kv_deq": kd}
    return rec


def decode_q_variants(
    p: Prepared, q_deqs: Sequence[torch.Tensor], kv_deq: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """fp64 decode of several dequantized q against one dequantized KV in a single `decode_reference` call.

    Heads never interact in attention, so the q variants are stacked along the head axis (an MLAConfig with
    16·k heads; sm_scale depends only on the 576 dims) and split afterwards: the same numbers as k separate
    calls, with the KV converted to fp64 once and one larger matrix product."""
    if not q_deqs:
        raise ValueError("q_deqs must hold at least one tensor")
    cfg = p.case.config
    h = cfg.num_heads
    stacked = torch.cat(list(q_deqs), dim=1)
    big = MLAConfig(num_heads=h * len(q_deqs), kv_lora_rank=cfg.kv_lora_rank, rope_dim=cfg.rope_dim)
    x = p.inputs
    out, lse = decode_reference(stacked, kv_deq, x.qo_indptr, p.kv_indptr, config=big, allow_nonfinite=True)
    return [(out[:, i * h : (i + 1) * h], lse[:, i * h : (i + 1) * h]) for i in range(len(q_deqs))]


def evaluate(
    case: DecodeCase,
    q_scheme: str = "bf16",
    kv_scheme: str = "bf16",
    fp8_format: str = "e4m3fn",
    *,
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
) -> dict[str, Any]:
    """Metrics record of one configuration (see the module docstring for the method).

    Keys: the configuration (case fields, schemes, format, KV bytes per token), rel_l2, sqnr_db, max_abs,
    max_abs_over_ref_rms, cosine, worst_row_cosine, lse_max_abs_err, nan_count, q_subnormal_frac,
    q_overflow_frac (of the scaled q under the Q scheme; NaN for bf16), q_direct_* (the same at scale 1),
    ``mismatch@rtol,atol`` for each tolerance and the ``zeros_`` / ``meanv_`` baselines at the same tolerances.
    """
    return evaluate_prepared(prepare(case), q_scheme, kv_scheme, fp8_format, tolerances=tolerances)


def _names(names: str | Sequence[str], kind: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    out = tuple(names)
    if not out:
        raise ValueError(f"{kind} must name at least one entry")
    return out


def sweep(
    cases: DecodeCase | Sequence[DecodeCase],
    q_schemes: str | Sequence[str] = ("bf16",),
    kv_schemes: str | Sequence[str] = ("bf16",),
    fp8_formats: str | Sequence[str] = ("e4m3fn",),
    *,
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Every (case × fp8 format × Q scheme × KV scheme) as one row. The reference runs once per case and each
    fake-quantized tensor once per (format, scheme). `progress` None shows a bar for grids over 8 rows."""
    cs = (cases,) if isinstance(cases, DecodeCase) else tuple(cases)
    if not cs or not all(isinstance(c, DecodeCase) for c in cs):
        raise TypeError("cases must be a DecodeCase or a non-empty sequence of them")
    qn, kn, fn = _names(q_schemes, "q_schemes"), _names(kv_schemes, "kv_schemes"), _names(fp8_formats, "fp8_formats")
    for f in fn:  # validate every name before any work
        get_fp8_format(f)
        for n in qn:
            get_q_scheme(n, f)
        for n in kn:
            get_kv_scheme(n, f)
    tols = _check_tolerances(tolerances)
    total = len(cs) * len(fn) * len(qn) * len(kn)
    bar = None
    if progress or (progress is None and total > 8):
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="accuracy sweep", leave=False)
    rows = []
    try:
        for c in cs:
            p = prepare(c)
            for f in fn:
                qd = {n: get_q_scheme(n, f).fake_quant(p.inputs.q) for n in qn}
                qst = {n: get_q_scheme(n, f).range_stats(p.inputs.q) for n in qn}
                for k in kn:
                    kd = _fake_quant_kv(p, k, f)
                    dec = dict(zip(qn, decode_q_variants(p, [qd[n] for n in qn], kd)))
                    for n in qn:
                        rows.append(
                            evaluate_prepared(
                                p, n, k, f, tolerances=tols, kv_deq=kd, q_deq=qd[n], q_stats=qst[n], decoded=dec[n]
                            )
                        )
                        if bar is not None:
                            bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return pd.DataFrame(rows)


def save_table(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write `df` to CSV or Parquet (by suffix) atomically: a temporary file in the same folder, then rename."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    p = Path(path)
    if p.suffix not in (".csv", ".parquet"):
        raise ValueError(f"path must end in .csv or .parquet, got {p.name!r}")

    def write(tmp: str) -> None:
        if p.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            try:
                df.to_parquet(tmp, index=False)
            except ImportError as e:
                raise ValueError(f"writing Parquet needs pyarrow ({e}); use a .csv path") from None

    atomic_write(p, write)
    return p


def vacuous_check_demo(
    batch: int = 4, kv_len: int = 1024, seed: int = 0, tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES
) -> pd.DataFrame:
    """Why randn*0.02 cannot fail: per distribution, the reference's size against the tolerance band, and the
    mismatch fractions of the zeros and mean(V) baselines next to a real fp8 and an MXFP4 variant."""
    tols = _check_tolerances(tolerances)
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

"""The precision frontier: every precision the GPU kernels run (`mlalab.quant.precision.PRECISIONS`) as one point of
time against accuracy at one shape, and which points are not dominated.

Time: a recorded run's µs for the shape (`mlalab.records.timings`, Triton at its default configuration, the run's own
copy bandwidth): by default `frontier_run`, the newest full suite run that times every precision (on whichever GPU it
was made: the table names the run and its GPU). A precision without a recording in the run is placed at
its **bandwidth floor** — the bytes of one call at that precision (`mlalab.timing.call_bytes`: KV bytes per token from
the precision table × tokens, plus q and the bf16 output) over the run's measured copy bandwidth — and marked
``time_kind = "floor"``: a lower bound, never a measurement.

Accuracy: computed now on the CPU (`evaluate_prepared`, fp64 reference) with each precision's Q and KV schemes
(`PRECISION_SCHEMES`: per-tensor fp8 for fp8 operands, aiter's block-32 rule for mxfp4, ``nvfp4``), at the shape's
kv_len on at most `ACCURACY_MAX_BATCH` requests (errors are per element and the requests independent draws, so more
requests change the metrics only by sampling; the table says when the batch was capped).

The frontier (`pareto_mask`) is taken over the measured points only (``on_frontier``) and, separately, over every
point with the floors standing in for the missing times (``on_frontier_with_floors``: what fp4 would buy if it ran at
its floor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..config import DecodeCase
from ..quant.precision import PRECISIONS, get_precision
from ..records.timings import TIMINGS_DIR, full_runs, load_recorded, recorded_view
from ..timing import call_bytes, rate_columns
from .metrics import NamedCheck, check_columns, evaluate_prepared, get_check, prepare
from .presets import CompetitionPreset, get_preset

__all__ = [
    "PRECISION_SCHEMES",
    "ACCURACY_MAX_BATCH",
    "FRONTIER_METRICS",
    "precision_schemes",
    "as_check",
    "pareto_mask",
    "frontier_run",
    "recorded_times",
    "frontier_table",
]

_Q = {"fp8": "fp8-tensor", "bf16": "bf16"}
_KV = {"fp8": "fp8-tensor", "bf16": "bf16", "mxfp4": "mxfp4-aiter", "nvfp4": "nvfp4"}

#: precision -> (Q scheme, KV scheme) of `mlalab.quant` that emulate what its kernels read.
PRECISION_SCHEMES: dict[str, tuple[str, str]] = {
    str(p): (_Q[s.q_format], _KV[s.kv_format]) for p, s in PRECISIONS.items()
}

#: Most requests the live accuracy uses (bounded CPU time and memory at batch 256 × 8192).
ACCURACY_MAX_BATCH = 8

#: The accuracy axes a frontier can use: column -> (axis title, lower is better after the transform).
FRONTIER_METRICS: dict[str, str] = {
    "rel_l2": "rel-L2 error vs fp64 (lower is better)",
    "one_minus_worst_cos": "1 − worst-row cosine (lower is better)",
    "mismatch": "share of mismatching elements (lower is better)",
}


def precision_schemes(precision: str) -> tuple[str, str]:
    """(Q scheme, KV scheme) emulating `precision` (ValueError naming the precisions otherwise)."""
    return PRECISION_SCHEMES[str(get_precision(precision).precision)]


def as_check(tolerance: str | NamedCheck | tuple[float, float]) -> NamedCheck:
    """A named check (`mlalab.accuracy.CHECKS` name or `NamedCheck`), or an (rtol, atol) pair with no mismatch
    allowed."""
    if isinstance(tolerance, tuple):
        if len(tolerance) != 2:
            raise ValueError(f"tolerance must be a check name or an (rtol, atol) pair, got {tolerance!r}")
        rt, at = (float(v) for v in tolerance)
        return NamedCheck(f"rtol {rt:g}, atol {at:g}", rt, at)
    return get_check(tolerance)


def pareto_mask(times: Sequence[float], errors: Sequence[float]) -> list[bool]:
    """True where no other point is at least as fast and at least as accurate and strictly better in one (lower is
    better on both axes; a NaN point is never on the frontier and dominates nothing)."""
    t, e = list(map(float, times)), list(map(float, errors))
    if len(t) != len(e):
        raise ValueError(f"times and errors must have the same length, got {len(t)} and {len(e)}")
    ok = [math.isfinite(a) and math.isfinite(b) for a, b in zip(t, e)]
    out = []
    for i in range(len(t)):
        dominated = any(
            ok[j] and t[j] <= t[i] and e[j] <= e[i] and (t[j] < t[i] or e[j] < e[i]) for j in range(len(t)) if j != i
        )
        out.append(ok[i] and not dominated)
    return out


def frontier_run(df: pd.DataFrame) -> str:
    """The run a frontier reads by default: the newest full suite run (`full_runs`, any GPU) whose default Triton rows
    time every precision of the precision table; else the newest full run of any GPU (the missing precisions then sit
    at their floors)."""
    runs = full_runs(df, PRECISIONS) or full_runs(df)
    if not runs:
        raise ValueError("no full suite run recorded (see mlalab.records.timings.full_runs)")
    return runs[-1][0]


def recorded_times(batch: int, kv_len: int, *, run: str | None = None, data_dir: str = TIMINGS_DIR) -> pd.DataFrame:
    """Per precision: µs at (batch, kv_len) from a recorded run (`recorded_view` of `run`, else of `frontier_run`;
    Triton at its default configuration), or the bandwidth floor where it has none. Columns: precision, bytes,
    floor_us, us, time_kind ("measured" | "floor"), copy_tbps, run, gpu."""
    df = load_recorded(data_dir)
    view = recorded_view(df, run=frontier_run(df) if run is None else run)
    (file,) = view.files
    rows = view.rows[view.rows["backend"] == "triton"]
    gpu = str(rows["gpu"].iloc[0]) if "gpu" in rows and len(rows) else "unknown GPU"
    copy = float(rows["copy_tbps"].median())  # one run, one copy-bandwidth measurement
    out = []
    for p in PRECISIONS:
        nbytes = call_bytes(batch, kv_len, str(p))
        floor = rate_columns(nbytes, copy)["floor_us"]
        hit = rows[(rows["precision"] == str(p)) & (rows["batch"] == batch) & (rows["kv_len"] == kv_len)]
        us, kind = (float(hit["us_median"].iloc[0]), "measured") if len(hit) else (floor, "floor")
        out.append(
            {
                "precision": str(p),
                "bytes": nbytes,
                "floor_us": floor,
                "us": us,
                "time_kind": kind,
                "copy_tbps": copy,
                "run": file,
                "gpu": gpu,
            }
        )
    return pd.DataFrame(out)


def frontier_table(
    batch: int,
    kv_len: int,
    preset: str | CompetitionPreset = "competition",
    tolerance: str | NamedCheck | tuple[float, float] | None = None,
    *,
    run: str | None = None,
    data_dir: str = TIMINGS_DIR,
    cache: dict[Any, Any] | None = None,
) -> pd.DataFrame:
    """One row per precision at (batch, kv_len): time (`recorded_times`), KV bytes per token, the accuracy of its
    schemes on the preset's inputs (rel_l2, worst_row_cosine, one_minus_worst_cos, mismatch and passes at
    `tolerance`, default the preset's check) and the frontier flags (module docstring). `cache` (a dict the caller
    keeps) reuses the prepared case and the records between calls. ``df.attrs`` say what was computed on what."""
    pr = get_preset(preset)
    check = pr.check if tolerance is None else as_check(tolerance)
    acc_batch = min(batch, ACCURACY_MAX_BATCH)
    case: DecodeCase = pr.case(acc_batch, kv_len, seed=pr.seed_for(batch, kv_len))
    times = recorded_times(batch, kv_len, run=run, data_dir=data_dir)
    cache = {} if cache is None else cache
    if cache.get("case") != case:
        cache.clear()
        cache["case"], cache["prepared"] = case, prepare(case)
    p = cache["prepared"]
    rows = []
    for prec, (qs, ks) in PRECISION_SCHEMES.items():
        if ("rec", prec) not in cache:
            rec = evaluate_prepared(p, qs, ks, return_tensors=True)
            t = rec.pop("_tensors")
            cache[("rec", prec)] = (rec, t["out"])
        rec, out = cache[("rec", prec)]
        cols = check_columns(out, p.ref_out, [check])
        spec = get_precision(prec)
        rows.append(
            {
                "precision": prec,
                "label": spec.label,
                "q_scheme": qs,
                "kv_scheme": ks,
                "kv_bytes_per_token": spec.kv_token_bytes,
                "rel_l2": rec["rel_l2"],
                "worst_row_cosine": rec["worst_row_cosine"],
                "one_minus_worst_cos": 1.0 - rec["worst_row_cosine"],
                "mismatch": cols[f"mismatch@{check.name}"],
                "passes": cols[f"passes@{check.name}"],
            }
        )
    df = pd.DataFrame(rows).merge(times, on="precision")
    measured = df["time_kind"] == "measured"
    for metric in FRONTIER_METRICS:
        m = pareto_mask(df["us"].where(measured, math.nan), df[metric])
        df[f"on_frontier:{metric}"] = m
        df[f"on_frontier_with_floors:{metric}"] = pareto_mask(df["us"], df[metric])
    df.attrs.update(
        {
            "shape": (batch, kv_len),
            "accuracy_case": case.short_str(),
            "accuracy_batch": acc_batch,
            "preset": pr.name,
            "check": check.describe(),
            "run": str(df["run"].iloc[0]),
            "gpu": str(df["gpu"].iloc[0]),
            "capped": acc_batch < batch,
        }
    )
    return df

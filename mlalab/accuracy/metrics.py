"""Accuracy of quantized MLA decode against the exact fp64 reference: one metrics record per configuration.

Method: the reference is `decode_reference` in fp64 on the original bf16 inputs.
A variant fake-quantizes Q and KV with the named schemes, runs the same fp64 decode on the dequantized values
and rounds its output to bf16, as every kernel returns bf16. So the "bf16" variant measures output rounding
alone (~0.16 % rel-L2), and everything else measures quantization plus that rounding.

Inputs are always drawn on the CPU from the case's seed (`make_inputs`); with ``device="cuda"`` they are moved to
the GPU and quantization and the fp64 decode run there (fp64 on both devices: the records agree to ~1e-15).

Three baselines sit in every record: an all-zeros output, mean(V) (the mean of each request's values, ignoring q)
and the half-KV cheat (the exact fp64 decode over every other page of each request's KV — at page size 1 every
other token — rounded to bf16: a sub-sampled decode that reads half the bytes). If one passes a tolerance, that
tolerance cannot tell it from a real decode at this input scale.

Named checks (`CHECKS`) are tolerances with an allowed share of mismatching elements, as a competition states them:
``competition`` (rtol 2e-2, atol 8e-3, no mismatch allowed) and ``mixed-mla-2026`` (rtol = atol = 1e-1, passing
while at most 5 % of the elements mismatch). Every record holds, for each, the mismatch share and whether the
output passes, and the same for the three baselines (`check_key`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import __version__
from ..config import DecodeCase, MLAConfig
from ..inputs import DecodeInputs, make_inputs
from ..quant import get_fp8_format, get_kv_scheme, get_q_scheme
from ..reference import decode_reference

__all__ = [
    "DEFAULT_TOLERANCES",
    "NamedCheck",
    "CHECKS",
    "get_check",
    "check_key",
    "check_columns",
    "half_kv_output",
    "Prepared",
    "prepare",
    "check_device",
    "evaluate",
    "evaluate_prepared",
    "decode_q_variants",
    "output_metrics",
    "mismatch_fraction",
    "mismatch_key",
    "check_tolerances",
    "config_columns",
]

# (rtol, atol): the competition's bf16 check, its fp8 a8w8 check, and its fp8 / mxfp4 tolerances.
DEFAULT_TOLERANCES: tuple[tuple[float, float], ...] = ((2e-2, 8e-3), (1e-2, 1e-2), (5e-2, 1e-2), (1e-1, 5e-2))


@dataclass(frozen=True)
class NamedCheck:
    """A competition's correctness check: elements outside ``atol + rtol * |ref|`` (`mismatch_fraction`) mismatch,
    and the output passes while their share is at most `max_mismatch` (0: every element must match)."""

    name: str
    rtol: float
    atol: float
    max_mismatch: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or "@" in self.name:
            raise ValueError(f"NamedCheck.name must be a non-empty name without '@', got {self.name!r}")
        for n in ("rtol", "atol"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"NamedCheck.{n} must be a finite number >= 0, got {v!r}")
        if not (isinstance(self.max_mismatch, (int, float)) and 0.0 <= self.max_mismatch < 1.0):
            raise ValueError(f"NamedCheck.max_mismatch must be a share in [0, 1), got {self.max_mismatch!r}")

    def passes(self, share: float) -> bool:
        """Whether a mismatch share passes (NaN never does)."""
        return bool(share <= self.max_mismatch)

    def describe(self) -> str:
        allowed = f", up to {100 * self.max_mismatch:g} % of elements may mismatch" if self.max_mismatch else ""
        return f"{self.name}: rtol {self.rtol:g}, atol {self.atol:g}{allowed}"


#: The named checks every record reports: the GPU MODE MLA-decode problem's (the competition's) and its 2026
#: successor's (``amd_202602/mixed-mla``).
CHECKS: dict[str, NamedCheck] = {
    c.name: c for c in (NamedCheck("competition", 2e-2, 8e-3), NamedCheck("mixed-mla-2026", 1e-1, 1e-1, 0.05))
}


def get_check(name: str | NamedCheck) -> NamedCheck:
    """The named check `name` (`CHECKS`), or `name` itself if it is a `NamedCheck`; ValueError naming the known."""
    if isinstance(name, NamedCheck):
        return name
    if not isinstance(name, str) or name not in CHECKS:
        raise ValueError(f"unknown check {name!r}; known: {', '.join(CHECKS)}")
    return CHECKS[name]


def check_key(check: str | NamedCheck, what: str = "passes", prefix: str = "") -> str:
    """The record column of a named check: ``passes@NAME`` or ``mismatch@NAME``, with a baseline's prefix
    (``zeros_``, ``meanv_``, ``halfkv_``)."""
    if what not in ("passes", "mismatch"):
        raise ValueError(f"what must be 'passes' or 'mismatch', got {what!r}")
    return f"{prefix}{what}@{get_check(check).name}"


def check_columns(
    out: torch.Tensor, ref: torch.Tensor, checks: Iterable[str | NamedCheck] = tuple(CHECKS), prefix: str = ""
) -> dict[str, Any]:
    """``mismatch@NAME`` (the share, float) and ``passes@NAME`` (bool) of `out` against `ref` for each check."""
    cols: dict[str, Any] = {}
    for c in (get_check(n) for n in checks):
        share = mismatch_fraction(out, ref, c.rtol, c.atol)
        cols[check_key(c, "mismatch", prefix)] = share
        cols[check_key(c, "passes", prefix)] = c.passes(share)
    return cols


@dataclass(frozen=True)
class Prepared:
    """A case's inputs in token layout plus its fp64 reference, computed once and shared by many variants.
    Every tensor lives on `device`."""

    case: DecodeCase
    inputs: DecodeInputs
    kv: torch.Tensor  # (total_kv, 1, 576) bf16, request order
    kv_indptr: torch.Tensor  # token indptr
    ref_out: torch.Tensor  # (total_q, 16, 512) fp64
    ref_lse: torch.Tensor  # (total_q, 16) fp64
    mean_v: torch.Tensor  # (total_q, 16, 512) fp64: the mean(V) baseline, rounded to bf16
    cache: dict[Any, Any] = field(
        default_factory=dict, compare=False, repr=False
    )  # case columns per (format, tolerances, checks); the half-KV output

    @property
    def device(self) -> torch.device:
        return self.ref_out.device


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device: "cpu", or a CUDA device that this machine has (clear error otherwise)."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}") from None
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: torch sees no CUDA GPU on this machine (torch {torch.__version__})")
    if d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return d


def prepare(x: DecodeCase | DecodeInputs, device: str | torch.device = "cpu") -> Prepared:
    """Draw the inputs of a case (on the CPU, from its seed) or take given inputs, move them to `device`, and run
    the fp64 reference once."""
    if isinstance(x, DecodeCase):
        dev = check_device(device)
        inputs = make_inputs(x).to(dev)
    elif isinstance(x, DecodeInputs):
        dev = check_device(device)
        inputs = x.to(dev)
    else:
        raise TypeError(f"x must be a DecodeCase or DecodeInputs, got {type(x).__name__}")
    case = inputs.case
    kv, indptr = inputs.token_kv()
    out, lse = decode_reference(inputs.q, kv, inputs.qo_indptr, indptr, config=case.config, compute_dtype=torch.float64,
                                causal=case.causal)  # fmt: skip
    dv = case.config.v_dim
    mv = torch.zeros_like(out)
    kp, qp = indptr.tolist(), inputs.qo_indptr.tolist()
    for b in range(case.batch):
        if kp[b + 1] > kp[b]:
            mv[qp[b] : qp[b + 1]] = kv[kp[b] : kp[b + 1], 0, :dv].double().mean(0)
    mv = mv.to(torch.bfloat16).double()
    return Prepared(case, inputs, kv, indptr, out, lse, mv)


def half_kv_output(p: Prepared) -> torch.Tensor:
    """The half-KV cheat of a prepared case: the exact fp64 decode over every other page of each request's KV (the
    even pages, counted from the request's first; at page size 1 every other token), rounded to bf16 as a kernel
    returns it; it ignores a causal mask too (every q row sees the whole half). Cached in the `Prepared`."""
    if not isinstance(p, Prepared):
        raise TypeError(f"p must be a Prepared (see prepare()), got {type(p).__name__}")
    if "half_kv" not in p.cache:
        page = p.case.page_size
        kp = p.kv_indptr.tolist()
        keep = [
            torch.arange(kp[b], kp[b + 1])[(torch.arange(kp[b + 1] - kp[b]) // page) % 2 == 0]
            for b in range(p.case.batch)
        ]
        idx = torch.cat(keep).to(p.kv.device)
        lens = torch.tensor([0] + [len(k) for k in keep], dtype=torch.int64)
        indptr = lens.cumsum(0).to(dtype=p.kv_indptr.dtype, device=p.kv_indptr.device)
        out, _ = decode_reference(
            p.inputs.q, p.kv[idx], p.inputs.qo_indptr, indptr, config=p.case.config, compute_dtype=torch.float64,
            empty_policy="zeros",
        )  # fmt: skip
        p.cache["half_kv"] = out.to(torch.bfloat16).double()
    return p.cache["half_kv"]


def mismatch_key(rtol: float, atol: float, prefix: str = "") -> str:
    return f"{prefix}mismatch@{rtol:g},{atol:g}"


def mismatch_fraction(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> float:
    """Share of elements outside the band around the reference: ``|out - ref| > atol + rtol * |ref|``.

    The band is relative to the *reference* (torch.allclose's rule with `input=out`, `other=ref`), not to `out`;
    `rtol` scales |ref| and `atol` is absolute. A NaN anywhere in an element's comparison (NaN or inf output)
    counts as a mismatch. Returns (number of mismatching elements) / (number of elements); 0.0 for empty tensors.
    """
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"out and ref must be tensors, got {type(out).__name__}, {type(ref).__name__}")
    if out.shape != ref.shape:
        raise ValueError(f"out shape {tuple(out.shape)} != ref shape {tuple(ref.shape)}")
    if not (rtol >= 0 and atol >= 0 and math.isfinite(rtol) and math.isfinite(atol)):
        raise ValueError(f"rtol and atol must be finite and >= 0, got {rtol}, {atol}")
    if out.numel() == 0:
        return 0.0
    r = ref.double()
    err = (out.double() - r).abs()
    ok = err <= atol + rtol * r.abs()  # NaN compares False
    return int((~ok).sum()) / ok.numel()


def check_tolerances(tolerances: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
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
    tols = check_tolerances(tolerances)
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


def config_columns(case: DecodeCase, q_scheme: str, kv_scheme: str, fp8_format: str) -> dict[str, Any]:
    """The configuration columns of a record: the case's fields, the schemes and the format (their canonical
    names), the Q scheme's overflow rule and the KV bytes per token."""
    if not isinstance(case, DecodeCase):
        raise TypeError(f"case must be a DecodeCase, got {type(case).__name__}")
    fmt = get_fp8_format(fp8_format)
    qs, ks = get_q_scheme(q_scheme, fmt.name), get_kv_scheme(kv_scheme, fmt.name)
    uniform = len(set(case.kv_lens)) == 1
    return {
        "case": case.short_str(),
        "batch": case.batch,
        "kv_len": case.kv_lens[0] if uniform else -1,
        "kv_lens": str(case.kv_lens[0]) if uniform else ",".join(map(str, case.kv_lens)),
        "q_len": case.q_len,
        "seed": case.seed,
        "dist": case.dist.value,
        "std": case.std,
        "q_scheme": qs.name,
        "kv_scheme": ks.name,
        "fp8_format": fmt.name,
        "q_overflow_rule": getattr(qs, "overflow", "none"),
        "kv_bytes_per_token": ks.bytes_per_token,
    }


def _case_columns(
    p: Prepared, fmt_name: str, tols: tuple[tuple[float, float], ...], checks: tuple[NamedCheck, ...]
) -> dict[str, Any]:
    """The columns that depend on the case, format, tolerances and checks only (reference size, direct-cast ranges,
    the zeros, mean(V) and half-KV baselines), computed once per prepared case and reused by every variant."""
    key = (fmt_name, tols, checks)
    if key not in p.cache:
        fmt = get_fp8_format(fmt_name)
        qf = p.inputs.q.float().abs()
        c: dict[str, Any] = {
            "ref_rms": float(p.ref_out.pow(2).mean().sqrt()),
            "ref_max_abs": float(p.ref_out.abs().max()),
            "q_direct_subnormal_frac": float(((qf > 0) & (qf < fmt.min_normal)).double().mean()),
            "q_direct_overflow_frac": float((qf > fmt.max).double().mean()),
        }
        baselines = {"zeros_": torch.zeros_like(p.ref_out), "meanv_": p.mean_v, "halfkv_": half_kv_output(p)}
        for rt, at in tols:
            for prefix, out in baselines.items():
                c[mismatch_key(rt, at, prefix)] = mismatch_fraction(out, p.ref_out, rt, at)
        for prefix, out in baselines.items():
            c.update(check_columns(out, p.ref_out, checks, prefix))
        c["meanv_rel_l2"] = float((p.mean_v - p.ref_out).norm() / p.ref_out.norm())
        c["halfkv_rel_l2"] = float((baselines["halfkv_"] - p.ref_out).norm() / p.ref_out.norm())
        p.cache[key] = c
    return p.cache[key]


def evaluate_prepared(
    p: Prepared,
    q_scheme: str = "bf16",
    kv_scheme: str = "bf16",
    fp8_format: str = "e4m3fn",
    *,
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    checks: Iterable[str | NamedCheck] = tuple(CHECKS),
    kv_deq: torch.Tensor | None = None,
    q_deq: torch.Tensor | None = None,
    q_stats: dict[str, float] | None = None,
    decoded: tuple[torch.Tensor, torch.Tensor] | None = None,
    return_tensors: bool = False,
) -> dict[str, Any]:
    """`evaluate` on a prepared case; `kv_deq` / `q_deq` / `q_stats` (the Q scheme's ``range_stats``) and
    `decoded` (the fp64 ``(out, lse)`` of the dequantized inputs) let a sweep or a panel reuse work."""
    tols = check_tolerances(tolerances)
    named = tuple(get_check(c) for c in checks)
    fmt = get_fp8_format(fp8_format)
    qs, ks = get_q_scheme(q_scheme, fmt.name), get_kv_scheme(kv_scheme, fmt.name)
    x = p.inputs
    qd = qs.fake_quant(x.q) if q_deq is None else q_deq
    kd = ks.fake_quant(p.kv) if kv_deq is None else kv_deq
    if decoded is None:
        out, lse = decode_reference(qd, kd, x.qo_indptr, p.kv_indptr, config=p.case.config, compute_dtype=torch.float64,
                                    allow_nonfinite=True, causal=p.case.causal)  # fmt: skip
    else:
        out, lse = decoded
        if out.shape != p.ref_out.shape or lse.shape != p.ref_lse.shape:
            raise ValueError("decoded (out, lse) must have the reference's shapes")
    out_bf16 = out.to(torch.bfloat16).double()  # kernels return bf16
    base = _case_columns(p, fmt.name, tols, named)
    rec = config_columns(p.case, qs.name, ks.name, fmt.name)
    rec["ref_rms"], rec["ref_max_abs"] = base["ref_rms"], base["ref_max_abs"]
    rec.update(output_metrics(out_bf16, p.ref_out, tols))
    rec.update(check_columns(out_bf16, p.ref_out, named))
    lse_err = (lse - p.ref_lse).abs()
    rec["lse_max_abs_err"] = float(lse_err.max()) if bool(torch.isfinite(lse_err).all()) else math.nan
    stats = qs.range_stats(x.q) if q_stats is None else q_stats
    rec["q_subnormal_frac"] = stats["subnormal_frac"]
    rec["q_overflow_frac"] = stats["overflow_frac"]
    rec.update({k: v for k, v in base.items() if k not in ("ref_rms", "ref_max_abs")})
    rec["device"] = str(p.device)
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
    out, lse = decode_reference(stacked, kv_deq, x.qo_indptr, p.kv_indptr, config=big, compute_dtype=torch.float64,
                                allow_nonfinite=True, causal=p.case.causal)  # fmt: skip
    return [(out[:, i * h : (i + 1) * h], lse[:, i * h : (i + 1) * h]) for i in range(len(q_deqs))]


def evaluate(
    x: DecodeCase | DecodeInputs,
    q_scheme: str = "bf16",
    kv_scheme: str = "bf16",
    fp8_format: str = "e4m3fn",
    *,
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    checks: Iterable[str | NamedCheck] = tuple(CHECKS),
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Metrics record of one configuration on a `DecodeCase` or given `DecodeInputs` (as `decode` and the
    reference take them); see the module docstring for the method.

    Keys: the configuration (case fields, schemes, format, KV bytes per token), rel_l2, sqnr_db, max_abs,
    max_abs_over_ref_rms, cosine, worst_row_cosine, lse_max_abs_err, nan_count, q_subnormal_frac,
    q_overflow_frac (of the scaled q under the Q scheme; NaN for bf16), q_direct_* (the same at scale 1),
    ``mismatch@rtol,atol`` for each tolerance, ``mismatch@NAME`` / ``passes@NAME`` for each named check (`CHECKS`),
    and the ``zeros_`` / ``meanv_`` / ``halfkv_`` baselines at the same tolerances and checks.
    """
    tols = check_tolerances(tolerances)
    named = tuple(get_check(c) for c in checks)
    fmt = get_fp8_format(fp8_format)  # validate names before drawing inputs
    get_q_scheme(q_scheme, fmt.name)
    get_kv_scheme(kv_scheme, fmt.name)
    return evaluate_prepared(prepare(x, device), q_scheme, kv_scheme, fp8_format, tolerances=tols, checks=named)

"""Execute a `WorkPlan` on the CPU, step by step: stage 1 per work item, then the LSE-weighted reduce.

This is the readable executor of the contract documented on `WorkPlan`: each work computes a partial
attention output over exactly its KV range with the max-subtracted softmax a kernel uses (``m``, ``l``), stores
a natural-log LSE ``m + ln l``, and split requests are merged by ``exp(L_i − M)`` weights. In float64 it
matches `mlalab.reference.decode_reference` (the specification) to ~1e-15 relative for every planner; the
tests check that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..checks import check_finite
from ..config import DecodeCase
from ..inputs import DecodeInputs
from ..reference import causal_visible, check_decode_args
from .merge import lse_merge
from .workplan import WorkPlan

__all__ = ["EmulationResult", "WorkTrace", "ReduceTrace", "emulate_plan", "dequantized_inputs", "token_operands"]


@dataclass(frozen=True)
class WorkTrace:
    """What one work item computed (tensors are ``(q rows, 16)``): for teaching and debugging."""

    work: int
    cu: int
    batch: int
    partial_row: int  # -1: wrote the final output directly
    q_rows: tuple[int, int]  # global q rows [qo_start, qo_end)
    kv_start: int  # positions in kv_indices
    kv_end: int
    tokens: tuple[int, int]  # token range within the request
    m: torch.Tensor  # max score (scaled), -inf for an empty range
    lse: torch.Tensor  # natural-log sum-exp of the scaled scores
    out_norm: torch.Tensor  # L2 norm of the partial output per (row, head)


@dataclass(frozen=True)
class ReduceTrace:
    """One merged reduce tile: the partial rows it read, their LSEs and normalised weights ``(n, q rows, 16)``."""

    tile: int
    batch: int
    rows: tuple[int, int]
    partial_rows: tuple[int, ...]
    lse_parts: torch.Tensor
    weights: torch.Tensor  # exp(L_i - M) / sum_j exp(L_j - M)
    lse: torch.Tensor  # merged LSE (rows, 16)


@dataclass(frozen=True)
class EmulationResult:
    """Output ``(total_q, 16, 512)`` and LSE ``(total_q, 16)`` in the compute dtype, plus an optional trace."""

    out: torch.Tensor
    lse: torch.Tensor
    trace: dict[str, list] | None = field(default=None)  # {"works": [WorkTrace], "reduce": [ReduceTrace]}

    def __iter__(self):  # lets callers write `out, lse, trace = emulate_plan(...)`
        return iter((self.out, self.lse, self.trace))


def token_operands(
    inputs: DecodeInputs, *, q_scheme: str | None = None, kv_scheme: str | None = None, fp8_format: str = "e4m3fn"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, kv_tokens (total_kv, 1, 576), token_indptr)`` with the chosen schemes' fake quantization applied
    (dequantized float32) or the original tensors when no scheme is given. KV is taken in request order
    (the page table resolved), so per-token / per-tensor schemes see exactly the tokens the decode reads."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    for name, v in (("q_scheme", q_scheme), ("kv_scheme", kv_scheme), ("fp8_format", fp8_format)):
        if v is not None and not isinstance(v, str):
            raise TypeError(f"{name} must be a string or None, got {type(v).__name__}")
    q = inputs.q
    kv, tok_indptr = inputs.token_kv()
    if q_scheme is not None or kv_scheme is not None:
        from .. import quant  # lazy: the quantization module is optional for this file

        if q_scheme is not None:
            q = quant.get_q_scheme(q_scheme, fp8_format).fake_quant(q)
        if kv_scheme is not None:
            kv = quant.get_kv_scheme(kv_scheme, fp8_format).fake_quant(kv)
    return q, kv, tok_indptr


def dequantized_inputs(
    inputs: DecodeInputs, *, q_scheme: str | None = None, kv_scheme: str | None = None, fp8_format: str = "e4m3fn"
) -> DecodeInputs:
    """The inputs the emulator actually computes with, as a page-size-1 `DecodeInputs` (for a reference check
    "on the same dequantized inputs")."""
    q, kv, tok_indptr = token_operands(inputs, q_scheme=q_scheme, kv_scheme=kv_scheme, fp8_format=fp8_format)
    lens = (tok_indptr[1:] - tok_indptr[:-1]).to(torch.int32)
    case = dataclasses.replace(inputs.case, page_size=1, permute_pages=False)
    assert isinstance(case, DecodeCase)
    return DecodeInputs(
        q,
        kv.unsqueeze(1),
        inputs.qo_indptr,
        tok_indptr.to(inputs.qo_indptr.device),
        torch.arange(int(tok_indptr[-1]), dtype=torch.int32, device=kv.device),
        (lens > 0).to(torch.int32).to(kv.device),
        case,
    )


def _stage1(q: torch.Tensor, k: torch.Tensor, sm_scale: float, v_dim: int,
            visible: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Partial attention of q rows ``(nq, H, 576)`` over KV ``(n, 576)``: ``(O, lse, m)`` with a kernel's
    max-subtracted softmax; with `visible` ``(nq,)`` row i sees only the range's first ``visible[i]`` tokens (the
    causal mask). A row that sees no token gives O = 0, lse = m = -inf (the identity of the merge)."""
    nq, H, n = q.shape[0], q.shape[1], k.shape[0]
    seen = torch.full((nq,), n, dtype=torch.int64) if visible is None else visible.clamp(0, n)
    s = torch.einsum("qhd,nd->qhn", q, k) * sm_scale
    s = s.masked_fill((torch.arange(n) >= seen.unsqueeze(1)).unsqueeze(1), float("-inf"))
    m = s.amax(-1) if n else torch.full((nq, H), float("-inf"), dtype=q.dtype)
    some = (seen > 0).unsqueeze(1).expand(nq, H)
    p = torch.exp(s - torch.where(some, m, 0.0).unsqueeze(-1))
    l = p.sum(-1)
    o = torch.einsum("qhn,nd->qhd", p, k[:, :v_dim]) / torch.where(some, l, 1.0).unsqueeze(-1)
    return o, torch.where(some, m + torch.log(l), float("-inf")), m


def emulate_plan(
    inputs: DecodeInputs,
    plan: WorkPlan,
    *,
    q_scheme: str | None = None,
    kv_scheme: str | None = None,
    fp8_format: str = "e4m3fn",
    compute_dtype: torch.dtype = torch.float64,
    trace: bool = False,
    allow_nonfinite: bool = False,
) -> EmulationResult:
    """Run `plan` on `inputs` exactly as a persistent kernel would, one CU after the other.

    Stage 1 writes unsplit works straight to the output and split ones to a partial buffer of
    ``plan.n_partial_rows`` rows (initialised to NaN, so a row the plan forgot to write cannot go unnoticed);
    the reduce merges tiles with >= 2 entries. With ``inputs.case.causal`` each q row sees only its causal prefix
    (`mlalab.reference.causal_visible`): a work whose range lies past a row's prefix gives that row an empty partial.
    Quantization schemes (``mlalab.quant``) are applied as fake
    quantization before the math. Returns `EmulationResult` ``(out, lse, trace)`` in `compute_dtype`.
    NaN/inf in the *inputs* are refused unless `allow_nonfinite` (non-finite values a quantization scheme itself
    produces, e.g. an e4m3fnuz direct cast overflowing to NaN, are what the workbench studies, and do propagate).
    """
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    if compute_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"compute_dtype must be torch.float32 or torch.float64, got {compute_dtype}")
    if plan.page_size != inputs.page_size:
        raise ValueError(f"plan was made for page size {plan.page_size}, inputs have page size {inputs.page_size}")
    check_decode_args(
        inputs.q,
        inputs.kv_buffer,
        inputs.qo_indptr,
        inputs.kv_indptr,
        inputs.kv_indices,
        inputs.kv_last_page_len,
        empty_policy="zeros",
        causal=inputs.case.causal,
    )
    if not allow_nonfinite:
        check_finite("q", inputs.q)
        check_finite("kv_buffer", inputs.kv_buffer)
    plan = plan.to("cpu")
    plan.validate(inputs.qo_indptr, inputs.kv_indptr)
    if plan.kv_lens and list(plan.kv_lens) != inputs.kv_lens.tolist():
        raise ValueError(f"plan was made for kv lengths {list(plan.kv_lens)[:8]}..., inputs differ")
    cfg = inputs.case.config
    H, Dv, scale = cfg.num_heads, cfg.v_dim, cfg.sm_scale
    q, kv, tok_indptr = token_operands(inputs, q_scheme=q_scheme, kv_scheme=kv_scheme, fp8_format=fp8_format)
    q = q.to("cpu", compute_dtype)
    kv = kv.to("cpu", compute_dtype).reshape(-1, cfg.qk_dim)
    tok = tok_indptr.to("cpu", torch.int64).tolist()
    kvp = inputs.kv_indptr.to("cpu", torch.int64).tolist()
    lens = inputs.kv_lens.tolist()
    qo = inputs.qo_indptr.to("cpu", torch.int64).tolist()
    ps = inputs.page_size

    total_q = q.shape[0]
    out = torch.full((total_q, H, Dv), float("nan"), dtype=compute_dtype)
    lse = torch.full((total_q, H), float("nan"), dtype=compute_dtype)
    part_out = torch.full((plan.n_partial_rows, H, Dv), float("nan"), dtype=compute_dtype)
    part_lse = torch.full((plan.n_partial_rows, H), float("nan"), dtype=compute_dtype)
    works_tr: list[WorkTrace] = []
    wip = plan.work_indptr.tolist()
    wi = plan.work_info.tolist()
    # Stage 1: every CU runs its works in order (the order cannot change results: works write disjoint rows).
    for c in range(plan.num_cus):
        for w in range(wip[c], wip[c + 1]):
            b, slot, qs, qe, ks, ke, _, _ = wi[w]
            t0 = (ks - kvp[b]) * ps  # positions -> tokens of request b (the last page may be partial)
            t1 = min((ke - kvp[b]) * ps, lens[b])
            visible = None
            if inputs.case.causal and lens[b]:  # row r of the request sees its first `prefix[r]` tokens
                prefix = causal_visible(lens[b], qo[b + 1] - qo[b])[qs - qo[b] : qe - qo[b]]
                visible = prefix - t0
            o, l, m = _stage1(q[qs:qe], kv[tok[b] + t0 : tok[b] + t1], scale, Dv, visible)
            if slot < 0:
                out[qs:qe], lse[qs:qe] = o, l
            else:
                part_out[slot : slot + qe - qs], part_lse[slot : slot + qe - qs] = o, l
            if trace:
                works_tr.append(WorkTrace(w, c, b, slot, (qs, qe), ks, ke, (t0, t1), m, l, o.norm(dim=-1)))
    # Reduce: tiles with < 2 entries are skipped (their request was written directly).
    red_tr: list[ReduceTrace] = []
    rip = plan.reduce_indptr.tolist()
    pmap = plan.reduce_partial_map.tolist()
    fmap = plan.reduce_final_map.tolist()
    for t in range(plan.n_tiles):
        parts = pmap[rip[t] : rip[t + 1]]
        if len(parts) < 2:
            continue
        r0, r1 = fmap[t]
        idx = torch.tensor(parts).unsqueeze(1) + torch.arange(r1 - r0).unsqueeze(0)  # (n, rows)
        L = part_lse[idx]  # (n, rows, H)
        out[r0:r1], lse[r0:r1], weights = lse_merge(part_out[idx], L)
        if trace:
            b = next(row[0] for row in wi if row[1] == parts[0])  # the work that wrote the tile's first partial row
            red_tr.append(ReduceTrace(t, b, (r0, r1), tuple(parts), L, weights, lse[r0:r1].clone()))
    tr = {"works": works_tr, "reduce": red_tr} if trace else None
    return EmulationResult(out, lse, tr)

"""Exact absorbed-MLA decode: the specification every other executor is compared against.

For each request ``b`` and each of its query rows ``i`` and heads ``h``::

    s[j]   = sm_scale * <q[i, h, :576], K[j, :576]>          j over the request's KV tokens
    lse    = log(sum_j exp(s[j]))                              natural log
    out    = sum_j exp(s[j] - lse) * K[j, :512]               values are the first 512 latent dims

Every query token of a request sees all of its KV (decode with q_len > 1 = speculative decode, as in the
competition), or with ``causal`` (speculative verification) q row ``i`` of ``q`` rows sees the first ``n - (q - 1 - i)``
of the request's ``n`` tokens. Computation is float64 on the CPU and float32 on a GPU unless asked otherwise.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from .checks import check_finite, check_indptr, check_tensor, ensure_fits
from .config import MLA, MLAConfig
from .inputs import DecodeInputs, kv_lens_from_layout

__all__ = ["decode_reference", "decode_inputs_reference", "decode_naive_loop", "check_decode_args", "causal_visible",
           "EmptyPolicy"]  # fmt: skip

EmptyPolicy = Literal["error", "zeros"]
_FLOAT_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def causal_visible(n_tokens: int, n_rows: int) -> torch.Tensor:
    """``(n_rows,)`` int64: how many of a request's first tokens each of its q rows sees under the causal mask of
    speculative verification, ``n - (q - 1 - i)`` for row i (the last row sees all n)."""
    if n_rows < 1 or n_tokens < n_rows:
        raise ValueError(f"causal decode: a request of {n_tokens} KV tokens cannot serve {n_rows} q rows (its first "
                         "row would see no token); it needs at least as many tokens as q rows")  # fmt: skip
    return n_tokens - (n_rows - 1 - torch.arange(n_rows, dtype=torch.int64))


def check_decode_args(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    *,
    config: MLAConfig = MLA,
    input_dtypes: tuple[torch.dtype, ...] = _FLOAT_INPUT_DTYPES,
    empty_policy: EmptyPolicy = "error",
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Validate a decode call; return ``(kv_buffer as 4-D, kv_indices, kv_last_page_len, page_size)``.

    A 3-D ``kv_buffer`` ``(total_kv, 1, 576)`` means page size 1 with identity page table when
    `kv_indices` is None. Raises ValueError/TypeError naming the argument at fault.
    """
    D, H = config.qk_dim, config.num_heads
    check_tensor("q", q, shape=(None, H, D), dtypes=input_dtypes)
    check_tensor("kv_buffer", kv_buffer, ndim=(3, 4), dtypes=input_dtypes)
    if kv_buffer.dim() == 3:
        check_tensor("kv_buffer", kv_buffer, shape=(None, config.num_kv_heads, D))
        kv4 = kv_buffer.unsqueeze(1)
    else:
        check_tensor("kv_buffer", kv_buffer, shape=(None, None, config.num_kv_heads, D))
        kv4 = kv_buffer
    page_size = int(kv4.shape[1])
    if page_size < 1:
        raise ValueError("kv_buffer page size (dim 1) must be >= 1")
    if q.device != kv_buffer.device:
        raise ValueError(f"q is on {q.device} but kv_buffer is on {kv_buffer.device}")
    check_indptr("qo_indptr", qo_indptr, total=int(q.shape[0]))
    batch = qo_indptr.numel() - 1
    check_indptr("kv_indptr", kv_indptr, length=batch + 1)
    n_page_refs = int(kv_indptr[-1])
    if kv_indices is None:
        if n_page_refs != kv4.shape[0]:
            raise ValueError(
                f"kv_indptr[-1] = {n_page_refs} does not match kv_buffer's {kv4.shape[0]} pages "
                "(pass kv_indices for a page table)"
            )
        kv_indices = torch.arange(n_page_refs, dtype=torch.int32, device=kv_buffer.device)
    else:
        check_tensor("kv_indices", kv_indices, ndim=1, dtypes=(torch.int32, torch.int64))
        if kv_indices.numel() < n_page_refs:
            raise ValueError(f"kv_indices has {kv_indices.numel()} entries but kv_indptr[-1] = {n_page_refs}")
        if n_page_refs and (
            int(kv_indices[:n_page_refs].min()) < 0 or int(kv_indices[:n_page_refs].max()) >= kv4.shape[0]
        ):
            raise ValueError(f"kv_indices must lie in [0, {kv4.shape[0]}) (kv_buffer pages)")
    pages = (kv_indptr[1:] - kv_indptr[:-1]).to("cpu", torch.int64)
    if kv_last_page_len is None:
        if page_size != 1:
            raise ValueError("kv_last_page_len is required when page_size > 1")
        kv_last_page_len = torch.ones(batch, dtype=torch.int32, device=kv_buffer.device) * (pages > 0).to(
            kv_buffer.device, torch.int32
        )
    else:
        check_tensor("kv_last_page_len", kv_last_page_len, shape=(batch,), dtypes=(torch.int32, torch.int64))
        last = kv_last_page_len.to("cpu", torch.int64)
        bad = ((pages > 0) & ((last < 1) | (last > page_size))) | ((pages == 0) & (last != 0))
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(
                f"kv_last_page_len[{b}] = {int(last[b])} is invalid for {int(pages[b])} pages of size {page_size} "
                "(must be in [1, page_size], or 0 for a request with no pages)"
            )
    lens = kv_lens_from_layout(kv_indptr, kv_last_page_len, page_size)
    q_rows = (qo_indptr[1:] - qo_indptr[:-1]).to("cpu", torch.int64)
    empty = (lens == 0) & (q_rows > 0)
    if bool(empty.any()) and empty_policy == "error":
        b = int(torch.nonzero(empty)[0])
        raise ValueError(
            f"request {b} has no KV tokens; the softmax over an empty set is undefined. "
            "Pass empty_policy='zeros' (CLI: --empty-policy zeros) to get output 0 and lse -inf (the identity of the "
            "LSE merge)"
        )
    if empty_policy not in ("error", "zeros"):
        raise ValueError(f"empty_policy must be 'error' or 'zeros', got {empty_policy!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    short = (lens > 0) & (lens < q_rows)
    if causal and bool(short.any()):
        b = int(torch.nonzero(short)[0])
        raise ValueError(f"causal=True: request {b} has {int(lens[b])} KV tokens but {int(q_rows[b])} q rows (its "
                         "first q row would see no token); each request needs as many tokens as q rows")  # fmt: skip
    return kv4, kv_indices, kv_last_page_len, page_size


def decode_reference(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None = None,
    kv_last_page_len: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
    config: MLAConfig = MLA,
    empty_policy: EmptyPolicy = "error",
    allow_nonfinite: bool = False,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact MLA decode over an (optionally paged) latent KV buffer.

    Args:
        q: ``(total_q, 16, 576)`` query, any float dtype (upcast to `compute_dtype`).
        kv_buffer: ``(num_pages, page_size, 1, 576)`` or ``(total_kv, 1, 576)`` (page size 1).
        qo_indptr: ``(B+1,)`` int32 query row offsets per request.
        kv_indptr: ``(B+1,)`` int32 offsets into `kv_indices` (in pages; = tokens for page size 1).
        kv_indices: page ids; None means the identity (pages stored in request order).
        kv_last_page_len: ``(B,)`` tokens used in each request's last page (None allowed for page size 1).
        sm_scale: softmax scale, default ``1/sqrt(576)``.
        compute_dtype: float64 on CPU and float32 on GPU by default.
        empty_policy: ``"error"`` (default) refuses requests with no KV; ``"zeros"`` returns output 0 and
            LSE −inf for them, which is exactly what an LSE-weighted merge treats as "no contribution".
        allow_nonfinite: by default NaN/inf in q or kv raise; set True to let them propagate (for studying
            overflow behaviour of quantized inputs).
        causal: q row i of a request's q rows sees its first ``n - (q - 1 - i)`` tokens (`causal_visible`);
            every request with KV then needs at least as many tokens as q rows.

    Returns:
        ``(out, lse)``: ``(total_q, 16, 512)`` and ``(total_q, 16)`` natural-log LSE of the *scaled* scores,
        both in `compute_dtype`.
    """
    kv4, kv_indices, kv_last_page_len, page_size = check_decode_args(
        q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, config=config, empty_policy=empty_policy,
        causal=causal,
    )  # fmt: skip
    if not allow_nonfinite:
        check_finite("q", q)
        check_finite("kv_buffer", kv_buffer)
    if compute_dtype is None:
        compute_dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    if compute_dtype not in (torch.float32, torch.float64):
        raise TypeError(f"compute_dtype must be float32 or float64, got {compute_dtype}")
    scale = config.sm_scale if sm_scale is None else float(sm_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"sm_scale must be a positive finite float, got {sm_scale!r}")
    lens = kv_lens_from_layout(kv_indptr, kv_last_page_len, page_size)
    qo = qo_indptr.to("cpu", torch.int64)
    kvp = kv_indptr.to("cpu", torch.int64)
    H, Dv = config.num_heads, config.v_dim
    max_len = int(lens.max()) if lens.numel() else 0
    max_q = int((qo[1:] - qo[:-1]).max())
    itemsize = torch.finfo(compute_dtype).bits // 8
    peak = (max_len * config.qk_dim + 2 * max_q * H * max_len + q.shape[0] * H * (Dv + 1)) * itemsize
    ensure_fits(peak, f"decode_reference ({compute_dtype}, longest request {max_len} tokens)")

    out = torch.zeros((q.shape[0], H, Dv), dtype=compute_dtype, device=q.device)
    lse = torch.full((q.shape[0], H), float("-inf"), dtype=compute_dtype, device=q.device)
    for b in range(qo.numel() - 1):
        q0, q1 = int(qo[b]), int(qo[b + 1])
        n = int(lens[b])
        if q1 == q0 or n == 0:
            continue  # empty request under empty_policy="zeros": out 0, lse -inf
        pages = kv_indices[int(kvp[b]) : int(kvp[b + 1])].long()
        kv = kv4[pages].reshape(-1, config.qk_dim)[:n].to(compute_dtype)  # (n, 576): one latent head
        qb = q[q0:q1].to(compute_dtype)  # (nq, H, 576)
        s = torch.einsum("qhd,nd->qhn", qb, kv) * scale
        if causal:
            hidden = torch.arange(n).unsqueeze(0) >= causal_visible(n, q1 - q0).unsqueeze(1)  # (nq, n)
            s = s.masked_fill(hidden.to(s.device).unsqueeze(1), float("-inf"))
        lse_b = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse_b.unsqueeze(-1))
        out[q0:q1] = torch.einsum("qhn,nd->qhd", p, kv[:, :Dv])
        lse[q0:q1] = lse_b
    return out, lse


def decode_inputs_reference(inputs: DecodeInputs, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    """`decode_reference` on a `DecodeInputs` bundle (causal when its case is)."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs (see mlalab.make_inputs), got {type(inputs).__name__}")
    kw.setdefault("causal", inputs.case.causal)
    return decode_reference(
        inputs.q,
        inputs.kv_buffer,
        inputs.qo_indptr,
        inputs.kv_indptr,
        inputs.kv_indices,
        inputs.kv_last_page_len,
        config=inputs.case.config,
        **kw,  # type: ignore[arg-type]
    )


def decode_naive_loop(inputs: DecodeInputs, sm_scale: float | None = None) -> torch.Tensor:
    """The competition-template formulation, written as plainly as possible: one request, one query token and
    one head at a time, max-subtracted softmax, float64 (causal when the case is: q row i of q sees the first
    n - (q - 1 - i) tokens). Slow; a teaching check of `decode_reference`."""
    from .inputs import gather_request_kv

    cfg = inputs.case.config
    scale = cfg.sm_scale if sm_scale is None else sm_scale
    out = torch.zeros((inputs.q.shape[0], cfg.num_heads, cfg.v_dim), dtype=torch.float64)
    for b in range(inputs.batch):
        kv = gather_request_kv(inputs, b)[:, 0, :].double().cpu()  # (n, 576)
        q0, q1 = int(inputs.qo_indptr[b]), int(inputs.qo_indptr[b + 1])
        for i in range(q0, q1):
            seen = kv.shape[0] - (q1 - 1 - i) if inputs.case.causal else kv.shape[0]
            keys, values = kv[:seen], kv[:seen, : cfg.v_dim]
            for h in range(cfg.num_heads):
                scores = (keys @ inputs.q[i, h].double().cpu()) * scale
                weights = torch.exp(scores - scores.max())
                out[i, h] = (weights / weights.sum()) @ values
    return out

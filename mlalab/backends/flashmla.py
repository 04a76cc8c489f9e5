"""FlashMLA peer (PyPI ``sgl-flash-mla``, legacy sm90 dense kernels): bf16, or fp8 q + fp8 KV (a8w8) with
per-tensor descales. Page block 64 is mandatory: a page-size-64 cache runs with its own page table, a page-size-1
contiguous cache is viewed as 64-token blocks with an arange block table (same bytes; every request's length a
multiple of 64 there). q_len > 1 runs as FlashMLA's ``s_q``, with its ``causal`` flag set from `DecodeCase.causal`
(off: every query row sees the request's whole KV; on: row i of s_q sees all but the s_q - 1 - i newest tokens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import MLA
from ..inputs import DecodeInputs

__all__ = ["probe", "decode", "make_callable", "PRECISIONS"]

PRECISIONS = ("bf16", "a8w8")


def probe() -> str | None:
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    if torch.cuda.get_device_capability() != (9, 0):
        cc = "".join(map(str, torch.cuda.get_device_capability()))
        return f"the legacy dense kernels are sm90 only; this GPU is sm{cc}"
    try:
        import flash_mla  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        return f"flash_mla not importable ({type(e).__name__}: {e}); pip install sgl-flash-mla"
    return None


def make_callable(
    inputs: DecodeInputs, *, precision: str = "a8w8", fp8_format: str = "e4m3fn", n_copies: int = 1
) -> tuple[Callable[[int], torch.Tensor], dict[str, Any]]:
    reason = probe()
    if reason is not None:
        raise RuntimeError(f"flashmla backend unavailable: {reason}")
    if precision not in PRECISIONS:
        raise ValueError(f"flashmla supports precision {PRECISIONS}, got {precision!r}")
    if fp8_format != "e4m3fn":
        raise ValueError("flashmla's fp8 kernel is e4m3fn only")
    lens = inputs.kv_lens
    q_lens = inputs.qo_indptr.diff()
    if inputs.page_size not in (1, 64) or len(set(lens.tolist())) != 1 or int(lens[0]) % 64 or (
            len(set(q_lens.tolist())) != 1):  # fmt: skip
        raise ValueError("flashmla peer here: page size 64 (any page table) or a contiguous page-size-1 cache, equal "
                         "lengths that are multiples of 64, the same q_len for every request")  # fmt: skip
    from flash_mla import flash_mla_with_kvcache, get_mla_decoding_metadata, get_mla_metadata
    from flash_mla.flash_mla_interface import FlashMLASchedMeta

    from ..kernels import prepare

    B, L, s_q = inputs.batch, int(lens[0]), int(q_lens[0])
    prep = prepare(inputs, precision, fp8_format)
    contiguous = inputs.page_size == 1 and prep.contiguous  # (prepare checks the table once: identity or not)
    if inputs.page_size == 1 and not contiguous:
        raise ValueError("flashmla peer here: a page-size-1 cache must be contiguous (identity kv_indices); "
                         "FlashMLA reads 64-token pages")  # fmt: skip
    q = prep.q.view(B, s_q, MLA.num_heads, MLA.qk_dim)
    kv = prep.kv.view(-1, 64, 1, MLA.qk_dim)
    copies = [kv] + [kv.clone() for _ in range(max(0, n_copies - 1))]
    if contiguous:
        table = torch.arange(B * L // 64, dtype=torch.int32, device=q.device).view(B, L // 64)
    else:
        table = prep.kv_indices.to(torch.int32).view(B, L // 64)
    seqlens = torch.full((B,), L, dtype=torch.int32, device=q.device)
    if precision == "bf16":
        meta, _ = get_mla_metadata()
        kw: dict[str, Any] = {}
    else:
        meta = FlashMLASchedMeta()
        meta.tile_scheduler_metadata, meta.num_splits = get_mla_decoding_metadata(
            seqlens, s_q * MLA.num_heads, 1, MLA.num_heads, is_fp8_kvcache=True, use_legacy=True
        )
        kw = {"is_fp8_kvcache": True, "descale_q": prep.q_scale, "descale_k": prep.kv_scale}
    last: dict[str, torch.Tensor] = {}
    causal = inputs.case.causal

    def call(i: int) -> torch.Tensor:
        o, lse = flash_mla_with_kvcache(
            q, copies[i % len(copies)], table, seqlens, MLA.v_dim, meta,
            softmax_scale=MLA.sm_scale, causal=causal, use_legacy=True, **kw,
        )  # fmt: skip
        last["lse"] = lse
        return o.view(B * s_q, MLA.num_heads, MLA.v_dim)

    call(0)  # the first call fills the scheduler metadata: keep it out of graphs and timings
    return call, {"prepared": prep, "last": last, "kv_bytes": kv.numel() * kv.element_size()}


def decode(inputs: DecodeInputs, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    call, info = make_callable(inputs, **options)
    out = call(0)
    lse = info["last"].get("lse")
    # FlashMLA's LSE is (batch, heads, s_q): rows of q in our order are (batch, s_q)
    if lse is None or lse.numel() != out.shape[0] * MLA.num_heads:
        return out, None
    return out, (lse.transpose(-1, -2) if lse.dim() == 3 else lse).reshape(out.shape[0], MLA.num_heads)

"""FlashInfer peer: ``BatchMLAPagedAttentionWrapper`` (fa3 on sm90), bf16 q with bf16 or fp8 KV (``a16w8``,
per-tensor scale), page size 1 through kv_indices (a scattered cache works); `DecodeCase.causal` is plan()'s
``causal`` (its mask is aligned to the end of the KV, as ours). The first plan() of a dtype pair
JIT-compiles for ~30-45 s; plan() runs once per shape, outside any timing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import MLA
from ..inputs import DecodeInputs

__all__ = ["probe", "decode", "make_callable", "PRECISIONS"]

PRECISIONS = ("bf16", "a16w8")
_WORKSPACE: dict[str, torch.Tensor] = {}


def probe() -> str | None:
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    try:
        import flashinfer  # noqa: F401
    except Exception as e:
        return f"flashinfer not importable ({type(e).__name__}: {e}); pip install flashinfer-python"
    return None


def make_callable(
    inputs: DecodeInputs,
    *,
    precision: str = "bf16",
    fp8_format: str = "e4m3fn",
    n_copies: int = 1,
    backend: str = "fa3",
) -> tuple[Callable[[int], torch.Tensor], dict[str, Any]]:
    reason = probe()
    if reason is not None:
        raise RuntimeError(f"flashinfer backend unavailable: {reason}")
    if precision not in PRECISIONS:
        raise ValueError(f"flashinfer supports precision {PRECISIONS} (no fp8 q), got {precision!r}")
    if fp8_format != "e4m3fn":
        raise ValueError("flashinfer's fp8 KV is e4m3fn only")
    if inputs.page_size != 1:
        raise ValueError("the flashinfer peer here uses page size 1")
    import flashinfer

    from ..kernels import prepare

    prep = prepare(inputs, precision, fp8_format)
    dev = prep.q.device
    if "ws" not in _WORKSPACE:
        _WORKSPACE["ws"] = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    w = flashinfer.mla.BatchMLAPagedAttentionWrapper(_WORKSPACE["ws"], backend=backend)
    lens = inputs.kv_lens.to(torch.int32).to(dev)
    w.plan(
        inputs.qo_indptr.to(dev), inputs.kv_indptr.to(dev), prep.kv_indices.to(dev), lens,
        MLA.num_heads, MLA.v_dim, MLA.rope_dim, 1, inputs.case.causal, MLA.sm_scale, torch.bfloat16, prep.kv.dtype,
    )  # fmt: skip
    q_nope, q_pe = prep.q[..., : MLA.v_dim], prep.q[..., MLA.v_dim :]
    n = prep.kv.shape[0]
    copies = [prep.kv] + [prep.kv.clone() for _ in range(max(0, n_copies - 1))]
    kw: dict[str, Any] = {}
    if precision == "a16w8":
        s = float(prep.kv_scale.cpu()[0])
        kw = {"ckv_scale": s, "kpe_scale": s}
    last: dict[str, torch.Tensor] = {}

    def call(i: int) -> torch.Tensor:
        kv = copies[i % len(copies)]
        out, lse = w.run(
            q_nope, q_pe, kv[:, : MLA.v_dim].view(n, 1, MLA.v_dim), kv[:, MLA.v_dim :].view(n, 1, MLA.rope_dim),
            return_lse=True, **kw,
        )  # fmt: skip
        last["lse"] = lse
        return out

    return call, {"prepared": prep, "last": last, "kv_bytes": prep.kv.numel() * prep.kv.element_size()}


def decode(inputs: DecodeInputs, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    call, info = make_callable(inputs, **options)
    out = call(0)
    lse = info["last"].get("lse")
    # flashinfer returns the LSE in base 2 by default
    return out, (lse.float() * 0.6931471805599453 if lse is not None else None)

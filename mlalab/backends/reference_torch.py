"""What a user would write: batched bf16 matmuls over a (B, L, 576) cache, fp32 softmax. A timing baseline (the
"reference-torch" backend of the suite), not a specification: that is `reference`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import MLA
from ..inputs import DecodeInputs

__all__ = ["probe", "decode", "make_callable", "PRECISIONS"]

PRECISIONS = ("bf16",)


def probe() -> str | None:
    return None  # plain torch: runs wherever torch does (timed on a GPU)


def make_callable(
    inputs: DecodeInputs, *, precision: str = "bf16", fp8_format: str = "e4m3fn", n_copies: int = 1
) -> tuple[Callable[[int], torch.Tensor], dict[str, Any]]:
    """``call(i)`` on KV copy ``i``: ``(B, 16, 512)`` bf16. Equal lengths, page size 1, q_len 1 only."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"reference-torch supports precision {PRECISIONS}, got {precision!r}")
    lens = inputs.kv_lens
    if inputs.page_size != 1 or inputs.case.q_len != 1 or len(set(lens.tolist())) != 1:
        raise ValueError("reference-torch: page size 1, q_len 1, equal lengths (a dense (B, L, 576) cache)")
    B, L = inputs.batch, int(lens[0])
    kv = inputs.kv_buffer.view(B, L, MLA.qk_dim)
    copies = [kv] + [kv.clone() for _ in range(max(0, n_copies - 1))]
    q = inputs.q.view(B, MLA.num_heads, MLA.qk_dim)

    def call(i: int) -> torch.Tensor:
        k = copies[i % len(copies)]
        s = torch.bmm(q, k.transpose(1, 2)).float() * MLA.sm_scale
        p = torch.softmax(s, -1).to(torch.bfloat16)
        return torch.bmm(p, k[..., : MLA.v_dim])

    return call, {"kv_bytes": kv.numel() * kv.element_size(), "record": {"variant": "bmm"}}


def decode(inputs: DecodeInputs, **options: Any) -> tuple[torch.Tensor, None]:
    call, _ = make_callable(inputs, **options)
    return call(0), None

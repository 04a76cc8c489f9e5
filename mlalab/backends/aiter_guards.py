"""Guards for aiter's documented hazards (docs/aiter.md, "Hazards and guards"): requests aiter is known to crash on
or get wrong are refused with the reason before anything runs, and the metadata aiter writes is checked after
planning. Pure Python and torch on the CPU; nothing here imports aiter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .aiter_abi import arch_from_gcn_name, fp8_flavour_for_arch
from .aiter_args import AiterSettings

__all__ = ["check_request", "check_fragments", "check_metadata_pointers"]

_GFX950_INTRA_BATCH_MIN_TOKENS = 196  # v1.0 on non-gfx942 divides by min(L // 196, ...) without a >= 1 clamp
_FP8_MIN_FRAGMENT = 4  # fp8 PS kernels gave NaN on KV fragments/tails under 4 tokens (aiter PRs #2106, #2128)
_GFX942_INTRA_BATCH_SPLITS = 16  # the v1.0 planner's fixed split count on gfx942


def check_request(
    *,
    kv_lens: Sequence[int],
    q_lens: Sequence[int],
    arch: str,
    settings: AiterSettings,
) -> None:
    """Refuse a decode that aiter is documented to crash on or get wrong; ValueError saying why and what to do."""
    if not isinstance(settings, AiterSettings):
        raise TypeError(f"settings must be an AiterSettings, got {type(settings).__name__}")
    kv = [int(x) for x in kv_lens]
    ql = [int(x) for x in q_lens]
    if not kv or len(kv) != len(ql):
        raise ValueError(f"kv_lens and q_lens must be non-empty and of equal length, got {len(kv)} and {len(ql)}")
    arch = arch_from_gcn_name(arch)
    fp8_flavour_for_arch(arch)  # refuses other architectures
    if min(kv) < 1:
        raise ValueError(f"request {kv.index(min(kv))} has no KV tokens; aiter's decode needs >= 1 per request")
    if len(set(ql)) != 1:
        raise ValueError(f"aiter's persistent decode takes one q length for all requests, got {sorted(set(ql))}")
    q_len = ql[0]
    if not 1 <= q_len <= 4:
        raise ValueError(f"q_len {q_len}: aiter has 16-head persistent kernels for q_len 1..4 only (vLLM #57642)")
    fp8 = settings.q_dtype == "fp8" or settings.kv_dtype == "fp8"
    if fp8 and min(kv) < _FP8_MIN_FRAGMENT:
        b = kv.index(min(kv))
        raise ValueError(
            f"request {b} has {kv[b]} KV tokens: fp8 persistent kernels gave NaN on KV fragments under "
            f"{_FP8_MIN_FRAGMENT} tokens (aiter PRs #2106/#2128); use bf16 or longer requests"
        )
    if settings.intra_batch_mode:
        if settings.split_arg < 1:
            raise ValueError("intra-batch mode needs max_split_per_batch > 0 (-1 reaches a divisor in v1.0)")
        if arch == "gfx942" and settings.num_kv_splits < _GFX942_INTRA_BATCH_SPLITS:
            raise ValueError(
                f"num_kv_splits={settings.num_kv_splits} < 16 on gfx942: the intra-batch planner always makes up to "
                "16 splits per request there, so work_info_set and reduce_partial_map would overflow"
            )
        if arch == "gfx950" and min(kv) < _GFX950_INTRA_BATCH_MIN_TOKENS:
            b = kv.index(min(kv))
            raise ValueError(
                f"request {b} has {kv[b]} KV tokens < {_GFX950_INTRA_BATCH_MIN_TOKENS}: on gfx950 the intra-batch "
                "planner computes 0 splits for it and divides by that; use mode='fast' for short requests"
            )


def check_fragments(
    work_info: torch.Tensor, n_work: int, *, page_size: int = 1, min_tokens: int = _FP8_MIN_FRAGMENT
) -> None:
    """After planning: every work's KV range (columns 4:5 of `work_info`, page-size-1 positions) must hold at
    least `min_tokens` tokens (fp8 hazard). Works with a real aiter work map read back to the CPU, or ours."""
    if not isinstance(work_info, torch.Tensor) or work_info.dim() != 2 or work_info.shape[1] != 8:
        raise ValueError(f"work_info must be an (n, 8) tensor, got {getattr(work_info, 'shape', type(work_info))}")
    if not 0 <= n_work <= work_info.shape[0]:
        raise ValueError(f"n_work must be in [0, {work_info.shape[0]}], got {n_work}")
    if page_size != 1:
        raise ValueError("check_fragments models page_size 1 (the aiter backend always expands pages to tokens)")
    w = work_info[:n_work].to("cpu", torch.int64)
    length = w[:, 5] - w[:, 4]
    bad = torch.nonzero(length < min_tokens).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"{bad.numel()} work(s) cover fewer than {min_tokens} KV tokens (first: work {i}, request "
            f"{int(w[i, 0])}, kv [{int(w[i, 4])}, {int(w[i, 5])})); the fp8 kernels are documented to give NaN "
            "there (aiter PRs #2106/#2128). Use bf16, another mode or a larger kv_granularity"
        )


def check_metadata_pointers(work_metadata: Sequence[int], work_indptr_ptr: int, work_info_ptr: int) -> None:
    """`work_metadata` holds the raw device addresses of `work_indptr` and `work_info_set`; the stage-1 kernel
    follows them, so the buffers must not have moved (cloned, re-allocated) since the metadata call."""
    vals = [int(x) for x in work_metadata]
    if len(vals) != 2:
        raise ValueError(f"work_metadata must hold 2 addresses, got {len(vals)}")
    # torch stores uint64 values as int64 on the host side: compare modulo 2**64.
    got = [x % (1 << 64) for x in vals]
    want = [int(work_indptr_ptr) % (1 << 64), int(work_info_ptr) % (1 << 64)]
    if got != want:
        raise RuntimeError(
            f"aiter work_metadata points at {[hex(x) for x in got]} but work_indptr/work_info_set live at "
            f"{[hex(x) for x in want]}: the metadata buffers moved after planning; re-plan before decoding"
        )

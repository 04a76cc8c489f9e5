"""Argument building for aiter's persistent MLA decode: pure Python, testable without a GPU.

Everything the `aiter` backend decides before it touches the GPU, apart from the release table (`aiter_abi`) and the
hazard guards (`aiter_guards`), lives here so it can be checked on the CPU with real values:

* the settings (planner mode, split budget, dtypes, call path) — `AiterSettings`, `settings_for_precision`;
* the metadata / partial buffer shapes from aiter's formulas — `metadata_buffer_shapes` (docs/aiter.md, "Buffer
  sizes");
* the keyword dictionaries for the calls — `info_kwargs`, `metadata_kwargs`, `stage1_kwargs`, `reduce_kwargs`,
  `mla_decode_fwd_kwargs`;
* the page table expanded to page size 1 — `token_kv_indices`.

Nothing here imports aiter. The names of `aiter_abi` (versions, `AiterAbi`, fp8 flavours) are re-exported.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..config import MLA
from ..quant.precision import PRECISIONS, get_precision
from .aiter_abi import (
    SUPPORTED_RANGE,
    AiterAbi,
    AiterVersion,
    abi_for_version,
    abi_from_signatures,
    arch_from_gcn_name,
    check_signature,
    fp8_flavour_for_arch,
    fp8_torch_dtype,
    parse_version,
)

__all__ = [
    "AiterVersion",
    "parse_version",
    "AiterAbi",
    "abi_for_version",
    "abi_from_signatures",
    "check_signature",
    "SUPPORTED_RANGE",
    "Mode",
    "AiterSettings",
    "settings_for_precision",
    "arch_from_gcn_name",
    "fp8_flavour_for_arch",
    "fp8_torch_dtype",
    "metadata_buffer_shapes",
    "partial_buffer_shapes",
    "check_release",
    "info_kwargs",
    "metadata_kwargs",
    "stage1_kwargs",
    "reduce_kwargs",
    "mla_decode_fwd_kwargs",
    "token_kv_indices",
]


# --------------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------------


class Mode(str, enum.Enum):  # noqa: UP042 (StrEnum is 3.11+, we support 3.10)
    """Which aiter planner builds the work map (docs/aiter.md, "Planners")."""

    INTRA_BATCH = "intra-batch"  # fast_mode=False, intra_batch_mode=True: v1.0 "fake non-persistent" (seeds, sglang)
    FAST = "fast"  # fast_mode=True: v1.2 greedy fill (vLLM)

    @classmethod
    def parse(cls, value: str | Mode) -> Mode:
        if isinstance(value, Mode):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"mode must be one of {[m.value for m in cls]}, got {value!r}") from None


_DTYPE_NAMES = ("bf16", "fp8")


@dataclass(frozen=True)
class AiterSettings:
    """How the aiter backend plans and calls the persistent decode.

    Args:
        mode: "intra-batch" (default; the seeds' and sglang's choice) or "fast".
        num_kv_splits: sizes the intra-batch buffers and is its per-request split cap (`max_split_per_batch`);
            must be >= 16 on gfx942 where the v1.0 planner always makes up to 16 splits (docs/aiter.md, "Planners").
        max_split_per_batch: None = the mode's default: `num_kv_splits` in intra-batch mode (a per-request cap on
            gfx950), -1 in fast mode (global budget ``min(CUs, msp * B)`` = all CUs, vLLM's choice). -1 is refused
            in intra-batch mode (the v1.0 planner divides by it), and so is a cap above `num_kv_splits` (the
            buffers are sized by `num_kv_splits`).
        kv_granularity: KV cut granularity in tokens (aiter's tests and sglang: max(page_size, 16)).
        q_dtype, kv_dtype: "bf16" or "fp8" ("fp8" = the architecture's flavour, with per-tensor scales).
            fp8 q with bf16 kv has no kernel and is refused.
        path: "direct" (cached buffers, stage 1 + reduce called directly, as seed V6c) or "mla_decode_fwd"
            (aiter's one-call wrapper, which allocates its partial buffers on every call; for comparison).
        quant_math: passed to `mlalab.quant.quantize_fp8_per_tensor` ("float32" or "bf16").
    """

    mode: Mode = Mode.INTRA_BATCH
    num_kv_splits: int = 32
    max_split_per_batch: int | None = None
    kv_granularity: int = 16
    q_dtype: str = "fp8"
    kv_dtype: str = "fp8"
    path: str = "direct"
    quant_math: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        for name in ("num_kv_splits", "max_split_per_batch", "kv_granularity"):
            v = getattr(self, name)
            if (not isinstance(v, int) or isinstance(v, bool)) and not (name == "max_split_per_batch" and v is None):
                raise TypeError(f"AiterSettings.{name} must be an int, got {type(v).__name__}")
        if self.num_kv_splits < 1:
            raise ValueError(f"AiterSettings.num_kv_splits must be >= 1, got {self.num_kv_splits}")
        msp = self.max_split_per_batch
        if msp is not None and (msp == 0 or msp < -1):
            raise ValueError(f"AiterSettings.max_split_per_batch must be -1 or >= 1, got {msp}")
        if self.mode is Mode.INTRA_BATCH and msp == -1:
            raise ValueError(
                "AiterSettings.max_split_per_batch=-1 in intra-batch mode: the v1.0 planner uses it as a divisor "
                "(negative splits); pass a positive cap or leave it None (= num_kv_splits)"
            )
        if self.mode is Mode.INTRA_BATCH and msp is not None and msp > self.num_kv_splits:
            raise ValueError(
                f"AiterSettings.max_split_per_batch={msp} > num_kv_splits={self.num_kv_splits}: the intra-batch "
                "buffers are sized for num_kv_splits per request and would overflow"
            )
        g = self.kv_granularity
        if g < 1 or g & (g - 1):
            raise ValueError(f"AiterSettings.kv_granularity must be a power of two (aiter checks this), got {g}")
        for name in ("q_dtype", "kv_dtype"):
            if getattr(self, name) not in _DTYPE_NAMES:
                raise ValueError(f"AiterSettings.{name} must be one of {_DTYPE_NAMES}, got {getattr(self, name)!r}")
        if self.q_dtype == "fp8" and self.kv_dtype == "bf16":
            raise ValueError("AiterSettings: fp8 q with bf16 kv has no aiter persistent kernel (docs/aiter.md)")
        if self.path not in ("direct", "mla_decode_fwd"):
            raise ValueError(f"AiterSettings.path must be 'direct' or 'mla_decode_fwd', got {self.path!r}")
        if self.quant_math not in ("float32", "bf16"):
            raise ValueError(f"AiterSettings.quant_math must be 'float32' or 'bf16', got {self.quant_math!r}")

    @property
    def fast_mode(self) -> bool:
        return self.mode is Mode.FAST

    @property
    def intra_batch_mode(self) -> bool:
        return self.mode is Mode.INTRA_BATCH

    @property
    def split_arg(self) -> int:
        """The `max_split_per_batch` value passed to the metadata call: never -1 in intra-batch mode (docs/aiter.md,
        "Hazards and guards")."""
        if self.max_split_per_batch is not None:
            return self.max_split_per_batch
        return self.num_kv_splits if self.intra_batch_mode else -1


def _precisions() -> dict[str, tuple[str, str]]:
    """{precision name: (q_dtype, kv_dtype)} from the one precision table (`mlalab.quant.precision`): the precisions
    whose operands aiter's persistent MLA decode reads (fp8 and bf16; not the fp4-KV ones)."""
    return {p.value: (s.q_format, s.kv_format) for p, s in PRECISIONS.items()
            if s.q_format in _DTYPE_NAMES and s.kv_format in _DTYPE_NAMES}  # fmt: skip


_PRECISIONS = _precisions()


def settings_for_precision(precision: str, **overrides: Any) -> AiterSettings:
    """`AiterSettings` for a name of the precision table (a8w8 = fp8 q and KV, a16w8 = bf16 q + fp8 KV, bf16)."""
    spec = get_precision(precision)  # ValueError naming the valid precisions
    if spec.precision.value not in _PRECISIONS:
        raise ValueError(f"aiter's persistent MLA decode has no {precision} kernel; it runs {', '.join(_PRECISIONS)}")
    return AiterSettings(q_dtype=spec.q_format, kv_dtype=spec.kv_format, **overrides)


# --------------------------------------------------------------------------------------------------------------
# Buffer shapes (docs/aiter.md, "Buffer sizes")
# --------------------------------------------------------------------------------------------------------------


def qo_tiles_per_request(q_len: int, num_heads: int, arch: str, q_dtype: str, kv_dtype: str) -> int:
    """q tiles per request (`max_qo_tiles_per_batch`) for the native 16-head case: 1 for every q_len <= 8."""
    if num_heads != 16:
        raise ValueError(f"only 16 query heads (DeepSeek-R1 at TP8) are modelled, got {num_heads}")
    rows = q_len * num_heads
    bf16 = q_dtype == "bf16" and kv_dtype == "bf16"
    if arch == "gfx950" and bf16 and rows % 128 == 0:
        return math.ceil(rows / 128)
    if arch == "gfx950" and bf16 and rows % 64 == 0:
        return math.ceil(rows / 64)
    return math.ceil(rows / 128)


def metadata_buffer_shapes(
    *,
    batch: int,
    q_len: int,
    num_cus: int,
    settings: AiterSettings,
    arch: str,
    num_heads: int = MLA.num_heads,
    info_has_max_split_per_batch: bool = False,
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The six metadata buffers as `get_mla_metadata_info_v1` sizes them, in ITS order (metadata, indptr,
    info_set, reduce_indptr, reduce_final_map, reduce_partial_map).

    N is the CU count (v0.1.11) or `max_splits` = CUs x occupancy (HEAD; occupancy is 1 except for an
    experimental HipKittens kernel, not modelled). `info_has_max_split_per_batch` applies HEAD's floor on
    `reduce_partial_map` when a positive split cap is passed."""
    for name, v in (("batch", batch), ("q_len", q_len), ("num_cus", num_cus)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not isinstance(settings, AiterSettings):
        raise TypeError(f"settings must be an AiterSettings, got {type(settings).__name__}")
    tiles = qo_tiles_per_request(q_len, num_heads, arch, settings.q_dtype, settings.kv_dtype)
    n = num_cus
    tile_cnt = batch * tiles
    if settings.intra_batch_mode:
        works = partials = tile_cnt * settings.num_kv_splits
    else:
        works = (batch + n - 1) * tiles
        partials = min(batch + n - 1, 2 * (n - 1)) * tiles
        if info_has_max_split_per_batch and settings.split_arg > 0:
            partials = max(partials, tile_cnt + min(n, settings.split_arg * batch))
    i32 = torch.int32
    return {
        "work_metadata": ((2,), torch.uint64),
        "work_indptr": ((n + 1,), i32),
        "work_info_set": ((works, 8), i32),
        "reduce_indptr": ((tile_cnt + 1,), i32),
        "reduce_final_map": ((tile_cnt, 2), i32),
        "reduce_partial_map": ((partials,), i32),
    }


def partial_buffer_shapes(
    partial_map_len: int, q_len: int, num_heads: int = MLA.num_heads, v_dim: int = MLA.v_dim
) -> dict[str, tuple[int, ...]]:
    """fp32 `logits` (partial outputs) and `attn_lse` as `mla_decode_fwd` allocates them (docs/aiter.md, "Buffer
    sizes"): one row per (partial, q token); 1 MiB per request at the seeds' 32 splits."""
    if partial_map_len < 0 or q_len < 1:
        raise ValueError(f"need partial_map_len >= 0 and q_len >= 1, got {partial_map_len}, {q_len}")
    rows = partial_map_len * q_len
    return {"logits": (rows, 1, num_heads, v_dim), "attn_lse": (rows, 1, num_heads, 1)}


# --------------------------------------------------------------------------------------------------------------
# Keyword dictionaries
# --------------------------------------------------------------------------------------------------------------


def check_release(abi: AiterAbi, settings: AiterSettings) -> None:
    """Refuse settings the release cannot run, with the reason (`AiterAbi.unsupported`)."""
    if not isinstance(abi, AiterAbi):
        raise TypeError(f"abi must be an AiterAbi, got {type(abi).__name__}")
    why = abi.unsupported().get("mode='intra-batch'")
    if settings.intra_batch_mode and why is not None:
        raise ValueError(
            f"aiter {abi.version} cannot run mode='intra-batch': {why}; use "
            "mode='fast', or aiter 0.1.10.post2 or later built from source (docs/aiter.md, Install)"
        )


def info_kwargs(
    abi: AiterAbi,
    *,
    settings: AiterSettings,
    batch: int,
    q_len: int,
    q_torch_dtype: torch.dtype,
    kv_torch_dtype: torch.dtype,
    num_heads: int = MLA.num_heads,
) -> dict[str, Any]:
    """Keywords for `get_mla_metadata_info_v1` (pure Python in aiter; returns six (shape, dtype) pairs)."""
    if batch < 1 or q_len < 1:
        raise ValueError(f"batch and q_len must be >= 1, got {batch}, {q_len}")
    check_release(abi, settings)
    kw: dict[str, Any] = {
        "batch_size": batch,
        "max_seqlen_qo": q_len,
        "num_head_qo": num_heads,
        "q_dtype": q_torch_dtype,
        "kv_dtype": kv_torch_dtype,
        "is_sparse": False,
        "fast_mode": settings.fast_mode,
    }
    if not abi.legacy:
        kw.update(num_kv_splits=settings.num_kv_splits, intra_batch_mode=settings.intra_batch_mode)
    if abi.info_has_max_split_per_batch:
        kw["max_split_per_batch"] = settings.split_arg
    return kw


def metadata_kwargs(
    abi: AiterAbi,
    *,
    settings: AiterSettings,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_last_page_lens: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    q_torch_dtype: torch.dtype,
    kv_torch_dtype: torch.dtype,
    num_heads: int = MLA.num_heads,
    num_kv_heads: int = MLA.num_kv_heads,
    causal: bool = False,
) -> dict[str, Any]:
    """Keywords for `get_mla_metadata_v1` (page size 1; dtypes passed wherever the release takes them — vLLM #46997).

    In the v0.1.7 window (`AiterAbi.legacy`) the stub names ``work_indptr, work_info`` but forwards its arguments by
    position to a binding that takes ``work_info_set, work_indptr`` (docs/aiter.md, "How a call reaches the
    kernel"): the work-info buffer is passed as ``work_indptr`` and the indptr as ``work_info`` so that each reaches
    the C++ parameter of its meaning."""
    check_release(abi, settings)
    for name in ("work_metadata", "work_info_set", "work_indptr", "reduce_indptr", "reduce_final_map"):
        if name not in buffers:
            raise ValueError(f"buffers is missing {name!r}")
    if "reduce_partial_map" not in buffers:
        raise ValueError("buffers is missing 'reduce_partial_map'")
    if q_len < 1:
        raise ValueError(f"q_len must be >= 1, got {q_len}")
    kw = {
        "seqlens_qo_indptr": qo_indptr,
        "seqlens_kv_indptr": kv_indptr,
        "kv_last_page_lens": kv_last_page_lens,
        "num_heads_per_head_k": num_heads // num_kv_heads,
        "num_heads_k": num_kv_heads,
        "is_causal": bool(causal),  # False: every q token sees all of its request's KV (the competition's decode)
        "work_metadata_ptrs": buffers["work_metadata"],
        "work_info_set": buffers["work_info_set"],
        "work_indptr": buffers["work_indptr"],
        "reduce_indptr": buffers["reduce_indptr"],
        "reduce_final_map": buffers["reduce_final_map"],
        "reduce_partial_map": buffers["reduce_partial_map"],
        "page_size": 1,
        "kv_granularity": settings.kv_granularity,
        "max_seqlen_qo": q_len,
        "uni_seqlen_qo": q_len,  # must be > 0 in intra-batch mode (v1.0 ignores qo_indptr)
        "fast_mode": settings.fast_mode,
        "topk": -1,  # dense attention (no sparse top-k selection)
        "max_split_per_batch": settings.split_arg,
        "intra_batch_mode": settings.intra_batch_mode,
        "dtype_q": q_torch_dtype,
        "dtype_kv": kv_torch_dtype,
    }
    if abi.legacy:
        for name in (
            "kv_last_page_lens",
            "page_size",
            "max_split_per_batch",
            "intra_batch_mode",
            "dtype_q",
            "dtype_kv",
        ):
            del kw[name]  # fast mode's -1 (all CUs) is the default of the wheel that has max_split_per_batch
        kw["work_indptr"], kw["work_info"] = buffers["work_info_set"], buffers["work_indptr"]
        del kw["work_info_set"]
    return kw


def stage1_kwargs(
    abi: AiterAbi,
    *,
    q: Any,
    kv_buffer: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_lens: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    sm_scale: float,
    logits: Any,
    attn_lse: Any,
    out: Any,
    final_lse: Any | None,
    q_scale: Any | None,
    kv_scale: Any | None,
    fp8: bool,
    causal: bool = False,
) -> dict[str, Any]:
    """Keywords for `mla_decode_stage1_asm_fwd` in persistent mode (`num_kv_splits_indptr=None` selects it).

    For fp8 both scales are required (aiter only asserts this in v0.1.11 and otherwise passes garbage)."""
    if fp8 and (q_scale is None or kv_scale is None):
        raise ValueError("fp8 decode needs both q_scale and kv_scale (float32 [1] dequantization multipliers)")
    kw: dict[str, Any] = {
        "Q": q,
        "KV": kv_buffer,
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "kv_page_indices": kv_indices,
        "kv_last_page_lens": kv_last_page_lens,
        "num_kv_splits_indptr": None,
        "work_meta_data": buffers["work_metadata"],
        "work_indptr": buffers["work_indptr"],
        "work_info_set": buffers["work_info_set"],
        "max_seqlen_q": q_len,
        "page_size": 1,
        "nhead_kv": MLA.num_kv_heads,
        "softmax_scale": float(sm_scale),
        "splitData": logits,
        "splitLse": attn_lse,
        "output": out,
        "q_scale": q_scale,
        "kv_scale": kv_scale,
    }
    if abi.legacy:
        del kw["page_size"], kw["nhead_kv"]
        kw["work_metadata"] = kw.pop("work_meta_data")
    if abi.stage1_has_lse:
        kw["lse"] = final_lse
    if abi.stage1_has_causal:
        kw["causal"] = bool(causal)  # always passed: the flag defaults to True (see AiterAbi)
    elif causal:
        raise ValueError(f"causal decode needs aiter >= v0.1.20 (stage 1's `causal` flag); aiter {abi.version} "
                         "has none")  # fmt: skip
    return kw


def reduce_kwargs(
    abi: AiterAbi,
    *,
    logits: Any,
    attn_lse: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    num_kv_splits: int,
    out: Any,
    final_lse: Any | None,
) -> dict[str, Any]:
    """Keywords for `mla_reduce_v1`. `num_kv_splits` (v0.1.16+) only sizes the reduce's scratch, as
    max(CUs, num_kv_splits); pass at least the largest partial count of any tile."""
    kw: dict[str, Any] = {
        "partial_output": logits,
        "partial_lse": attn_lse,
        "reduce_indptr": buffers["reduce_indptr"],
        "reduce_final_map": buffers["reduce_final_map"],
        "reduce_partial_map": buffers["reduce_partial_map"],
        "max_seqlen_q": q_len,
        "final_output": out,
        "final_lse": final_lse,
    }
    if abi.legacy:
        del kw["max_seqlen_q"]  # the v0.1.7 reduce reads each tile's rows from reduce_final_map
    if abi.reduce_has_num_kv_splits:
        kw["num_kv_splits"] = int(num_kv_splits)
    return kw


def mla_decode_fwd_kwargs(
    *,
    q: Any,
    kv_buffer: Any,
    out: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_lens: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    sm_scale: float,
    num_kv_splits: int,
    settings: AiterSettings,
    q_scale: Any | None,
    kv_scale: Any | None,
    accepts: Iterable[str] = (),
    return_lse: bool = False,
    abi: AiterAbi | None = None,
    causal: bool = False,
) -> dict[str, Any]:
    """Keywords for aiter's one-call `mla_decode_fwd` (persistent branch: `work_meta_data` given). Passing
    `num_kv_splits` explicitly keeps HEAD from falling back to non-persistent for gfx950 bf16 B >= 32.
    `return_lse=True` is added when asked for and the installed signature (`accepts`) has it; ``causal`` whenever
    the signature has it (HEAD defaults it to True, which would mask speculative decode), and a causal decode is
    refused where it has not."""
    kw: dict[str, Any] = {
        "q": q,
        "kv_buffer": kv_buffer,
        "o": out,
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_last_page_lens": kv_last_page_lens,
        "max_seqlen_q": q_len,
        "page_size": 1,
        "nhead_kv": MLA.num_kv_heads,
        "sm_scale": float(sm_scale),
        "logit_cap": 0.0,
        "num_kv_splits": int(num_kv_splits),
        "work_meta_data": buffers["work_metadata"],
        "work_indptr": buffers["work_indptr"],
        "work_info_set": buffers["work_info_set"],
        "reduce_indptr": buffers["reduce_indptr"],
        "reduce_final_map": buffers["reduce_final_map"],
        "reduce_partial_map": buffers["reduce_partial_map"],
        "q_scale": q_scale,
        "kv_scale": kv_scale,
        "intra_batch_mode": settings.intra_batch_mode,
    }
    if abi is not None and abi.legacy:
        del kw["page_size"], kw["nhead_kv"], kw["intra_batch_mode"]  # the v0.1.7 mla_decode_fwd has none of them
    accepted = set(accepts)
    if return_lse and "return_lse" in accepted:
        kw["return_lse"] = True
    if "causal" in accepted:
        kw["causal"] = bool(causal)
    elif causal:
        raise ValueError("causal decode needs an aiter whose mla_decode_fwd takes `causal` (v0.1.20 and later)")
    return kw


def token_kv_indices(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand a page table to page size 1 (what vLLM does for aiter): returns ``(token_indptr, token_indices)``
    where ``token_indices`` are rows of ``kv_buffer.view(num_pages * page_size, 1, 1, 576)``. No KV is copied.

    aiter's bf16 persistent paths were wrong at page_size > 1 on gfx950 (aiter #3095), hence always 1."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    dev = kv_indices.device
    pages = (kv_indptr[1:] - kv_indptr[:-1]).to("cpu", torch.int64)
    last = kv_last_page_len.to("cpu", torch.int64)
    lens = torch.where(pages > 0, (pages - 1) * page_size + last, torch.zeros_like(pages))
    token_indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32)
    token_indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
    if page_size == 1:
        return token_indptr.to(dev), kv_indices[: int(kv_indptr[-1])].to(torch.int32)
    n_refs = int(kv_indptr[-1])
    rows = kv_indices[:n_refs].to(torch.int64).repeat_interleave(page_size) * page_size
    rows = rows + torch.arange(page_size, device=dev).repeat(n_refs)
    # keep the first len_b tokens of each request's expanded pages (drop the unused tail of its last page)
    keep = torch.zeros(n_refs * page_size, dtype=torch.bool)
    start = 0
    for p, n in zip(pages.tolist(), lens.tolist()):
        keep[start : start + n] = True
        start += p * page_size
    return token_indptr.to(dev), rows[keep.to(dev)].to(torch.int32)

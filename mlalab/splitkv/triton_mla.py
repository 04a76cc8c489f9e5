"""Host side of the Triton split-KV decode: precision schemes, quantisation of the inputs, plan checks, launches.

Public API:

* `Precision` (enum: ``a8w8``, ``a16w8``, ``bf16``) and `prepare(inputs, precision, fp8_dtype)` -> `PreparedInputs`
  (q and the KV as the kernel reads them, plus per-tensor dequantisation scales);
* `TritonDecoder(prepared, plan, ...)`: holds the plan on the device and the partial buffers, and runs stage 1 +
  reduce with no host synchronisation (so it can be captured in a CUDA graph);
* `triton_decode(prepared, plan, ...)` -> ``(out, lse)``: one call;
* `naive_decode(prepared)`: the readable version — the exact fp64 reference on the dequantised inputs, i.e. what
  the kernel must reproduce up to fp32 accumulation (and P rounding, in the production modes);
* `token_work_info(plan, kv_indptr, kv_last_page_len)`: a WorkPlan's page positions as the token positions the
  kernel walks (done once per plan, in `TritonDecoder`), so every planner of `mlalab.splitkv` runs on paged KV.

Plans come from `mlalab.splitkv.make_plan` (the Triton default is the ``simple`` planner).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

import torch

from ..config import MLA
from ..inputs import DecodeInputs, kv_lens_from_layout
from ..quant import fp8_dtype, quantize_fp8_per_tensor
from ..reference import decode_reference
from .plan import WorkPlan
from .planners import make_plan
from .timeline import CtaTimeline, launch_clock_ghz, measure_clock_ghz, timeline_from_stamps

__all__ = [
    "Precision",
    "PreparedInputs",
    "prepare",
    "check_plan",
    "token_work_info",
    "KernelConfig",
    "TritonDecoder",
    "triton_decode",
    "naive_decode",
    "main",
]


class Precision(str, enum.Enum):  # noqa: UP042
    """Which operands are fp8 (per-tensor scales) and which stay bf16."""

    A8W8 = "a8w8"  # fp8 q, fp8 KV: the competition reference's numerics
    A16W8 = "a16w8"  # bf16 q, fp8 KV
    BF16 = "bf16"  # bf16 q, bf16 KV

    @classmethod
    def parse(cls, x: str | Precision) -> Precision:
        if isinstance(x, Precision):
            return x
        try:
            return cls(str(x).lower())
        except ValueError:
            raise ValueError(f"unknown precision {x!r}; supported: {', '.join(p.value for p in cls)}") from None


@dataclass(frozen=True)
class PreparedInputs:
    """Inputs as the kernel reads them. ``kv`` is the buffer flattened to ``(pages·page_size, 576)`` rows."""

    q: torch.Tensor
    kv: torch.Tensor
    q_scale: torch.Tensor  # (1,) float32 dequantisation scale (1.0 when bf16)
    kv_scale: torch.Tensor
    kv_indices: torch.Tensor  # int32 page ids
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor  # in pages
    kv_last_page_len: torch.Tensor
    page_size: int
    precision: Precision
    fp8_format: str
    #: kv_indices is the identity (checked once here, never per call): the kernel may skip the gather.
    contiguous: bool = False

    @property
    def batch(self) -> int:
        return int(self.qo_indptr.numel() - 1)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, kv as (pages, page_size, 1, 576)) in float64 on the CPU: what the kernel's math sees."""
        q = self.q.to("cpu", torch.float64) * float(self.q_scale.cpu()[0])
        kv = self.kv.to("cpu", torch.float64) * float(self.kv_scale.cpu()[0])
        return q, kv.reshape(-1, self.page_size, 1, kv.shape[-1])


def prepare(inputs: DecodeInputs, precision: str | Precision = "a8w8", fp8_format: str = "e4m3fn") -> PreparedInputs:
    """Quantise `inputs` for `precision` (per-tensor amax scales) and flatten the KV pages to token rows."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    prec = Precision.parse(precision)
    if prec is not Precision.BF16:
        fp8_dtype(fp8_format)  # validates the flavour name
    q, kv = inputs.q, inputs.kv_buffer
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise TypeError(f"prepare expects bf16 q and kv_buffer (as make_inputs builds them), got {q.dtype}, {kv.dtype}")
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    idx = inputs.kv_indices
    contiguous = bool(torch.equal(idx.cpu(), torch.arange(idx.numel(), dtype=idx.dtype)))
    kv_rows = kv.reshape(-1, kv.shape[-1])
    if prec is Precision.BF16:
        qk, qs, kvk, ks = q, one, kv_rows, one
    elif prec is Precision.A16W8:
        kvk, ks = quantize_fp8_per_tensor(kv_rows, fp8_format)
        qk, qs = q, one
    else:
        kvk, ks = quantize_fp8_per_tensor(kv_rows, fp8_format)
        qk, qs = quantize_fp8_per_tensor(q, fp8_format)
    return PreparedInputs(
        q=qk.contiguous(),
        kv=kvk.contiguous(),
        q_scale=qs.to(q.device),
        kv_scale=ks.to(q.device),
        kv_indices=inputs.kv_indices.to(torch.int32),
        qo_indptr=inputs.qo_indptr,
        kv_indptr=inputs.kv_indptr,
        kv_last_page_len=inputs.kv_last_page_len,
        page_size=inputs.page_size,
        precision=prec,
        fp8_format=fp8_format,
        contiguous=contiguous,
    )


# ------------------------------------------------------------------------------------------------ plans
def check_plan(plan: WorkPlan, batch: int, total_q: int, *, page_size: int | None = None) -> None:
    """Reject a plan that cannot belong to these tensors (not a WorkPlan, wrong batch or page size, q rows out of
    range). `WorkPlan.validate` checks the rest of the contract."""
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan (mlalab.splitkv.make_plan), got {type(plan).__name__}")
    if plan.batch != batch:
        raise ValueError(f"plan was built for batch {plan.batch} but the inputs have batch {batch}")
    if page_size is not None and plan.page_size != page_size:
        raise ValueError(f"plan was built for page size {plan.page_size} but the inputs have page size {page_size}")
    wi = plan.work_info
    if wi.numel():
        wc = wi.cpu()
        if int(wc[:, 3].max()) > total_q or int(wc[:, 2].min()) < 0:
            raise ValueError(f"plan.work_info q rows lie outside [0, {total_q}): built for other inputs?")


def token_work_info(plan: WorkPlan, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor) -> torch.Tensor:
    """``plan.work_info`` (CPU int32 copy) with kv_start / kv_end turned from ``kv_indices`` positions (pages) into
    the token positions of the page-expanded list that the kernel walks.

    Pages are page-aligned and only a request's last page is partial: ``tok_start = kv_start·page_size``,
    ``tok_end = min(kv_end·page_size, kv_indptr[b]·page_size + kv_len[b])``. Identity at page size 1.
    """
    ps = plan.page_size
    wi = plan.work_info.to("cpu", torch.int64).clone()
    if wi.numel() == 0:
        return wi.to(torch.int32)
    lens = kv_lens_from_layout(kv_indptr, kv_last_page_len, ps)
    req_end = kv_indptr.to("cpu", torch.int64)[:-1] * ps + lens  # first token position after each request
    b = wi[:, 0]
    wi[:, 4] = wi[:, 4] * ps
    wi[:, 5] = torch.minimum(wi[:, 5] * ps, req_end[b])
    return wi.to(torch.int32).contiguous()


# ------------------------------------------------------------------------------------------------ launch
@dataclass(frozen=True)
class KernelConfig:
    """Launch knobs of stage 1 (measured on the H200 by `mlalab.timing`).

    ``kernel``: ``"hopper"`` = the sm_90 Gluon kernel (`gluon_hopper`: wgmma, TMA ring of ``hopper_stages`` 64-token
    tiles; a8w8 on two fp8 paths, bf16 on v-tile, a16w8 on v-conv; see `hopper_unsupported`), ``"portable"`` = the
    Triton kernel of `triton_decode` (every precision, page layout and GPU, and Triton's CPU interpreter),
    ``"auto"`` = hopper where it applies,
    else portable. ``pdl`` (hopper): launch the reduce as a programmatic dependent of stage 1, so its launch
    overlaps stage 1 and it starts the moment stage 1's writes are visible. ``pdl_chain`` (hopper, with ``pdl``):
    stage 1 too is a programmatic dependent of whatever precedes it in the stream; it reads its plan header and
    sets up shared memory, then waits for that kernel to complete before it reads q or the KV or writes
    anything, so back-to-back calls overlap one call's launch and header with the previous call's tail. ``hopper_variant`` (hopper):
    ``"vt-smem"``, ``"v-regs"`` (a8w8), ``"v-tile"`` (bf16), ``"v-conv"`` (a16w8) or ``"auto"`` (a8w8: by the plan,
    `HOPPER_LONG_STREAM`; bf16: v-tile; a16w8: v-conv; `HOPPER_VARIANTS`, `resolve_config`). ``hopper_ablate``
    (hopper, timing experiments only: the outputs are WRONG): ``"none"``, ``"qk"`` (the score wgmma is skipped, scores
    are 0) or ``"qk+pv"`` (the value wgmma and its V operand too): what the decode would take if that compute were
    free, every byte still loaded and stored (`HOPPER_ABLATIONS`, ``scripts/profile_hopper.py --ablations``).
    ``hopper_refill_after_pv`` (hopper): True = a ring stage's refill TMA is issued right after the tile's PV, False =
    between the softmax and the PV (v-tile: True = the previous tile's stage after this tile's softmax, False = right
    after its wait with one more barrier); None (default) = the faster of the two on the path (`HOPPER_EARLY_REFILL`:
    False on v-tile, True on the fp8 paths). ``hopper_q_first`` (hopper): the first work's q is fetched before the ring's
    first tiles (default; else after them, as up to 2026-12-03's run 9: 0.718x vs 0.710x of FlashMLA fp8's geomean
    in one A/B, data/profiles/h200_2026-12-03_ab_qfirst_stages.csv). ``hopper_warp_exchange`` (hopper): each tile's
    score maximum and each work's softmax sum across the 4 warps with one shared-memory exchange and one barrier
    (`gluon_hopper._across_warps`) instead of the two of Triton 3.6's reduction (3.9 already uses one); correct on the
    H200 but no faster (21.48 vs 21.47 us geomean, data/profiles/h200_2026-12-03_ab_warp_exchange.csv), so off.
    ``hopper_merge_splits`` (hopper; 0 = off, 2, 4 or 8): a request split in at most this many partials (one q row,
    its partial rows consecutive) is merged inside stage 1 by the CTA that stores its last partial (an arrival
    counter per request; nobody waits), so the reduce kernel runs only for the others, or not at all. Correct on the
    H200 but slower (2026-12-03: 0.709x / 0.718x / 0.758x of FlashMLA fp8's geomean for 2 / 4 / 8 against 0.698x,
    data/profiles/h200_2026-12-03_ab_merge.csv; probably because the merging CTA's tail lies on the critical path of
    the last SM to finish), so off. ``hopper_stages``: the TMA ring's depth, 1 to `HOPPER_MAX_STAGES` of the path;
    None (default) = the path's default (`hopper_ring`: 3 fp8 tiles; 2 on v-tile (exactly 2) and v-conv (at most 2);
    2 tiles of 128 tokens).
    ``hopper_block`` (hopper): tokens per tile, 64 (one warpgroup per CTA) or 128 (two warpgroups, 8 warps, on one
    128-token tile; v-regs, at most `HOPPER_MAX_STAGES_128` stages, no warp exchange or merge; a plan cut on multiples
    of 128 tokens avoids half-empty tiles). Correct on the H200, ~10 % cheaper per token, but slower overall (a later
    first tile, a longer last one): 0.731x vs 0.700x (data/profiles/h200_2026-12-03_ab_block128.csv), so 64.
    ``hopper_warpgroups`` (hopper): 1, or 2 = two warpgroups per CTA on alternate 64-token tiles of the same stream,
    sharing one ring of ``hopper_stages`` (1 to 4) tiles, each with its own softmax state and Oᵀ, merged once per work
    inside the CTA (`gluon_hopper_2wg`; v-regs, 64-token tiles, no warp exchange, merge, ablation or time line).
    Correct on the H200 but slower: 0.779x-0.814x vs 0.699x-0.702x (data/profiles/h200_2026-12-03_ab_2wg*.csv), so 1.
    ``hopper_first_burst`` (hopper, one warpgroup): only this many of the ring's first tiles (1 to ``hopper_stages``
    - 1) are issued at the start, the rest once the CTA's first tile has arrived (`gluon_hopper._issue_deferred`:
    with every SM's ring issued at once the first tile lands with the last of them); 0 = the whole ring at once;
    None (the default) = `HOPPER_FIRST_BURST` tiles when some CTA of the plan streams more tiles than that and the
    ring is deeper, else the whole ring (where the two issue the same tiles, the plain kernel runs).
    ``hopper_partials`` (hopper; fp8 KV, i.e. a8w8 and a16w8): the split works' partial outputs in ``"fp32"``, or in
    ``"fp16"`` holding V in units of its fp8 codes (|o| <= the fp8 maximum: no overflow whatever the KV scale; the
    reduce applies the scale): half the bytes stage 1 stores and the reduce reads, one fp16 rounding (<= 2^-12
    relative) of each partial before the merge; ``"auto"`` (default): fp16 for fp8 KV on 64-token tiles of one
    warpgroup without ``hopper_merge_splits``, else fp32 (fp16 is faster at every competition shape since the Gluon
    reduce's session-16 rewrite, data/profiles/h200_2026-12-04_ab_s16_reduce.csv; two warpgroups spill with fp16
    partials under Triton 3.9; 128-token tiles with fp16 partials compile but have not run on a GPU). ``hopper_reduce`` (hopper):
    the reduce after the sm_90 stage 1, ``"triton"`` (`triton_decode.reduce_kernel`, the portable one), ``"gluon"``
    (`gluon_reduce`: the same merge with the partials in registers, an explicit layout instead of Triton's shuffle
    trees, which cost the fp16 partials their gain) or ``"auto"`` (default: gluon with fp16 partials, else triton).
    The knobs below belong to the portable kernel.
    ``mma_fp16`` (a8w8 only): both dots on fp16 operands (the fp8 codes are exact in fp16) instead of fp8 QK +
    fp8 PV; ``p_fp8`` rounds P through the KV's fp8 type first (aiter's numerics); ``contiguous``: use the
    gather-free path when `prepare` found the page table to be the identity (ignored otherwise);
    ``qk_tokens_m`` (heads-major only): compute the scores as Sᵀ = K·Qᵀ so that QK can use Hopper's wgmma;
    ``d_chunk`` (heads-major only; 0 = off, 128 or 256): stream the 512 latent dims in chunks so only one
    (block_n, d_chunk) K chunk is live (fewer registers); ``chunk_pv``: with ``d_chunk``, PV per chunk into
    separate accumulators (else one (16, 512) accumulator and one full V re-load).
    """

    kernel: str = "auto"
    hopper_stages: int | None = None
    pdl: bool = True
    pdl_chain: bool = False
    hopper_variant: str = "auto"
    hopper_ablate: str = "none"
    hopper_refill_after_pv: bool | None = None
    hopper_q_first: bool = True
    hopper_warp_exchange: bool = False
    hopper_merge_splits: int = 0
    hopper_block: int = 64
    hopper_warpgroups: int = 1
    hopper_first_burst: int | None = None
    hopper_partials: str = "auto"
    hopper_reduce: str = "auto"
    block_n: int = 64
    num_warps: int = 8  # halves the a8w8 time vs 4 (H200, run 2): 4 warps spill the (16, 512) fp32 accumulator
    num_stages: int = 2
    transposed: bool = False
    mma_fp16: bool = True
    p_fp8: bool = True
    contiguous: bool = True
    qk_tokens_m: bool = False
    d_chunk: int = 0
    chunk_pv: bool = True


def hopper_import_error() -> str | None:
    """Why the Gluon Hopper kernel module cannot be imported here (None when it can)."""
    try:
        from . import gluon_hopper  # noqa: F401
    except Exception as e:  # a Triton without Gluon's Hopper API, or no Triton at all
        return f"triton.experimental.gluon (Hopper) is unavailable: {type(e).__name__}: {e}"
    return None


def hopper_unsupported(prepared: PreparedInputs, work_info: torch.Tensor | None, *, pv_exact: bool = False,
                       out_dtype: torch.dtype = torch.bfloat16, block: int = 64,
                       variant: str = "auto") -> str | None:  # fmt: skip
    """Why the sm_90 Gluon kernel cannot run these inputs and plan (None when it can): first what the inputs ask
    for, then what this machine lacks. `work_info`: the plan's works (`token_work_info`); None = before any plan
    exists, judging q rows per request from ``qo_indptr`` (the planners never split a request's q rows).
    The one place that decides: `TritonDecoder` (kernel="auto") and the backend's plan default both ask it.
    `variant`: `KernelConfig.hopper_variant`; bf16 runs the sm_90 kernel on ``"v-tile"``, a16w8 on ``"v-conv"``
    (`PRECISION_VARIANT`: what ``"auto"`` means for them)."""
    own = PRECISION_VARIANT.get(prepared.precision)  # bf16 and a16w8: one path each
    if own is not None and variant not in ("auto", own):
        return (f"{prepared.precision.value} runs the sm_90 kernel on its {own} path only (hopper_variant 'auto' or "
                f"{own!r}, not {variant!r})")  # fmt: skip
    if prepared.precision is not Precision.BF16 and prepared.kv.dtype != torch.float8_e4m3fn:
        return f"needs e4m3fn codes (what sm_90 wgmma reads), not {prepared.kv.dtype}"
    if pv_exact or out_dtype != torch.bfloat16:
        return "production numerics only (bf16 output, fp8 products): exact mode runs on the portable kernel"
    if tuple(prepared.q.shape[1:]) != (MLA.num_heads, MLA.qk_dim) or prepared.kv.shape[-1] != MLA.qk_dim:
        return f"written for {MLA.num_heads} heads x {MLA.qk_dim} dims"
    if not (prepared.contiguous and prepared.page_size == 1) and prepared.page_size % block:
        return (f"tiles of {block} tokens must be contiguous rows: page size 1 with the identity page table, or a "
                f"page size that is a multiple of {block} (got page size {prepared.page_size}, "
                f"{'identity' if prepared.contiguous else 'permuted'} page table)")  # fmt: skip
    if work_info is None:
        q_rows = prepared.qo_indptr[1:] - prepared.qo_indptr[:-1]
    else:
        q_rows = work_info[:, 3] - work_info[:, 2]
    if q_rows.numel() and int(q_rows.max()) > 1:
        return "one q row per work (q_len 1); speculative decode (q_len > 1) runs on the portable kernel"
    dev = prepared.q.device
    if dev.type != "cuda" or torch.version.cuda is None:
        return "needs an NVIDIA GPU"
    if torch.cuda.get_device_capability(dev) != (9, 0):
        return f"needs compute capability 9.0 (Hopper), this GPU has {torch.cuda.get_device_capability(dev)}"
    return hopper_import_error()


def hopper_tiles(prepared: PreparedInputs, work_indptr: torch.Tensor, work_info: torch.Tensor,
                 block_n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(tile_indptr, tile_rows)`` int32 on the CPU: the Hopper kernel's tile stream. CTA ``c`` consumes the
    `block_n`-token tiles (64 or 128) of its works in order; ``tile_rows[t]`` is the KV row of tile t's first token (its
    position itself with the identity page table, else through ``kv_indices``: tiles never cross a page because pages
    are multiples of `block_n` tokens and works start on page boundaries)."""
    wi = work_info.to("cpu", torch.int64)
    ks, ke = wi[:, 4], wi[:, 5]
    counts = torch.clamp((ke - ks + block_n - 1) // block_n, min=0)
    n = int(counts.sum())
    owner = torch.repeat_interleave(torch.arange(wi.shape[0]), counts)
    first = torch.cumsum(counts, 0) - counts
    pos = ks[owner] + block_n * (torch.arange(n) - first[owner])
    if prepared.contiguous and prepared.page_size == 1:
        rows = pos
    else:
        ps = prepared.page_size
        rows = prepared.kv_indices.to("cpu", torch.int64)[pos // ps] * ps + pos % ps
    csum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    tile_indptr = csum[work_indptr.to("cpu", torch.int64)]
    if rows.numel() and int(rows.max()) >= 2**31:
        raise ValueError("KV rows beyond 2^31: TMA coordinates are int32")
    return tile_indptr.to(torch.int32), rows.to(torch.int32)


#: The paths of the sm_90 stage 1 `gluon_hopper.stage1_kernel` (`KernelConfig.hopper_variant`): ``vt-smem``
#: (Vᵀ transposed through shared memory, QK and PV pipelined across tiles), ``v-regs`` (``V_IN_REGS``, helpers in
#: `gluon_hopper_vreg`: V straight from the K tile into the PV's register operand; no Vᵀ buffer, but PV(i-1) is
#: waited for before QK(i)); ``v-tile`` (``V_FROM_K``, bf16 only: the PV reads Vᵀ straight from the K tile in shared
#: memory, which wgmma can read transposed for 16-bit types only; the stage is refilled once that PV has completed);
#: ``v-conv`` (``KV_CONVERT``, a16w8 only: each fp8 ring tile is converted by the CUDA cores into one bf16 tile, exact,
#: which QK (bf16 q) and PV then read as on v-tile; the ring stage is refilled right after the conversion).
#: a8w8 runs vt-smem or v-regs; bf16 runs v-tile, a16w8 v-conv (their ``"auto"``, `resolve_config`).
HOPPER_VARIANTS = ("vt-smem", "v-regs", "v-tile", "v-conv")

#: The sm_90 path of each precision that has only one (what ``hopper_variant="auto"`` means for it); a8w8 has two.
PRECISION_VARIANT = {Precision.BF16: "v-tile", Precision.A16W8: "v-conv"}

#: What those two paths allow (checked in `TritonDecoder`): their precision (``why``), a ring of exactly (v-tile: it
#: refills a stage one tile late) or at most (v-conv) `HOPPER_MAX_STAGES` tiles, the refill points, and one warpgroup
#: on 64-token tiles without the fp8 paths' experiments (merge, warp exchange, ablation).
ONE_PATH_RULES: dict[str, dict[str, Any]] = {
    "v-tile": dict(why="reads Vᵀ straight from the K tile, which wgmma transposes for 16-bit types only: bf16 precision",
                   exact_ring=True, refill=(True, False), ring_note="tiles (it refills a stage one tile late)"),
    "v-conv": dict(why="converts fp8 KV codes for bf16 q: a16w8 precision", exact_ring=False, refill=(True,),
                   ring_note="fp8 tiles (beside its bf16 tile), refilled once each is converted "
                             "(hopper_refill_after_pv None or True)"),
}  # fmt: skip

#: `KernelConfig.hopper_ablate` -> the kernel's ``ABLATE``: which compute the sm_90 stage 1 skips (timing only).
HOPPER_ABLATIONS = {"none": 0, "qk": 1, "qk+pv": 2}

#: ``hopper_variant="auto"`` runs ``v-regs`` when some CTA of the plan streams at least this many 64-token tiles.
#: Since the ring's refill moved after the PV (2026-12-03, data/profiles/h200_2026-12-03_ab_refill.csv, one process,
#: H200), v-regs is the faster path on every competition shape (geomean 21.9 vs 23.9 µs for vt-smem; 4 x 1024 6.09 vs
#: 6.24, 64 x 1024 17.70 vs 19.39, 128 x 8192 141.1 vs 170.6; 16 x 8192 28.28 vs 30.51), so "auto" means v-regs. (The
#: rule was 16 tiles on 2026-12-02's A/B, data/profiles/h200_2026-12-02_ab_hopper.csv, with the older epilogue.)
HOPPER_LONG_STREAM = 1

#: The ring tiles a CTA issues at its start when `KernelConfig.hopper_first_burst` is None (auto); the rest follow once
#: its first tile has arrived. Measured on the H200 (2026-12-03, one process, data/profiles/h200_2026-12-03_ab_burst.csv,
#: 3 stages): 2 tiles gave 0.688x FlashMLA fp8's geomean against 0.697x for the whole ring and 0.700x for 1 tile; the
#: first tile lands ~3.6 us after the start instead of 4.6-4.9 (data/profiles/h200_2026-12-03s11_burst2_profile.csv).
#: CTAs with at most 2 tiles issue the same tiles either way, and the plain kernel measured faster there (4 x 1024:
#: 5.72 vs 6.23 us, 1 tile per CTA), hence "more tiles than the burst" in the rule.
HOPPER_FIRST_BURST = 2


def first_burst(config: KernelConfig, most_tiles: int, stages: int) -> int:
    """The ring tiles the sm_90 stage 1 issues at a CTA's start (its ``FIRST_BURST``; `stages` = all), for a plan whose
    longest CTA tile stream is `most_tiles` tiles and a ring of `stages` tiles (`hopper_ring`;
    `KernelConfig.hopper_first_burst`, `HOPPER_FIRST_BURST`)."""
    if type(most_tiles) is not int or most_tiles < 0:
        raise ValueError(f"most_tiles must be an int >= 0, got {most_tiles!r}")
    if type(stages) is not int or stages < 1:
        raise ValueError(f"stages must be an int >= 1, got {stages!r}")
    if config.hopper_first_burst is not None:
        return config.hopper_first_burst or stages
    deep_ring = stages > HOPPER_FIRST_BURST
    if config.hopper_warpgroups == 1 and deep_ring and most_tiles > HOPPER_FIRST_BURST:
        return HOPPER_FIRST_BURST
    return stages


def resolve_config(config: KernelConfig, precision: Precision) -> KernelConfig:
    """`config` with the knobs that the path decides resolved for `precision`: ``hopper_variant="auto"`` is
    ``"v-tile"`` for bf16 and ``"v-conv"`` for a16w8 (their only sm_90 paths, `PRECISION_VARIANT`; a8w8's "auto" is
    decided per plan, `HOPPER_LONG_STREAM`), and
    ``hopper_refill_after_pv=None`` is True (after the PV) on the fp8 paths, False (early) on v-tile
    (`HOPPER_EARLY_REFILL`)."""
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(config).__name__}")
    refill = config.hopper_refill_after_pv
    if refill is not None and not isinstance(refill, bool):
        raise TypeError(f"KernelConfig switches must be True or False, got hopper_refill_after_pv={refill!r} (or None: "
                        "the path's default)")  # fmt: skip
    variant = config.hopper_variant
    own = PRECISION_VARIANT.get(Precision(precision))
    if own is not None and variant == "auto" and config.kernel != "portable":
        variant = own
    if refill is None:
        refill = variant not in HOPPER_EARLY_REFILL
    return dataclasses.replace(config, hopper_variant=variant, hopper_refill_after_pv=refill)


#: The sm_90 paths whose ring refill goes out early by default (``hopper_refill_after_pv=None``): v-tile, where the
#: previous tile's stage is refilled right after this tile's wait (one more barrier) instead of after its softmax.
#: Measured on the H200 (2026-12-03, one process, data/profiles/h200_2026-12-03_ab_bf16_v_tile.csv): 0.861x FlashMLA
#: bf16's geomean against 0.883x (portable kernel 1.357x). On the fp8 paths the refill after the PV won (v-regs
#: 21.88 vs 22.66 us geomean, data/profiles/h200_2026-12-03_ab_refill.csv).
HOPPER_EARLY_REFILL = ("v-tile",)


def hopper_ring(config: KernelConfig) -> int:
    """The sm_90 stage 1's ring depth: `KernelConfig.hopper_stages`, or when None the default of the path these
    knobs select (`HOPPER_DEFAULT_STAGES`, `HOPPER_MAX_STAGES_128`)."""
    if config.hopper_stages is not None:
        return config.hopper_stages
    if config.hopper_block == 128:
        return HOPPER_MAX_STAGES_128
    # ("auto" and two warpgroups run v-regs's ring)
    variant = config.hopper_variant if config.hopper_variant in HOPPER_DEFAULT_STAGES else "v-regs"
    return HOPPER_DEFAULT_STAGES[variant]


#: The deepest TMA ring of each sm_90 path (`KernelConfig.hopper_stages`): a stage holds a 64-token tile (36 KB in
#: fp8); vt-smem also keeps two 32 KB Vᵀ buffers, so 3 stages fill its 227 KB of shared memory; v-regs fits 5; a bf16
#: tile (v-tile) is 72 KB: 2 (196 KB with q and P); v-conv: 2 fp8 tiles beside its one 72 KB bf16 tile (196 KB).
HOPPER_MAX_STAGES = {"vt-smem": 3, "v-regs": 5, "v-tile": 2, "v-conv": 2}

#: The ring depth each path runs when `KernelConfig.hopper_stages` is None (`hopper_ring`): 3 tiles of 64 fp8 tokens
#: (session 7's A/B: 4 and 5 were slower; also the two-warpgroup kernel's), 2 bf16 tiles (all that fits); 128-token
#: tiles: `HOPPER_MAX_STAGES_128`.
HOPPER_DEFAULT_STAGES = {"vt-smem": 3, "v-regs": 3, "v-tile": 2, "v-conv": 2}

#: Tokens per tile of the sm_90 stage 1 (`KernelConfig.hopper_block`): 64 = one warpgroup (4 warps) per CTA; 128 =
#: two warpgroups (8 warps) on one 128-token tile, each computing the scores of 64 tokens and half of the 512 value rows,
#: so the per-tile chain (softmax, V operand, epilogue) has two warps per scheduler; v-regs only.
HOPPER_BLOCKS = (64, 128)
#: `KernelConfig.hopper_partials`: the partial outputs' type
HOPPER_PARTIALS = ("auto", "fp32", "fp16")
#: The deepest ring of 128-token tiles (74 KB a stage): 2 (plus q, P and the reductions' scratch in 227 KB).
HOPPER_MAX_STAGES_128 = 2

#: The deepest ring (shared by both warpgroups) with ``hopper_warpgroups=2`` (`gluon_hopper_2wg`): 4 tiles of 36 KB,
#: with q, Pᵀ and the 32 KB hand-over of Oᵀ: 199 KB.
HOPPER_MAX_STAGES_2WG = 4

#: Registers per thread of the second warpgroup of `gluon_hopper_2wg` (the first gets 256): with 240 or fewer ptxas
#: spills (Triton 3.6, sm_90).
HOPPER_2WG_WORKER_REGS = 248

#: Columns of `hopper_cta_info`'s table: 5 + the rows of the deepest ring's first tiles.
HOPPER_INFO_COLS = 5 + max(HOPPER_MAX_STAGES.values())


def merge_tiles(plan: WorkPlan, max_splits: int) -> list[int]:
    """The reduce tiles that stage 1 can merge itself (`KernelConfig.hopper_merge_splits`): 2 to `max_splits`
    partials, one q row, the partials' rows consecutive (so the merging CTA needs only the first)."""
    if max_splits == 0:
        return []
    indptr = plan.reduce_indptr.to("cpu", torch.int64)
    final = plan.reduce_final_map.to("cpu", torch.int64).reshape(-1, 2)
    pmap = plan.reduce_partial_map.to("cpu", torch.int64)
    out = []
    for t in range(int(indptr.numel()) - 1):
        s, e = int(indptr[t]), int(indptr[t + 1])
        rows = pmap[s:e]
        one_row = int(final[t, 1] - final[t, 0]) == 1
        if 2 <= e - s <= max_splits and one_row and bool((rows == rows[0] + torch.arange(e - s)).all()):
            out.append(t)
    return out


def hopper_merge_info(plan: WorkPlan, work_info: torch.Tensor, max_splits: int) -> tuple[torch.Tensor, list[int]]:
    """(MERGE_INFO (n_work, 4) int32: counter slot or -1, partials n, first partial row, q row; the tiles
    `merge_tiles` picks, slot i being tile i of the list): each work whose partial belongs to one of them gets its
    tile's slot."""
    n_work = int(work_info.shape[0])
    info = torch.full((max(1, n_work), 4), -1, dtype=torch.int32)
    info[:, 1:] = 0
    tiles = merge_tiles(plan, max_splits)
    if not tiles:
        return info, tiles
    indptr = plan.reduce_indptr.to("cpu", torch.int64)
    final = plan.reduce_final_map.to("cpu", torch.int64).reshape(-1, 2)
    pmap = plan.reduce_partial_map.to("cpu", torch.int64)
    row_of = {}  # partial row -> (slot, n, first row, q row)
    for slot, t in enumerate(tiles):
        s, e = int(indptr[t]), int(indptr[t + 1])
        for r in pmap[s:e].tolist():
            row_of[r] = (slot, e - s, int(pmap[s]), int(final[t, 0]))
    loc = work_info[:, 1].to(torch.int64).tolist()
    for w, r in enumerate(loc):
        if r in row_of:
            info[w] = torch.tensor(row_of[r], dtype=torch.int32)
    return info, tiles


def hopper_cta_info(work_indptr: torch.Tensor, tile_indptr: torch.Tensor, tile_rows: torch.Tensor,
                    work_info: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``(n_cu, HOPPER_INFO_COLS)`` int32 on the CPU, one row per CTA of the Hopper kernel, read in one round trip
    at its start: first work, end work, first tile, end tile, the q row of its first work (0 if none), then the KV
    rows of its first tiles, as many as the deepest ring holds (0 where absent)."""
    wp = work_indptr.to("cpu", torch.int64)
    tp = tile_indptr.to("cpu", torch.int64)
    rows = tile_rows.to("cpu", torch.int64)
    wi = work_info.to("cpu", torch.int64)
    n_cu = wp.numel() - 1
    info = torch.zeros((n_cu, HOPPER_INFO_COLS), dtype=torch.int64)
    info[:, 0], info[:, 1], info[:, 2], info[:, 3] = wp[:-1], wp[1:], tp[:-1], tp[1:]
    has_work = wp[:-1] < wp[1:]
    if wi.numel():
        info[has_work, 4] = wi[wp[:-1][has_work], 2]
    for i in range(HOPPER_INFO_COLS - 5):
        has = tp[:-1] + i < tp[1:]
        info[has, 5 + i] = rows[tp[:-1][has] + i]
    return info.to(torch.int32).contiguous()


class TritonDecoder:
    """Stage 1 + reduce for one plan and one set of tensor shapes; `__call__` launches without host syncs.

    ``out_dtype=torch.float32`` keeps the output before the final bf16 cast (used by the exactness tests).
    ``pv_exact=True`` runs both dots on fp32 operands ("ieee"), so the only kernel error is fp32 accumulation.
    """

    def __init__(
        self,
        prepared: PreparedInputs,
        plan: WorkPlan,
        *,
        config: KernelConfig = KernelConfig(),
        out_dtype: torch.dtype = torch.bfloat16,
        pv_exact: bool = False,
        sm_scale: float | None = None,
    ) -> None:
        import triton  # (clear ImportError before any work)

        from . import triton_decode as K

        if not isinstance(prepared, PreparedInputs):
            raise TypeError(f"prepared must be a PreparedInputs (see prepare()), got {type(prepared).__name__}")
        flags = [f.name for f in dataclasses.fields(config) if f.type in ("bool", bool)]
        wrong = [f"{n}={getattr(config, n)!r}" for n in flags if not isinstance(getattr(config, n), bool)]
        if wrong:
            raise TypeError(f"KernelConfig switches must be True or False, got {', '.join(wrong)}")
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
        if config.block_n < 16 or config.block_n & (config.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {config.block_n}")
        if config.d_chunk not in (0, 128, 256):
            raise ValueError(f"d_chunk must be 0 (off), 128 or 256, got {config.d_chunk}")
        if config.d_chunk and (config.transposed or config.qk_tokens_m):
            raise ValueError("d_chunk is a heads-major path: it cannot be combined with transposed or qk_tokens_m")
        if config.hopper_variant not in ("auto", *HOPPER_VARIANTS):
            raise ValueError(f"hopper_variant must be 'auto', 'vt-smem', 'v-regs', 'v-tile' or 'v-conv', "
                             f"got {config.hopper_variant!r}")  # fmt: skip
        #: the knobs as this decoder runs them (`resolve_config`: bf16's "auto" is v-tile, a16w8's v-conv, the refill
        #: point chosen)
        config = resolve_config(config, prepared.precision)
        most = max(HOPPER_MAX_STAGES.values())
        if config.hopper_stages is not None and (type(config.hopper_stages) is not int or
                                                 not 1 <= config.hopper_stages <= most):  # fmt: skip
            raise ValueError(f"hopper_stages must be 1 to {most} (227 KB of shared memory; vt-smem holds 3 tiles, "
                             f"v-regs 5, v-tile and v-conv 2) or None (the path's default ring), "
                             f"got {config.hopper_stages!r}")  # fmt: skip
        #: the sm_90 stage 1's ring depth (`hopper_ring`: `KernelConfig.hopper_stages` or the path's default)
        self.stages = stages = hopper_ring(config)
        if config.hopper_ablate not in HOPPER_ABLATIONS:
            raise ValueError(f"hopper_ablate must be one of {', '.join(map(repr, HOPPER_ABLATIONS))}, "
                             f"got {config.hopper_ablate!r}")  # fmt: skip
        if config.kernel not in ("auto", "hopper", "portable"):
            raise ValueError(f"kernel must be 'auto', 'hopper' or 'portable', got {config.kernel!r}")
        if config.hopper_merge_splits not in (0, 2, 4, 8) or isinstance(config.hopper_merge_splits, bool):
            raise ValueError(f"hopper_merge_splits must be 0 (off), 2, 4 or 8, got {config.hopper_merge_splits!r}")
        if config.hopper_merge_splits and stages == 1:
            raise ValueError("hopper_merge_splits needs hopper_stages >= 2 (with a 1-stage ring the merge spills "
                             "registers on sm_90 with Triton 3.6)")  # fmt: skip
        if type(config.hopper_block) is not int or config.hopper_block not in HOPPER_BLOCKS:
            raise ValueError(f"hopper_block must be 64 or 128 (tokens per tile), got {config.hopper_block!r}")
        if config.hopper_block == 128:
            if config.hopper_variant == "vt-smem" or config.hopper_warp_exchange or config.hopper_merge_splits:
                raise ValueError("hopper_block=128 (two warpgroups) is written for the v-regs path without "
                                 "hopper_warp_exchange or hopper_merge_splits")  # fmt: skip
            if config.hopper_warpgroups != 1:
                raise ValueError(
                    "hopper_block=128 already spreads a tile over two warpgroups: hopper_warpgroups must be 1"
                )
            if stages > HOPPER_MAX_STAGES_128:
                raise ValueError(f"hopper_block=128 holds at most {HOPPER_MAX_STAGES_128} tiles of 128 tokens in shared "
                                 f"memory (hopper_stages={stages}; pass hopper_stages=2 or 1)")  # fmt: skip
        if type(config.hopper_warpgroups) is not int or config.hopper_warpgroups not in (1, 2):
            raise ValueError(f"hopper_warpgroups must be 1 or 2, got {config.hopper_warpgroups!r}")
        if config.hopper_warpgroups == 2:
            if (
                config.hopper_variant == "vt-smem"
                or config.hopper_warp_exchange
                or config.hopper_merge_splits
                or config.hopper_ablate != "none"
            ):
                raise ValueError("hopper_warpgroups=2 is written for the v-regs path without hopper_warp_exchange, "
                                 "hopper_merge_splits or hopper_ablate")  # fmt: skip
            if not 1 <= stages <= HOPPER_MAX_STAGES_2WG:
                raise ValueError(f"hopper_warpgroups=2 shares a ring of 1 to {HOPPER_MAX_STAGES_2WG} tiles between its two "
                                 f"warpgroups, got hopper_stages={stages}")  # fmt: skip
        burst = config.hopper_first_burst
        if burst is not None and (type(burst) is not int or not 0 <= burst < stages):
            raise ValueError(f"hopper_first_burst must be None (auto), 0 (the whole ring at once) or 1 to "
                             f"hopper_stages - 1 = {stages - 1}, got {burst!r}")  # fmt: skip
        path = config.hopper_variant
        if path in ONE_PATH_RULES:  # the 16-bit paths: one precision each, fewer knobs
            rule = ONE_PATH_RULES[path]
            if PRECISION_VARIANT.get(prepared.precision) != path:
                raise ValueError(f"hopper_variant={path!r} {rule['why']}, not {prepared.precision.value}")
            limit = HOPPER_MAX_STAGES[path]
            ring_ok = stages == limit if rule["exact_ring"] else stages <= limit
            if config.kernel != "portable" and (
                not ring_ok or config.hopper_block != 64 or config.hopper_warpgroups != 1 or config.hopper_merge_splits
                or config.hopper_warp_exchange or config.hopper_ablate != "none"
                or config.hopper_refill_after_pv not in rule["refill"]
            ):  # fmt: skip
                raise ValueError(f"hopper_variant={path!r} ({prepared.precision.value}) runs 64-token tiles on one "
                                 f"warpgroup with a ring of {'exactly' if rule['exact_ring'] else 'at most'} {limit} "
                                 f"{rule['ring_note']}, without hopper_merge_splits, "
                                 "hopper_warp_exchange or hopper_ablate")  # fmt: skip
        if config.hopper_partials not in HOPPER_PARTIALS:
            raise ValueError(f"hopper_partials must be one of {', '.join(map(repr, HOPPER_PARTIALS))}, "
                             f"got {config.hopper_partials!r}")  # fmt: skip
        if config.hopper_reduce not in ("auto", "triton", "gluon"):
            raise ValueError(f"hopper_reduce must be 'auto', 'triton' or 'gluon', got {config.hopper_reduce!r}")
        if config.hopper_partials == "fp16":
            if prepared.precision is Precision.BF16:
                raise ValueError("hopper_partials='fp16' holds V in units of its fp8 codes: a8w8 and a16w8 only (bf16 "
                                 "partials in fp16 would add error beyond the bf16 tolerance and could overflow)")  # fmt: skip
            if config.hopper_merge_splits:
                raise ValueError("hopper_partials='fp16' with hopper_merge_splits: the in-stage-1 merge reads fp32 "
                                 "partials")  # fmt: skip
        if config.hopper_first_burst and config.hopper_warpgroups == 2:
            raise ValueError("hopper_first_burst is a knob of the one-warpgroup kernel (hopper_warpgroups=1)")
        check_plan(plan, prepared.batch, int(prepared.q.shape[0]), page_size=prepared.page_size)
        plan.validate(prepared.qo_indptr, prepared.kv_indptr)  # once per plan: a broken plan never reaches the GPU
        # the kernel walks token positions; WorkPlan counts kv_indices positions (pages): translate once, here
        work_info = token_work_info(plan, prepared.kv_indptr, prepared.kv_last_page_len)
        self.pv_exact = bool(pv_exact or (K.INTERPRET and prepared.precision is not Precision.A8W8))
        why_not = None
        if config.kernel != "portable":
            why_not = hopper_unsupported(prepared, work_info, pv_exact=self.pv_exact, out_dtype=out_dtype,
                                         block=config.hopper_block, variant=config.hopper_variant)  # fmt: skip
            if why_not is not None and config.kernel == "hopper":
                raise ValueError(f"kernel='hopper' cannot run here: {why_not}")
        #: which stage-1 kernel runs ("hopper" or "portable") and, for "auto", why not hopper (None: it runs)
        self.kernel = "portable" if config.kernel == "portable" or why_not is not None else "hopper"
        if config.hopper_ablate != "none" and self.kernel != "hopper":
            raise ValueError(f"hopper_ablate={config.hopper_ablate!r} is an experiment of the sm_90 kernel, which does not "
                             f"run here ({why_not or 'kernel=' + repr(config.kernel)})")  # fmt: skip
        self.hopper_reason = why_not
        self.hopper_variant: str | None = None  # set below when the hopper kernel runs
        self.block = config.hopper_block  # tokens per tile of the sm_90 stage 1
        self.merge_max = 0  # (hopper: partials of the largest request stage 1 merges itself, a power of two)
        dev = prepared.q.device
        if dev.type == "cpu" and not K.INTERPRET:
            raise RuntimeError("the Triton backend needs a GPU (or TRITON_INTERPRET=1 for tiny CPU runs)")
        self.K = K
        self.p = prepared
        self.plan = plan.to(dev)
        self.work_info = work_info.to(dev)
        self.config = config
        self.sm_scale = MLA.sm_scale if sm_scale is None else float(sm_scale)
        total_q, H = int(prepared.q.shape[0]), MLA.num_heads
        n_part = max(1, plan.n_partial_rows)
        self.out = torch.empty((total_q, H, MLA.v_dim), dtype=out_dtype, device=dev)
        self.lse = torch.empty((total_q, H), dtype=torch.float32, device=dev)
        #: the sm_90 stage 1 stores its fp32 partials head-minor, (rows, 512, 16), straight from the wgmma accumulator
        #: (the portable one head-major, (rows, 16, 512)); the reduce reads either
        self.part_head_minor = self.kernel == "hopper"
        shape = (n_part, MLA.v_dim, H) if self.part_head_minor else (n_part, H, MLA.v_dim)
        self.n_cu = int(plan.work_indptr.numel() - 1)
        self.n_tiles = int(plan.reduce_indptr.numel() - 1)
        counts = (plan.reduce_indptr[1:] - plan.reduce_indptr[:-1]).cpu()
        #: fp16 partials (`KernelConfig.hopper_partials`, sm_90 only) hold V in units of its fp8 codes
        fp16 = config.hopper_partials == "fp16" or (
            config.hopper_partials == "auto" and prepared.precision is not Precision.BF16
            and not config.hopper_merge_splits and config.hopper_warpgroups == 1 and config.hopper_block == 64
        )  # fmt: skip
        part_dtype = torch.float16 if self.part_head_minor and fp16 else torch.float32
        self.part_o = torch.empty(shape, dtype=part_dtype, device=dev)
        self.part_lse = torch.empty((n_part, H), dtype=torch.float32, device=dev)
        # partials read per block load in the reduce: all of a tile's, up to 32. Each program merges a value slice
        # of BLOCK_DV dims x 16 heads: one warp of 32-64 fp32 per thread when a tile has >= 16 partials, else two
        # warps of 16 (scripts/reduce_sweep.py, H200: 4 x 1024 took 6.7 us this way against 8.8 with 4 warps of 64)
        self.reduce_block_p = min(32, triton.next_power_of_2(max(2, int(counts.max()) if self.n_tiles else 1)))
        self.reduce_block_dv = max(4, 64 // self.reduce_block_p)
        self.reduce_warps = 1 if self.reduce_block_p >= 16 else 2
        #: the Gluon reduce's launch shape (`KernelConfig.hopper_reduce`; None: the Triton reduce runs)
        self.gluon_reduce: dict[str, int] | None = None
        if self.kernel == "hopper" and (config.hopper_reduce == "gluon" or (
                config.hopper_reduce == "auto" and part_dtype == torch.float16)):  # fmt: skip
            from . import gluon_reduce

            self.gluon_reduce = gluon_reduce.launch_shape(max(1, int(counts.max()) if self.n_tiles else 1))
            # (kernel and value-slice count resolved once here, not on every call)
            self._gluon_reduce_kernel = gluon_reduce.reduce_kernel
            self._gluon_reduce_slices = MLA.v_dim // (self.gluon_reduce["DPT"] * 8 // self.gluon_reduce["LP"])
        #: the reduce tiles with >= 2 partials: the reduce's grid (none: no reduce launch at all)
        self.split_tiles = torch.nonzero(counts >= 2).flatten().to(device=dev, dtype=torch.int32)
        #: the reduce is a programmatic dependent launch of the Hopper stage 1 (its launch overlaps stage 1)
        self.use_pdl = self.kernel == "hopper" and config.pdl and K.gdc_wait is not None
        self.pdl_chain = self.use_pdl and config.pdl_chain
        if self.kernel == "hopper":
            from . import gluon_hopper

            t_indptr, t_rows = hopper_tiles(prepared, plan.work_indptr, self.work_info, self.block)
            most_tiles = int(t_indptr.diff().max()) if t_indptr.numel() > 1 else 0
            #: which sm_90 kernel runs (`HOPPER_VARIANTS`); "auto" picks by the plan's longest tile stream
            self.hopper_variant = config.hopper_variant
            if self.hopper_variant == "auto":
                # (a ring deeper than vt-smem holds: v-regs, even for a plan without tiles)
                deep = stages > HOPPER_MAX_STAGES["vt-smem"]
                wide = config.hopper_block == 128 or config.hopper_warpgroups == 2
                self.hopper_variant = "v-regs" if most_tiles >= HOPPER_LONG_STREAM or deep or wide else "vt-smem"
            #: tiles of the ring issued at the start (`KernelConfig.hopper_first_burst`; = the stages: all of them)
            self.first_burst = first_burst(config, most_tiles, stages)
            if stages > HOPPER_MAX_STAGES[self.hopper_variant]:
                raise ValueError(f"hopper_stages={stages}: the {self.hopper_variant} path holds at most "
                                 f"{HOPPER_MAX_STAGES[self.hopper_variant]} tiles in shared memory")  # fmt: skip
            self.G = gluon_hopper
            self.tile_indptr, self.tile_rows = t_indptr.to(dev), t_rows.to(dev)
            self.cta_info = hopper_cta_info(plan.work_indptr, t_indptr, t_rows, self.work_info).to(dev)
            self._descs: dict[tuple[int, int], tuple] = {}
            # requests merged inside stage 1 by their last CTA (`hopper_merge_splits`): their works' merge rows, one
            # arrival counter each, and the reduce's grid without them
            merge, tiles = hopper_merge_info(plan, self.work_info, config.hopper_merge_splits)
            self.merge_max = triton.next_power_of_2(int(merge[:, 1].max())) if tiles else 0
            self.merge_info = merge.to(dev)
            self.merge_counters = torch.zeros(max(1, len(tiles)), dtype=torch.int32, device=dev)
            if tiles:
                merged = torch.zeros(self.n_tiles, dtype=torch.bool)
                merged[tiles] = True
                keep = (counts >= 2) & ~merged
                self.split_tiles = torch.nonzero(keep).flatten().to(device=dev, dtype=torch.int32)
            self._launch_kw = self._hopper_launch_kw()

    def _hopper_launch_kw(self) -> dict[str, Any]:
        """The sm_90 stage 1's compile-time arguments and launch options, fixed per decoder (built once, not per
        call; ``TIMELINE`` is added per launch of the one-warpgroup kernel)."""
        p, c = self.p, self.config
        kw: dict[str, Any] = dict(H=MLA.num_heads, NQ=MLA.num_heads, D_NOPE=MLA.v_dim, D_ROPE=MLA.rope_dim,
                                  BLOCK_N=self.block, MASK_TAIL=not (p.contiguous and p.page_size == 1),
                                  LAUNCH_DEPENDENTS=self.use_pdl, WAIT_PRIOR=self.pdl_chain,
                                  INFO_COLS=HOPPER_INFO_COLS, REPORT=False)  # fmt: skip
        if self.pdl_chain:
            kw["launch_pdl"] = True
        if c.hopper_warpgroups == 2:
            from . import gluon_hopper_2wg

            self.G2 = gluon_hopper_2wg
            return dict(kw, RING=self.stages, WORKER_REGS=HOPPER_2WG_WORKER_REGS, num_warps=4)
        return dict(kw, NUM_STAGES=self.stages, V_IN_REGS=self.hopper_variant == "v-regs",
                    V_FROM_K=self.hopper_variant in ("v-tile", "v-conv"), KV_CONVERT=self.hopper_variant == "v-conv",
                    ABLATE=HOPPER_ABLATIONS[c.hopper_ablate], REFILL_AFTER_PV=c.hopper_refill_after_pv,
                    Q_FIRST=c.hopper_q_first, FIRST_BURST=self.first_burst,
                    WARP_XCHG=c.hopper_warp_exchange, MERGE_MAX=self.merge_max, num_warps=self.block // 16)  # fmt: skip

    @property
    def ran(self) -> str:
        """The stage-1 kernel that runs: ``portable``, ``hopper:vt-smem`` or ``hopper:v-regs`` (``+ablate:qk`` etc.
        when an ablation skips compute: its outputs are wrong)."""
        name = self.kernel if self.hopper_variant is None else f"{self.kernel}:{self.hopper_variant}"
        if self.kernel == "hopper" and self.merge_max:
            name += f"+merge{self.config.hopper_merge_splits}"
        if self.kernel == "hopper" and self.config.hopper_block != 64:
            name += f"+block{self.config.hopper_block}"
        if self.kernel == "hopper" and self.config.hopper_warpgroups == 2:
            name += "+2wg"
        if self.part_o.dtype == torch.float16:
            name += "+fp16-partials"
        if self.gluon_reduce is not None:
            name += "+gluon-reduce"
        return name if self.config.hopper_ablate == "none" else f"{name}+ablate:{self.config.hopper_ablate}"

    def __call__(
        self, q: torch.Tensor | None = None, kv: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run on the prepared tensors, or on same-shaped `q` / `kv` (e.g. rotated copies for timing)."""
        p = self.p
        q = p.q if q is None else q
        kv = p.kv if kv is None else kv
        if self.kernel == "hopper":
            self._stage1_hopper(q, kv)
        else:
            self._stage1_portable(q, kv)
        self._reduce()
        return self.out, self.lse

    def _reduce(self) -> None:
        plan, H, DV = self.plan, MLA.num_heads, MLA.v_dim
        if self.split_tiles.numel() and self.gluon_reduce is not None:
            self._gluon_reduce_kernel[(self.split_tiles.numel(), self._gluon_reduce_slices)](
                self.part_o, self.part_lse, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map,
                self.split_tiles, self.out, self.lse, self.p.kv_scale, self.out.stride(0), self.out.stride(1),
                H=H, DV=DV, USE_PDL=self.use_pdl, CHAIN=self.pdl_chain, **self.gluon_reduce,
                **({"launch_pdl": True} if self.use_pdl else {}),
            )  # fmt: skip
        elif self.split_tiles.numel():
            pdl = {"launch_pdl": True} if self.use_pdl else {}
            self.K.reduce_kernel[(self.split_tiles.numel(), DV // self.reduce_block_dv)](
                self.part_o, self.part_lse, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map,
                self.split_tiles, self.out, self.lse, self.p.kv_scale, self.out.stride(0), self.out.stride(1),
                H=H, DV=DV, BLOCK_DV=self.reduce_block_dv, BLOCK_P=self.reduce_block_p, HEAD_MINOR=self.part_head_minor,
                USE_PDL=self.use_pdl, CHAIN=self.pdl_chain, num_warps=self.reduce_warps, **pdl,
            )  # fmt: skip

    def stage1_timeline(self, q: torch.Tensor | None = None, kv: torch.Tensor | None = None, *,
                        cold_l2: bool = True) -> CtaTimeline:  # fmt: skip
        """Run stage 1 once with per-CTA time stamps and return when each CTA did what (`timeline.CtaTimeline`).

        GPU and the sm_90 kernels only. Run the decoder a few times first: the first launch compiles. The reduce is
        not run (the timeline is stage 1's), so `out` holds only the unsplit requests (and those stage 1 merged itself,
        `hopper_merge_splits`) afterwards. `cold_l2`
        (default): read twice the L2 of other data first, so the KV comes from HBM as in the timed calls (which rotate KV
        copies past the L2); a repeated launch on the same small KV would otherwise read it from L2."""
        if self.kernel != "hopper":
            raise ValueError(f"the timeline is stamped by the sm_90 kernels only; this decoder runs {self.ran!r}"
                             + (f" ({self.hopper_reason})" if self.hopper_reason else ""))  # fmt: skip
        if self.config.hopper_warpgroups == 2:
            raise ValueError("hopper_warpgroups=2 has no time-line stamps (stage1_timeline runs hopper_warpgroups=1)")
        from . import gluon_hopper

        cols, most = gluon_hopper.TIMELINE_COLS.value, gluon_hopper.TIMELINE_MAX.value
        buf = torch.zeros((self.n_cu, cols), dtype=torch.int64, device=self.out.device)
        if cold_l2:
            from ..timing import L2_BYTES

            # read (not write: dirty lines would cost the kernel write-backs) twice the L2's worth of other data
            torch.empty(2 * L2_BYTES // 4, dtype=torch.float32, device=self.out.device).sum()
        self._stage1_hopper(self.p.q if q is None else q, self.p.kv if kv is None else kv, timeline=buf)
        stamps = buf.cpu().numpy()  # (waits for the launch)
        # the clock of this launch (its CTAs stamp cycles and the global timer); an idle spin's if all were too short
        ghz = None if launch_clock_ghz(stamps) is not None else measure_clock_ghz(self.out.device)
        return timeline_from_stamps(
            stamps, self.tile_indptr.diff().cpu().numpy(), self.plan.work_indptr.diff().cpu().numpy(),
            clock_ghz=ghz, kernel=self.ran, max_events=most, clock_source="idle-spin",
        )  # fmt: skip

    def _stage1_hopper(self, q: torch.Tensor, kv: torch.Tensor, timeline: torch.Tensor | None = None) -> None:
        if (q.dtype, q.shape, kv.dtype, kv.shape) != (self.p.q.dtype, self.p.q.shape, self.p.kv.dtype, self.p.kv.shape):
            raise ValueError("q / kv must have the prepared tensors' dtype and shape (TMA descriptors are cached)")
        if not (q.is_contiguous() and kv.is_contiguous()):
            raise ValueError("q / kv must be contiguous (their TMA descriptors assume the prepared strides)")
        key = (q.data_ptr(), kv.data_ptr())
        descs = self._descs.get(key)
        if descs is None:  # one set of TMA descriptors per (q, kv) buffer pair, e.g. per rotated KV copy
            if kv.shape[0] == 0:  # every request empty: no tile is read, but a TMA descriptor needs a non-empty box
                kv = torch.zeros((self.block, kv.shape[-1]), dtype=kv.dtype, device=kv.device)
                self._empty_kv = kv  # (kept alive with its descriptor)
            descs = self.G.make_descriptors(q.reshape(-1, q.shape[-1]), kv, MLA.num_heads, self.block)
            self._descs[key] = descs
        p = self.p
        if self.config.hopper_warpgroups == 2:  # (no time-line stamps: stage1_timeline refuses this path first)
            self.G2.stage1_kernel[(self.n_cu,)](
                *descs, self.cta_info, self.work_info, self.tile_rows, self.out, self.lse, self.part_o,
                self.part_lse, p.q_scale, p.kv_scale, self.sm_scale, **self._launch_kw,
            )  # fmt: skip
            return
        stamps = self.lse if timeline is None else timeline  # (any tensor when not stamping: never touched)
        self.G.stage1_kernel[(self.n_cu,)](
            *descs, self.cta_info, self.work_info, self.tile_rows, self.out, self.lse, self.part_o, self.part_lse,
            p.q_scale, p.kv_scale, self.sm_scale, stamps, self.merge_info, self.merge_counters,
            TIMELINE=timeline is not None, **self._launch_kw,
        )  # fmt: skip

    def _stage1_portable(self, q: torch.Tensor, kv: torch.Tensor) -> None:
        p, c, plan = self.p, self.config, self.plan
        H, DV = MLA.num_heads, MLA.v_dim
        self.K.stage1_kernel[(self.n_cu,)](
            q, kv, p.kv_indices, plan.work_indptr, self.work_info,
            self.out, self.lse, self.part_o, self.part_lse, p.q_scale, p.kv_scale, self.sm_scale,
            q.stride(0), q.stride(1), kv.stride(0), self.out.stride(0), self.out.stride(1),
            H=H, D_NOPE=DV, D_ROPE=MLA.rope_dim, BLOCK_N=c.block_n, PAGE_SIZE=p.page_size,
            QK_FP8=p.precision is Precision.A8W8, KV_FP8=p.precision is not Precision.BF16,
            PV_EXACT=self.pv_exact, TRANSPOSED=c.transposed,
            MMA_FP16=c.mma_fp16 and p.precision is Precision.A8W8, P_FP8=c.p_fp8,
            CONTIGUOUS=c.contiguous and p.contiguous, QK_TOKENS_M=c.qk_tokens_m and not self.pv_exact,
            D_CHUNK=c.d_chunk, CHUNK_PV=c.chunk_pv,
            num_warps=c.num_warps, num_stages=c.num_stages,
        )  # fmt: skip


def triton_decode(prepared: PreparedInputs, plan: WorkPlan, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode through the Triton kernels (see `TritonDecoder` for the keyword options)."""
    return TritonDecoder(prepared, plan, **kw)()


def naive_decode(prepared: PreparedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The readable version: fp64 reference attention on the dequantised codes (the kernel's target)."""
    q, kv = prepared.dequantized()
    return decode_reference(
        q,
        kv,
        prepared.qo_indptr.cpu(),
        prepared.kv_indptr.cpu(),
        prepared.kv_indices.cpu(),
        prepared.kv_last_page_len.cpu(),
        empty_policy="zeros",
    )


def main() -> None:
    """Demo: a tiny ragged, paged (permuted pages, one empty request) a8w8 decode under two planners, in Triton's
    CPU interpreter (set TRITON_INTERPRET=1) or on a GPU."""
    from ..config import DecodeCase
    from ..inputs import make_inputs

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    case = DecodeCase(kv_lens=(37, 130, 64, 0), seed=1, page_size=4, permute_pages=True)
    x = make_inputs(case)
    prep = prepare(x.to(dev), "a8w8")
    ref, ref_lse = naive_decode(prep)
    live = ref.norm(dim=-1) > 0
    for name, knobs in (("simple", {"block": 8}), ("balanced", {"kv_granularity": 4})):
        plan = make_plan(name, x.qo_indptr, x.kv_indptr, 8, page_size=4, kv_last_page_len=x.kv_last_page_len, **knobs)
        out, lse = triton_decode(prep, plan, config=KernelConfig(block_n=32), out_dtype=torch.float32)
        err = float((out.cpu().double() - ref)[live].norm() / ref[live].norm())
        dlse = float((lse.cpu().double() - ref_lse)[live.all(-1)].abs().max())
        print(f"{plan}: a8w8 Triton vs dequantised fp64 reference: rel-L2 {err:.2e}, max |dLSE| {dlse:.2e}")


if __name__ == "__main__":
    main()

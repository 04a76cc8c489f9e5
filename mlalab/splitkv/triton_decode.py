"""Persistent split-KV MLA decode in Triton: stage 1 executes a WorkPlan, a reduce merges the partials.

The problem (DeepSeek-R1 absorbed MLA, TP8): 16 query heads share ONE latent KV head of 576 dims whose first
512 dims are also the values. Per KV token a kernel must read 576 B (fp8) or 1152 B (bf16) and does
2·16·(576+512) FLOP, i.e. ~60 FLOP/B at fp8: far below the H200's ridge, so the decode is memory-bound and the
whole game is (1) read every KV byte exactly once, for all 16 heads together, and (2) keep enough loads in flight
on all 132 SMs. Everything below follows from that.

Stage 1 (``_stage1_kernel``) is *persistent*: the grid has one program per "CU slot" of the plan
(``work_indptr.numel() - 1``, e.g. 132 on the H200), and program ``c`` walks its works
``work_info[work_indptr[c]:work_indptr[c+1]]`` in order. A work row is
``[batch_idx, partial_qo_loc, qo_start, qo_end, kv_start, kv_end, kv_offset, pad]``; for each of its query rows
the program streams the KV range ``kv_start:kv_end`` (positions in ``kv_indices``) through an online softmax
and writes either the final bf16 output (``partial_qo_loc < 0``: the request was not split) or an fp32 partial
output plus its natural-log LSE at partial row ``partial_qo_loc + (i - qo_start)``.

Reduce (``_reduce_kernel``): for each reduce tile with >= 2 partials, ``o = Σ_i exp(L_i - M) O_i / Σ_i exp(L_i - M)``
with ``M = max_i L_i`` (natural log), cast to the output dtype; tiles with one partial are skipped (the
stage-1 work already wrote the output), exactly aiter's ``mla_reduce_v1`` contract. The partials are read (P, H, DV) as the
portable stage 1 writes them, or (P, DV, H) (``HEAD_MINOR``) as the sm_90 one does.

Precision variants (the dtype of q and of the KV buffer decide; scales are per tensor):

* ``bf16``:  bf16 q · bf16 KV, bf16 tensor-core dots, fp32 accumulation.
* ``a16w8``: bf16 q · fp8 KV; K/V codes are widened to bf16 in registers (exact), the scale is folded into the
  softmax scale (for QK) and into the final normalisation (for PV), so no per-element multiply is needed.
* ``a8w8``:  fp8 q · fp8 KV (the competition reference's numerics). ``MMA_FP16`` (default): the fp8 codes are
  widened to fp16 (exact; one cvt per pair on sm89+) and both dots run as fp16 mma with fp32 accumulation;
  P = exp(S - m) ∈ (0, 1] is rounded through the KV's fp8 type first (``P_FP8``, aiter's numerics). Measured on
  the H200 (Triton 3.6): ~8 % faster than fp8 operands, because Triton's sm90 mma.sync path upcasts fp8 to fp16
  anyway and fp16 V is read with ldmatrix; the rest of the time goes to shared-memory→register traffic
  of the 8-bit tiles and one 8-warp CTA per SM (255 registers), not to bytes.
* ``D_CHUNK`` (heads-major, off by default): the 512 latent dims in chunks of 128 / 256 (see `_row_chunked`).
  Compiled for sm_90 it cuts registers only at 8 warps (197 at D_CHUNK 256, no spill); at 4 warps every variant
  still sits at 255 (the 16-row mma.sync A operand and the unrolled chunks stay live), so no 2-CTA occupancy.
  Measured on the H200 (data/timings/h200_2026-12-02_sweep_dchunk.csv): geomean within 1 % of the default at
  best (D_CHUNK 256, 3 stages), 5 % faster only at B128xL8192 with 4 warps x 264 slots, slower elsewhere.

The fp8 *flavour* is whatever the tensors carry (e4m3fn on NVIDIA, e4m3fnuz on AMD through Triton-ROCm): the
kernel only ever casts "to the KV's element type", it never names a flavour.

Two orientations of the same math (constexpr ``TRANSPOSED``):

* heads-major: ``S = Q·Kᵀ`` is (16, BLOCK_N); the MMA's M dimension is the 16 heads. Hopper's wgmma needs
  M = 64 per warpgroup, so Triton falls back to mma.sync tiles for M = 16.
* tokens-major (FlashMLA-ETAP's trick): ``Sᵀ = K·Qᵀ`` is (BLOCK_N, 16) and ``Oᵀ = Vᵀ·Pᵀ`` is (512, 16); the KV
  tokens / value dims are the M dimension, so 16 heads never pad a 64-row tile.

Page size 1 (``kv_indices`` are token rows) and paged layouts (``PAGE_SIZE`` > 1: positions are *token*
positions in the page-expanded list, token ``p`` lives at row ``kv_indices[p // PAGE_SIZE]·PAGE_SIZE + p % PAGE_SIZE``)
are both gathers: the row index is computed per token, so a scattered page-size-1 cache costs the same bytes.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

try:  # programmatic dependent launch (sm_90+): the reduce waits for stage 1's writes
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without it: the reduce is then launched plainly (USE_PDL False)
    gdc_wait = gdc_launch_dependents = None

__all__ = ["stage1_kernel", "reduce_kernel", "INTERPRET", "HEAD_MINOR_COLUMN"]

#: fp16 head-minor partials (the sm_90 stage 1 with `KernelConfig.hopper_partials` "fp16") keep head ``h`` at column
#: ``HEAD_MINOR_COLUMN[h]`` of their (rows, 512, 16) rows and of their LSE rows (h = 8j + 2i + b -> 4i + 2j + b): the 4
#: heads one thread of the wgmma accumulator holds side by side, so that stage 1 stores whole 32-byte sectors.
HEAD_MINOR_COLUMN = tuple(4 * ((h >> 1) & 3) + 2 * (h >> 3) + (h & 1) for h in range(16))

#: True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``): the interpreter computes bf16
#: ``tl.dot`` wrongly (see research/triton_interpreter.md), so the launcher upcasts bf16 dots to fp32 there.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _kv_rows(KV_INDICES, pos, mask, PAGE_SIZE: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """Physical token rows of logical positions ``pos`` (a gather through the page table).

    ``CONTIGUOUS``: the host checked once (at prepare time) that the page table is the identity, so position ``p``
    IS row ``p``: no index load, and the KV tile is a plain strided block Triton can vectorise and pipeline."""
    if CONTIGUOUS:
        rows = pos
    elif PAGE_SIZE == 1:
        rows = tl.load(KV_INDICES + pos, mask=mask, other=0)
    else:
        page = tl.load(KV_INDICES + pos // PAGE_SIZE, mask=mask, other=0)
        rows = page * PAGE_SIZE + pos % PAGE_SIZE
    # int64: a 128 x 8192 x 576 fp8 cache is 604 MB, bf16 1.2 GB; row * stride can pass 2^31.
    return rows.to(tl.int64)


@triton.jit
def _p_fp16(p, fp8_ty: tl.constexpr, P_FP8: tl.constexpr):
    """P ∈ (0, 1] as an fp16 PV operand; with ``P_FP8`` first rounded to the KV's fp8 type (exact in fp16)."""
    if P_FP8:
        return p.to(fp8_ty).to(tl.float16)
    return p.to(tl.float16)


@triton.jit
def _widen(x, PV_EXACT: tl.constexpr, MMA_FP16: tl.constexpr, TO_BF16: tl.constexpr):
    """The dot operand of loaded codes: fp32 (exact mode), fp16 (a8w8 fp16-operand path; exact for e4m3),
    bf16 (``TO_BF16``: a16w8 K/V codes or bf16 q), or as loaded (fp8 · fp8, bf16 · bf16)."""
    # One return statement: Triton type-checks every return of a function, even in a constexpr branch not taken.
    y = x
    if PV_EXACT:
        y = x.to(tl.float32)
    elif MMA_FP16:
        y = x.to(tl.float16)
    elif TO_BF16:
        y = x.to(tl.bfloat16)
    return y


@triton.jit
def _dot(a, b, acc, PV_EXACT: tl.constexpr):
    if PV_EXACT:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _pv_chunk(
    acc, p_op, KV, rows, mask, offs_c, stride_kv, PV_EXACT: tl.constexpr, MMA_FP16: tl.constexpr, TO_BF16: tl.constexpr
):
    """acc += P · V_c for one D-chunk of the values. V_c is the K chunk the scores just read, loaded again: it
    comes from L2 (the tile was read moments ago), so HBM traffic is unchanged while no K chunk stays live."""
    v = tl.load(KV + rows[:, None] * stride_kv + offs_c[None, :], mask=mask[:, None], other=0.0)
    return _dot(p_op, _widen(v, PV_EXACT, MMA_FP16, TO_BF16), acc, PV_EXACT)


@triton.jit
def _store_o(
    o,
    lse,
    d_off,
    qi,
    qo_start,
    partial_loc,
    OUT,
    OUT_LSE,
    PART_O,
    PART_LSE,
    stride_ot,
    stride_oh,
    H: tl.constexpr,
    D_NOPE: tl.constexpr,
):
    """Write one (H, chunk) slice of a row's output: final (not split) or fp32 partial + LSE."""
    offs_h = tl.arange(0, H)
    if partial_loc < 0:
        tl.store(OUT + qi * stride_ot + offs_h[:, None] * stride_oh + d_off[None, :], o.to(OUT.dtype.element_ty))
        tl.store(OUT_LSE + qi * H + offs_h, lse)
    else:
        row = (partial_loc + qi - qo_start).to(tl.int64)
        tl.store(PART_O + row * (H * D_NOPE) + offs_h[:, None] * D_NOPE + d_off[None, :], o)
        tl.store(PART_LSE + row * H + offs_h, lse)


@triton.jit
def _online_softmax_step(s, m_i, l_i, mask, qk_scale, HEADS_AXIS: tl.constexpr):
    """One KV tile of the online softmax, in base 2: scale the raw scores, mask the padded tokens, update the
    running max `m` and sum `l`. Returns ``(p, alpha, m_new, l_new)``; the caller rescales its accumulator by
    `alpha`. HEADS_AXIS is where the 16 heads sit in `s`: 0 for heads-major (H, BLOCK_N), 1 for tokens-major."""
    s = s * qk_scale
    if HEADS_AXIS == 0:
        s = tl.where(mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        p_sum = tl.sum(p, 1)
    else:
        s = tl.where(mask[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.math.exp2(s - m_new[None, :])
        p_sum = tl.sum(p, 0)
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + p_sum


@triton.jit
def _row_chunked(
    q_ptr, KV, KV_INDICES, OUT, OUT_LSE, PART_O, PART_LSE, qi, qo_start, partial_loc, kv_start, kv_end,
    qk_scale, v_scale, stride_qh, stride_kv, stride_ot, stride_oh,
    H: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    QK_FP8: tl.constexpr, KV_FP8: tl.constexpr, PV_EXACT: tl.constexpr, MMA_FP16: tl.constexpr,
    P_FP8: tl.constexpr, CONTIGUOUS: tl.constexpr, D_CHUNK: tl.constexpr, CHUNK_PV: tl.constexpr,
):  # fmt: skip
    """One query row, heads-major, with the 512 latent dims streamed in D-chunks (``D_CHUNK`` = 128 or 256).

    Why: the full-width path keeps the whole (BLOCK_N, 576) K tile widened to fp16, q (16, 576) and acc (16, 512)
    live at once: 255 registers at 8 warps, one CTA per SM, nothing to hide latency. Here only one
    (BLOCK_N, D_CHUNK) K chunk is live: S = Σ_c Q_c·K_cᵀ (+ RoPE), then acc_c += P·V_c with V_c re-loaded (an
    L2 hit: same HBM bytes). q chunks are re-loaded each tile too (16 x 576 B, L1-resident).
    ``CHUNK_PV``: one (16, D_CHUNK) fp32 accumulator per chunk; otherwise one (16, 512) acc and a full V load."""
    NC: tl.constexpr = D_NOPE // D_CHUNK
    TO_BF16_Q: tl.constexpr = not QK_FP8  # bf16 q (a16w8, bf16): a no-op cast
    TO_BF16_K: tl.constexpr = KV_FP8 and not QK_FP8  # a16w8: widen the K/V codes (exact)
    offs_h = tl.arange(0, H)
    offs_r = tl.arange(0, D_ROPE)
    offs_n = tl.arange(0, BLOCK_N)
    q_rope = _widen(tl.load(q_ptr + offs_h[:, None] * stride_qh + D_NOPE + offs_r[None, :]), PV_EXACT, MMA_FP16,
                    TO_BF16_Q)  # fmt: skip
    m_i = tl.full([H], float("-inf"), tl.float32)
    l_i = tl.zeros([H], tl.float32)
    acc = tl.zeros([H, D_NOPE], tl.float32)  # CHUNK_PV False
    acc0 = tl.zeros([H, D_CHUNK], tl.float32)  # CHUNK_PV: chunk c of the output in acc<c>
    acc1 = tl.zeros([H, D_CHUNK], tl.float32)
    acc2 = tl.zeros([H, D_CHUNK], tl.float32)
    acc3 = tl.zeros([H, D_CHUNK], tl.float32)
    for start in range(kv_start, kv_end, BLOCK_N):
        pos = start + offs_n
        mask = pos < kv_end
        rows = _kv_rows(KV_INDICES, pos, mask, PAGE_SIZE, CONTIGUOUS)
        k_r = tl.load(KV + rows[:, None] * stride_kv + D_NOPE + offs_r[None, :], mask=mask[:, None], other=0.0)
        s = _dot(q_rope, tl.trans(_widen(k_r, PV_EXACT, MMA_FP16, TO_BF16_K)), tl.zeros([H, BLOCK_N], tl.float32),
                 PV_EXACT)  # fmt: skip
        for c in tl.static_range(NC):
            offs_c = c * D_CHUNK + tl.arange(0, D_CHUNK)
            q_c = _widen(tl.load(q_ptr + offs_h[:, None] * stride_qh + offs_c[None, :]), PV_EXACT, MMA_FP16, TO_BF16_Q)
            k_c = tl.load(KV + rows[:, None] * stride_kv + offs_c[None, :], mask=mask[:, None], other=0.0)
            s = _dot(q_c, tl.trans(_widen(k_c, PV_EXACT, MMA_FP16, TO_BF16_K)), s, PV_EXACT)
        p, alpha, m_i, l_i = _online_softmax_step(s, m_i, l_i, mask, qk_scale, 0)  # s: (H, BLOCK_N)
        if PV_EXACT:
            p_op = p
        elif MMA_FP16:
            p_op = _p_fp16(p, KV.dtype.element_ty, P_FP8)
        elif KV_FP8 and QK_FP8:
            p_op = p.to(KV.dtype.element_ty)
        else:
            p_op = p.to(tl.bfloat16)
        if CHUNK_PV:
            acc0 = _pv_chunk(acc0 * alpha[:, None], p_op, KV, rows, mask, tl.arange(0, D_CHUNK), stride_kv,
                             PV_EXACT, MMA_FP16, TO_BF16_K)  # fmt: skip
            acc1 = _pv_chunk(acc1 * alpha[:, None], p_op, KV, rows, mask, D_CHUNK + tl.arange(0, D_CHUNK), stride_kv,
                             PV_EXACT, MMA_FP16, TO_BF16_K)  # fmt: skip
            if NC == 4:
                acc2 = _pv_chunk(acc2 * alpha[:, None], p_op, KV, rows, mask, 2 * D_CHUNK + tl.arange(0, D_CHUNK),
                                 stride_kv, PV_EXACT, MMA_FP16, TO_BF16_K)  # fmt: skip
                acc3 = _pv_chunk(acc3 * alpha[:, None], p_op, KV, rows, mask, 3 * D_CHUNK + tl.arange(0, D_CHUNK),
                                 stride_kv, PV_EXACT, MMA_FP16, TO_BF16_K)  # fmt: skip
        else:
            acc = _pv_chunk(acc * alpha[:, None], p_op, KV, rows, mask, tl.arange(0, D_NOPE), stride_kv, PV_EXACT,
                            MMA_FP16, TO_BF16_K)  # fmt: skip

    # An empty range gives l = 0: output 0 and LSE -inf, the identity of the merge.
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    lse = tl.where(has, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    norm = (v_scale / l_safe)[:, None]
    if CHUNK_PV:
        _store_o(acc0 * norm, lse, tl.arange(0, D_CHUNK), qi, qo_start, partial_loc, OUT, OUT_LSE, PART_O, PART_LSE,
                 stride_ot, stride_oh, H, D_NOPE)  # fmt: skip
        _store_o(acc1 * norm, lse, D_CHUNK + tl.arange(0, D_CHUNK), qi, qo_start, partial_loc, OUT, OUT_LSE, PART_O,
                 PART_LSE, stride_ot, stride_oh, H, D_NOPE)  # fmt: skip
        if NC == 4:
            _store_o(acc2 * norm, lse, 2 * D_CHUNK + tl.arange(0, D_CHUNK), qi, qo_start, partial_loc, OUT, OUT_LSE,
                     PART_O, PART_LSE, stride_ot, stride_oh, H, D_NOPE)  # fmt: skip
            _store_o(acc3 * norm, lse, 3 * D_CHUNK + tl.arange(0, D_CHUNK), qi, qo_start, partial_loc, OUT, OUT_LSE,
                     PART_O, PART_LSE, stride_ot, stride_oh, H, D_NOPE)  # fmt: skip
    else:
        _store_o(acc * norm, lse, tl.arange(0, D_NOPE), qi, qo_start, partial_loc, OUT, OUT_LSE, PART_O, PART_LSE,
                 stride_ot, stride_oh, H, D_NOPE)  # fmt: skip


@triton.jit
def _stage1_kernel(
    Q,  # (total_q, H, 576) bf16 or fp8 codes
    KV,  # (rows, 576) bf16 or fp8 codes: rows = num_pages * page_size
    KV_INDICES,  # int32 page ids (token rows when PAGE_SIZE == 1)
    WORK_INDPTR,  # (n_cu + 1,) int32
    WORK_INFO,  # (n_work, 8) int32
    OUT,  # (total_q, H, 512) output (bf16, or fp32 for exactness tests)
    OUT_LSE,  # (total_q, H) fp32
    PART_O,  # (n_partial_rows, H, 512) fp32
    PART_LSE,  # (n_partial_rows, H) fp32
    Q_SCALE,  # (1,) fp32 dequantisation scale of q (1.0 for bf16)
    KV_SCALE,  # (1,) fp32 dequantisation scale of the KV (1.0 for bf16)
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kv,
    stride_ot,
    stride_oh,
    H: tl.constexpr,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    QK_FP8: tl.constexpr,  # q and K both fp8: the QK dot runs on fp8 operands
    KV_FP8: tl.constexpr,  # K/V are fp8 codes
    PV_EXACT: tl.constexpr,  # PV (and QK) in fp32 "ieee": kernel error only from accumulation (tests)
    TRANSPOSED: tl.constexpr,
    MMA_FP16: tl.constexpr,  # a8w8 only: widen the fp8 codes of q and KV to fp16 and run both dots in fp16
    P_FP8: tl.constexpr,  # with MMA_FP16: round P through the KV's fp8 type first (aiter's a8w8 numerics)
    CONTIGUOUS: tl.constexpr,  # kv_indices is the identity: rows are positions (no gather)
    QK_TOKENS_M: tl.constexpr,  # heads-major PV, but QK computed as Sᵀ = K·Qᵀ (tokens as the MMA's M)
    D_CHUNK: tl.constexpr = 0,  # heads-major only: > 0 streams the 512 dims in chunks of D_CHUNK (128 or 256)
    CHUNK_PV: tl.constexpr = True,  # with D_CHUNK: PV per chunk into D_NOPE // D_CHUNK accumulators (else one)
):
    pid = tl.program_id(0)
    w_begin = tl.load(WORK_INDPTR + pid)
    w_end = tl.load(WORK_INDPTR + pid + 1)

    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    offs_n = tl.arange(0, BLOCK_N)
    # Fold every scalar factor of the scores into one multiply, in base 2 (exp2 is the native instruction):
    # S·log2(e) = (q_codes·k_codes) · sm_scale · q_scale · kv_scale · log2(e).
    qk_scale = sm_scale * tl.load(Q_SCALE) * tl.load(KV_SCALE) * 1.4426950408889634
    v_scale = tl.load(KV_SCALE)

    for w in range(w_begin, w_end):
        info = WORK_INFO + w * 8
        partial_loc = tl.load(info + 1)
        qo_start = tl.load(info + 2)
        qo_end = tl.load(info + 3)
        kv_start = tl.load(info + 4)
        kv_end = tl.load(info + 5)
        # q_len > 1 (speculative decode) re-streams the KV range per query row: simple, and decode is q_len 1.
        for qi in range(qo_start, qo_end):
            q_ptr = Q + qi * stride_qt
            if D_CHUNK > 0:
                _row_chunked(
                    q_ptr, KV, KV_INDICES, OUT, OUT_LSE, PART_O, PART_LSE, qi, qo_start, partial_loc, kv_start,
                    kv_end, qk_scale, v_scale, stride_qh, stride_kv, stride_ot, stride_oh, H, D_NOPE, D_ROPE, BLOCK_N,
                    PAGE_SIZE, QK_FP8, KV_FP8, PV_EXACT, MMA_FP16, P_FP8, CONTIGUOUS, D_CHUNK, CHUNK_PV,
                )  # fmt: skip
            else:
                if TRANSPOSED:
                    # (D, H) views of q: the B operand of Sᵀ = K·Qᵀ, reduction dim contiguous ("K-major").
                    q_nope = tl.load(q_ptr + offs_h[None, :] * stride_qh + offs_d[:, None])
                    q_rope = tl.load(q_ptr + offs_h[None, :] * stride_qh + D_NOPE + offs_r[:, None])
                    m_i = tl.full([H], float("-inf"), tl.float32)
                    l_i = tl.zeros([H], tl.float32)
                    acc = tl.zeros([D_NOPE, H], tl.float32)
                else:
                    q_nope = tl.load(q_ptr + offs_h[:, None] * stride_qh + offs_d[None, :])
                    q_rope = tl.load(q_ptr + offs_h[:, None] * stride_qh + D_NOPE + offs_r[None, :])
                    m_i = tl.full([H], float("-inf"), tl.float32)
                    l_i = tl.zeros([H], tl.float32)
                    acc = tl.zeros([H, D_NOPE], tl.float32)
                if PV_EXACT:
                    q_nope = q_nope.to(tl.float32)
                    q_rope = q_rope.to(tl.float32)
                elif MMA_FP16:
                    q_nope = q_nope.to(tl.float16)  # e4m3 codes are exact in fp16: one cvt per pair on sm89+
                    q_rope = q_rope.to(tl.float16)
                elif not QK_FP8:
                    q_nope = q_nope.to(tl.bfloat16)
                    q_rope = q_rope.to(tl.bfloat16)

                for start in range(kv_start, kv_end, BLOCK_N):
                    pos = start + offs_n
                    mask = pos < kv_end
                    rows = _kv_rows(KV_INDICES, pos, mask, PAGE_SIZE, CONTIGUOUS)
                    # One gather of the 576-dim rows, used as K (all 576) and V (first 512): each byte read once.
                    k_nope = tl.load(KV + rows[:, None] * stride_kv + offs_d[None, :], mask=mask[:, None], other=0.0)
                    k_rope = tl.load(
                        KV + rows[:, None] * stride_kv + D_NOPE + offs_r[None, :], mask=mask[:, None], other=0.0
                    )
                    if PV_EXACT:
                        kq_nope = k_nope.to(tl.float32)
                        kq_rope = k_rope.to(tl.float32)
                    elif MMA_FP16:
                        kq_nope = k_nope.to(tl.float16)  # exact; used as K (QK) and as V (PV): no fp8 transpose
                        kq_rope = k_rope.to(tl.float16)
                    elif KV_FP8 and not QK_FP8:
                        kq_nope = k_nope.to(tl.bfloat16)  # a16w8: widen the codes (exact); the scale is in qk_scale
                        kq_rope = k_rope.to(tl.bfloat16)
                    else:
                        kq_nope = k_nope
                        kq_rope = k_rope

                    if TRANSPOSED:
                        if PV_EXACT:
                            s = tl.dot(kq_nope, q_nope, input_precision="ieee")
                            s = tl.dot(kq_rope, q_rope, s, input_precision="ieee")
                        else:
                            s = tl.dot(kq_nope, q_nope)
                            s = tl.dot(kq_rope, q_rope, s)
                        p, alpha, m_new, l_i = _online_softmax_step(s, m_i, l_i, mask, qk_scale, 1)  # (BLOCK_N, H)
                        acc = acc * alpha[None, :]
                        if PV_EXACT:
                            acc = tl.dot(tl.trans(k_nope.to(tl.float32)), p, acc, input_precision="ieee")
                        elif MMA_FP16:
                            acc = tl.dot(tl.trans(kq_nope), _p_fp16(p, k_nope.dtype, P_FP8), acc)
                        elif KV_FP8 and QK_FP8:
                            acc = tl.dot(tl.trans(k_nope), p.to(k_nope.dtype), acc)
                        else:
                            acc = tl.dot(tl.trans(kq_nope), p.to(tl.bfloat16), acc)
                    else:
                        if PV_EXACT:
                            s = tl.dot(q_nope, tl.trans(kq_nope), input_precision="ieee")
                            s = tl.dot(q_rope, tl.trans(kq_rope), s, input_precision="ieee")
                        elif QK_TOKENS_M:
                            # Sᵀ = K·Qᵀ: the K tile is the A operand as stored (no transpose), so K and V are read
                            # from ONE shared-memory tile and the load can be software-pipelined; only the small
                            # (BLOCK_N, 16) score tile is transposed.
                            s = tl.dot(kq_nope, tl.trans(q_nope))
                            s = tl.trans(tl.dot(kq_rope, tl.trans(q_rope), s))
                        else:
                            s = tl.dot(q_nope, tl.trans(kq_nope))
                            s = tl.dot(q_rope, tl.trans(kq_rope), s)
                        p, alpha, m_new, l_i = _online_softmax_step(s, m_i, l_i, mask, qk_scale, 0)  # (H, BLOCK_N)
                        acc = acc * alpha[:, None]
                        if PV_EXACT:
                            acc = tl.dot(p, k_nope.to(tl.float32), acc, input_precision="ieee")
                        elif MMA_FP16:
                            # fp16 mma: V (reduction dim not contiguous) is read with ldmatrix.trans, unlike fp8.
                            acc = tl.dot(_p_fp16(p, k_nope.dtype, P_FP8), kq_nope, acc)
                        elif KV_FP8 and QK_FP8:
                            # a8w8: P ∈ (0, 1] rounded to the KV's fp8 type, PV on fp8 tensor cores (aiter's numerics).
                            acc = tl.dot(p.to(k_nope.dtype), k_nope, acc)
                        else:
                            acc = tl.dot(p.to(tl.bfloat16), kq_nope, acc)
                    m_i = m_new

                # An empty range (kv_start == kv_end) gives l = 0: output 0 and LSE -inf, the identity of the merge.
                has = l_i > 0.0
                l_safe = tl.where(has, l_i, 1.0)
                lse = tl.where(has, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
                if TRANSPOSED:
                    o = acc * (v_scale / l_safe)[None, :]
                    d_off = offs_d[:, None]
                    h_off = offs_h[None, :]
                else:
                    o = acc * (v_scale / l_safe)[:, None]
                    d_off = offs_d[None, :]
                    h_off = offs_h[:, None]
                if partial_loc < 0:
                    o_ptr = OUT + qi * stride_ot + h_off * stride_oh + d_off
                    tl.store(o_ptr, o.to(OUT.dtype.element_ty))
                    tl.store(OUT_LSE + qi * H + offs_h, lse)
                else:
                    row = (partial_loc + qi - qo_start).to(tl.int64)
                    tl.store(PART_O + row * (H * D_NOPE) + h_off * D_NOPE + d_off, o)
                    tl.store(PART_LSE + row * H + offs_h, lse)


@triton.jit
def _reduce_kernel(
    PART_O,  # partial outputs: (P, H, DV), or (P, DV, H) with HEAD_MINOR (the sm_90 stage 1's layout); fp32, or
    # fp16 holding V in units of its fp8 codes (`KernelConfig.hopper_partials`), scaled here by V_SCALE, head-minor
    # with the heads (and their LSEs) in the columns `HEAD_MINOR_COLUMN`
    PART_LSE,  # (P, H) fp32
    REDUCE_INDPTR,  # (T + 1,) int32
    REDUCE_FINAL_MAP,  # (T, 2) int32: q rows [q_start, q_end) of tile t
    REDUCE_PARTIAL_MAP,  # (P_tiles,) int32: first partial row of each partial
    SPLIT_TILES,  # (n,) int32: the tiles with >= 2 partials, the only ones with work (program 0 axis)
    OUT,
    OUT_LSE,
    V_SCALE,  # (1,) fp32: the KV's scale, applied to fp16 partials (unused with fp32 ones, which carry it)
    stride_ot,
    stride_oh,
    H: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HEAD_MINOR: tl.constexpr,
    USE_PDL: tl.constexpr,
    CHAIN: tl.constexpr,  # the next stage 1 is a programmatic dependent too: let it launch once we have waited
):
    # Grid (split tiles, DV // BLOCK_DV): a small batch has few tiles with many partials, so each (tile, value
    # slice) is its own program, all 16 heads together, and it reads BLOCK_P partials' slices in ONE block load
    # (their latencies overlap; the sum over partials stays inside each thread's registers). Tiles with one partial
    # (stage 1 wrote their output) get no program at all: the host lists the split ones once per plan.
    # Everything that comes from the plan (not from stage 1) is loaded BEFORE the PDL wait, so after it only one
    # round trip remains: each block's LSEs and partial outputs are loaded together and merged online.
    t = tl.load(SPLIT_TILES + tl.program_id(0))
    s = tl.load(REDUCE_INDPTR + t)
    n = tl.load(REDUCE_INDPTR + t + 1) - s
    q_start = tl.load(REDUCE_FINAL_MAP + 2 * t)
    q_end = tl.load(REDUCE_FINAL_MAP + 2 * t + 1)
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    offs_h = tl.arange(0, H)  # the merge runs over the partials' columns, head h at column h but for fp16 ones:
    if PART_O.dtype.element_ty == tl.float16:  # column c holds head 8j + 2i + b for c = 4i + 2j + b
        tl.static_assert(H == 16 and HEAD_MINOR, "fp16 partials: head-minor, 16 heads in HEAD_MINOR_COLUMN order")
        head = ((offs_h >> 2) << 1) | (offs_h & 1) | (((offs_h >> 1) & 1) << 3)
    else:
        head = offs_h
    # element (d, column h) of one partial row: where the chosen layout keeps it
    if HEAD_MINOR:
        offs_dh = offs_d[:, None] * H + offs_h[None, :]
    else:
        offs_dh = offs_h[None, :] * DV + offs_d[:, None]
    pm0 = offs_p < n
    prow0 = tl.load(REDUCE_PARTIAL_MAP + s + offs_p, mask=pm0, other=0)  # first block's partial rows (q row 0)
    if PART_O.dtype.element_ty == tl.float16:
        v_scale = tl.load(V_SCALE)
    else:
        v_scale = 1.0
    if USE_PDL:  # launched as a programmatic dependent of stage 1: wait until its writes are visible
        gdc_wait()
        if CHAIN:  # (the next stage 1 waits for this grid's completion before it writes anything)
            gdc_launch_dependents()
    for r in range(q_start, q_end):
        u = r - q_start
        m, acc, wsum = _merge_block(PART_O, PART_LSE, (prow0 + u).to(tl.int64), pm0, offs_h, offs_dh,
                                    tl.full([H], float("-inf"), tl.float32), tl.zeros([BLOCK_DV, H], tl.float32),
                                    tl.zeros([H], tl.float32), H, DV)  # fmt: skip
        for p0 in range(BLOCK_P, n, BLOCK_P):  # more than BLOCK_P partials: further blocks, same online merge
            pm = p0 + offs_p < n
            prow = (tl.load(REDUCE_PARTIAL_MAP + s + p0 + offs_p, mask=pm, other=0) + u).to(tl.int64)
            m, acc, wsum = _merge_block(PART_O, PART_LSE, prow, pm, offs_h, offs_dh, m, acc, wsum, H, DV)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w_safe = tl.where(wsum > 0.0, wsum, 1.0)
        o = (acc * (v_scale / w_safe)[None, :]).to(OUT.dtype.element_ty)
        tl.store(OUT + r * stride_ot + head[None, :] * stride_oh + offs_d[:, None], o)
        if tl.program_id(1) == 0:
            tl.store(OUT_LSE + r * H + head, tl.where(wsum > 0.0, m_safe + tl.log(w_safe), float("-inf")))


@triton.jit
def _merge_block(PART_O, PART_LSE, prow, pm, offs_h, offs_dh, m, acc, wsum, H: tl.constexpr, DV: tl.constexpr):
    """Fold one block of partials (rows `prow`, valid where `pm`) into the running per-head state (max LSE m,
    Σ w·o over a (BLOCK_DV, H) slice, Σ w), with the weights exp(L_i - m) <= 1 (no overflow). A head whose
    partials are all empty (-inf) keeps m = -inf and exactly 0 in acc and wsum."""
    lp = tl.load(PART_LSE + prow[:, None] * H + offs_h[None, :], mask=pm[:, None], other=float("-inf"))  # (P, H)
    o_p = tl.load(PART_O + prow[:, None, None] * (H * DV) + offs_dh[None, :, :], mask=pm[:, None, None], other=0.0)
    o_p = o_p.to(tl.float32)
    m_new = tl.maximum(m, tl.max(lp, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    # base 2: exp2 is one MUFU.EX2 (ex2.approx.ftz); tl.exp adds a range test and two predicated multiplies per
    # element for subnormal results, and this merge is a short chain of dependent instructions per warp. A masked
    # partial's LSE is -inf: weight 0
    log2e: tl.constexpr = 1.4426950408889634
    corr = tl.exp2((m - m_safe) * log2e)  # 0 while m is -inf
    wgt = tl.exp2(lp * log2e - (m_safe * log2e)[None, :])  # (P, H)
    acc = acc * corr[None, :] + tl.sum(wgt[:, None, :] * o_p, 0)
    wsum = wsum * corr + tl.sum(wgt, 0)
    return m_new, acc, wsum


stage1_kernel = _stage1_kernel
reduce_kernel = _reduce_kernel

"""The portable persistent split-KV MLA decode in Triton: stage 1 executes a WorkPlan, a reduce merges the partials.

Runs on any GPU Triton supports (and in Triton's CPU interpreter, ``TRITON_INTERPRET=1``), every precision, fp8
flavour (e4m3fn on NVIDIA, e4m3fnuz on AMD through Triton-ROCm: the kernel only ever casts "to the KV's element
type"), page layout and q_len. On the H200 the sm_90 kernel (`mlalab.kernels.sm90`) is the fast path; this one is
what the decoder falls back to, and says why (`Decoder.sm90_reason`).

The problem (DeepSeek-R1 absorbed MLA, TP8): 16 query heads share ONE latent KV head of 576 dims whose first 512 dims
are also the values. Per KV token a kernel reads 576 B (fp8) or 1152 B (bf16) and does 2·16·(576+512) FLOP: ~60
FLOP/B at fp8, far below a GPU's ridge, so the decode is memory-bound: read every KV byte once, for all 16 heads
together, and keep enough loads in flight on every SM.

Stage 1 (``_stage1_kernel``) is *persistent*: one program per plan slot (``work_indptr.numel() - 1``), program ``c``
walks its works ``work_info[work_indptr[c]:work_indptr[c+1]]`` in order. A work row is ``[batch_idx,
partial_qo_loc, qo_start, qo_end, kv_start, kv_end, kv_offset, pad]`` (token positions here: the decoder translates a
paged plan once); for each of its q rows the program streams the KV range through an online softmax (base 2) and
writes the final output (``partial_qo_loc < 0``: the request was not split) or an fp32 partial + natural-log LSE at
partial row ``partial_qo_loc + (i - qo_start)``. The 16 heads are the MMA's M dimension (heads-major).

Precisions (the dtypes of q and of the KV decide; scales are per tensor, folded into the softmax scale for QK and
into the final normalisation for PV):

* ``bf16``: bf16 q · bf16 KV, bf16 dots, fp32 accumulation.
* ``a16w8``: bf16 q · fp8 KV; the codes widened to bf16 in registers (exact).
* ``a8w8``: fp8 q · fp8 KV; the codes widened to fp16 (exact for e4m3) and both dots run as fp16 MMAs (Triton's
  mma.sync path widens fp8 anyway, and fp16 V is read with ldmatrix); P = exp(S - m) ∈ (0, 1] is rounded through
  the KV's fp8 type first when ``P_FP8`` (aiter's numerics, `KernelConfig.p_fp8`).
* ``a16w4-mxfp4`` / ``a16w4-nvfp4`` / ``a8w4-*`` (``KV_FP4``): the KV as packed E2M1 codes with block scales
  (`mlalab.kernels.fp4`), decoded in registers (`_fp4_values`: code -> value, times its block's E8M0 or E4M3 scale;
  exact in bf16, NVFP4's per-tensor scale is the KV scale); bf16 dots; with fp8 q its codes are widened to bf16
  (exact) and P is rounded through q's fp8 type when ``P_FP8``.
* ``PV_EXACT``: both dots on fp32 operands ("ieee"), so the only kernel error is fp32 accumulation (tests; and bf16
  dots in the interpreter, which computes them wrongly).

Reduce (``_reduce_kernel``): for each reduce tile with >= 2 partials, the LSE merge of docs/kernels.md (`_lse_merge`,
the name it has in every dialect), cast to the output dtype; tiles with one partial are skipped (stage 1 wrote their
output): aiter's ``mla_reduce_v1`` contract. It reads the partials (P, H, DV) as this stage 1 writes them, or
(P, DV, H) (``HEAD_MINOR``) as the sm_90 one writes fp32 partials.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

try:  # programmatic dependent launch (sm_90+): the reduce waits for stage 1's writes
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # a Triton without it: the reduce is then launched plainly (USE_PDL False)
    gdc_wait = None

__all__ = ["stage1_kernel", "reduce_kernel", "INTERPRET", "HEAD_MINOR_COLUMN", "block_n"]

#: fp16 head-minor partials (the sm_90 stage 1, fp8 KV) keep head ``h`` at column ``HEAD_MINOR_COLUMN[h]`` of their
#: (rows, 512, 16) rows and of their LSE rows (h = 8j + 2i + b -> 4i + 2j + b): the 4 heads one thread of the wgmma
#: accumulator holds side by side, so that stage 1 stores whole 32-byte sectors (`sm90.epilogue`).
HEAD_MINOR_COLUMN = tuple(4 * ((h >> 1) & 3) + 2 * (h >> 3) + (h & 1) for h in range(16))

#: True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``): the interpreter computes bf16
#: ``tl.dot`` wrongly, so the decoder upcasts bf16 dots to fp32 there.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: Launch shape of stage 1 on a GPU: 64-token tiles, 8 warps (4 spill the (16, 512) fp32 accumulator), 2 stages.
NUM_WARPS = 8
NUM_STAGES = 2


def block_n(pv_exact: bool = False) -> int:
    """Tokens per tile of stage 1: 64 on a GPU (32 with fp32 operands, ``pv_exact``: two pipeline stages of fp32 tiles
    fit the 227 KB of shared memory), 16 in the CPU interpreter (fewer padded products per tile)."""
    return 16 if INTERPRET else (32 if pv_exact else 64)


@triton.jit
def _kv_rows(KV_INDICES, pos, mask, PAGE_SIZE: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """Physical token rows of logical positions ``pos`` (a gather through the page table).

    ``CONTIGUOUS``: the host checked once (`prepare`) that the page table is the identity, so position ``p`` IS row
    ``p``: no index load, and the KV tile is a plain strided block Triton can vectorise and pipeline."""
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
def _fp4_values(KV, KV_SCALES, rows, mask, stride_kv, stride_ks, COL: tl.constexpr, SCOL: tl.constexpr,
                BLOCK_N: tl.constexpr, N: tl.constexpr, KV_FP4: tl.constexpr):  # fmt: skip
    """`N` values of each KV row `rows` as fp32: packed E2M1 codes from byte `COL` (even index in the low nibble),
    times their block scales from scale column `SCOL` (``KV_FP4`` 1: E8M0 per 32 values, 2: E4M3 per 16; NVFP4's
    per-tensor scale is left to the KV scale). Masked rows give 0."""
    G: tl.constexpr = 32 if KV_FP4 == 1 else 16
    offs = tl.arange(0, N // 2)
    packed = tl.load(KV + rows[:, None] * stride_kv + COL + offs[None, :], mask=mask[:, None], other=0).to(tl.int32)
    codes = tl.reshape(tl.join(packed & 15, packed >> 4), [BLOCK_N, N])
    e = (codes >> 1) & 3
    m = (codes & 1).to(tl.float32)
    # E2M1 magnitudes 0, 0.5 | 1, 1.5 | 2, 3 | 4, 6
    mag = tl.where(e == 0, 0.5 * m, tl.where(e == 1, 1.0 + 0.5 * m, tl.where(e == 2, 2.0 + m, 4.0 + 2.0 * m)))
    val = tl.where(codes >= 8, -mag, mag)
    offs_s = tl.arange(0, N // G)
    sc = tl.load(KV_SCALES + rows[:, None] * stride_ks + SCOL + offs_s[None, :], mask=mask[:, None], other=0)
    if KV_FP4 == 1:  # E8M0: 2^(code - 127); 0 is fp32's subnormal 2^-127, 255 NaN
        sc = sc.to(tl.int32)
        bits = tl.where(sc == 255, 0x7FC00000, tl.where(sc > 0, sc << 23, 0x00400000))
        scale = bits.to(tl.float32, bitcast=True)
    else:  # E4M3 bytes: 2^(E-7)·(1 + M/8), subnormal 2^-6·M/8, 0x7F NaN (sign in bit 7)
        sc = sc.to(tl.int32)
        ex, mt = (sc >> 3) & 15, sc & 7
        norm = (((ex + 120) << 23) | (mt << 20)).to(tl.float32, bitcast=True)
        scale = tl.where(ex == 0, mt.to(tl.float32) * 0.001953125, norm)
        scale = tl.where((sc & 0x7F) == 0x7F, float("nan"), tl.where(sc >= 128, -scale, scale))
    return tl.reshape(tl.reshape(val, [BLOCK_N, N // G, G]) * scale[:, :, None], [BLOCK_N, N])


@triton.jit
def _online_softmax_step(s, m_i, l_i, mask, qk_scale):
    """One KV tile of the online softmax, in base 2, on scores ``s`` (H, BLOCK_N): scale them, mask the padded
    tokens, update the running max `m` and sum `l`. Returns ``(p, alpha, m_new, l_new)``; the caller rescales its
    accumulator by `alpha`."""
    s = s * qk_scale
    s = tl.where(mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _stage1_kernel(
    Q,  # (total_q, H, 576) bf16 or fp8 codes
    KV,  # (rows, 576) bf16 or fp8 codes: rows = num_pages * page_size
    KV_INDICES,  # int32 page ids (token rows when PAGE_SIZE == 1)
    WORK_INDPTR,  # (n_cu + 1,) int32
    WORK_INFO,  # (n_work, 8) int32, kv positions in tokens
    OUT,  # (total_q, H, 512) output (bf16, or fp32 for exactness tests)
    OUT_LSE,  # (total_q, H) fp32
    PART_O,  # (n_partial_rows, H, 512) fp32
    PART_LSE,  # (n_partial_rows, H) fp32
    Q_SCALE,  # (1,) fp32 dequantisation scale of q (1.0 for bf16)
    KV_SCALE,  # (1,) fp32 dequantisation scale of the KV (1.0 for bf16 and MXFP4)
    KV_SCALES,  # fp4 KV: (rows, 576 / block) block scales as bytes (E8M0 or E4M3); else any tensor (unused)
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kv,
    stride_ks,
    stride_ot,
    stride_oh,
    H: tl.constexpr,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    QK_FP8: tl.constexpr,  # q and K both fp8 (a8w8): both dots on fp16-widened codes
    KV_FP8: tl.constexpr,  # K/V are fp8 codes
    PV_EXACT: tl.constexpr,  # both dots in fp32 "ieee": kernel error only from accumulation (tests)
    P_FP8: tl.constexpr,  # fp8 q: round P through the KV's (a8w8) or q's (a8w4) fp8 type before the PV
    KV_FP4: tl.constexpr,  # 0: fp8 / bf16 KV; 1: MXFP4 codes + E8M0 scales; 2: NVFP4 codes + E4M3 scales
    CONTIGUOUS: tl.constexpr,  # kv_indices is the identity: rows are positions (no gather)
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
            q_nope = tl.load(q_ptr + offs_h[:, None] * stride_qh + offs_d[None, :])
            q_rope = tl.load(q_ptr + offs_h[:, None] * stride_qh + D_NOPE + offs_r[None, :])
            m_i = tl.full([H], float("-inf"), tl.float32)
            l_i = tl.zeros([H], tl.float32)
            acc = tl.zeros([H, D_NOPE], tl.float32)
            if PV_EXACT:
                q_nope = q_nope.to(tl.float32)
                q_rope = q_rope.to(tl.float32)
            elif QK_FP8:
                q_nope = q_nope.to(tl.float16)  # e4m3 codes are exact in fp16: one cvt per pair on sm89+
                q_rope = q_rope.to(tl.float16)
            else:
                q_nope = q_nope.to(tl.bfloat16)
                q_rope = q_rope.to(tl.bfloat16)

            for start in range(kv_start, kv_end, BLOCK_N):
                pos = start + offs_n
                mask = pos < kv_end
                rows = _kv_rows(KV_INDICES, pos, mask, PAGE_SIZE, CONTIGUOUS)
                # One gather of the 576-dim rows, used as K (all 576) and V (first 512): each byte read once.
                if KV_FP4:
                    G: tl.constexpr = 32 if KV_FP4 == 1 else 16
                    k_nope = _fp4_values(KV, KV_SCALES, rows, mask, stride_kv, stride_ks, 0, 0, BLOCK_N, D_NOPE,
                                         KV_FP4)  # fmt: skip
                    k_rope = _fp4_values(KV, KV_SCALES, rows, mask, stride_kv, stride_ks, D_NOPE // 2, D_NOPE // G,
                                         BLOCK_N, D_ROPE, KV_FP4)  # fmt: skip
                else:
                    k_nope = tl.load(KV + rows[:, None] * stride_kv + offs_d[None, :], mask=mask[:, None], other=0.0)
                    k_rope = tl.load(KV + rows[:, None] * stride_kv + D_NOPE + offs_r[None, :], mask=mask[:, None],
                                     other=0.0)  # fmt: skip
                if PV_EXACT:
                    kq_nope = k_nope.to(tl.float32)
                    kq_rope = k_rope.to(tl.float32)
                elif QK_FP8:
                    kq_nope = k_nope.to(tl.float16)  # exact; used as K (QK) and as V (PV): no fp8 transpose
                    kq_rope = k_rope.to(tl.float16)
                elif KV_FP8 or KV_FP4:
                    # a16w8: widen the codes (exact); fp4: E2M1 x block scale is exact in bf16. Per-tensor scales
                    # are in qk_scale / v_scale
                    kq_nope = k_nope.to(tl.bfloat16)
                    kq_rope = k_rope.to(tl.bfloat16)
                else:
                    kq_nope = k_nope
                    kq_rope = k_rope

                if PV_EXACT:
                    s = tl.dot(q_nope, tl.trans(kq_nope), input_precision="ieee")
                    s = tl.dot(q_rope, tl.trans(kq_rope), s, input_precision="ieee")
                else:
                    s = tl.dot(q_nope, tl.trans(kq_nope))
                    s = tl.dot(q_rope, tl.trans(kq_rope), s)
                p, alpha, m_new, l_i = _online_softmax_step(s, m_i, l_i, mask, qk_scale)  # (H, BLOCK_N)
                acc = acc * alpha[:, None]
                if PV_EXACT:
                    acc = tl.dot(p, k_nope.to(tl.float32), acc, input_precision="ieee")
                elif QK_FP8:
                    # fp16 mma: V (reduction dim not contiguous) is read with ldmatrix.trans, unlike fp8.
                    acc = tl.dot(_p_fp16(p, k_nope.dtype, P_FP8), kq_nope, acc)
                elif P_FP8:  # fp8 q with fp4 KV: P rounded through q's fp8 type (exact in bf16)
                    acc = tl.dot(p.to(Q.dtype.element_ty).to(tl.bfloat16), kq_nope, acc)
                else:
                    acc = tl.dot(p.to(tl.bfloat16), kq_nope, acc)
                m_i = m_new

            # An empty range (kv_start == kv_end) gives l = 0: output 0 and LSE -inf, the identity of the merge.
            has = l_i > 0.0
            l_safe = tl.where(has, l_i, 1.0)
            lse = tl.where(has, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
            o = acc * (v_scale / l_safe)[:, None]
            if partial_loc < 0:
                o_ptr = OUT + qi * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
                tl.store(o_ptr, o.to(OUT.dtype.element_ty))
                tl.store(OUT_LSE + qi * H + offs_h, lse)
            else:
                row = (partial_loc + qi - qo_start).to(tl.int64)
                tl.store(PART_O + row * (H * D_NOPE) + offs_h[:, None] * D_NOPE + offs_d[None, :], o)
                tl.store(PART_LSE + row * H + offs_h, lse)


@triton.jit
def _reduce_kernel(
    PART_O,  # fp32 partial outputs: (P, H, DV), or (P, DV, H) with HEAD_MINOR (the sm_90 stage 1's layout)
    PART_LSE,  # (P, H) fp32
    REDUCE_INDPTR,  # (T + 1,) int32
    REDUCE_FINAL_MAP,  # (T, 2) int32: q rows [q_start, q_end) of tile t
    REDUCE_PARTIAL_MAP,  # (P_tiles,) int32: first partial row of each partial
    SPLIT_TILES,  # (n,) int32: the tiles with >= 2 partials, the only ones with work (program 0 axis)
    OUT,
    OUT_LSE,
    stride_ot,
    stride_oh,
    H: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HEAD_MINOR: tl.constexpr,
    USE_PDL: tl.constexpr,
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
    offs_h = tl.arange(0, H)
    # element (d, h) of one partial row: where the chosen layout keeps it
    if HEAD_MINOR:
        offs_dh = offs_d[:, None] * H + offs_h[None, :]
    else:
        offs_dh = offs_h[None, :] * DV + offs_d[:, None]
    pm0 = offs_p < n
    prow0 = tl.load(REDUCE_PARTIAL_MAP + s + offs_p, mask=pm0, other=0)  # first block's partial rows (q row 0)
    if USE_PDL:  # launched as a programmatic dependent of stage 1: wait until its writes are visible
        gdc_wait()
    for r in range(q_start, q_end):
        u = r - q_start
        m, acc, wsum = _lse_merge(PART_O, PART_LSE, (prow0 + u).to(tl.int64), pm0, offs_h, offs_dh,
                                  tl.full([H], float("-inf"), tl.float32), tl.zeros([BLOCK_DV, H], tl.float32),
                                  tl.zeros([H], tl.float32), H, DV)  # fmt: skip
        for p0 in range(BLOCK_P, n, BLOCK_P):  # more than BLOCK_P partials: further blocks, same online merge
            pm = p0 + offs_p < n
            prow = (tl.load(REDUCE_PARTIAL_MAP + s + p0 + offs_p, mask=pm, other=0) + u).to(tl.int64)
            m, acc, wsum = _lse_merge(PART_O, PART_LSE, prow, pm, offs_h, offs_dh, m, acc, wsum, H, DV)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w_safe = tl.where(wsum > 0.0, wsum, 1.0)
        o = (acc * (1.0 / w_safe)[None, :]).to(OUT.dtype.element_ty)
        tl.store(OUT + r * stride_ot + offs_h[None, :] * stride_oh + offs_d[:, None], o)
        if tl.program_id(1) == 0:
            tl.store(OUT_LSE + r * H + offs_h, tl.where(wsum > 0.0, m_safe + tl.log(w_safe), float("-inf")))


@triton.jit
def _lse_merge(PART_O, PART_LSE, prow, pm, offs_h, offs_dh, m, acc, wsum, H: tl.constexpr, DV: tl.constexpr):
    """Fold one block of partials (rows `prow`, valid where `pm`) into the running per-head state (max LSE m,
    Σ w·o over a (BLOCK_DV, H) slice, Σ w), with the weights exp(L_i - m) <= 1 (no overflow): the LSE merge of
    docs/kernels.md. A head whose partials are all empty (-inf) keeps m = -inf and exactly 0 in acc and wsum."""
    lp = tl.load(PART_LSE + prow[:, None] * H + offs_h[None, :], mask=pm[:, None], other=float("-inf"))  # (P, H)
    o_p = tl.load(PART_O + prow[:, None, None] * (H * DV) + offs_dh[None, :, :], mask=pm[:, None, None], other=0.0)
    m_new = tl.maximum(m, tl.max(lp, 0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    # base 2: exp2 is one MUFU.EX2 (ex2.approx.ftz); tl.exp adds a range test and two predicated multiplies per
    # element for subnormal results. A masked partial's LSE is -inf: weight 0
    log2e: tl.constexpr = 1.4426950408889634
    corr = tl.exp2((m - m_safe) * log2e)  # 0 while m is -inf
    wgt = tl.exp2(lp * log2e - (m_safe * log2e)[None, :])  # (P, H)
    acc = acc * corr[None, :] + tl.sum(wgt[:, None, :] * o_p, 0)
    wsum = wsum * corr + tl.sum(wgt, 0)
    return m_new, acc, wsum


stage1_kernel = _stage1_kernel
reduce_kernel = _reduce_kernel

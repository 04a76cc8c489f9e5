"""The reduce after the sm_90 stage 1, in Gluon: merges the fp16 head-minor partials of every split request.

Math and contract: the LSE merge of docs/kernels.md (``o = Σ_i 2^(L_i·log2 e - M) O_i / Σ_i 2^(L_i·log2 e - M)``, M the
largest, natural-log LSEs; an all-empty tile gives 0 and LSE -inf), on head-minor partials, (rows, 512, 16), fp32,
or fp16 in units of the KV's fp8 codes with the heads in the columns `portable.HEAD_MINOR_COLUMN`. The helper that
merges one block of partials is `_lse_merge`, the name it has in every dialect (`portable._lse_merge`,
`mlalab.plan.merge.lse_merge`).

The layout is explicit: each lane holds 4 heads of one value dim (one 16-byte fp32 or 8-byte fp16 load per partial
and dim), 4 lanes a row of 16 heads, the other lanes and ``DPT`` registers more dims, and the partials of a thread's
elements sit in its registers, so the merge is register arithmetic (Triton's own layout for the same block spreads
the partials over lanes: a tree of shuffles). From 16 partials on, 2 lanes (``LP``) and up to 4 warps share them (one
shuffle, one merge through shared memory). Grid: (split tiles, 512 // (DPT·8/LP)); up to BLOCK_P partials at a time
(more: further blocks, merged online); `launch_shape` picks the shape from a plan's largest partial count. The merged
slice is stored through a layout of up to 8 consecutive dims of a head per thread (16-byte vectors).

What paces it: one warp per program and per scheduler, so a program's time is its chain of dependent instructions.
Hence weights in base 2 (one FFMA + MUFU.EX2 each), normalisation on the SFU, the common tile (one q row, at most
BLOCK_P partials) merged straight with no running state, and everything that comes from the plan (rows, pointers)
computed before the wait on stage 1.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .epilogue import _lg2_approx, _rcp_approx

__all__ = ["reduce_kernel", "launch_shape"]


def launch_shape(max_partials: int) -> dict[str, int]:
    """``BLOCK_P`` (partials per block load: all of a tile's, up to 64; more go in further blocks), ``DPT`` (value
    dims per thread), ``LP`` (lanes sharing the partials), ``num_warps`` (warps sharing them) and ``maxnreg`` for
    tiles of at most `max_partials` partials. Up to 8: every partial of a thread's elements in its registers, one
    warp, 8·DPT dims per program, 8 values of a partial per thread. From 16 on (16 partials in one thread need all 255
    registers and spill in fp32): 8 per thread, 2 lanes and up to 4 warps share them (one shuffle, one merge through
    shared memory), 4 dims per program."""
    if type(max_partials) is not int or max_partials < 1:
        raise ValueError(f"max_partials must be an int >= 1, got {max_partials!r}")
    block_p = 2
    while block_p < min(max_partials, 64):
        block_p *= 2
    # (maxnreg: without it ptxas of Triton 3.6 held the 4-warp program to 128 registers and spilled)
    if block_p <= 8:
        return {"BLOCK_P": block_p, "DPT": 8 // block_p, "LP": 1, "num_warps": 1, "maxnreg": 255}
    return {"BLOCK_P": block_p, "DPT": 1, "LP": 2, "num_warps": block_p // 16, "maxnreg": 255}


@gluon.jit
def _head_of_column(c, FP16: gl.constexpr):
    """The head that column `c` of a partial row holds: c, or in fp16 partials 8j + 2i + b for c = 4i + 2j + b
    (`portable.HEAD_MINOR_COLUMN`, inverted)."""
    if FP16:
        c = ((c >> 2) << 1) | (c & 1) | (((c >> 1) & 1) << 3)
    return c


@gluon.jit
def _lse_merge(lse_ptrs, o_ptrs, pmask, LDH: gl.constexpr):
    """One block of partials (LSE pointers (partial, column), output pointers (partial, dim, column); the partials
    valid where `pmask`, the others point at a valid row and get weight 0 from their -inf LSE, so the output loads
    need no mask): its max LSE per column m (-inf if every partial is empty), Σ_i 2^((L_i - m)·log2 e) O_i over the
    slice, and Σ_i of those weights (both 0 for an empty block)."""
    LOG2E: gl.constexpr = 1.4426950408889634
    lp = gl.load(lse_ptrs, mask=pmask[:, None], other=float("-inf"))
    o_p = gl.load(o_ptrs)
    m = gl.max(lp, axis=0)
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    # base 2: one FFMA + MUFU.EX2 per weight (gl.exp compiles to ex2.approx.f32 with a range test and two predicated
    # multiplies for subnormal results; gl.exp2 to ex2.approx.ftz)
    wgt = gl.exp2(lp * LOG2E - (m_safe * LOG2E)[None, :])
    acc = gl.sum(gl.expand_dims(wgt, 1) * o_p.to(gl.float32), axis=0)
    wsum = gl.convert_layout(gl.sum(wgt, axis=0), gl.SliceLayout(0, LDH))
    return gl.convert_layout(m, gl.SliceLayout(0, LDH)), acc, wsum


@gluon.jit
def _merge_row(PART_O, PART_LSE, REDUCE_PARTIAL_MAP, s, n, u, first, lse_ptrs, o_ptrs, pm, offs_p, offs_p3, elem,
               offs_c, H: gl.constexpr, DV: gl.constexpr, BLOCK_P: gl.constexpr, LDH: gl.constexpr):  # fmt: skip
    """q row `u` of a tile: its first block of partials at `lse_ptrs` / `o_ptrs` straight (most tiles have no
    other), further blocks (more than BLOCK_P partials) merged online."""
    LOG2E: gl.constexpr = 1.4426950408889634
    m, acc, wsum = _lse_merge(lse_ptrs, o_ptrs, pm, LDH)
    for p0 in range(BLOCK_P, n, BLOCK_P):
        pmask = p0 + offs_p < n
        rows = gl.where(pmask, gl.load(REDUCE_PARTIAL_MAP + s + p0 + offs_p, mask=pmask, other=0), first) + u
        pmask3 = p0 + offs_p3 < n
        rows3 = gl.where(pmask3, gl.load(REDUCE_PARTIAL_MAP + s + p0 + offs_p3, mask=pmask3, other=0), first) + u
        m_b, acc_b, wsum_b = _lse_merge(
            PART_LSE + rows.to(gl.int64)[:, None] * H + offs_c[None, :],
            PART_O + rows3.to(gl.int64)[:, None, None] * (H * DV) + elem,
            pmask,
            LDH,
        )
        m_new = gl.maximum(m, m_b)
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        # each side was weighted relative to its own max; an all-empty side (-inf) gets factor 0
        c = gl.exp2((m - m_ref) * LOG2E)
        c_b = gl.exp2((m_b - m_ref) * LOG2E)
        acc = acc * c[None, :] + acc_b * c_b[None, :]
        wsum = wsum * c + wsum_b * c_b
        m = m_new
    return m, acc, wsum


@gluon.jit
def _store_row(OUT, OUT_LSE, r, m, acc, wsum, v_scale, stride_ot, stride_oh, head, head_o, d_o, H: gl.constexpr,
               OUT_L: gl.constexpr):  # fmt: skip
    """Normalise q row `r`'s merged slice and store it (and, from the first slice's programs, its LSEs)."""
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    w_safe = gl.where(wsum > 0.0, wsum, 1.0)  # (>= 1 where a partial has a token: its max contributes 2^0)
    # 1 / w and log w on the SFU, as stage 1's epilogue does (`epilogue._normaliser`): the IEEE division
    # and gl.log add a range test, Newton steps and a ~25-instruction software log to one warp's chain
    o = (acc * (v_scale * _rcp_approx(w_safe))[None, :]).to(OUT.dtype.element_ty)
    # stored through a layout with up to 8 consecutive dims of a head per thread (one 16-byte vector): from the
    # merge's layout (4 heads of one dim per thread) every 2-byte element would be its own partial-sector write
    o = gl.convert_layout(o, OUT_L)
    gl.store(OUT + r * stride_ot + head_o[None, :] * stride_oh + d_o[:, None], o)
    if gl.program_id(1) == 0:
        lse_out = gl.where(wsum > 0.0, m_safe + _lg2_approx(w_safe) * 0.6931471805599453, float("-inf"))
        gl.store(OUT_LSE + r * H + head, lse_out)


@gluon.jit
def _reduce_kernel(
    PART_O,  # (P, 512, 16) head-minor partials: fp32, or fp16 in KV code units with heads in HEAD_MINOR_COLUMN order
    PART_LSE,  # (P, 16) fp32, in the same column order as PART_O
    REDUCE_INDPTR,  # (T + 1,) int32
    REDUCE_FINAL_MAP,  # (T, 2) int32: q rows [q_start, q_end) of tile t
    REDUCE_PARTIAL_MAP,  # (P_tiles,) int32: first partial row of each partial
    SPLIT_TILES,  # (n,) int32: the tiles with >= 2 partials (program axis 0)
    OUT,  # (total_q, 16, 512)
    OUT_LSE,  # (total_q, 16) fp32
    V_SCALE,  # (1,) fp32: applied to fp16 partials (fp32 ones carry it)
    stride_ot,
    stride_oh,
    H: gl.constexpr,
    DV: gl.constexpr,
    BLOCK_P: gl.constexpr,  # partials per block load (in each thread's registers and across the warps)
    DPT: gl.constexpr,  # value dims per thread (a program merges DPT·8/LP dims)
    LP: gl.constexpr,  # lanes sharing the partials (1 or 2)
    USE_PDL: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(H == 16, "4 lanes x 4 heads: written for 16 heads")
    FP16: gl.constexpr = PART_O.dtype.element_ty == gl.float16
    # (partial, dim, column): 4 columns per lane, 4 lanes per row, DPT·8/LP rows (dims); partials in registers, LP
    # lanes and the warps
    L3: gl.constexpr = gl.BlockedLayout([1, DPT, 4], [LP, 8 // LP, 4], [num_warps, 1, 1], [2, 1, 0])
    BLOCK_DV: gl.constexpr = DPT * (8 // LP)
    LPH: gl.constexpr = gl.SliceLayout(1, L3)  # (partial, column)
    LDH: gl.constexpr = gl.SliceLayout(0, L3)  # (dim, column): the merged slice
    t = gl.load(SPLIT_TILES + gl.program_id(0))
    s = gl.load(REDUCE_INDPTR + t)
    n = gl.load(REDUCE_INDPTR + t + 1) - s
    q_start = gl.load(REDUCE_FINAL_MAP + 2 * t)
    q_end = gl.load(REDUCE_FINAL_MAP + 2 * t + 1)
    offs_p = gl.arange(0, BLOCK_P, layout=gl.SliceLayout(1, LPH))
    offs_c = gl.arange(0, H, layout=gl.SliceLayout(0, LPH))
    offs_p3 = gl.arange(0, BLOCK_P, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    offs_dh = gl.arange(0, BLOCK_DV, layout=gl.SliceLayout(1, LDH))
    offs_ch = gl.arange(0, H, layout=gl.SliceLayout(0, LDH))
    d = gl.program_id(1) * BLOCK_DV + offs_dh
    elem = gl.expand_dims(d[:, None] * H + offs_ch[None, :], 0)  # (1, dim, column) inside a partial row
    # the first block's partial rows (q row 0) and their pointers, all before the wait (they come from the plan, not
    # from stage 1); a masked partial points at the tile's first partial (weight 0 from its masked -inf LSE)
    first = gl.load(REDUCE_PARTIAL_MAP + s)
    pm = offs_p < n
    prow = gl.where(pm, gl.load(REDUCE_PARTIAL_MAP + s + offs_p, mask=pm, other=0), first)
    pm3 = offs_p3 < n
    prow3 = gl.where(pm3, gl.load(REDUCE_PARTIAL_MAP + s + offs_p3, mask=pm3, other=0), first)
    lse_ptrs = PART_LSE + prow.to(gl.int64)[:, None] * H + offs_c[None, :]
    o_ptrs = PART_O + prow3.to(gl.int64)[:, None, None] * (H * DV) + elem
    if FP16:
        v_scale = gl.load(V_SCALE)
    else:
        v_scale = 1.0
    if USE_PDL:  # a programmatic dependent of stage 1: wait until its writes are visible
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    # the output's layout: up to 8 consecutive dims of one head per thread
    SPT_O: gl.constexpr = 8 if BLOCK_DV >= 8 else BLOCK_DV
    TD_O: gl.constexpr = BLOCK_DV // SPT_O if BLOCK_DV // SPT_O <= 32 else 32
    OUT_L: gl.constexpr = gl.BlockedLayout([SPT_O, 1], [TD_O, 32 // TD_O], [1, num_warps], [0, 1])
    d_o = gl.program_id(1) * BLOCK_DV + gl.arange(0, BLOCK_DV, layout=gl.SliceLayout(1, OUT_L))
    head_o = _head_of_column(gl.arange(0, H, layout=gl.SliceLayout(0, OUT_L)), FP16)
    head = _head_of_column(offs_ch, FP16)
    if q_end > q_start:  # q row 0 on the pointers above; the rows after it (q_len > 1) offset from them
        m, acc, wsum = _merge_row(PART_O, PART_LSE, REDUCE_PARTIAL_MAP, s, n, 0, first, lse_ptrs, o_ptrs, pm, offs_p,
                                  offs_p3, elem, offs_c, H, DV, BLOCK_P, LDH)  # fmt: skip
        _store_row(OUT, OUT_LSE, q_start, m, acc, wsum, v_scale, stride_ot, stride_oh, head, head_o, d_o, H, OUT_L)
    for r in range(q_start + 1, q_end):
        u = r - q_start
        m, acc, wsum = _merge_row(PART_O, PART_LSE, REDUCE_PARTIAL_MAP, s, n, u, first, lse_ptrs + u * H,
                                  o_ptrs + u * (H * DV), pm, offs_p, offs_p3, elem, offs_c, H, DV, BLOCK_P,
                                  LDH)  # fmt: skip
        _store_row(OUT, OUT_LSE, r, m, acc, wsum, v_scale, stride_ot, stride_oh, head, head_o, d_o, H, OUT_L)


reduce_kernel = _reduce_kernel

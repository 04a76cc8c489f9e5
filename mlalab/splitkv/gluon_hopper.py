"""Persistent split-KV MLA decode for Hopper (sm_90) in Gluon, Triton's explicit-layout dialect: wgmma + TMA.

Why a second kernel. The portable Triton kernel (`triton_decode`) puts the 16 heads on the MMA's M dimension;
Hopper's wgmma needs M = 64 per warpgroup, so Triton falls back to mma.sync, widens every fp8 code to fp16 in
registers and needs all 255 registers: 30 % of the copy bandwidth at batch 128 × 8192 (H200, 2026-12-02). Here
every matrix product runs on fp8 wgmma (SASS ``QGMMA``) straight from shared memory, in the orientation where
the 16 heads are the *small* N dimension, so nothing is padded:

* scores, tokens as M:  ``Sᵀ (64 tok × 16 heads) = K (64 × 576) · Qᵀ (576 × 16)``; K is the TMA-loaded tile as
  stored (576 B per token, the reduction dim contiguous: what fp8 wgmma requires of A), Qᵀ a permuted view of
  q in shared memory;
* values, value dims as M:  ``Oᵀ (512 × 16) += Vᵀ (512 × 64 tok) · Pᵀ (64 tok × 16)``. fp8 wgmma needs the
  reduction dim (tokens) contiguous in both operands, and the cache stores V token-major, so each tile's V is
  transposed once in shared memory by the CUDA cores (16-byte loads and stores, 0 bank conflicts: see
  `_V_LOAD`), while the tensor cores compute the scores of the same tile.

The 512 Oᵀ rows are *not* in natural value-dim order: the transpose stores value dim ``d`` at row ``m = π(d)``
(π swaps bits 0-2 with bits 4-6 of d, an involution) because that order is what makes the transposing stores
conflict-free; the epilogue writes row ``m`` to dim ``π(m)``. Tokens stay in natural order (Pᵀ and Vᵀ agree).

Per CTA (one warpgroup of 4 warps; the grid is the plan's slots, one per SM): the works
``work_info[work_indptr[c]:work_indptr[c+1]]`` are walked in order, their 64-token tiles flattened into one stream
that a ring of ``NUM_STAGES`` TMA buffers prefetches across work boundaries (the host lists each CTA's tile start rows
once per plan: `tile_rows`; the first work's q goes out before the ring's first tiles, ``Q_FIRST``, 0.718x -> 0.710x
in data/profiles/h200_2026-12-03_ab_qfirst_stages.csv). Per tile: wait for its TMA barrier → issue QK on the tensor
cores (async) → transpose V → wait → online softmax in base 2 (the running sum is kept per thread and reduced once per
work) → P (rounded to the KV's fp8 type, aiter's a8w8 numerics) to shared memory → fence + barrier → rescale Oᵀ →
issue PV (async; it overlaps the next tile's wait and QK) → refill this stage with the tile ``NUM_STAGES`` ahead
(after the PV, which reads Pᵀ and Vᵀ / registers, not the stage: issued before it, the refill cost the v-regs path 3.5
% of the geomean, data/profiles/h200_2026-12-03_ab_refill.csv; ``REFILL_AFTER_PV``). Vᵀ and Pᵀ are double-buffered so
PV(i) never races the writes of tile i+1.
Each work ends like the portable kernel's: final bf16 output + LSE when the request is whole, else an fp32 partial +
natural-log LSE for the reduce (`triton_decode.reduce_kernel`, the same WorkPlan contract). The final output is
un-permuted (a relabelling of register dims) and converted in 128-dim chunks so that each warp stores 512 contiguous
bytes (writing it straight from the wgmma layout scattered 4-byte stores: 1.5–5 µs per call, data/timings/
h200_2026-12-02_hopper_dev3 vs dev5). Partials are ours alone (only the reduce reads them), so they are stored
*head-minor*, (rows, 512, 16), straight from the accumulator: 8-byte stores that fill whole sectors, no conversion
(`_store_partial_head_minor`; the v-regs epilogue got 170 ns shorter, the vt-smem one 20 ns). With
``LAUNCH_DEPENDENTS`` every CTA signals at once that the reduce (launched as a programmatic dependent) may start; the
reduce waits for this grid's writes.

Measured on the H200 (data/timings/h200_2026-12-03_run14.csv, v-regs on every shape, deferred ring fill): 0.67x FlashMLA
fp8's geomean over the 12 competition shapes, 105 % of the copy bandwidth at batch 128 × 8192. A CTA spends 1.24-1.31 µs
per tile on this path (data/profiles/h200_2026-12-03s6b_profile.csv), 1.01-1.11 on v-regs
(h200_2026-12-03s7_profile.csv, launch clock): one warpgroup serialises QK → softmax → PV, and at small batch the fixed
chain (header, first tile, epilogue, reduce), not bytes, sets the time: with both wgmmas skipped (``ABLATE``) the call
would be 0.625x.

A sibling, `gluon_hopper_vreg`, feeds V to the PV wgmma from registers instead of a Vᵀ buffer; since the refill moved
after the PV it is the faster path on every competition shape, and ``hopper_variant="auto"`` runs it
(`triton_mla.HOPPER_LONG_STREAM`); this path stays selectable and tested.

With ``BLOCK_N=128`` and 8 warps (`KernelConfig.hopper_block`, v-regs only) two warpgroups share one 128-token tile:
each scores 64 tokens (the wgmma's M splits across them) and holds 256 of the 512 Oᵀ rows (`gluon_hopper_vreg`'s
``_V_REGS_128``). Per 64 tokens a tile is ~10 % cheaper this way (data/profiles/h200_2026-12-03s9_ablation_profile.csv),
but the larger ring delays the first tile and the last tile is longer: slower overall (0.731x vs 0.700x,
data/profiles/h200_2026-12-03_ab_block128.csv), so off by default.

16-bit operands (``V_FROM_K``): bf16 q and KV on bf16 wgmma, the PV reading Vᵀ straight from the K tile, which wgmma
transposes for 16-bit types (fp8 cannot, hence the paths above); a 2-tile ring of 72 KB stages, each refilled one tile
late (the PV of tile i reads stage i). With ``KV_CONVERT`` (a16w8: bf16 q, fp8 KV) the ring holds fp8 tiles and each is
converted into one bf16 tile (`_convert_tile`, exact: `_E4M3_TO_BF16`) that QK and PV read; its stage is refilled right
after the conversion.

Constraints (checked on the host, `hopper_unsupported`): a8w8 (vt-smem, v-regs), bf16 (v-tile) or a16w8 (v-conv), 16
heads × (512 + 64) dims, KV rows of a tile contiguous (page size 1 with the identity page table, or a page size that is
a multiple of the tile, 64 or 128), one q row per work (q_len 1).
The fp8 flavour is e4m3fn (what sm_90 wgmma takes; v-conv's conversion is written for it).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gluon_hopper_vreg import (
    VT_ROW_BITS,
    _normaliser,
    _p_operand,
    _partial_value_scale,
    _pv_operand,
    _store_partial_head_minor,
    _store_work_vregs,
)

__all__ = ["BLOCK_N", "stage1_kernel", "make_descriptors", "TensorDescriptor"]

#: TMA global -> shared copy: ``async_copy_global_to_shared`` up to Triton 3.6 (the H200 machine's), renamed
#: ``async_load`` later (3.9 on the CPU machines, which compile the kernel for sm_90 in a test).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
#: CTA-wide barrier: ``thread_barrier`` up to 3.6, ``barrier`` later.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


#: tokens per tile: the M of the score wgmma (one warpgroup covers 64 rows) and the K of the value wgmma.
BLOCK_N = 64

#: The optional per-CTA timeline (``TIMELINE=True``, `triton_mla.TritonDecoder.stage1_timeline`): one int64 row per
#: CTA. Columns: 0/1 global timer (ns) at start / end, 2/3 SM clock at start / end, 4 SM clock once the first
#: TMAs are in flight, 5 / 6 SM clock when the last work's final PV has completed / its softmax sum is reduced
#: (the epilogue's parts: what follows 6 is the output's normalisation and stores); then four blocks of
#: `TIMELINE_MAX` SM-clock columns: tile ``it`` has arrived (``8 + it``), its scores are done
#: (``8 + TIMELINE_MAX + it``), its PV is issued (``8 + 2·TIMELINE_MAX + it``), and work ``j``'s output stores
#: are issued (``8 + 3·TIMELINE_MAX + j``).
TIMELINE_MAX = gl.constexpr(256)
TIMELINE_COLS = gl.constexpr(8 + 4 * 256)


@gluon.jit
def _stamp(TL, col, GLOBAL: gl.constexpr = False):
    """Write the SM's cycle counter (or, with `GLOBAL`, the GPU's nanosecond timer) to ``TL[col]``."""
    if GLOBAL:
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    else:
        t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(TL + col, t)


#: Registers of a CTA while it transposes V: each thread holds a 16-token × 16-dim block, so both the loads
#: (16 dims of one token, from the 128-byte-swizzled K tile) and the stores (16 tokens of one value row, into the
#: 64-byte-swizzled Vᵀ) are 16-byte vectors. With the row order π below, both are free of bank conflicts
#: (checked with ``gl.bank_conflicts`` when the kernel is compiled).
_V_LOAD = gl.BlockedLayout([16, 16], [1, 32], [4, 1], [1, 0])


#: The 4 warps' per-head maxima of one tile (warp index, head), every thread holding the 4 values of each head column it
#: holds in the wgmma accumulator (`ACC`'s head bits: registers 0 and 3, lanes 1 and 2): the maximum over the warps is
#: then a register reduction whose result has exactly ``SliceLayout(0, ACC)`` (checked: ``assert_trivial``). Used by
#: `_across_warps`.
_ALL_WARPS = gl.DistributedLinearLayout(
    reg_bases=[[1, 0], [2, 0], [0, 1], [0, 8]],
    lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
    warp_bases=[[0, 0], [0, 0]],
    block_bases=[],
    shape=[4, 16],
)


@gluon.jit
def _across_warps(x, buf, IS_MAX: gl.constexpr, NQ: gl.constexpr):
    """max (`IS_MAX`) or sum over the 64 tokens of `x` (64 tokens × NQ heads, wgmma accumulator layout: warp w holds
    tokens 16w .. 16w + 15) per head, in ``SliceLayout(0, ACC)``: each warp reduces its 16 tokens with shuffles,
    writes its NQ results to `buf` (4 × NQ fp32), one barrier, and every thread reads the 4 warps' values of its
    heads. Triton 3.6's own cross-warp reduction (the H200 machine's) takes two shared-memory rounds and two
    barriers (3.9: one). `buf` must not be read by an earlier call that no barrier separates from this one (see the
    kernel's ``xchg_smem``)."""
    gl.static_assert(NQ == 16, "_ALL_WARPS is written for 16 heads")
    ACC: gl.constexpr = x.type.layout
    if IS_MAX:
        per_warp = gl.max(x.reshape([4, 16, NQ]), axis=1)  # (warp, head): shuffles inside each warp
    else:
        per_warp = gl.sum(x.reshape([4, 16, NQ]), axis=1)
    buf.store(per_warp)
    _cta_barrier()
    v = buf.load(_ALL_WARPS)
    if IS_MAX:
        r = gl.max(v, axis=0)
    else:
        r = gl.sum(v, axis=0)
    return gl.convert_layout(r, gl.SliceLayout(0, ACC), assert_trivial=True)


@gluon.jit
def _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row, it, n_tiles, NUM_STAGES: gl.constexpr):
    """TMA the CTA's tile number `it` (KV row `row` onwards), if it exists, into ring stage ``it % NUM_STAGES``."""
    if it < n_tiles:
        s = it % NUM_STAGES
        bar = ready.index(s)
        mbarrier.expect(bar, kn_desc.block_type.nbytes + kr_desc.block_type.nbytes)
        _tma_load(kn_desc, [row, 0], bar, kn_smem.index(s))
        _tma_load(kr_desc, [row, 0], bar, kr_smem.index(s))


@gluon.jit
def _issue_deferred(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, row2, row3, row4, n_tiles,
                    NUM_STAGES: gl.constexpr, FIRST_BURST: gl.constexpr):  # fmt: skip
    """Issue the ring's tiles ``FIRST_BURST .. NUM_STAGES - 1`` (rows `row1` .. `row4` of tiles 1 .. 4).

    Why defer them: when every SM issues its whole ring at once, the HBM serves all those tiles interleaved and a
    CTA's first tile lands with the last of them — 4.6-4.9 µs after the start with 3 tiles per SM, 2.8 µs with 2,
    2.0-2.5 with 1 (data/profiles/h200_2026-12-03s7_timeline.csv) — while the stream afterwards is paced by compute,
    not bytes, so the later tiles are not needed that early. (Session 7's ramp spaced the ring's issues with a spin
    *before* the first tile's compute, which delayed that compute by as much: no gain.)"""
    if FIRST_BURST <= 1 and NUM_STAGES > 1:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, 1, n_tiles, NUM_STAGES)
    if FIRST_BURST <= 2 and NUM_STAGES > 2:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row2, 2, n_tiles, NUM_STAGES)
    if FIRST_BURST <= 3 and NUM_STAGES > 3:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row3, 3, n_tiles, NUM_STAGES)
    if FIRST_BURST <= 4 and NUM_STAGES > 4:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row4, 4, n_tiles, NUM_STAGES)


@gluon.jit
def _work_row(info):
    """A work's row of `token_work_info` (8 int32 at `info`): partial row (-1: none), first q row, KV token range."""
    return gl.load(info + 1), gl.load(info + 2), gl.load(info + 4), gl.load(info + 5)


@gluon.jit
def _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row, j, H: gl.constexpr):
    """TMA the 16 head rows of q row `q_row` (the CTA's j-th work) into q buffer ``j % 2``."""
    b = j % 2
    bar = q_bar.index(b)
    mbarrier.expect(bar, qn_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    _tma_load(qn_desc, [q_row * H, 0], bar, qn_smem.index(b))  # q viewed as (total_q · 16, 576)
    _tma_load(qr_desc, [q_row * H, 0], bar, qr_smem.index(b))


@gluon.jit
def _load_v(kn, start, kv_end, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr, MASK_TAIL: gl.constexpr,
            REPORT: gl.constexpr):  # fmt: skip
    """V (token, d) = the first 512 dims of the K tile, into registers, value dims already in the row order π
    of Vᵀ (`_store_vt`): ``d = 128·a + 16·b + 8·c + e`` (a < 4, b < 8, c < 2, e < 8) goes to ``m = 128·a + 16·e +
    8·c + b`` (a relabelling of register tensor dims: no data moves).

    ``MASK_TAIL`` (paged caches): tokens past the work's end are zeroed, since a page's unused slots may hold
    anything and 0 · NaN would poison Oᵀ although their P is 0. With the identity page table those rows are the
    next request's tokens or TMA's zero fill past the buffer, so the mask is compiled out."""
    v = kn.load(_V_LOAD)
    if REPORT:  # compile-time count for `sm90_build` (printed by the compiler, not at run time)
        gl.static_print("mlalab hopper: V load bank conflicts =", gl.bank_conflicts(v.type, kn.type))
    if MASK_TAIL and start + BLOCK_N > kv_end:
        offs_t = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, _V_LOAD))
        v = gl.where(((start + offs_t) < kv_end)[:, None], v, gl.zeros_like(v))
    v = v.reshape([BLOCK_N, 4, 8, 2, 8]).permute([0, 1, 4, 3, 2]).reshape([BLOCK_N, D_NOPE])
    return v.permute([1, 0])


@gluon.jit
def _zero_tail_rows(kn, n_valid, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr):
    """Zero rows `n_valid` .. of a 16-bit K tile's value dims in shared memory (``V_FROM_K``: the PV reads V straight
    from the tile, and a paged cache's unused slots may hold anything, NaN included: 0 · NaN = NaN). 64 columns at a
    time (one 128-byte swizzle span), 32 values per thread."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L))
    for c in gl.static_range(D_NOPE // 64):
        chunk = kn.slice(c * 64, 64, dim=1)
        x = chunk.load(L)
        chunk.store(gl.where((rows < n_valid)[:, None], x, gl.zeros_like(x)))


#: e4m3fn codes -> bf16, 4 per instruction group, exact: a code's 7 magnitude bits shifted into a bf16's exponent and
#: mantissa fields (and its sign into the sign bit) make the bf16 whose value is the code's times 2^-120 — normal and
#: subnormal codes alike, since both formats lay the exponent above the mantissa — and one bf16x2 multiply by 2^120
#: (0x7B80) scales it back without rounding. Two byte permutes put codes 0, 1 (2, 3) in the high bytes of the two
#: halves of a word (a code's sign lands on the bf16 sign bit), then per word: mask the magnitudes, shift them by 4,
#: OR the signs back in (one LOP3, immLut 0xEC = (a & c) | b), multiply — 10 integer / bf16x2 instructions per 4 codes
#: (session 12's first version took ~15, equally fast: 37.0 vs 37.2 µs geomean, data/profiles/h200_2026-12-03s13_a16w8_
#: conv10_times.csv; the compiler's per-code conversion, F2F then F2FP, 45.0, data/profiles/h200_2026-12-03_ab_a16w8_
#: v_conv.csv). The conversion still costs ~1.3 µs per tile (h200_2026-12-03s13_a16w8_profile.csv against the bf16 one).
#: The NaN codes (0x7F, 0xFF) become ±480: a paged tail's unused slots are zeroed after the conversion, and the
#: quantiser never writes NaN. (Checked for all 256 codes against torch's e4m3fn in tests/test_hopper_kernel.py.)
_E4M3_TO_BF16 = gl.constexpr("""{
.reg .b32 a, b, t, u, k;
prmt.b32 a, $2, 0, 0x1404;
prmt.b32 b, $2, 0, 0x3424;
and.b32 t, a, 0x7F007F00;
and.b32 u, b, 0x7F007F00;
shr.b32 t, t, 4;
shr.b32 u, u, 4;
lop3.b32 a, a, t, 0x80008000, 0xEC;
lop3.b32 b, b, u, 0x80008000, 0xEC;
mov.b32 k, 0x7B807B80;
mul.rn.bf16x2 $0, a, k;
mul.rn.bf16x2 $1, b, k;
}""")


@gluon.jit
def _convert_tile(src, dst, n_valid, MASK_TAIL: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr):
    """``KV_CONVERT``: the fp8 codes of a (BLOCK_N, D) ring tile into the bf16 tile `dst` (exact, `_E4M3_TO_BF16`), 64
    columns at a time, 16 codes per thread per row; with `MASK_TAIL`, rows `n_valid` .. zeroed (a paged cache's unused
    slots may hold NaN, and the PV reads V from this tile: 0 · NaN = NaN)."""
    L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L))
    for c in gl.static_range(D // 64):
        codes = src.slice(c * 64, 64, dim=1).load(L).to(gl.uint8, bitcast=True)
        x = gl.inline_asm_elementwise(_E4M3_TO_BF16, "=r,=r,r", [codes], dtype=gl.bfloat16, is_pure=True, pack=4)
        if MASK_TAIL:
            x = gl.where((rows < n_valid)[:, None], x, gl.zeros_like(x))
        dst.slice(c * 64, 64, dim=1).store(x)


@gluon.jit
def _store_vt(v_t, vt, REPORT: gl.constexpr):
    """Vᵀ (value row m, token) into shared memory: 16-byte stores, 0 bank conflicts with the π row order."""
    if REPORT:
        gl.static_print("mlalab hopper: Vt store bank conflicts =", gl.bank_conflicts(v_t.type, vt.type))
    vt.store(v_t)


@gluon.jit
def _store_work_vt(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                   H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr, NATURAL: gl.constexpr = False):  # fmt: skip
    """Normalise one work's Oᵀ (512, NQ) and write it: final bf16 output + LSE, or fp32 partial + LSE. Row m of Oᵀ
    holds value dim π(m) (the vt-smem path's Vᵀ order), or dim m with ``NATURAL`` (V read from the K tile)."""
    lse, scale = _normaliser(m_i, l_sum, _partial_value_scale(v_scale, partial_loc, PART_O))  # empty: 0, LSE -inf
    o = o * scale[None, :]
    if partial_loc < 0:  # the request is whole: final output (bf16) at its q rows
        # Oᵀ row m holds value dim π(m); π only permutes bits 0-6, so un-permuting is a relabelling, and rows
        # [128·c, 128·c + 128) are dims [128·c, 128·c + 128) for each chunk c (register bits: split is free)
        if NATURAL:
            o_nat = o.reshape([4, 128, NQ]).permute([1, 2, 0])
        else:
            o_nat = o.reshape([4, 8, 2, 8, NQ]).permute([0, 3, 2, 1, 4]).reshape([4, 128, NQ]).permute([1, 2, 0])
        even, odd = gl.split(o_nat.reshape([128, NQ, 2, 2]))  # chunk c = 2·a + b: split takes b (the last axis) first
        o0, o2 = gl.split(even)
        o1, o3 = gl.split(odd)
        n_valid = H  # one q row of 16 heads per work (NQ == H): every column is valid
        _store_rows(o0, o1, o2, o3, lse, OUT, OUT_LSE, qo_start.to(gl.int64) * H, n_valid, D_NOPE, NQ)
    else:  # one split of it: fp32 partial at the plan's partial row, head-minor, straight from the accumulator
        if NATURAL:
            ROW_BITS: gl.constexpr = NATURAL_ROW_BITS
        else:
            ROW_BITS: gl.constexpr = VT_ROW_BITS
        _store_partial_head_minor(o, lse, PART_O, PART_LSE, partial_loc.to(gl.int64) * H, ROW_BITS, D_NOPE, NQ)


#: Oᵀ's row m is value dim m (bits 0-8 in place) when the PV reads V straight from the K tile (``V_FROM_K``)
NATURAL_ROW_BITS: gl.constexpr = gl.constexpr((0, 1, 2, 3, 4, 5, 6, 7, 8))


@gluon.jit
def _store_rows(o0, o1, o2, o3, lse, DST, DST_LSE, base, n_valid, D_NOPE: gl.constexpr, NQ: gl.constexpr):
    """Rows ``base + n`` (n < n_valid) of DST get the four 128-dim chunks, DST_LSE their LSE."""
    _store_chunk(o0, DST, base, n_valid, 0, D_NOPE, NQ)
    _store_chunk(o1, DST, base, n_valid, 128, D_NOPE, NQ)
    _store_chunk(o2, DST, base, n_valid, 256, D_NOPE, NQ)
    _store_chunk(o3, DST, base, n_valid, 384, D_NOPE, NQ)
    offs_n = gl.arange(0, NQ, layout=lse.type.layout)
    gl.store(DST_LSE + base + offs_n, lse, mask=offs_n < n_valid)


@gluon.jit
def _store_chunk(o, DST, base, n_valid, d0: gl.constexpr, D_NOPE: gl.constexpr, NQ: gl.constexpr):
    """Store value dims [d0, d0 + 128) of the NQ output rows: converted (through shared memory) so that each
    thread writes 4 consecutive dims and a warp 512 contiguous bytes, instead of 4-byte scatter."""
    L: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
    o = gl.convert_layout(o, L)
    offs_d = gl.arange(0, 128, layout=gl.SliceLayout(1, L))
    offs_n = gl.arange(0, NQ, layout=gl.SliceLayout(0, L))
    ptr = DST + (base + offs_n[None, :]) * D_NOPE + d0 + offs_d[:, None]
    gl.store(ptr, o.to(DST.dtype.element_ty), mask=(offs_n < n_valid)[None, :] & (offs_d < 128)[:, None])


@gluon.jit
def _fence_gpu():
    """``fence.acq_rel.gpu`` for this thread: its memory operations before / after are ordered GPU-wide."""
    gl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


#: The last-arriver merge (`_merge_request`): a (partials, value dims, 16 heads) block of head-minor partials, every
#: partial of an element in one thread (the merge is a register reduction), 4 heads of one dim per 16-byte load.
_MERGE_IN: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 8, 4], [1, 4, 1], [2, 1, 0])


@gluon.jit
def _merge_request(PART_O, PART_LSE, OUT, OUT_LSE, p0, n, q_row, MP: gl.constexpr, H: gl.constexpr,
                   D_NOPE: gl.constexpr):  # fmt: skip
    """Merge the `n` (<= MP) head-minor fp32 partials at rows p0 .. p0 + n - 1 (one q row of H heads each) into the
    final output row `q_row` and its LSE, as the reduce would (`triton_decode._reduce_kernel`). Called by the CTA
    that stored the request's last partial, once every other partial is visible (`_stage1_kernel`, ``MERGE_MAX``):
    the loads bypass L1 (``.cg``; another SM wrote them, and this SM's L1 may hold lines of an earlier call). The
    512 dims go in chunks of 128 (up to 4 partials) or 32 (8): at most 64 partial values per thread."""
    CHUNK: gl.constexpr = 128 if MP <= 4 else 32
    # the merged (CHUNK dims, 16 heads) chunk for the output's stores: consecutive dims of one head per thread
    OUT_L: gl.constexpr = gl.BlockedLayout([CHUNK // 32, 1], [32, 1], [1, 4], [0, 1])
    L2D: gl.constexpr = gl.SliceLayout(1, _MERGE_IN)  # (partial, head)
    offs_p = gl.arange(0, MP, layout=gl.SliceLayout(1, L2D))
    offs_h = gl.arange(0, H, layout=gl.SliceLayout(0, L2D))
    pm = offs_p < n
    rows = (p0 + offs_p).to(gl.int64)
    lse = gl.load(PART_LSE + rows[:, None] * H + offs_h[None, :], mask=pm[:, None], other=float("-inf"),
                  cache_modifier=".cg")  # fmt: skip
    m = gl.max(lse, axis=0)
    m_safe = gl.where(m == float("-inf"), 0.0, m)
    w = gl.exp(lse - m_safe[None, :])  # (an empty partial: -inf -> 0)
    wsum = gl.sum(w, axis=0)
    w_safe = gl.where(wsum > 0.0, wsum, 1.0)
    w = w / w_safe[None, :]  # normalised weights: the merged output is sum_p w_p o_p
    w3 = gl.expand_dims(w, 1)  # (MP, 1, H)
    offs_d = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, gl.SliceLayout(2, _MERGE_IN)))
    offs_h3 = gl.arange(0, H, layout=gl.SliceLayout(0, gl.SliceLayout(1, _MERGE_IN)))
    offs_p3 = gl.arange(0, MP, layout=gl.SliceLayout(1, gl.SliceLayout(2, _MERGE_IN)))
    rows3 = (p0 + offs_p3).to(gl.int64)
    pm3 = (offs_p3 < n)[:, None, None]
    od = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, OUT_L))
    oh = gl.arange(0, H, layout=gl.SliceLayout(0, OUT_L))
    out_row = OUT + q_row.to(gl.int64) * H * D_NOPE
    for c in gl.static_range(D_NOPE // CHUNK):
        ptr = (
            PART_O
            + rows3[:, None, None] * (H * D_NOPE)
            + (c * CHUNK + offs_d)[None, :, None] * H
            + offs_h3[None, None, :]
        )
        o_p = gl.load(ptr, mask=pm3, other=0.0, cache_modifier=".cg")
        o = gl.convert_layout(gl.sum(w3 * o_p, axis=0), OUT_L)  # (CHUNK dims, H): dims contiguous per thread
        gl.store(out_row + oh[None, :] * D_NOPE + (c * CHUNK + od)[:, None], o.to(OUT.dtype.element_ty))
    gl.store(OUT_LSE + q_row.to(gl.int64) * H + offs_h, gl.where(wsum > 0.0, m_safe + gl.log(w_safe), float("-inf")))


@gluon.jit
def _stage1_kernel(
    qn_desc, qr_desc,  # TMA descriptors of q viewed as (total_q·16, 576) fp8: dims [0, 512) and [512, 576)
    kn_desc, kr_desc,  # TMA descriptors of the KV rows (rows, 576) fp8: dims [0, 512) and [512, 576)
    CTA_INFO,  # (n_cu, INFO_COLS) int32: first work, end work, first tile, end tile, q row of work 0, rows of tiles 0..
    WORK_INFO,  # (n_work, 8) int32, kv positions in tokens (token_work_info)
    TILE_ROWS,  # int32 KV row of each tile's first token, in the order the CTAs consume them
    OUT, OUT_LSE, PART_O, PART_LSE,
    Q_SCALE, KV_SCALE,  # (1,) fp32 dequantisation scales
    sm_scale,
    TIMELINE_BUF,  # (n_cu, TIMELINE_COLS) int64 when TIMELINE, else any tensor (unused)
    MERGE_INFO,  # (n_work, 4) int32 when MERGE_MAX: counter slot (-1: none), partials n, first partial row, q row
    COUNTERS,  # (slots,) int32, zero between calls: arrivals of this call at each merged request
    H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, MASK_TAIL: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr,
    V_IN_REGS: gl.constexpr,  # the PV's Vᵀ from registers (gluon_hopper_vreg) instead of a Vᵀ buffer
    V_FROM_K: gl.constexpr,  # 16-bit KV: the PV reads Vᵀ straight from the K tile (wgmma transposes 16-bit operands)
    KV_CONVERT: gl.constexpr,  # fp8 KV, bf16 q (a16w8): each fp8 tile converted to one bf16 tile, then as V_FROM_K
    WAIT_PRIOR: gl.constexpr,  # launched as a programmatic dependent: wait for the prior kernel before any TMA
    TIMELINE: gl.constexpr,  # stamp this CTA's row of TIMELINE_BUF (TIMELINE_COLS)
    REPORT: gl.constexpr,  # print the V bank-conflict counts while compiling (sm90_build)
    ABLATE: gl.constexpr,  # 0; 1 skips the QK wgmma, 2 also the PV (timing experiments only: wrong outputs)
    REFILL_AFTER_PV: gl.constexpr,  # issue a stage's refill TMA after the tile's PV (else between softmax and PV);
    # V_FROM_K: the previous tile's stage refilled after this tile's softmax (else right after its wait + a barrier)
    Q_FIRST: gl.constexpr,  # the first work's q TMA before the ring's first tiles (else after them)
    FIRST_BURST: gl.constexpr,  # ring tiles issued at the start (NUM_STAGES: all); the rest once tile 0 has arrived
    WARP_XCHG: gl.constexpr,  # maxima / softmax sums across the 4 warps with one barrier each (`_across_warps`)
    INFO_COLS: gl.constexpr,  # columns of CTA_INFO (`triton_mla.hopper_cta_info`): 5 + the rows of the first tiles
    MERGE_MAX: gl.constexpr,  # 0, or a power of two: requests split in <= MERGE_MAX merged here by their last CTA
    num_warps: gl.constexpr,
):  # fmt: skip
    gl.static_assert(num_warps * 16 == BLOCK_N, "one warpgroup per 64 tokens of a tile (4 warps x 16 rows)")
    gl.static_assert(
        BLOCK_N == 64 or (BLOCK_N == 128 and V_IN_REGS and not WARP_XCHG and MERGE_MAX == 0),
        "the V layouts are written for 64-token tiles, and 128-token tiles on the v-regs path",
    )
    gl.static_assert(D_NOPE == 512, "the value-row orders are written for 512 value dims")
    KV_BITS: gl.constexpr = kn_desc.dtype.primitive_bitwidth  # the KV as stored and TMA'd (the ring's type)
    MMA_BITS: gl.constexpr = qn_desc.dtype.primitive_bitwidth  # the wgmma operands' type: q's
    gl.static_assert(
        (MMA_BITS == 16) == V_FROM_K, "fp8 wgmma reads only K-major operands: 16-bit operands exactly when V_FROM_K"
    )
    gl.static_assert(KV_BITS == MMA_BITS or (KV_CONVERT and KV_BITS == 8 and V_FROM_K),
                     "q and KV of one type, or fp8 KV converted for bf16 q (KV_CONVERT)")  # fmt: skip
    # (V_FROM_K refills a stage one tile late: with one stage it would wait for a tile it has not issued yet)
    gl.static_assert(not V_FROM_K or KV_CONVERT or NUM_STAGES >= 2, "the V_FROM_K ring needs 2 stages")
    gl.static_assert(not (V_FROM_K and (V_IN_REGS or WARP_XCHG or MERGE_MAX > 0 or BLOCK_N != 64 or ABLATE > 0)),
                     "the V_FROM_K path: 64-token tiles, no warp exchange, merge or ablation")  # fmt: skip
    gl.static_assert(NQ == 16 and H == 16, "one q row of 16 heads per work")
    gl.static_assert(NUM_STAGES <= 5 and NUM_STAGES <= INFO_COLS - 5, "CTA_INFO lists the rows of the ring's tiles")
    gl.static_assert(FIRST_BURST >= 1 and FIRST_BURST <= NUM_STAGES, "the first burst is 1 to NUM_STAGES tiles")
    if LAUNCH_DEPENDENTS:  # programmatic dependent launch: the reduce's CTAs may start (and wait) right away
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)  # fmt: skip
    tl_row = TIMELINE_BUF + gl.program_id(0) * TIMELINE_COLS
    if TIMELINE:
        _stamp(tl_row, 0, GLOBAL=True)
        _stamp(tl_row, 2)
    # The CTA's header, the scales and the first tiles' rows: independent loads, so ONE round trip before the
    # first TMAs (loads written between TMA issues would each wait for the previous issue: measured 3.6 us).
    head = CTA_INFO + gl.program_id(0) * INFO_COLS
    w_begin = gl.load(head)
    w_end = gl.load(head + 1)
    t_begin = gl.load(head + 2)
    t_end = gl.load(head + 3)
    q_row0 = gl.load(head + 4)
    row0 = gl.load(head + 5)
    row1 = 0  # (rows of tiles the ring does not hold: never issued)
    row2 = 0
    row3 = 0
    row4 = 0
    if NUM_STAGES > 1:
        row1 = gl.load(head + 6)
    if NUM_STAGES > 2:
        row2 = gl.load(head + 7)
    if NUM_STAGES > 3:
        row3 = gl.load(head + 8)
    if NUM_STAGES > 4:
        row4 = gl.load(head + 9)
    q_scale = gl.load(Q_SCALE)
    v_scale = gl.load(KV_SCALE)
    n_tiles = t_end - t_begin

    # wgmma accumulators (Sᵀ: BLOCK_N × NQ, Oᵀ: 512 × NQ): the 4 or 8 warps along M, N = NQ (16 heads) per instruction
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, NQ, 256 // MMA_BITS])  # fmt: skip
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=4)
    # a row of Pᵀ / Vᵀ: BLOCK_N tokens of the products' type (64 B in fp8, 128 B in bf16)
    T_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BLOCK_N * MMA_BITS // 8, element_bitwidth=MMA_BITS,
                                                  rank=2)  # fmt: skip
    mma_type: gl.constexpr = qn_desc.dtype  # the products' element type (q's): fp8, or bf16 with V_FROM_K

    kn_smem = gl.allocate_shared_memory(kn_desc.dtype, [NUM_STAGES, BLOCK_N, D_NOPE], kn_desc.layout)
    kr_smem = gl.allocate_shared_memory(kr_desc.dtype, [NUM_STAGES, BLOCK_N, D_ROPE], kr_desc.layout)
    qn_smem = gl.allocate_shared_memory(mma_type, [2, NQ, D_NOPE], qn_desc.layout)
    qr_smem = gl.allocate_shared_memory(mma_type, [2, NQ, D_ROPE], qr_desc.layout)
    p_smem = gl.allocate_shared_memory(mma_type, [2, NQ, BLOCK_N], T_LAYOUT)
    if KV_CONVERT:  # the one bf16 tile that QK and PV read (the ring holds the fp8 codes as TMA brought them)
        KB_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        kb_smem = gl.allocate_shared_memory(mma_type, [1, BLOCK_N, D_NOPE], KB_LAYOUT)
        krb_smem = gl.allocate_shared_memory(mma_type, [1, BLOCK_N, D_ROPE], KB_LAYOUT)
    if not V_IN_REGS and not V_FROM_K:
        vt_smem = gl.allocate_shared_memory(mma_type, [2, D_NOPE, BLOCK_N], T_LAYOUT)
    if WARP_XCHG:
        # the 4 warps' per-head values of `_across_warps`: slot 0 for the tiles' maxima (a tile's reads precede the
        # barrier after its P store, which the next tile passes before it writes), 1 / 2 for the works' softmax sums by
        # work parity (a work without tiles has no barrier between the previous epilogue's reads and its write)
        xchg_smem = gl.allocate_shared_memory(gl.float32, [3, 4, NQ], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    fence_async_shared()
    if WAIT_PRIOR:  # everything above is plan data and setup; q, the KV and our outputs belong to the stream order
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    # Fill the ring and fetch the first work's q before anything else. With Q_FIRST, q's 18 KB go out ahead of the
    # ring's tiles: issued after them, q queues behind up to 5 x 36 KB per SM and the first tile cannot start
    # before it arrives.
    if Q_FIRST:  # noqa: SIM102
        if w_begin < w_end:
            _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row0, 0, H)
    _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row0, 0, n_tiles, NUM_STAGES)
    if NUM_STAGES > 1 and FIRST_BURST > 1:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, 1, n_tiles, NUM_STAGES)
    if NUM_STAGES > 2 and FIRST_BURST > 2:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row2, 2, n_tiles, NUM_STAGES)
    if NUM_STAGES > 3 and FIRST_BURST > 3:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row3, 3, n_tiles, NUM_STAGES)
    if NUM_STAGES > 4 and FIRST_BURST > 4:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row4, 4, n_tiles, NUM_STAGES)
    if not Q_FIRST:  # noqa: SIM102
        if w_begin < w_end:
            _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row0, 0, H)
    if TIMELINE:
        _stamp(tl_row, 4)
    # The row of the next refill is always loaded one tile ahead (a load in the refill's path would stall the CTA).
    row_pf = gl.load(TILE_ROWS + t_begin + NUM_STAGES, mask=n_tiles > NUM_STAGES, other=0)

    # Every scalar factor of the scores in one multiply, base 2: S·log2(e) = (q·k codes)·sm·s_q·s_kv·log2(e).
    qk_scale = sm_scale * q_scale * v_scale * 1.4426950408889634
    offs_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))

    it = 0  # tiles consumed by this CTA (ring position and phase)
    for w in range(w_begin, w_end):
        j = w - w_begin
        info = WORK_INFO + w * 8
        partial_loc, qo_start, kv_start, kv_end = _work_row(info)
        qb = j % 2
        mbarrier.wait(q_bar.index(qb), (j // 2) & 1)
        if w + 1 < w_end:  # buffer (j+1) % 2 held work w-1's q, whose MMAs all completed in its epilogue
            _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, gl.load(info + 10), j + 1, H)  # next work's q row
        q_nope_t = qn_smem.index(qb).permute((1, 0))  # (512, NQ): the B operand, reduction dim contiguous
        q_rope_t = qr_smem.index(qb).permute((1, 0))

        m_i = gl.full([NQ], float("-inf"), gl.float32, gl.SliceLayout(0, ACC))
        l_acc = gl.zeros([BLOCK_N, NQ], gl.float32, ACC)
        o_acc = warpgroup_mma_init(gl.zeros([D_NOPE, NQ], gl.float32, ACC))
        for start in range(kv_start, kv_end, BLOCK_N):
            row_nx = gl.load(TILE_ROWS + t_begin + it + NUM_STAGES + 1, mask=it + NUM_STAGES + 1 < n_tiles, other=0)
            if V_FROM_K and not KV_CONVERT:
                # the row of this tile's refill (tile it-1+NUM_STAGES, one tile late), loaded here so the wait hides it.
                # (A first version carried it in a variable from the previous tile; in the IR Triton 3.6 made of it the
                # loop over works did not carry that variable, so each work restarted from its initial value: a CTA's
                # second work read wrong KV rows, which the H200 tests caught.)
                row_rf = gl.load(TILE_ROWS + t_begin + it - 1 + NUM_STAGES,
                                 mask=(it > 0) & (it - 1 + NUM_STAGES < n_tiles), other=0)  # fmt: skip
            s = it % NUM_STAGES
            mbarrier.wait(ready.index(s), (it // NUM_STAGES) & 1)
            if TIMELINE:  # noqa: SIM102 (a constexpr test: compiled out when False)
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + it)
            if FIRST_BURST < NUM_STAGES:  # noqa: SIM102
                if it == 0:  # the first burst has landed: the rest of the ring goes out now (`_issue_deferred`)
                    _issue_deferred(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, row2, row3, row4, n_tiles,
                                    NUM_STAGES, FIRST_BURST)  # fmt: skip
            kn = kn_smem.index(s)
            if KV_CONVERT:
                # PV(it-1) read the bf16 tile: complete in this warp, then (barrier) in every warp, before it is
                # overwritten with this tile's codes as bf16 (exact: every e4m3 value is a bf16 value)
                o_cur = warpgroup_mma_wait(0, deps=(o_acc,))
                _cta_barrier()
                # (the one buffer indexed by a value the compiler cannot fold, 0: with a constant address ptxas
                # computes the 68 wgmma descriptors of the tile once, before the loop, and spills them)
                zero = (it < 0).to(gl.int32)
                kb = kb_smem.index(zero)
                krb = krb_smem.index(zero)
                _convert_tile(kn, kb, kv_end - start, MASK_TAIL, BLOCK_N, D_NOPE)
                _convert_tile(kr_smem.index(s), krb, BLOCK_N, False, BLOCK_N, D_ROPE)  # (rope: masked scores: no zeros)
                fence_async_shared()  # generic-proxy writes before the wgmma's async reads
                _cta_barrier()  # every warp's part converted, and every warp done reading stage s: refill it now
                _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_pf, it + NUM_STAGES, n_tiles, NUM_STAGES)
                kn = kb
            if V_IN_REGS:
                # PV(it-1) has run while this tile arrived; once it completes, its A registers (V of tile it-1) and
                # its P buffer are free. (Waiting for it only after issuing QK, with a partial wait_group, makes
                # ptxas serialise every wgmma of the kernel; waiting for both after the V load spills.)
                o_cur = warpgroup_mma_wait(0, deps=(o_acc,))
            # QK on the tensor cores, asynchronously ...
            if ABLATE >= 1:  # ablation: scores 0 (the QK's time is what this saves)
                s_tok = gl.zeros([BLOCK_N, NQ], gl.float32, ACC)
            else:
                s_tok = warpgroup_mma(kn, q_nope_t, gl.zeros([BLOCK_N, NQ], gl.float32, ACC), use_acc=False,
                                      is_async=True)  # fmt: skip
                if KV_CONVERT:
                    s_tok = warpgroup_mma(krb, q_rope_t, s_tok, is_async=True)
                else:
                    s_tok = warpgroup_mma(kr_smem.index(s), q_rope_t, s_tok, is_async=True)
            # ... while the CUDA cores load this tile's V: into the PV's A-operand registers, or transposed into Vᵀ
            if V_IN_REGS:
                v_op = _pv_operand(kn, start, kv_end, DOT_A, MASK_TAIL, REPORT, BLOCK_N)
                s_acc = warpgroup_mma_wait(0, deps=(s_tok,))
            elif KV_CONVERT:  # (PV(it-1) completed before the conversion)
                s_acc = warpgroup_mma_wait(0, deps=(s_tok,))
            elif V_FROM_K:  # QK(it) and this warp's part of PV(it-1) complete
                s_acc, o_cur = warpgroup_mma_wait(0, deps=(s_tok, o_acc))
                if not REFILL_AFTER_PV:  # noqa: SIM102
                    # early refill (a timing variant): one more barrier, then tile it-1's stage goes out before the
                    # softmax instead of after it, so the TMA overlaps this tile's softmax and PV
                    if it > 0:
                        _cta_barrier()  # every warp past its wait: PV(it-1) no longer reads tile it-1's stage
                        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_rf, it - 1 + NUM_STAGES, n_tiles,
                                       NUM_STAGES)  # fmt: skip
                if MASK_TAIL:  # noqa: SIM102
                    if kv_end - start < BLOCK_N:  # a work's last tile of a paged cache: zero its tail (NaN-safe PV)
                        _zero_tail_rows(kn, kv_end - start, BLOCK_N, D_NOPE)
            else:
                v_t = _load_v(kn, start, kv_end, BLOCK_N, D_NOPE, MASK_TAIL, REPORT)
                s_acc, o_cur = warpgroup_mma_wait(0, deps=(s_tok, o_acc))  # QK(it) and PV(it-1) complete
                vt = vt_smem.index(it % 2)  # PV(it-2) read this buffer and completed in the previous iteration
                _store_vt(v_t, vt, REPORT)
            if TIMELINE:  # noqa: SIM102
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + TIMELINE_MAX + it)

            # Online softmax over the tile's tokens (axis 0), per head column, in base 2.
            sc = s_acc * qk_scale
            sc = gl.where(((start + offs_tok) < kv_end)[:, None], sc, float("-inf"))
            if WARP_XCHG:  # per-warp maxima (shuffles), one smem exchange, one barrier (`_across_warps`)
                m_new = gl.maximum(m_i, _across_warps(sc, xchg_smem.index(0), True, NQ))
            else:  # Triton's cross-warp reduction (3.6: two smem rounds, two barriers)
                m_new = gl.maximum(m_i, gl.max(sc, axis=0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(sc - m_new[None, :])
            l_acc = l_acc * alpha[None, :] + p
            m_i = m_new
            pb = it % 2
            if V_IN_REGS:
                p_smem.index(pb).store(_p_operand(p, mma_type, NQ, BLOCK_N))  # P rounded to the KV's fp8 (aiter's a8w8)
            else:
                p_smem.index(pb).store(p.to(mma_type).permute([1, 0]))  # Pᵀ as (NQ, 64): tokens contiguous
            fence_async_shared()  # generic-proxy writes (Vᵀ, Pᵀ) and reads (V from the K tile) before async ones
            _cta_barrier()  # ... by all four warps: the stage is free and Vᵀ / Pᵀ complete
            if V_FROM_K and not KV_CONVERT:  # noqa: SIM102
                # every warp has waited for PV(it-1), which read V from tile it-1's stage: refill that stage now
                if REFILL_AFTER_PV:  # noqa: SIM102
                    if it > 0:
                        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_rf, it - 1 + NUM_STAGES, n_tiles,
                                       NUM_STAGES)  # fmt: skip
            elif not REFILL_AFTER_PV and not KV_CONVERT:
                _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_pf, it + NUM_STAGES, n_tiles, NUM_STAGES)

            o_cur = o_cur * alpha[None, :]
            if ABLATE >= 2:  # ablation: no PV (and, v-regs, no V operand: the compiler drops its loads)
                o_acc = warpgroup_mma_init(o_cur)
            elif V_IN_REGS:
                o_acc = warpgroup_mma(v_op, p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            elif V_FROM_K:  # Vᵀ = the K tile's value dims read transposed (M-major A: 16-bit types only)
                o_acc = warpgroup_mma(kn.permute((1, 0)), p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            else:
                o_acc = warpgroup_mma(vt, p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            if TIMELINE:  # noqa: SIM102
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + 2 * TIMELINE_MAX + it)
            if REFILL_AFTER_PV and not V_FROM_K:  # PV(it) reads registers / Vᵀ and Pᵀ, not this stage: refill it now
                _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_pf, it + NUM_STAGES, n_tiles, NUM_STAGES)
            row_pf = row_nx
            it += 1
        o = warpgroup_mma_wait(0, deps=(o_acc,))
        if TIMELINE:  # the last PV has completed; then the work's softmax sum
            _stamp(tl_row, 5)
        # the work's softmax sum per head, reduced once from the per-thread running sums
        if WARP_XCHG:
            l_sum = _across_warps(l_acc, xchg_smem.index(1 + j % 2), False, NQ)
        else:
            l_sum = gl.sum(l_acc, axis=0)
        if TIMELINE:  # (a data dependence orders the stamp after the sum: >= 0, so the offset is always 0; the sum
            # over the 16 heads is extra work that the unstamped kernel does not do)
            _stamp(tl_row + (gl.sum(l_sum, axis=0) < 0.0).to(gl.int64), 6)
        if V_IN_REGS:
            _store_work_vregs(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                              H, NQ, D_NOPE, BLOCK_N)  # fmt: skip
        else:
            _store_work_vt(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                           H, NQ, D_NOPE, V_FROM_K)  # fmt: skip
        if TIMELINE:  # noqa: SIM102
            if j < TIMELINE_MAX:
                _stamp(tl_row, 8 + 3 * TIMELINE_MAX + j)
        if MERGE_MAX > 0:  # noqa: SIM102
            # A split of a request merged in stage 1 (no reduce for it): count this partial in; the CTA that stores
            # the request's last partial merges them all. Nobody waits, so there is no deadlock whatever the order.
            # (the work's merge row in one round trip: plan data, read-only, so before the fences)
            slot = gl.load(MERGE_INFO + w * 4)
            n_parts = gl.load(MERGE_INFO + w * 4 + 1)
            first_row = gl.load(MERGE_INFO + w * 4 + 2)
            q_row = gl.load(MERGE_INFO + w * 4 + 3)
            if slot >= 0:
                _cta_barrier()  # every warp's partial stores issued before the release below
                _fence_gpu()
                arrived = gl.atomic_add(COUNTERS + slot, 1, sem="acq_rel", scope="gpu")
                if arrived == n_parts - 1:  # the last one: every other partial is visible from here
                    _fence_gpu()  # (the acquire was thread 0's; every thread orders its loads after it)
                    gl.store(COUNTERS + slot, 0)  # (the next call counts from 0; it starts after this grid ends)
                    _merge_request(PART_O, PART_LSE, OUT, OUT_LSE, first_row, n_parts, q_row, MERGE_MAX, H, D_NOPE)

    if TIMELINE:
        _stamp(tl_row, 3)
        _stamp(tl_row, 1, GLOBAL=True)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(q_bar.index(i))


stage1_kernel = _stage1_kernel


def make_descriptors(q2d, kv, nq: int, block_n: int = BLOCK_N) -> tuple:
    """TMA descriptors ``(qn, qr, kn, kr)`` of q viewed as ``(total_q·16, 576)`` and the KV rows ``(rows, 576)``
    (both fp8, both bf16, or bf16 q with fp8 KV for ``KV_CONVERT``; contiguous): 512 nope + 64 rope dims, blocks of
    ``nq`` q rows and `block_n` tokens (64, or 128 for the two-warpgroup tile)."""
    rows, d = int(kv.shape[0]), int(kv.shape[1])
    nope, rope = 512, d - 512

    def layouts(bits: int) -> tuple:  # (nope, rope) shared layouts of a `bits`-bit element type
        return (
            gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bits, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=min(128, rope * bits // 8), element_bitwidth=bits, rank=2),
        )

    qn_l, qr_l = layouts(q2d.element_size() * 8)
    kn_l, kr_l = layouts(kv.element_size() * 8)
    qrows = int(q2d.shape[0])
    qn = TensorDescriptor(q2d, [qrows, nope], [d, 1], [nq, nope], qn_l)
    qr = TensorDescriptor(q2d[:, nope:], [qrows, rope], [d, 1], [nq, rope], qr_l)
    kn = TensorDescriptor(kv, [rows, nope], [d, 1], [block_n, nope], kn_l)
    kr = TensorDescriptor(kv[:, nope:], [rows, rope], [d, 1], [block_n, rope], kr_l)
    return qn, qr, kn, kr

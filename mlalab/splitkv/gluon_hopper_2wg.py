"""The sm_90 stage 1 with two warpgroups per CTA, each streaming alternate 64-token tiles: split-KV inside the CTA.

Read `gluon_hopper` first (one warpgroup per CTA, a 3-stage TMA ring, fp8 wgmma for both products, V from
registers on the v-regs path of `gluon_hopper_vreg`). There a CTA's tile time is a serial chain (QK → softmax →
PV) of about 1.06 µs, close to the ~1.09 µs in which HBM delivers a 36 KB tile to each of 128 SMs
(data/profiles/h200_2026-12-03s9_ablation_profile.csv): the tensor cores idle during the softmax, the CUDA cores
during the QK, and the stream never catches up with the burst that fills the ring at the start.

Here the CTA has 8 warps in two partitions (``gl.warp_specialize``) running the same consumer code: warpgroup
``g`` takes the CTA's tiles ``g, g + 2, g + 4, ...`` (the stream of `gluon_hopper`, flattened across works), from
one TMA ring of ``RING`` buffers shared by both (tile ``g`` in buffer ``g % RING``, refilled with tile ``g + RING`` by
the warpgroup that consumed it, whichever warpgroup that tile belongs to), each with its own online-softmax state and
Oᵀ accumulator. The two are never
synchronised inside a work, so one's softmax runs while the other's wgmmas use the tensor cores; the warp
schedulers interleave them. At a work's end the warpgroup that did *not* stream the work's last tile hands its
(Oᵀ, running max, softmax sum) to the other through shared memory (32 KB, stored in the accumulator's own register
order: 256 contiguous bytes per warp instruction) and the other merges the two states — the same LSE merge as the
reduce, inside the CTA — and writes the work's output or partial exactly as `gluon_hopper` does. A work of one tile
needs no hand-over. Both warpgroups read the work's q from one double-buffered q buffer; warpgroup 0 fetches the
next work's q once both have released the buffer (``q_free``, two arrivals).

Shared memory: ``RING`` × 36 KB of ring + 18 KB of q + 4 KB of Pᵀ + 32 KB of hand-over (``RING`` = 4: 199 KB).
Measured on the H200 (session 10, `scripts/hopper_ab.py`, data/profiles/h200_2026-12-03_ab_2wg.csv and
``..._ab_2wg_ring.csv``): correct, but slower than the one-warpgroup default on every competition shape — 0.779x-0.814x
of FlashMLA fp8's geomean for rings of 2-4 tiles against 0.699x-0.702x in the same processes; ~2 µs more even where a
CTA has one tile and the second warpgroup idles (4 x 1024: 7.68 vs 5.92 µs), not because of the reduce's dependent
launch (same loss without it) nor the ring depth. Kept, off (`KernelConfig.hopper_warpgroups`), for the next look: it
has no time-line stamps yet. With a paged cache (``MASK_TAIL``) ptxas spills (~300 B per thread), and a 1-tile ring
spills a little; correct either way.

Constraints: those of the v-regs path (a8w8, 16 heads × 576 dims, q_len 1, tiles of contiguous rows), no
time-line stamps, no ablations, no in-stage-1 merge.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from .gluon_hopper import _cta_barrier, _issue_kv_tile, _issue_q, _work_row
from .gluon_hopper_vreg import _p_operand, _pv_operand, _store_work_vregs

__all__ = ["stage1_kernel", "HANDOVER_LAYOUT"]

#: The hand-over buffer of Oᵀ (512 × 16 fp32) in the wgmma accumulator's own order: element-offset bit i holds the
#: (row, column) bit listed i-th. The first six are the bits of a register pair and a warp's 32 lanes (column 1; lanes:
#: columns 2, 4 and rows 1, 2, 4), so each store instruction of a warp writes 256 contiguous bytes; then the other
#: register bits (rows 8, column 8, rows 64, 128, 256) and the warp bits (rows 16, 32).
HANDOVER_LAYOUT = gl.SharedLinearLayout(
    offset_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [8, 0], [0, 8], [64, 0], [128, 0], [256, 0],
                  [16, 0], [32, 0]],
)  # fmt: skip


@gluon.jit
def _consumer(WG: gl.constexpr, qn_desc, qr_desc, kn_desc, kr_desc, kn_smem, kr_smem, qn_smem, qr_smem, p_smem,
              x_o, x_ml, ready, used, q_bar, q_free, x_full, x_empty, CTA_INFO, WORK_INFO, TILE_ROWS, OUT, OUT_LSE,
              PART_O, PART_LSE, Q_SCALE, KV_SCALE, sm_scale, H: gl.constexpr, NQ: gl.constexpr,
              D_NOPE: gl.constexpr, BLOCK_N: gl.constexpr, RING: gl.constexpr, MASK_TAIL: gl.constexpr,
              REPORT: gl.constexpr, INFO_COLS: gl.constexpr):  # fmt: skip
    """Warpgroup `WG` (0: the default partition, 1: the worker): every work of the CTA, its own tiles of each."""
    head = CTA_INFO + gl.program_id(0) * INFO_COLS
    w_begin = gl.load(head)
    w_end = gl.load(head + 1)
    t_begin = gl.load(head + 2)
    t_end = gl.load(head + 3)
    q_scale = gl.load(Q_SCALE)
    v_scale = gl.load(KV_SCALE)
    n_tiles = t_end - t_begin

    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NQ, 32])
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=4)
    HEADS: gl.constexpr = gl.SliceLayout(0, ACC)
    fp8: gl.constexpr = kn_desc.dtype
    qk_scale = sm_scale * q_scale * v_scale * 1.4426950408889634  # every scalar factor of the scores, base 2
    offs_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))

    it = 0  # the CTA's tiles before the current work (both warpgroups count them alike)
    n_x = 0  # hand-overs so far (the phase of x_full / x_empty)
    for w in range(w_begin, w_end):
        j = w - w_begin
        info = WORK_INFO + w * 8
        partial_loc, qo_start, kv_start, kv_end = _work_row(info)
        n = (kv_end - kv_start + BLOCK_N - 1) // BLOCK_N  # the work's tiles: this warpgroup's are t0, t0 + 2, ...
        qb = j % 2
        if WG == 0:  # noqa: SIM102
            if w + 1 < w_end:  # the next work's q into the other buffer, once both warpgroups released it (work j-1)
                if j >= 1:
                    mbarrier.wait(q_free.index(1 - qb), ((j - 1) // 2) & 1)
                _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, gl.load(info + 10), j + 1, H)
        mbarrier.wait(q_bar.index(qb), (j // 2) & 1)
        q_nope_t = qn_smem.index(qb).permute((1, 0))
        q_rope_t = qr_smem.index(qb).permute((1, 0))

        m_i = gl.full([NQ], float("-inf"), gl.float32, HEADS)
        l_acc = gl.zeros([BLOCK_N, NQ], gl.float32, ACC)
        o_acc = warpgroup_mma_init(gl.zeros([D_NOPE, NQ], gl.float32, ACC))
        t0 = (it + WG) % 2
        for t in range(t0, n, 2):
            g = it + t  # the tile's place in the CTA's stream; this warpgroup's tile number g // 2
            c = g // 2
            b = g % RING
            start = kv_start + t * BLOCK_N
            # the row of this buffer's refill (tile g + RING), loaded now: it is needed after the softmax
            row_nx = gl.load(TILE_ROWS + t_begin + g + RING, mask=g + RING < n_tiles, other=0)
            if RING % 2 == 1 and g >= RING:  # noqa: SIM102
                # An odd ring hands each buffer from one warpgroup to the other: this warpgroup may come to tile g
                # before the other has consumed the buffer's previous tile g - RING (even before it arrived), and
                # a wait on the parity of g's phase of `ready` would then pass at once. `used` counts consumptions.
                mbarrier.wait(used.index(b), ((g - RING) // RING) & 1)
            mbarrier.wait(ready.index(b), (g // RING) & 1)
            kn = kn_smem.index(b)
            o_cur = warpgroup_mma_wait(0, deps=(o_acc,))  # PV of this warpgroup's previous tile
            s_tok = warpgroup_mma(kn, q_nope_t, gl.zeros([BLOCK_N, NQ], gl.float32, ACC), use_acc=False,
                                  is_async=True)  # fmt: skip
            s_tok = warpgroup_mma(kr_smem.index(b), q_rope_t, s_tok, is_async=True)
            v_op = _pv_operand(kn, start, kv_end, DOT_A, MASK_TAIL, REPORT and WG == 0, BLOCK_N)
            s_acc = warpgroup_mma_wait(0, deps=(s_tok,))

            sc = s_acc * qk_scale
            sc = gl.where(((start + offs_tok) < kv_end)[:, None], sc, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(sc - m_new[None, :])
            l_acc = l_acc * alpha[None, :] + p
            m_i = m_new
            pb = WG * 2 + c % 2  # this warpgroup's Pᵀ buffers; PV(c - 2) read this one and has completed
            p_smem.index(pb).store(_p_operand(p, fp8, NQ, BLOCK_N))
            fence_async_shared()  # the P stores and the V loads from the stage, before the async proxy's accesses
            _cta_barrier()  # (inside a partition: its 4 warps)
            o_cur = o_cur * alpha[None, :]
            o_acc = warpgroup_mma(v_op, p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            if RING % 2 == 1:
                mbarrier.arrive(used.index(b), count=1)  # (after the barrier above: every warp is done with it)
            # (the refill's tile belongs to either warpgroup: the ring is shared, each buffer refilled by its consumer)
            _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_nx, g + RING, n_tiles, RING)
        o = warpgroup_mma_wait(0, deps=(o_acc,))
        _cta_barrier()  # every warp's QKs of this work have completed before q's buffer is released
        mbarrier.arrive(q_free.index(qb), count=1)
        l_sum = gl.sum(l_acc, axis=0)

        # The work's two halves: the warpgroup of its last tile merges (work without tiles: warpgroup 0 writes it).
        last = gl.where(n > 0, (it + n - 1) % 2, 0)
        both = n >= 2
        if last == WG:
            if both:
                mbarrier.wait(x_full, n_x & 1)
                o_x = x_o.load(ACC)
                m_x = x_ml.slice(0, NQ).load(HEADS)
                l_x = x_ml.slice(NQ, NQ).load(HEADS)
                _cta_barrier()  # every warp has read the hand-over before it is released
                mbarrier.arrive(x_empty, count=1)
                m_new = gl.maximum(m_i, m_x)  # both finite: each half has a tile, each tile a token
                a = gl.exp2(m_i - m_new)
                bx = gl.exp2(m_x - m_new)
                o = o * a[None, :] + o_x * bx[None, :]
                l_sum = l_sum * a + l_x * bx
                m_i = m_new
            _store_work_vregs(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                              H, NQ, D_NOPE, BLOCK_N)  # fmt: skip
        else:
            if both:
                mbarrier.wait(x_empty, (n_x & 1) ^ 1)  # (a fresh barrier's phase "1" counts as complete)
                if REPORT and WG == 1:  # compile-time count for `sm90_build`
                    gl.static_print("mlalab hopper: hand-over bank conflicts =", gl.bank_conflicts(o.type, x_o.type))
                x_o.store(o)
                x_ml.slice(0, NQ).store(m_i)
                x_ml.slice(NQ, NQ).store(l_sum)
                _cta_barrier()  # every warp's stores before the one arrival
                mbarrier.arrive(x_full, count=1)
        n_x += both.to(gl.int32)
        it += n


@gluon.jit
def stage1_kernel(
    qn_desc, qr_desc, kn_desc, kr_desc,  # as `gluon_hopper._stage1_kernel`
    CTA_INFO, WORK_INFO, TILE_ROWS, OUT, OUT_LSE, PART_O, PART_LSE, Q_SCALE, KV_SCALE, sm_scale,
    H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    BLOCK_N: gl.constexpr,
    RING: gl.constexpr,  # ring buffers (tiles in flight), 1 to 4, shared by the two warpgroups
    MASK_TAIL: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr, WAIT_PRIOR: gl.constexpr,
    INFO_COLS: gl.constexpr,
    WORKER_REGS: gl.constexpr,  # registers per thread of the worker warpgroup (the default one gets the rest)
    REPORT: gl.constexpr,  # print the V load's and the hand-over's bank conflicts while compiling (sm90_build)
    num_warps: gl.constexpr,
):  # fmt: skip
    gl.static_assert(num_warps == 4, "the default partition is one warpgroup; the worker adds the second")
    gl.static_assert(BLOCK_N == 64 and D_NOPE == 512 and NQ == 16 and H == 16, "64-token tiles, 16 heads x 512")
    gl.static_assert(RING <= 4 and RING <= INFO_COLS - 5, "CTA_INFO lists the rows of the ring's first tiles")
    if LAUNCH_DEPENDENTS:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)  # fmt: skip
    head = CTA_INFO + gl.program_id(0) * INFO_COLS
    w_begin = gl.load(head)
    w_end = gl.load(head + 1)
    t_begin = gl.load(head + 2)
    t_end = gl.load(head + 3)
    q_row0 = gl.load(head + 4)
    row0 = gl.load(head + 5)
    if RING > 1:
        row1 = gl.load(head + 6)
    if RING > 2:
        row2 = gl.load(head + 7)
    if RING > 3:
        row3 = gl.load(head + 8)
    n_tiles = t_end - t_begin

    T_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BLOCK_N, element_bitwidth=8, rank=2)
    fp8: gl.constexpr = kn_desc.dtype
    kn_smem = gl.allocate_shared_memory(fp8, [RING, BLOCK_N, D_NOPE], kn_desc.layout)
    kr_smem = gl.allocate_shared_memory(fp8, [RING, BLOCK_N, D_ROPE], kr_desc.layout)
    qn_smem = gl.allocate_shared_memory(fp8, [2, NQ, D_NOPE], qn_desc.layout)
    qr_smem = gl.allocate_shared_memory(fp8, [2, NQ, D_ROPE], qr_desc.layout)
    p_smem = gl.allocate_shared_memory(fp8, [4, NQ, BLOCK_N], T_LAYOUT)  # two per warpgroup
    x_o = gl.allocate_shared_memory(gl.float32, [D_NOPE, NQ], HANDOVER_LAYOUT)
    x_ml = gl.allocate_shared_memory(gl.float32, [2 * NQ], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # max, sum
    ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    used = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())  # odd rings: consumptions
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    x_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    x_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RING):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(used.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(q_free.index(i), count=2)  # one arrival per warpgroup
    mbarrier.init(x_full, count=1)
    mbarrier.init(x_empty, count=1)
    fence_async_shared()
    if WAIT_PRIOR:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    # q of the first work, then the ring's tiles in stream order (each warpgroup's first, then their second ones)
    if w_begin < w_end:
        _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row0, 0, H)
    _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row0, 0, n_tiles, RING)
    if RING > 1:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, 1, n_tiles, RING)
    if RING > 2:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row2, 2, n_tiles, RING)
    if RING > 3:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row3, 3, n_tiles, RING)

    # Both partitions run `_consumer`, `WG` 0 (the default) and 1 (the worker); the argument tuples are written out in
    # the call (a tuple bound to a name would turn the constexprs into tensors).
    gl.warp_specialize([
        (_consumer, (0, qn_desc, qr_desc, kn_desc, kr_desc, kn_smem, kr_smem, qn_smem, qr_smem, p_smem, x_o, x_ml,
                     ready, used, q_bar, q_free, x_full, x_empty, CTA_INFO, WORK_INFO, TILE_ROWS, OUT, OUT_LSE, PART_O,
                     PART_LSE, Q_SCALE, KV_SCALE, sm_scale, H, NQ, D_NOPE, BLOCK_N, RING, MASK_TAIL, REPORT,
                     INFO_COLS)),
        (_consumer, (1, qn_desc, qr_desc, kn_desc, kr_desc, kn_smem, kr_smem, qn_smem, qr_smem, p_smem, x_o, x_ml,
                     ready, used, q_bar, q_free, x_full, x_empty, CTA_INFO, WORK_INFO, TILE_ROWS, OUT, OUT_LSE, PART_O,
                     PART_LSE, Q_SCALE, KV_SCALE, sm_scale, H, NQ, D_NOPE, BLOCK_N, RING, MASK_TAIL, REPORT,
                     INFO_COLS)),
    ], [4], [WORKER_REGS])  # fmt: skip
    for i in gl.static_range(RING):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(used.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(q_bar.index(i))
        mbarrier.invalidate(q_free.index(i))
    mbarrier.invalidate(x_full)
    mbarrier.invalidate(x_empty)

"""The sm_90 Gluon stage 1 with V in registers: the PV product takes Vᵀ as its *register* A operand.

Same contract, numerics and constraints as `gluon_hopper` (read that module first: fp8 wgmma for both products,
tokens as M for the scores, value dims as M for the values, TMA ring across work boundaries, one warpgroup per
CTA). What differs is how Vᵀ reaches the tensor cores. `gluon_hopper` transposes each tile's V into a Vᵀ buffer in
shared memory (16-byte loads and stores) and the PV wgmma reads it back: 64 KB of shared-memory traffic per tile
on top of what the scores read, and 64 KB of Vᵀ buffers. Here each thread loads 16 tokens × 16 dims of V from the
K tile (16-byte loads, 0 bank conflicts) in a layout whose lane and warp bits are those of the wgmma A-operand
fragment of Vᵀ once rows and tokens are relabelled (`_V_REGS`, `_pv_operand`), so the operand is built by byte
permutes inside each thread's registers (``PRMT``) and no Vᵀ is ever stored. Shared memory: 94 KB at 2 stages,
131 KB at 3. Row m of Oᵀ holds value dim π(m) and column k of Vᵀ/Pᵀ token σ(k) (bit permutations chosen for the
conflict-free loads); the epilogue undoes π with a register renaming and stores 16 consecutive dims per thread.

The price: ptxas serialises every wgmma of the kernel when the PV of the previous tile is waited for with a
partial ``wait_group`` after the next QK is issued (warning C7514), and waiting for both after the V load spills;
so PV(i-1) is waited for before QK(i) is issued, and the tensor cores idle during each softmax. Measured on the
H200 (data/profiles/h200_2026-12-02_ab_hopper.csv, all else equal): faster than `gluon_hopper` on long tile
streams (128 × 8192: 149.5 vs 164.1 us, within 1 % of the copy-bandwidth floor in that run; 64 × 8192: 84.8 vs
90.1), slower on
short ones (4 × 1024: 9.2 vs 8.5 us). `TritonDecoder` picks by the plan (`triton_mla.HOPPER_LONG_STREAM`).
Tried and dropped on the same run (12 competition shapes, geomean): two CTAs per SM (264 plan slots, 2 stages;
30.6 vs 25.6 us) and, on top of that, merging the split requests inside this kernel (a spin-wait per request on
a global counter, no reduce launch; 34.4 us).
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

from .gluon_hopper import (
    BLOCK_N,
    TIMELINE_COLS,
    TIMELINE_MAX,
    TensorDescriptor,
    _cta_barrier,
    _stamp,
    _tma_load,
    make_descriptors,
)

__all__ = ["BLOCK_N", "stage1_kernel", "make_descriptors", "TensorDescriptor"]

#: V of a tile in registers, as loaded from the K tile (token t, value dim d). Its lane and warp bits are those of
#: the wgmma A-operand layout of Vᵀ (`_pv_operand`) once rows and columns are relabelled (m, k) with d = π(m) and
#: t = σ(k), so the conversion to that operand moves bytes only inside each thread's registers. Each thread holds
#: 16 consecutive dims of 16 tokens: 16-byte loads; the 8 lanes of a load phase see tokens t0, t1 and dim bit 6, so
#: the 128-byte swizzle of the K tile spreads them over 8 distinct bank groups (0 conflicts, counted at compile time
#: with ``REPORT``).
_V_REGS = gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [4, 0], [8, 0], [16, 0], [32, 0]],
    lane_bases=[[1, 0], [2, 0], [0, 64], [0, 16], [0, 32]],
    warp_bases=[[0, 128], [0, 256]],
    block_bases=[],
    shape=[64, 512],
)

#: Oᵀ in natural value-dim order, registers ordered so each thread's 16 consecutive dims come first (16-byte stores;
#: a warp writes 128 contiguous dims of a head row). Same lanes and warps as the accumulator: a register renaming.
_O_STORE = gl.DistributedLinearLayout(
    reg_bases=[[1, 0], [2, 0], [4, 0], [8, 0], [0, 1], [0, 8]],
    lane_bases=[[0, 2], [0, 4], [64, 0], [16, 0], [32, 0]],
    warp_bases=[[128, 0], [256, 0]],
    block_bases=[],
    shape=[512, 16],
)


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
def _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row, j, H: gl.constexpr):
    """TMA the 16 head rows of q row `q_row` (the CTA's j-th work) into q buffer ``j % 2``."""
    b = j % 2
    bar = q_bar.index(b)
    mbarrier.expect(bar, qn_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    _tma_load(qn_desc, [q_row * H, 0], bar, qn_smem.index(b))  # q viewed as (total_q · 16, 576)
    _tma_load(qr_desc, [q_row * H, 0], bar, qr_smem.index(b))


@gluon.jit
def _pv_operand(kn, start, kv_end, DOT_A: gl.constexpr, MASK_TAIL: gl.constexpr, REPORT: gl.constexpr):
    """Vᵀ of the tile in `kn` as the register A operand of the PV wgmma: (512 rows m, 64 tokens k).

    Loaded in `_V_REGS`, then relabelled: row m holds value dim ``d = π(m)`` and column k token ``t = σ(k)``, with
    ``π: m0..m8 -> d6 d4 d5 d0 d7 d8 d1 d2 d3`` and ``σ`` swapping token bits (0, 1) with (2, 3). Pᵀ uses the same
    token order σ (`_p_operand`) and the epilogue undoes π (`_store_work`). ``MASK_TAIL`` (paged caches): tokens
    past the work's end are zeroed, since a page's unused slots may hold anything and 0 · NaN would poison Oᵀ."""
    v = kn.load(_V_REGS)
    if REPORT:  # compile-time count for `sm90_build` (printed by the compiler, not at run time)
        gl.static_print("mlalab hopper: V load bank conflicts =", gl.bank_conflicts(v.type, kn.type))
    if MASK_TAIL and start + 64 > kv_end:
        offs_t = gl.arange(0, 64, layout=gl.SliceLayout(1, _V_REGS))
        v = gl.where(((start + offs_t) < kv_end)[:, None], v, gl.zeros_like(v))
    # t = (X = t5 t4, Y = t3 t2, Z = t1 t0), d = (A = d8 d7, B = d6, C = d5 d4, D = d3 d2 d1, E = d0);
    # m = (D, A, E, C, B) and k = (X, Z, Y), most significant first
    v = v.reshape([4, 4, 4, 4, 2, 4, 8, 2]).permute([6, 3, 7, 5, 4, 0, 2, 1]).reshape([512, 64])
    return gl.convert_layout(v, DOT_A)


@gluon.jit
def _p_operand(p, fp8: gl.constexpr, NQ: gl.constexpr):
    """Pᵀ (NQ, 64 tokens) in fp8 with the token order σ of `_pv_operand` (column k holds token σ(k))."""
    return p.to(fp8).reshape([4, 4, 4, NQ]).permute([0, 2, 1, 3]).reshape([64, NQ]).permute([1, 0])


@gluon.jit
def _store_work(o, m_i, l_acc, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr):  # fmt: skip
    """Normalise one work's Oᵀ (512, NQ) and write it: final bf16 output + LSE, or fp32 partial + LSE."""
    l = gl.sum(l_acc, axis=0)  # (NQ,): the per-thread running sums, reduced once per work
    has = l > 0.0  # an empty work (0-token request): output 0, LSE -inf (the identity of the merge)
    l_safe = gl.where(has, l, 1.0)
    lse = gl.where(has, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o = o * (v_scale / l_safe)[None, :]
    # row m of Oᵀ holds value dim π(m): relabel to natural order m = (D, A, E, C, B) -> d = (A, B, C, D, E)
    o = o.reshape([8, 4, 2, 4, 2, NQ]).permute([1, 4, 3, 0, 2, 5]).reshape([D_NOPE, NQ])
    o = gl.convert_layout(o, _O_STORE)
    offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, _O_STORE))
    offs_n = gl.arange(0, NQ, layout=gl.SliceLayout(0, _O_STORE))
    offs_l = gl.arange(0, NQ, layout=lse.type.layout)
    if partial_loc < 0:  # the request is whole: final output (bf16) at its q row
        base = qo_start.to(gl.int64) * H
        gl.store(OUT + (base + offs_n[None, :]) * D_NOPE + offs_d[:, None], o.to(OUT.dtype.element_ty))
        gl.store(OUT_LSE + base + offs_l, lse)
    else:  # one split of it: fp32 partial at the plan's partial row
        base = partial_loc.to(gl.int64) * H
        gl.store(PART_O + (base + offs_n[None, :]) * D_NOPE + offs_d[:, None], o)
        gl.store(PART_LSE + base + offs_l, lse)


@gluon.jit
def _stage1_kernel(
    qn_desc, qr_desc,  # TMA descriptors of q viewed as (total_q·16, 576) fp8: dims [0, 512) and [512, 576)
    kn_desc, kr_desc,  # TMA descriptors of the KV rows (rows, 576) fp8: dims [0, 512) and [512, 576)
    CTA_INFO,  # (n_cu, 8) int32: first work, end work, first tile, end tile, rows of tiles 0..2, q row of work 0
    WORK_INFO,  # (n_work, 8) int32, kv positions in tokens (token_work_info)
    TILE_ROWS,  # int32 KV row of each tile's first token, in the order the CTAs consume them
    OUT, OUT_LSE, PART_O, PART_LSE,
    Q_SCALE, KV_SCALE,  # (1,) fp32 dequantisation scales
    sm_scale,
    TIMELINE_BUF,  # (n_cu, TIMELINE_COLS) int64 when TIMELINE, else any tensor (unused)
    H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, MASK_TAIL: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr,
    TIMELINE: gl.constexpr,  # stamp this CTA's row of TIMELINE_BUF (gluon_hopper.TIMELINE_COLS)
    REPORT: gl.constexpr,  # print the V-load bank-conflict count while compiling (sm90_build)
    num_warps: gl.constexpr,
):  # fmt: skip
    gl.static_assert(num_warps == 4, "one warpgroup per CTA")
    gl.static_assert(BLOCK_N == 64, "the V register layout is written for 64-token tiles")
    gl.static_assert(D_NOPE == 512, "the value-row order pi is written for 512 value dims")
    gl.static_assert(NQ == 16, "one q row of 16 heads per work")
    gl.static_assert(NUM_STAGES <= 3, "CTA_INFO lists the rows of the first three tiles")
    if LAUNCH_DEPENDENTS:  # programmatic dependent launch: the reduce's CTAs may start (and wait) right away
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)  # fmt: skip
    tl_row = TIMELINE_BUF + gl.program_id(0) * TIMELINE_COLS
    if TIMELINE:
        _stamp(tl_row, 0, GLOBAL=True)
        _stamp(tl_row, 2)
    # One round trip of scalar loads, then every first TMA is in flight.
    head = CTA_INFO + gl.program_id(0) * 8
    w_begin = gl.load(head)
    w_end = gl.load(head + 1)
    t_begin = gl.load(head + 2)
    n_tiles = gl.load(head + 3) - t_begin

    # wgmma accumulators (Sᵀ: 64 × NQ, Oᵀ: 512 × NQ): 4 warps along M, N = NQ (16 heads) per instruction
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NQ, 32])
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=4)
    P_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)  # 64-B rows
    fp8: gl.constexpr = kn_desc.dtype

    kn_smem = gl.allocate_shared_memory(fp8, [NUM_STAGES, BLOCK_N, D_NOPE], kn_desc.layout)
    kr_smem = gl.allocate_shared_memory(fp8, [NUM_STAGES, BLOCK_N, D_ROPE], kr_desc.layout)
    qn_smem = gl.allocate_shared_memory(fp8, [2, NQ, D_NOPE], qn_desc.layout)
    qr_smem = gl.allocate_shared_memory(fp8, [2, NQ, D_ROPE], qr_desc.layout)
    p_smem = gl.allocate_shared_memory(fp8, [2, NQ, BLOCK_N], P_LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    fence_async_shared()

    # Fill the ring and fetch the first work's q before anything else.
    for i in gl.static_range(NUM_STAGES):
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, gl.load(head + 4 + i), i, n_tiles, NUM_STAGES)
    if w_begin < w_end:
        _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, gl.load(head + 7), 0, H)
    # The row of the next refill is always loaded one tile ahead (a load in the refill's path would stall the CTA).
    row_pf = gl.load(TILE_ROWS + t_begin + NUM_STAGES, mask=n_tiles > NUM_STAGES, other=0)
    if TIMELINE:
        _stamp(tl_row, 4)

    # Every scalar factor of the scores in one multiply, base 2: S·log2(e) = (q·k codes)·sm·s_q·s_kv·log2(e).
    qk_scale = sm_scale * gl.load(Q_SCALE) * gl.load(KV_SCALE) * 1.4426950408889634
    v_scale = gl.load(KV_SCALE)
    offs_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))

    it = 0  # tiles consumed by this CTA (ring position and phase)
    for w in range(w_begin, w_end):
        j = w - w_begin
        info = WORK_INFO + w * 8
        partial_loc = gl.load(info + 1)
        qo_start = gl.load(info + 2)
        kv_start = gl.load(info + 4)
        kv_end = gl.load(info + 5)
        qb = j % 2
        mbarrier.wait(q_bar.index(qb), (j // 2) & 1)
        if w + 1 < w_end:  # buffer (j+1) % 2 held work w-1's q, whose MMAs all completed in its epilogue
            _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, gl.load(info + 10), j + 1, H)
        q_nope_t = qn_smem.index(qb).permute((1, 0))  # (512, NQ): the B operand, reduction dim contiguous
        q_rope_t = qr_smem.index(qb).permute((1, 0))

        m_i = gl.full([NQ], float("-inf"), gl.float32, gl.SliceLayout(0, ACC))
        l_acc = gl.zeros([BLOCK_N, NQ], gl.float32, ACC)
        o_acc = warpgroup_mma_init(gl.zeros([D_NOPE, NQ], gl.float32, ACC))
        for start in range(kv_start, kv_end, BLOCK_N):
            row_nx = gl.load(TILE_ROWS + t_begin + it + NUM_STAGES + 1, mask=it + NUM_STAGES + 1 < n_tiles, other=0)
            s = it % NUM_STAGES
            mbarrier.wait(ready.index(s), (it // NUM_STAGES) & 1)
            if TIMELINE:  # noqa: SIM102 (a constexpr test: compiled out when False)
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + it)
            kn = kn_smem.index(s)
            # PV(it-1) has run while this tile arrived; once it completes, its A registers (V of tile it-1) and
            # its P buffer are free. (Waiting for it only after issuing QK, with a partial wait_group, makes ptxas
            # serialise every wgmma of the kernel; waiting for both after the V load spills.)
            o_cur = warpgroup_mma_wait(0, deps=(o_acc,))
            # QK on the tensor cores, asynchronously ...
            s_tok = warpgroup_mma(kn, q_nope_t, gl.zeros([BLOCK_N, NQ], gl.float32, ACC), use_acc=False,
                                  is_async=True)  # fmt: skip
            s_tok = warpgroup_mma(kr_smem.index(s), q_rope_t, s_tok, is_async=True)
            # ... while the CUDA cores load this tile's V into the PV's A-operand registers
            v_op = _pv_operand(kn, start, kv_end, DOT_A, MASK_TAIL, REPORT)
            s_acc = warpgroup_mma_wait(0, deps=(s_tok,))

            # Online softmax over the tile's tokens (axis 0), per head column, in base 2.
            sc = s_acc * qk_scale
            sc = gl.where(((start + offs_tok) < kv_end)[:, None], sc, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(sc - m_new[None, :])
            l_acc = l_acc * alpha[None, :] + p
            m_i = m_new
            pb = it % 2
            p_smem.index(pb).store(_p_operand(p, fp8, NQ))  # P rounded to the KV's fp8 type (aiter's a8w8)
            fence_async_shared()  # generic-proxy writes (Pᵀ) and reads (V from the K tile) before async ones
            _cta_barrier()  # ... by all four warps: the stage is free and Pᵀ complete
            _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_pf, it + NUM_STAGES, n_tiles, NUM_STAGES)
            row_pf = row_nx

            o_cur = o_cur * alpha[None, :]
            o_acc = warpgroup_mma(v_op, p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            it += 1
        o = warpgroup_mma_wait(0, deps=(o_acc,))
        _store_work(o, m_i, l_acc, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start, H, NQ, D_NOPE)
        if TIMELINE:  # noqa: SIM102 (a constexpr test: compiled out when False)
            if j < TIMELINE_MAX:
                _stamp(tl_row, 8 + TIMELINE_MAX + j)

    if TIMELINE:
        _stamp(tl_row, 3)
        _stamp(tl_row, 1, GLOBAL=True)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(q_bar.index(i))


stage1_kernel = _stage1_kernel

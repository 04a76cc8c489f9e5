"""Stage 1 of the persistent split-KV MLA decode on Hopper (sm_90), in Gluon (Triton's explicit-layout dialect):
wgmma + TMA. docs/kernels.md walks through it; this docstring is the map.

Every matrix product runs on wgmma straight from shared memory, in the orientation where the 16 heads are the *small*
N dimension, so nothing is padded:

* scores, tokens as M:  ``Sᵀ (64 tok × 16 heads) = K (64 × 576) · Qᵀ (576 × 16)``; K is the TMA-loaded tile as
  stored (576 values per token, the reduction dim contiguous: what fp8 wgmma requires of A), Qᵀ a permuted view of
  q in shared memory;
* values, value dims as M:  ``Oᵀ (512 × 16) += Vᵀ (512 × 64 tok) · Pᵀ (64 tok × 16)``; how Vᵀ gets there depends
  on the operand types (`vpaths`): from registers (fp8), read transposed from the K tile (bf16), or from a bf16 copy
  of each fp8 tile (bf16 q with fp8 KV).

Speculative decode on the fp8 path puts a work's 2 or 4 q rows side by side in N (``NQ`` = 32 or 64 columns) on two
warpgroups: each computes the scores, softmax and Pᵀ of its half of the columns (its q rows) and the value product of
its half of Oᵀ's rows for every column (256 × NQ: 128 registers a thread at NQ = 64, which one warpgroup could not
hold), taking the other's softmax rescale factors from shared memory, next to Pᵀ.

Per CTA (one warpgroup of 4 warps, or two; the grid is the plan's slots, one per SM): the works
``work_info[work_indptr[c]:work_indptr[c+1]]`` are walked in order, their 64-token tiles flattened into one stream
that a ring of ``NUM_STAGES`` TMA buffers prefetches across work boundaries (the host lists each CTA's tile start rows
once per plan: ``TILE_ROWS``; its header ``CTA_INFO`` holds its work and tile ranges, its first q row and the rows of
its first tiles, read in one round trip). The first work's q goes out before the ring's first tiles; the ring's first
``FIRST_BURST`` tiles go out at the start and the rest once the first tile has landed (when every SM issues its whole
ring at once, a CTA's first tile lands with the last of them).

Per tile: wait for its TMA barrier → issue QK on the tensor cores (async) → meanwhile load V (fp8 path) → wait →
online softmax in base 2 (the running sum kept per thread, reduced once per work) → P to shared memory (rounded to the
KV's fp8 type on the fp8 path, aiter's a8w8 numerics) → fence + barrier → rescale Oᵀ → issue PV (async; it overlaps
the next tile's wait) → refill a ring stage: on the fp8 path this tile's stage right after the PV is issued (the PV
reads registers and Pᵀ, not the stage); on the bf16 path the previous tile's stage, right after this tile's wait (its
PV read V from that stage); with converted fp8 tiles, this tile's stage as soon as it is converted.

Each work ends in `epilogue`: the final bf16 output + LSE when the request is whole, else a head-minor partial + LSE
for the reduce (`reduce`, or the portable Triton reduce for fp32 partials). With ``LAUNCH_DEPENDENTS`` every CTA
signals at once that the reduce (launched as a programmatic dependent) may start; the reduce waits for this grid's
writes.

Measurement hooks (compile-time, off in production): ``TIMELINE`` stamps each CTA's clock at each step
(`timeline.CtaTimeline`); ``ABLATE`` skips the score wgmma (1), both wgmmas (2) or, on the e4m3 route, the fp4 →
e4m3 conversion (3) and also the block scales' loads (4), so the call's time without that work can be measured
(outputs wrong); ``REPORT`` prints the V loads' bank conflicts while compiling (`build`).

Constraints (checked on the host, `host.unsupported`): 16 heads × (512 + 64) dims, the KV rows of a tile contiguous
(page size 1 with the identity page table, or pages that are multiples of 64 tokens), a tile of whole pages of 16
or 32 tokens (one TMA box per page), or 64 rows of a token table (page size 1, any table: ``TOKENS``, the ring filled
by cp.async, `tokenrows`); the last two not with fp4 KV, whose block scales are read per tile; e4m3fn codes
for fp8. A work is 1 q row (16 heads), or 2 or 4 on the fp8 path (above; `host.row_passes`, `host.rows_per_cta_of`).
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

from .epilogue import _store_work_natural, _store_work_vregs
from .fp4tiles import E4M3_SHIFT, _as_words, _convert_fp4_tile, _convert_q, _load_tile_scales, _scale_buffers
from .tokenrows import _copy_token_rows, _token_rows
from .vpaths import _convert_tile, _p_operand, _pv_operand, _zero_tail_rows

__all__ = ["BLOCK_N", "INFO_COLS", "TIMELINE_COLS", "TIMELINE_MAX", "stage1_kernel", "make_descriptors"]

#: TMA global -> shared copy: ``async_copy_global_to_shared`` up to Triton 3.6 (the H200 machine's), renamed
#: ``async_load`` later (3.9 on the CPU machines, which compile the kernel for sm_90 in a test).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
#: CTA-wide barrier: ``thread_barrier`` up to 3.6, ``barrier`` later.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

#: tokens per tile: the M of the score wgmma (one warpgroup covers 64 rows) and the K of the value wgmma.
BLOCK_N = 64

#: Columns of a CTA's header (`host.cta_info`): first work, end work, first tile, end tile, the q row of its first
#: work, then the KV rows of its first tiles, as many as the deepest ring holds (3).
INFO_COLS = gl.constexpr(8)

#: The per-CTA time line (``TIMELINE=True``): one int64 row per CTA. Columns: 0/1 global timer (ns) at start / end,
#: 2/3 SM clock at start / end, 4 SM clock once the first TMAs are in flight, 5 / 6 SM clock when the last work's
#: final PV has completed / its softmax sum is reduced; then four blocks of `TIMELINE_MAX` SM-clock columns: tile
#: ``it`` has arrived (``8 + it``), its scores are done (``8 + TIMELINE_MAX + it``), its PV is issued
#: (``8 + 2·TIMELINE_MAX + it``), and work ``j``'s output stores are issued (``8 + 3·TIMELINE_MAX + j``).
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


@gluon.jit
def _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row, it, n_tiles, NUM_STAGES: gl.constexpr, ROWS, KV,
                   TOKENS: gl.constexpr, PRELOADED: gl.constexpr = False, rows=0):  # fmt: skip
    """TMA the CTA's tile number `it` (KV row `row` onwards), if it exists, into ring stage ``it % NUM_STAGES``.

    Pages of fewer tokens than a tile (the descriptors' box is one page, P < 64 rows): the tile is 64 / P pages, one
    box each into its rows of the stage; their KV rows are ``ROWS[it · 64 / P ...]`` (`row` is unused). `TOKENS`
    (page size 1, any token table): the tile's 64 rows ``ROWS[it · 64 ...]`` of `KV` by cp.async
    (`_copy_token_rows`), called by every thread; with `PRELOADED` their row numbers are `rows` (`_token_rows`,
    loaded earlier)."""
    if it < n_tiles:
        s = it % NUM_STAGES
        bar = ready.index(s)
        P: gl.constexpr = kn_desc.block_type.shape[0]
        SUB: gl.constexpr = kn_smem.shape[1] // P
        if TOKENS:
            if PRELOADED:
                _copy_token_rows(KV, kn_smem.index(s), kr_smem.index(s), bar, rows)
            else:
                own = _token_rows(ROWS + it * kn_smem.shape[1], kn_smem.index(s), it < n_tiles)
                _copy_token_rows(KV, kn_smem.index(s), kr_smem.index(s), bar, own)
        elif SUB == 1:
            mbarrier.expect(bar, kn_desc.block_type.nbytes + kr_desc.block_type.nbytes)
            _tma_load(kn_desc, [row, 0], bar, kn_smem.index(s))
            _tma_load(kr_desc, [row, 0], bar, kr_smem.index(s))
        else:
            mbarrier.expect(bar, SUB * (kn_desc.block_type.nbytes + kr_desc.block_type.nbytes))
            for i in gl.static_range(SUB):
                r = gl.load(ROWS + it * SUB + i)
                _tma_load(kn_desc, [r, 0], bar, kn_smem.index(s).slice(i * P, P))
                _tma_load(kr_desc, [r, 0], bar, kr_smem.index(s).slice(i * P, P))


@gluon.jit
def _issue_deferred(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, row2, n_tiles, NUM_STAGES: gl.constexpr,
                    FIRST_BURST: gl.constexpr, ROWS, KV, TOKENS: gl.constexpr):  # fmt: skip
    """Issue the ring's tiles ``FIRST_BURST .. NUM_STAGES - 1`` (rows `row1`, `row2` of tiles 1, 2): called once the
    CTA's first tile has landed. Deferring them gets the first tile in sooner; the stream afterwards is paced by
    compute, not bytes, so the later tiles are not needed that early."""
    if FIRST_BURST <= 1 and NUM_STAGES > 1:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, 1, n_tiles, NUM_STAGES, ROWS, KV, TOKENS)
    if FIRST_BURST <= 2 and NUM_STAGES > 2:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row2, 2, n_tiles, NUM_STAGES, ROWS, KV, TOKENS)


@gluon.jit
def _pow2(f):
    """2^f as fp32 for integer f in [-126, 127] (built from its exponent bits)."""
    return ((f + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _work_row(info):
    """A work's row of the token work table (8 int32 at `info`): partial row (-1: none), first q row, KV token
    range."""
    return gl.load(info + 1), gl.load(info + 2), gl.load(info + 4), gl.load(info + 5)


@gluon.jit
def _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row, j, H: gl.constexpr):
    """TMA the NQ head rows of q rows `q_row` .. (the CTA's j-th work: 16 heads a q row) into q buffer ``j % 2``."""
    b = j % 2
    bar = q_bar.index(b)
    mbarrier.expect(bar, qn_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    _tma_load(qn_desc, [q_row * H, 0], bar, qn_smem.index(b))  # q viewed as (total_q · 16, 576)
    _tma_load(qr_desc, [q_row * H, 0], bar, qr_smem.index(b))


@gluon.jit
def _stage1_kernel(
    qn_desc, qr_desc,  # TMA descriptors of q viewed as (total_q·16, 576): dims [0, 512) and [512, 576)
    kn_desc, kr_desc,  # TMA descriptors of the KV rows (rows, 576): dims [0, 512) and [512, 576)
    CTA_INFO,  # (n_cu, INFO_COLS) int32: first work, end work, first tile, end tile, q row of work 0, rows of tiles 0..
    WORK_INFO,  # (n_work, 8) int32, kv positions in tokens
    TILE_ROWS,  # int32 KV row of each tile's first token (of each of its pages, pages < 64 tokens), in stream order
    OUT, OUT_LSE, PART_O, PART_LSE,
    Q_SCALE, KV_SCALE,  # (1,) fp32 dequantisation scales (NVFP4: KV_SCALE is the per-cache scale)
    KV_SCALES, KV_ROWS,  # fp4 KV: the block scales as bytes (KV_ROWS, 18 or 36) and KV_ROWS; else any tensor, 0
    KV,  # the KV rows (rows, 576) when TOKENS (read by cp.async), else any tensor
    sm_scale,
    TIMELINE_BUF,  # (n_cu, TIMELINE_COLS) int64 when TIMELINE, else any tensor (unused)
    H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr,
    BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, MASK_TAIL: gl.constexpr, LAUNCH_DEPENDENTS: gl.constexpr,
    FIRST_BURST: gl.constexpr,  # ring tiles issued at the start (NUM_STAGES: all); the rest once tile 0 has arrived
    KV_FP4: gl.constexpr,  # 0: fp8 / bf16 KV; 1: MXFP4 codes + E8M0 scales; 2: NVFP4 codes + E4M3 scales (`fp4tiles`)
    FP4_E4M3: gl.constexpr,  # fp8 q, MXFP4 KV on fp8 wgmma: tiles of e4m3 residuals, 2^F in the softmax (`fp4tiles`)
    TOKENS: gl.constexpr,  # page size 1, any token table: TILE_ROWS lists every row, the ring is filled by cp.async
    CAUSAL: gl.constexpr,  # q rows side by side under the causal mask: column c's KV ends ROWS - 1 - c // H before the
    # end of the work's last row's prefix, WORK_INFO column 7 (`decoder.causal_work_info`), or at the work's end
    TIMELINE: gl.constexpr,  # stamp this CTA's row of TIMELINE_BUF (TIMELINE_COLS)
    ABLATE: gl.constexpr,  # 0; 1 skips the QK wgmma, 2 also the PV, 3 the e4m3 route's conversion, 4 also its
    # scales' loads (timing experiments only: wrong outputs)
    REPORT: gl.constexpr,  # print the V loads' bank conflicts while compiling (`build`)
    num_warps: gl.constexpr,
):  # fmt: skip
    ROWS: gl.constexpr = NQ // H  # q rows per work, side by side in the wgmmas' N
    gl.static_assert(H == 16 and NQ == H * ROWS and (ROWS == 1 or ROWS == 2 or ROWS == 4),
                     "one, two or four q rows of 16 heads a work")  # fmt: skip
    WG: gl.constexpr = num_warps // 4  # warpgroups: 1, or 2 sharing each tile (`_stage1_kernel`'s layouts)
    gl.static_assert(num_warps == 4 or (num_warps == 8 and ROWS > 1), "one warpgroup, or two for 2 or 4 q rows")
    gl.static_assert(BLOCK_N == 64 and D_NOPE == 512, "the V layouts are written for 64-token tiles of 512 values")
    KV_BITS: gl.constexpr = kn_desc.dtype.primitive_bitwidth  # the KV as stored and TMA'd (the ring's type)
    gl.static_assert(not FP4_E4M3 or (KV_FP4 == 1 and qn_desc.dtype == gl.float8e4nv),
                     "the e4m3 route is for e4m3fn q with MXFP4 KV")  # fmt: skip
    # the wgmma operands' type: q's, or bf16 with fp4 KV (whatever q's type: fp8 q is converted once per work) except
    # on the e4m3 route (q's fp8)
    mma_type: gl.constexpr = gl.bfloat16 if KV_FP4 and not FP4_E4M3 else qn_desc.dtype
    MMA_BITS: gl.constexpr = mma_type.primitive_bitwidth
    Q_CONVERT: gl.constexpr = KV_FP4 and qn_desc.dtype.primitive_bitwidth == 8 and not FP4_E4M3  # q rows to bf16
    # the V paths (`vpaths`, `fp4tiles`), decided by the operand types
    V_IN_REGS: gl.constexpr = MMA_BITS == 8  # fp8 q and KV: Vᵀ as the PV's register operand
    V_FROM_K: gl.constexpr = MMA_BITS == 16  # 16-bit operands: the PV reads Vᵀ transposed from the K tile
    # bf16 q with fp8 KV, or fp4 KV: each ring tile converted to one bf16 (e4m3 route: e4m3) tile first, which QK and
    # PV read
    KV_CONVERT: gl.constexpr = (MMA_BITS == 16 and KV_BITS == 8) or FP4_E4M3
    gl.static_assert(not KV_FP4 or kn_desc.dtype == gl.uint8, "fp4 KV arrives as packed code bytes (uint8)")
    gl.static_assert(KV_BITS == MMA_BITS or KV_CONVERT, "q and KV of one type, bf16 q with fp8 KV, or fp4 KV")
    gl.static_assert(ROWS == 1 or (V_IN_REGS and not KV_CONVERT), "q rows side by side: the fp8 path (v-regs)")
    gl.static_assert(ROWS < 4 or WG == 2, "four q rows: Oᵀ (512 x 64) split over two warpgroups")
    gl.static_assert(not CAUSAL or ROWS > 1, "one q row a work takes the causal mask from its KV end alone")
    # (the bf16 path refills a stage one tile late: with one stage it would wait for a tile it has not issued yet)
    gl.static_assert(not V_FROM_K or KV_CONVERT or NUM_STAGES >= 2, "the bf16 ring needs 2 stages")
    gl.static_assert(not V_FROM_K or ABLATE == 0, "ablations are written for the fp8 path")
    gl.static_assert(ABLATE < 3 or FP4_E4M3, "the conversion (and scale load) ablations are the e4m3 route's")
    gl.static_assert(NUM_STAGES <= 3 and NUM_STAGES <= INFO_COLS - 5, "CTA_INFO lists the rows of the ring's tiles")
    gl.static_assert(FIRST_BURST >= 1 and FIRST_BURST <= NUM_STAGES, "the first burst is 1 to NUM_STAGES tiles")
    if LAUNCH_DEPENDENTS:  # programmatic dependent launch: the reduce's CTAs may start (and wait) right away
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)  # fmt: skip
    tl_row = TIMELINE_BUF + gl.program_id(0) * TIMELINE_COLS
    if TIMELINE:
        _stamp(tl_row, 0, GLOBAL=True)
        _stamp(tl_row, 2)
    # The CTA's header, the scales and the first tiles' rows: independent loads, so ONE round trip before the
    # first TMAs (loads written between TMA issues would each wait for the previous issue).
    head = CTA_INFO + gl.program_id(0) * INFO_COLS
    w_begin = gl.load(head)
    w_end = gl.load(head + 1)
    t_begin = gl.load(head + 2)
    t_end = gl.load(head + 3)
    q_row0 = gl.load(head + 4)
    row0 = gl.load(head + 5)
    row1 = 0  # (rows of tiles the ring does not hold: never issued)
    row2 = 0
    if NUM_STAGES > 1:
        row1 = gl.load(head + 6)
    if NUM_STAGES > 2:
        row2 = gl.load(head + 7)
    q_scale = gl.load(Q_SCALE)
    v_scale = gl.load(KV_SCALE)
    n_tiles = t_end - t_begin
    # pages shorter than a tile: TILE_ROWS lists each tile's page rows (64 / P of them; TOKENS: 64), this CTA's on
    SUB: gl.constexpr = BLOCK_N if TOKENS else BLOCK_N // kn_desc.block_type.shape[0]
    gl.static_assert(SUB == 1 or not KV_FP4, "fp4 block scales are read per tile: pages of >= 64 tokens")
    sub_rows = TILE_ROWS + t_begin * SUB

    # wgmma accumulators: Sᵀ (BLOCK_N × NQ), a warpgroup's 4 warps along the tokens (M), the warpgroups side by side
    # along N (its q rows); Oᵀ (512 × NQ), all warps along M (value dims, π of `vpaths`), N = NQ. One WG: one layout.
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                  instr_shape=[16, NQ // WG, 256 // MMA_BITS])  # fmt: skip
    ACC_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1],
                                                    instr_shape=[16, NQ, 256 // MMA_BITS])  # fmt: skip
    DOT_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_O, k_width=4)
    # a row of Pᵀ: BLOCK_N tokens of the products' type (64 B in fp8, 128 B in bf16)
    T_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=BLOCK_N * MMA_BITS // 8, element_bitwidth=MMA_BITS,
                                                  rank=2)  # fmt: skip

    # a ring tile as stored: D_NOPE + D_ROPE values of 8 or 16 bits, or fp4 codes two per byte
    kn_smem = gl.allocate_shared_memory(kn_desc.dtype, [NUM_STAGES, BLOCK_N, kn_desc.block_type.shape[1]],
                                        kn_desc.layout)  # fmt: skip
    kr_smem = gl.allocate_shared_memory(kr_desc.dtype, [NUM_STAGES, BLOCK_N, kr_desc.block_type.shape[1]],
                                        kr_desc.layout)  # fmt: skip
    qn_smem = gl.allocate_shared_memory(qn_desc.dtype, [2, NQ, D_NOPE], qn_desc.layout)
    qr_smem = gl.allocate_shared_memory(qr_desc.dtype, [2, NQ, D_ROPE], qr_desc.layout)
    p_smem = gl.allocate_shared_memory(mma_type, [2, NQ, BLOCK_N], T_LAYOUT)
    if WG > 1:  # each warpgroup's softmax rescale factors, for the other's Oᵀ rows (a tile's, next to its Pᵀ)
        a_smem = gl.allocate_shared_memory(gl.float32, [2, NQ], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    if KV_CONVERT:  # the one bf16 / e4m3 tile that QK and PV read (the ring holds the codes as TMA brought them)
        KB_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=MMA_BITS, rank=2)
        RB_SWIZZLE: gl.constexpr = 128 if D_ROPE * MMA_BITS // 8 >= 128 else D_ROPE * MMA_BITS // 8
        KRB_LAYOUT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=RB_SWIZZLE, element_bitwidth=MMA_BITS,
                                                        rank=2)  # fmt: skip
        kb_smem = gl.allocate_shared_memory(mma_type, [1, BLOCK_N, D_NOPE], KB_LAYOUT)
        krb_smem = gl.allocate_shared_memory(mma_type, [1, BLOCK_N, D_ROPE], KRB_LAYOUT)
    if KV_FP4:  # the converted tile as the words the fp4 conversion stores: int32 (2 bf16), int16 (2 e4m3 codes)
        WORD: gl.constexpr = gl.int16 if FP4_E4M3 else gl.int32
        kb_words = _as_words(kb_smem, BLOCK_N, D_NOPE, 128, WORD)
        krb_words = _as_words(krb_smem, BLOCK_N, D_ROPE, RB_SWIZZLE, WORD)
    if Q_CONVERT:  # fp8 q: the one bf16 copy of the current work's q rows that the QK reads
        qb_smem = gl.allocate_shared_memory(mma_type, [1, NQ, D_NOPE], KB_LAYOUT)
        qrb_smem = gl.allocate_shared_memory(mma_type, [1, NQ, D_ROPE], KB_LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):  # (TOKENS: one cp.async arrival per thread; else the TMA's transaction)
        mbarrier.init(ready.index(i), count=num_warps * 32 if TOKENS else 1)
    for i in gl.static_range(2):
        mbarrier.init(q_bar.index(i), count=1)
    fence_async_shared()

    # The first work's q before anything else (issued after the ring's tiles, q's 18 KB would queue behind them and
    # the first tile could not start), then the ring's first burst.
    if w_begin < w_end:
        _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, q_row0, 0, H)
    _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row0, 0, n_tiles, NUM_STAGES, sub_rows, KV, TOKENS)
    if NUM_STAGES > 1 and FIRST_BURST > 1:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, 1, n_tiles, NUM_STAGES, sub_rows, KV, TOKENS)
    if NUM_STAGES > 2 and FIRST_BURST > 2:
        _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row2, 2, n_tiles, NUM_STAGES, sub_rows, KV, TOKENS)
    if TIMELINE:
        _stamp(tl_row, 4)
    # The row of the next refill is always loaded one tile ahead (a load in the refill's path would stall the CTA).
    row_pf = gl.load(TILE_ROWS + t_begin + NUM_STAGES, mask=n_tiles > NUM_STAGES, other=0)

    # Every scalar factor of the scores in one multiply, base 2: S·log2(e) = (q·k codes)·sm·s_q·s_kv·log2(e).
    qk_scale = sm_scale * q_scale * v_scale * 1.4426950408889634
    offs_tok = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    # CAUSAL: how many tokens before the work's KV end each column's q row stops (its row r of ROWS: ROWS - 1 - r)
    col_back = ROWS - 1 - gl.arange(0, NQ, layout=gl.SliceLayout(0, ACC)) // H
    if KV_FP4:  # the first tile's block scales, staged in shared memory (then each tile stages the next one's)
        # (the ablation of the scales' loads (4) masks them all off: every scale 0)
        sc_nope, sc_rope = _load_tile_scales(KV_SCALES, row0, (n_tiles > 0) & (ABLATE != 4), KV_ROWS, KV_FP4, BLOCK_N)
        scn_smem, scr_smem = _scale_buffers(sc_nope, sc_rope)

    it = 0  # tiles consumed by this CTA (ring position and phase)
    for w in range(w_begin, w_end):
        j = w - w_begin
        info = WORK_INFO + w * 8
        partial_loc, qo_start, kv_start, kv_end = _work_row(info)
        if CAUSAL:  # where each column's q row stops seeing the KV
            col_end = gl.minimum(kv_end, gl.load(info + 7) - col_back)
        qb = j % 2
        mbarrier.wait(q_bar.index(qb), (j // 2) & 1)
        if w + 1 < w_end:  # buffer (j+1) % 2 held work w-1's q, whose MMAs all completed in its epilogue (fp8 q
            # with fp4 KV: whose conversion, followed by a barrier, read it)
            _issue_q(qn_desc, qr_desc, qn_smem, qr_smem, q_bar, gl.load(info + 10), j + 1, H)  # next work's q row
        if Q_CONVERT:
            # every warp past the previous work (a work without tiles has no barrier of its own: a warp could still
            # be writing its q), then this work's q as bf16 (exact), visible to the wgmma
            _cta_barrier()
            zq = (j < 0).to(gl.int32)  # (0, not foldable: see kb below)
            _convert_q(qn_smem.index(qb), qr_smem.index(qb), qb_smem.index(zq), qrb_smem.index(zq), D_NOPE, D_ROPE)
            fence_async_shared()
            _cta_barrier()
            q_nope_t = qb_smem.index(zq).permute((1, 0))
            q_rope_t = qrb_smem.index(zq).permute((1, 0))
        else:
            q_nope_t = qn_smem.index(qb).permute((1, 0))  # (512, NQ): the B operand, reduction dim contiguous
            q_rope_t = qr_smem.index(qb).permute((1, 0))

        m_i = gl.full([NQ], float("-inf"), gl.float32, gl.SliceLayout(0, ACC))
        l_acc = gl.zeros([BLOCK_N, NQ], gl.float32, ACC)
        o_acc = warpgroup_mma_init(gl.zeros([D_NOPE, NQ], gl.float32, ACC_O))
        for start in range(kv_start, kv_end, BLOCK_N):
            row_nx = gl.load(TILE_ROWS + t_begin + it + NUM_STAGES + 1, mask=it + NUM_STAGES + 1 < n_tiles, other=0)
            if KV_FP4:  # the next tile's first row: its block scales go out once this tile is converted
                row_sc = gl.load(TILE_ROWS + t_begin + it + 1, mask=it + 1 < n_tiles, other=0)
            if V_FROM_K and not KV_CONVERT:
                # the row of this tile's refill (tile it-1+NUM_STAGES, one tile late), loaded here so the wait hides it
                # (loaded, not carried from the previous tile: Triton 3.6 did not carry such a variable across works)
                row_rf = gl.load(TILE_ROWS + t_begin + it - 1 + NUM_STAGES,
                                 mask=(it > 0) & (it - 1 + NUM_STAGES < n_tiles), other=0)  # fmt: skip
            # token tables: the row numbers of this tile's refill, loaded before the wait hides their latency
            tok = 0
            if TOKENS:
                k0 = kn_smem.index(0)
                if V_FROM_K and not KV_CONVERT:  # (the bf16 path refills one tile late)
                    rf = it - 1 + NUM_STAGES
                    tok = _token_rows(sub_rows + rf * BLOCK_N, k0, (it > 0) & (rf < n_tiles))
                else:
                    rf = it + NUM_STAGES
                    tok = _token_rows(sub_rows + rf * BLOCK_N, k0, rf < n_tiles)
            s = it % NUM_STAGES
            mbarrier.wait(ready.index(s), (it // NUM_STAGES) & 1)
            if TIMELINE:  # noqa: SIM102 (a constexpr test: compiled out when False)
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + it)
            if FIRST_BURST < NUM_STAGES:  # noqa: SIM102
                if it == 0:  # the first burst has landed: the rest of the ring goes out now (`_issue_deferred`)
                    _issue_deferred(kn_desc, kr_desc, kn_smem, kr_smem, ready, row1, row2, n_tiles, NUM_STAGES,
                                    FIRST_BURST, sub_rows, KV, TOKENS)  # fmt: skip
            kn = kn_smem.index(s)
            if KV_CONVERT:
                # PV(it-1) read the bf16 tile: complete in this warp, then (barrier) in every warp, before it is
                # overwritten with this tile's codes as bf16 (exact: every e4m3 value is a bf16 value). (The e4m3
                # route's PV(it-1) reads registers, but they stay live until it completes: the conversion beside them
                # spilled)
                o_cur = warpgroup_mma_wait(0, deps=(o_acc,))
                if not V_IN_REGS:
                    _cta_barrier()
                # (the one buffer indexed by a value the compiler cannot fold, 0: with a constant address ptxas
                # computes the 68 wgmma descriptors of the tile once, before the loop, and spills them)
                zero = (it < 0).to(gl.int32)
                kb = kb_smem.index(zero)
                krb = krb_smem.index(zero)
                if KV_FP4:  # codes x block scales (exact: `fp4tiles`), or e4m3 residuals and the tokens' exponents
                    e_max = _convert_fp4_tile(kn, kr_smem.index(s), scn_smem, scr_smem, kb_words.index(zero),
                                              krb_words.index(zero), kv_end - start, MASK_TAIL, KV_FP4, BLOCK_N,
                                              FP4_E4M3, REPORT, ABLATE >= 3)  # fmt: skip
                else:
                    _convert_tile(kn, kb, kv_end - start, MASK_TAIL, BLOCK_N, D_NOPE)
                    _convert_tile(kr_smem.index(s), krb, BLOCK_N, False, BLOCK_N, D_ROPE)  # (rope: scores masked)
                fence_async_shared()  # generic-proxy writes before the wgmma's async reads
                _cta_barrier()  # every warp's part converted, and every warp done reading stage s: refill it now
                _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_pf, it + NUM_STAGES, n_tiles,
                               NUM_STAGES, sub_rows, KV, TOKENS, True, tok)  # fmt: skip
                if KV_FP4:  # the next tile's block scales, in flight while this tile's QK and softmax run
                    sc_nope, sc_rope = _load_tile_scales(KV_SCALES, row_sc, (it + 1 < n_tiles) & (ABLATE != 4), KV_ROWS,
                                                         KV_FP4, BLOCK_N)  # fmt: skip
                kn = kb
            if V_IN_REGS and not KV_CONVERT:
                # PV(it-1) has run while this tile arrived; once it completes, its A registers (V of tile it-1) and
                # its P buffer are free. (Waiting for it only after issuing QK, with a partial wait_group, makes
                # ptxas serialise every wgmma of the kernel; waiting for both after the V load spills.)
                o_cur = warpgroup_mma_wait(0, deps=(o_acc,))
                if MASK_TAIL and not KV_CONVERT:  # noqa: SIM102 (a converted tile has its tail zeroed already)
                    if kv_end - start < BLOCK_N:  # a work's last tile of a paged cache: zero V's tail rows in shared
                        # memory (NaN-safe PV) before QK and the V load read the tile; a masked select on the V
                        # operand's registers instead made the whole loop spill
                        _zero_tail_rows(kn, kv_end - start, BLOCK_N, D_NOPE)
                        fence_async_shared()
                        _cta_barrier()
            if TOKENS and not KV_CONVERT:  # cp.async wrote the tile through the generic proxy, the wgmmas read it
                # through the async one (right after the barrier wait instead, Triton 3.6's ptxas crashed)
                fence_async_shared()
            # QK on the tensor cores, asynchronously ...
            if ABLATE == 1 or ABLATE == 2:  # ablation: scores 0 (the QK's time is what this saves)
                s_tok = gl.zeros([BLOCK_N, NQ], gl.float32, ACC)
            else:
                s_tok = warpgroup_mma(kn, q_nope_t, gl.zeros([BLOCK_N, NQ], gl.float32, ACC), use_acc=False,
                                      is_async=True)  # fmt: skip
                if KV_CONVERT:
                    s_tok = warpgroup_mma(krb, q_rope_t, s_tok, is_async=True)
                else:
                    s_tok = warpgroup_mma(kr_smem.index(s), q_rope_t, s_tok, is_async=True)
            # ... while the CUDA cores load this tile's V into the PV's A-operand registers (fp8 path)
            if V_IN_REGS:
                v_op = _pv_operand(kn, DOT_A, REPORT)
                s_acc = warpgroup_mma_wait(0, deps=(s_tok,))
            elif KV_CONVERT:  # (PV(it-1) completed before the conversion)
                s_acc = warpgroup_mma_wait(0, deps=(s_tok,))
            else:  # bf16: QK(it) and this warp's part of PV(it-1) complete
                s_acc, o_cur = warpgroup_mma_wait(0, deps=(s_tok, o_acc))
                if it > 0:  # every warp past its wait: PV(it-1) no longer reads tile it-1's stage, refill it
                    _cta_barrier()
                    _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_rf, it - 1 + NUM_STAGES, n_tiles,
                                   NUM_STAGES, sub_rows, KV, TOKENS, True, tok)  # fmt: skip
                if MASK_TAIL:  # noqa: SIM102
                    if kv_end - start < BLOCK_N:  # a work's last tile of a paged cache: zero its tail (NaN-safe PV)
                        _zero_tail_rows(kn, kv_end - start, BLOCK_N, D_NOPE)
            if TIMELINE:  # noqa: SIM102
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + TIMELINE_MAX + it)

            # Online softmax over the tile's tokens (axis 0), per head column, in base 2.
            if FP4_E4M3:  # token t's values are 2^F_t times the tile's: score x 2^F_t, logit + F_t (`fp4tiles`)
                f_tok = gl.convert_layout(e_max, gl.SliceLayout(1, ACC)) - (127 + E4M3_SHIFT)
                col = gl.where(f_tok == 255 - 127 - E4M3_SHIFT, float("nan"), _pow2(f_tok))  # (E8M0 NaN: NaN scores)
                sc = s_acc * (qk_scale * col)[:, None] + f_tok.to(gl.float32)[:, None]
            else:
                sc = s_acc * qk_scale
            if CAUSAL:  # each column up to its own row's prefix; a column that has seen no token yet keeps m = -inf
                # and takes p = 0, alpha = 0 (its accumulators are 0) rather than exp2(-inf + inf)
                sc = gl.where((start + offs_tok)[:, None] < col_end[None, :], sc, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(sc, axis=0))
                m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = gl.exp2(m_i - m_use)
                p = gl.exp2(sc - m_use[None, :])
            else:
                sc = gl.where(((start + offs_tok) < kv_end)[:, None], sc, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(sc, axis=0))
                alpha = gl.exp2(m_i - m_new)
                p = gl.exp2(sc - m_new[None, :])
            if FP4_E4M3:  # the softmax sum counts P = P̂ · 2^-F
                l_acc = l_acc * alpha[None, :] + p * _pow2(-f_tok)[:, None]
            else:
                l_acc = l_acc * alpha[None, :] + p
            m_i = m_new
            pb = it % 2
            if V_IN_REGS:
                p_smem.index(pb).store(_p_operand(p, mma_type, NQ, BLOCK_N))  # P rounded to the KV's fp8 (aiter's a8w8)
            else:
                p_smem.index(pb).store(p.to(mma_type).permute([1, 0]))  # Pᵀ as (NQ, 64): tokens contiguous
            if WG > 1:
                a_smem.index(pb).store(alpha)
            fence_async_shared()  # generic-proxy writes (Pᵀ) and reads (V from the K tile) before async ones
            _cta_barrier()  # ... by every warp: Pᵀ complete

            if WG > 1:  # every column's factor, for this warpgroup's rows of Oᵀ (double-buffered as Pᵀ is: a
                # warpgroup a tile ahead writes the other buffer)
                alpha = a_smem.index(pb).load(gl.SliceLayout(0, ACC_O))
            o_cur = o_cur * alpha[None, :]
            if ABLATE == 2:  # ablation: no PV (and no V operand: the compiler drops its loads)
                o_acc = warpgroup_mma_init(o_cur)
            elif V_IN_REGS:
                o_acc = warpgroup_mma(v_op, p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            else:  # Vᵀ = the K tile's value dims read transposed (M-major A: 16-bit types only)
                o_acc = warpgroup_mma(kn.permute((1, 0)), p_smem.index(pb).permute((1, 0)), o_cur, is_async=True)
            if TIMELINE:  # noqa: SIM102
                if it < TIMELINE_MAX:
                    _stamp(tl_row, 8 + 2 * TIMELINE_MAX + it)
            if V_IN_REGS and not KV_CONVERT:  # PV(it) reads registers and Pᵀ, not this stage: refill it now
                _issue_kv_tile(kn_desc, kr_desc, kn_smem, kr_smem, ready, row_pf, it + NUM_STAGES, n_tiles,
                               NUM_STAGES, sub_rows, KV, TOKENS, True, tok)  # fmt: skip
            if KV_FP4:  # (staged, not carried in registers: carried across the loops, Triton 3.6's build spilled)
                scn_smem.store(sc_nope)
                scr_smem.store(sc_rope)
            row_pf = row_nx
            it += 1
        o = warpgroup_mma_wait(0, deps=(o_acc,))
        if TIMELINE:  # the last PV has completed; then the work's softmax sum
            _stamp(tl_row, 5)
        l_sum = gl.sum(l_acc, axis=0)  # the work's softmax sum per head, reduced once from the per-thread sums
        if TIMELINE:  # (a data dependence orders the stamp after the sum: >= 0, so the offset is always 0; the sum
            # over the 16 heads is extra work that the unstamped kernel does not do)
            _stamp(tl_row + (gl.sum(l_sum, axis=0) < 0.0).to(gl.int64), 6)
        if V_IN_REGS:
            _store_work_vregs(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start, H, NQ,
                              D_NOPE)  # fmt: skip
        else:
            _store_work_natural(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start, H, NQ,
                                D_NOPE)  # fmt: skip
        if TIMELINE:  # noqa: SIM102
            if j < TIMELINE_MAX:
                _stamp(tl_row, 8 + 3 * TIMELINE_MAX + j)

    if TIMELINE:
        _stamp(tl_row, 3)
        _stamp(tl_row, 1, GLOBAL=True)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(q_bar.index(i))


stage1_kernel = _stage1_kernel


def make_descriptors(q2d, kv, nq: int, kv_box: int = BLOCK_N) -> tuple:
    """TMA descriptors ``(qn, qr, kn, kr)`` of q viewed as ``(total_q·16, 576)`` and the KV rows ``(rows, 576)``
    (both fp8, both bf16, or bf16 q with fp8 KV; contiguous) or ``(rows, 288)`` bytes of fp4 codes (with bf16 or fp8
    q): 512 nope + 64 rope dims, blocks of ``nq`` q rows and `kv_box` tokens (`BLOCK_N`, or one page of 16 or 32
    tokens: a tile is then that many boxes)."""
    if kv_box not in (16, 32, BLOCK_N):
        raise ValueError(f"kv_box must be 16, 32 or {BLOCK_N} rows, got {kv_box!r}")
    import torch

    rows, d_kv, d_q = int(kv.shape[0]), int(kv.shape[1]), int(q2d.shape[1])  # (row strides: fp4 KV rows are 288 B)
    nope, rope = 512, d_q - 512  # value dims, rope dims (of q; of the KV unless fp4)
    kv_nope, kv_rope = (nope // 2, rope // 2) if kv.dtype == torch.uint8 else (nope, rope)  # fp4: two per byte

    def layouts(bits: int) -> tuple:  # (nope, rope) shared layouts of a `bits`-bit element type
        return (
            gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bits, rank=2),
            gl.NVMMASharedLayout(swizzle_byte_width=min(128, rope * bits // 8), element_bitwidth=bits, rank=2),
        )

    qn_l, qr_l = layouts(q2d.element_size() * 8)
    kn_l, kr_l = layouts(kv.element_size() * 8)
    qrows = int(q2d.shape[0])
    qn = TensorDescriptor(q2d, [qrows, nope], [d_q, 1], [nq, nope], qn_l)
    qr = TensorDescriptor(q2d[:, nope:], [qrows, rope], [d_q, 1], [nq, rope], qr_l)
    if kv.dtype == torch.uint8:  # fp4 codes: 256 + 32 bytes a token (rope: a 32-byte swizzle)
        kr_l = gl.NVMMASharedLayout(swizzle_byte_width=kv_rope, element_bitwidth=8, rank=2)
    kn = TensorDescriptor(kv, [rows, kv_nope], [d_kv, 1], [kv_box, kv_nope], kn_l)
    kr = TensorDescriptor(kv[:, kv_nope:], [rows, kv_rope], [d_kv, 1], [kv_box, kv_rope], kr_l)
    return qn, qr, kn, kr

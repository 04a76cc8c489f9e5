"""The "v-regs" path of the sm_90 Gluon stage 1 (`gluon_hopper.stage1_kernel` with ``V_IN_REGS=True``): the PV
product takes Vᵀ as its *register* A operand.

Read `gluon_hopper` first (fp8 wgmma for both products, tokens as M for the scores, value dims as M for the
values, TMA ring across work boundaries, one warpgroup per 64 tokens of a tile). What differs is how Vᵀ reaches the
tensor cores.
The "vt-smem" path transposes each tile's V into a Vᵀ buffer in shared memory (16-byte loads and stores) and the
PV wgmma reads it back: 64 KB of shared-memory traffic per tile on top of what the scores read, and 64 KB of Vᵀ
buffers. Here each thread loads 16 tokens × 16 dims of V from the K tile (16-byte loads, 0 bank conflicts) in a
layout whose lane and warp bits are those of the wgmma A-operand fragment of Vᵀ once rows and tokens are
relabelled (`_V_REGS`, `_pv_operand`), so the operand is built by byte permutes inside each thread's registers
(``PRMT``) and no Vᵀ is ever stored. Shared memory: 94 KB at 2 stages, 131 KB at 3. Row m of Oᵀ holds value dim
π(m) and column k of Vᵀ/Pᵀ token σ(k) (bit permutations chosen for the conflict-free loads); the epilogue undoes π
with a register renaming and stores 16 consecutive dims per thread (partials: head-minor from the accumulator,
`_store_partial_head_minor`).

The price: ptxas serialises every wgmma of the kernel when the PV of the previous tile is waited for with a
partial ``wait_group`` after the next QK is issued (warning C7514), and waiting for both after the V load spills;
so PV(i-1) is waited for before QK(i) is issued, and the tensor cores idle during each softmax. Measured on the
H200 (data/profiles/h200_2026-12-02_ab_hopper.csv, all else equal): faster than vt-smem on long tile streams
(128 × 8192: 149.5 vs 164.1 µs, within 1 % of the copy-bandwidth floor in that run; 64 × 8192: 84.8 vs 90.1),
slower on short ones (4 × 1024: 9.2 vs 8.5 µs) — until the ring's refill moved after the PV (2026-12-03,
data/profiles/h200_2026-12-03_ab_refill.csv): since then faster on every shape (geomean 21.9 vs 23.9 µs), and
``hopper_variant="auto"`` runs it everywhere (`triton_mla.HOPPER_LONG_STREAM`).
Tried and dropped on the same run (12 competition shapes, geomean): two CTAs per SM (264 plan slots, 2 stages;
30.6 vs 25.6 µs) and, on top of that, merging the split requests inside stage 1 (a spin-wait per request on a
global counter, no reduce launch; 34.4 µs).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

__all__: list[str] = []  # helpers of `gluon_hopper.stage1_kernel` (``V_IN_REGS=True``); no kernel of its own


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

#: The 128-token tile of two warpgroups (``BLOCK_N=128``, 8 warps; `KernelConfig.hopper_block`): the PV's A operand
#: (512 rows m, 128 tokens k) puts m4, m5, m6 on the 8 warps, so a third value-dim bit moves from the registers to the
#: warps and each thread loads 8 consecutive dims (8-byte loads) of 32 tokens. The lanes (t0, t1, d3, d6, d5) make each
#: 16-lane phase of an 8-byte load hit 8 distinct 16-byte chunks of the 128-byte swizzle x both halves of a chunk: 0
#: conflicts (counted at compile time with ``REPORT``). Relabelling: m = (d2 d1, d4, d8 d7, d0, d5, d6, d3) and
#: k = (t6 t5 t4, t1 t0, t3 t2), most significant first.
_V_REGS_128 = gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [4, 0], [8, 0], [16, 0], [32, 0], [64, 0]],
    lane_bases=[[1, 0], [2, 0], [0, 8], [0, 64], [0, 32]],
    warp_bases=[[0, 128], [0, 256], [0, 16]],
    block_bases=[],
    shape=[128, 512],
)

#: `_O_STORE` of the 8-warp tile: the accumulator's lanes and warps relabelled by π (lanes n1, n2, d3, d6, d5; warps
#: d7, d8, d4), registers ordered so each thread's 8 consecutive dims come first (16-byte stores of bf16).
_O_STORE_128 = gl.DistributedLinearLayout(
    reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8]],
    lane_bases=[[0, 2], [0, 4], [8, 0], [64, 0], [32, 0]],
    warp_bases=[[128, 0], [256, 0], [16, 0]],
    block_bases=[],
    shape=[512, 16],
)

#: Row m of the Oᵀ accumulator holds value dim d: bit i of m is bit ``ROW_BITS[i]`` of d (the π of each path, as the
#: epilogues' register relabellings undo it): v-regs (`_pv_operand`; 64- and 128-token tiles) and vt-smem (bits 0-2
#: and 4-6 swapped, `gluon_hopper._load_v`). `tests/test_hopper_kernel.py` checks both against those relabellings.
VREGS_ROW_BITS = gl.constexpr((6, 4, 5, 0, 7, 8, 1, 2, 3))
VREGS128_ROW_BITS = gl.constexpr((3, 6, 5, 0, 7, 8, 4, 1, 2))  # the 8-warp tile's π
VT_ROW_BITS = gl.constexpr((4, 5, 6, 3, 0, 1, 2, 7, 8))

#: The relabellings as (factor shape, permutation) pairs for reshape + permute, shared by the kernel and
#: `tests/test_hopper_kernel.py` (which checks them against the row bits above and each other): V of a tile (tokens,
#: 512 dims) -> the PV operand Vᵀ (512 rows m, tokens k), for 64- and 128-token tiles (`_pv_operand`); Oᵀ's rows m
#: (with the 16 heads last) -> natural value dims (`_store_work_vregs`).
V_TO_OPERAND_64 = gl.constexpr(((4, 4, 4, 4, 2, 4, 8, 2), (6, 3, 7, 5, 4, 0, 2, 1)))
V_TO_OPERAND_128 = gl.constexpr(((8, 4, 4, 4, 2, 2, 2, 2, 4, 2), (8, 6, 3, 9, 5, 4, 7, 0, 2, 1)))
O_TO_NATURAL_64 = gl.constexpr(((8, 4, 2, 4, 2, 16), (1, 4, 3, 0, 2, 5)))
O_TO_NATURAL_128 = gl.constexpr(((4, 2, 4, 2, 2, 2, 2, 16), (2, 5, 4, 1, 6, 0, 3, 7)))
#: P (tokens, heads) viewed as (tokens / 16, t3 t2, t1 t0, heads), permuted to σ's order: token bits (1, 0) and (3, 2)
#: swapped (`_p_operand`; a (factor shape, permutation) pair like the others, the shape's first factor left to the tile)
P_TO_OPERAND = gl.constexpr(((4, 4), (0, 2, 1, 3)))


@gluon.jit
def _lg2_approx(x):
    """log2 on the SFU (``MUFU.LG2``, |error| < 2^-22 here): ``gl.log2`` compiles to a ~25-instruction software log,
    and the epilogue runs on one warp per scheduler, where every dependent instruction is latency."""
    return gl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _rcp_approx(x):
    """1 / x on the SFU (``MUFU.RCP``, 1 ulp) instead of the IEEE division's Newton steps and slow-path branch."""
    return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _normaliser(m_i, l, v_scale):
    """A work's softmax sum per head `l` (reduced once from the per-thread running sums), as (LSE in natural log, the
    factor that normalises Oᵀ's columns). ``l >= 1`` whenever the work has a token (its maximum contributes exp2(0)),
    so the SFU's flush-to-zero never applies; an empty work (0 tokens) gets LSE -inf and factor v_scale (Oᵀ is 0)."""
    has = l > 0.0
    l_safe = gl.where(has, l, 1.0)
    lse = gl.where(has, (m_i + _lg2_approx(l_safe)) * 0.6931471805599453, float("-inf"))
    return lse, v_scale * _rcp_approx(l_safe)


@gluon.jit
def _pv_operand(kn, start, kv_end, DOT_A: gl.constexpr, MASK_TAIL: gl.constexpr, REPORT: gl.constexpr,
                BLOCK_N: gl.constexpr = 64):  # fmt: skip
    """Vᵀ of the tile in `kn` as the register A operand of the PV wgmma: (512 rows m, 64 tokens k).

    Loaded in `_V_REGS`, then relabelled: row m holds value dim ``d = π(m)`` and column k token ``t = σ(k)``, with
    ``π: m0..m8 -> d6 d4 d5 d0 d7 d8 d1 d2 d3`` and ``σ`` swapping token bits (0, 1) with (2, 3). Pᵀ uses the same
    token order σ (`_p_operand`) and the epilogue undoes π (`_store_work_vregs`). With ``BLOCK_N=128`` (8 warps) the
    load layout is `_V_REGS_128` and the relabelling `V_TO_OPERAND_128` (π of `VREGS128_ROW_BITS`, the same σ on the
    low token bits). ``MASK_TAIL`` (paged caches): tokens past the work's end are zeroed, since a page's unused slots
    may hold anything and 0 · NaN would poison Oᵀ."""
    if BLOCK_N == 128:
        V_L: gl.constexpr = _V_REGS_128
    else:
        V_L: gl.constexpr = _V_REGS
    v = kn.load(V_L)
    if REPORT:  # compile-time count for `sm90_build` (printed by the compiler, not at run time)
        gl.static_print("mlalab hopper: V load bank conflicts =", gl.bank_conflicts(v.type, kn.type))
    if MASK_TAIL and start + BLOCK_N > kv_end:
        offs_t = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, V_L))
        v = gl.where(((start + offs_t) < kv_end)[:, None], v, gl.zeros_like(v))
    # t = (X = t5 t4, Y = t3 t2, Z = t1 t0), d = (A = d8 d7, B = d6, C = d5 d4, D = d3 d2 d1, E = d0);
    # m = (D, A, E, C, B) and k = (X, Z, Y), most significant first
    if BLOCK_N == 128:  # t = (A = t6 t5 t4, B = t3 t2, C = t1 t0), d = (D = d8 d7, E, F, G, H = d6 .. d3, I = d2 d1,
        # J = d0); m = (I, G, D, J, F, E, H) and k = (A, C, B)
        v = v.reshape(V_TO_OPERAND_128[0]).permute(V_TO_OPERAND_128[1]).reshape([512, 128])
    else:
        v = v.reshape(V_TO_OPERAND_64[0]).permute(V_TO_OPERAND_64[1]).reshape([512, 64])
    return gl.convert_layout(v, DOT_A)


@gluon.jit
def _p_operand(p, fp8: gl.constexpr, NQ: gl.constexpr, BLOCK_N: gl.constexpr = 64):
    """Pᵀ (NQ, BLOCK_N tokens) in fp8 with the token order σ of `_pv_operand` (column k holds token σ(k)): token bits
    (1, 0) and (3, 2) swapped, the higher ones in place."""
    p8 = p.to(fp8).reshape([BLOCK_N // 16, P_TO_OPERAND[0][0], P_TO_OPERAND[0][1], NQ]).permute(P_TO_OPERAND[1])
    return p8.reshape([BLOCK_N, NQ]).permute([1, 0])


@gluon.jit
def _partial_value_scale(v_scale, partial_loc, PART_O):
    """The factor of V in what a work stores: the KV scale, except in 16-bit partials (``PART_O`` fp16,
    `KernelConfig.hopper_partials`), which hold V in units of its fp8 codes (|o| <= the fp8 maximum, no fp16
    overflow whatever the scale): the reduce applies the scale once."""
    if PART_O.dtype.element_ty == gl.float16:
        return gl.where(partial_loc < 0, v_scale, 1.0)
    return v_scale


@gluon.jit
def _store_work_vregs(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr, BLOCK_N: gl.constexpr = 64):  # fmt: skip
    """Normalise one work's Oᵀ (512, NQ) and write it: final bf16 output + LSE, or fp32 partial + LSE."""
    lse, scale = _normaliser(m_i, l_sum, _partial_value_scale(v_scale, partial_loc, PART_O))
    o = o * scale[None, :]
    if partial_loc < 0:  # the request is whole: final output (bf16) at its q row
        if BLOCK_N == 128:  # m = (d2 d1, d4, d8 d7, d0, d5, d6, d3) -> natural d
            o_nat = o.reshape(O_TO_NATURAL_128[0]).permute(O_TO_NATURAL_128[1]).reshape([D_NOPE, NQ])
            O_L: gl.constexpr = _O_STORE_128
        else:  # row m of Oᵀ holds value dim π(m): relabel to natural order m = (D, A, E, C, B) -> d = (A, B, C, D, E)
            o_nat = o.reshape(O_TO_NATURAL_64[0]).permute(O_TO_NATURAL_64[1]).reshape([D_NOPE, NQ])
            O_L: gl.constexpr = _O_STORE
        ob = gl.convert_layout(o_nat, O_L)
        offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, O_L))
        offs_n = gl.arange(0, NQ, layout=gl.SliceLayout(0, O_L))
        base = qo_start.to(gl.int64) * H
        gl.store(OUT + (base + offs_n[None, :]) * D_NOPE + offs_d[:, None], ob.to(OUT.dtype.element_ty))
        gl.store(OUT_LSE + base + gl.arange(0, NQ, layout=lse.type.layout), lse)
    else:  # one split of it: fp32 partial at the plan's partial row, head-minor
        if BLOCK_N == 128:
            ROW_BITS: gl.constexpr = VREGS128_ROW_BITS
        else:
            ROW_BITS: gl.constexpr = VREGS_ROW_BITS
        _store_partial_head_minor(o, lse, PART_O, PART_LSE, partial_loc.to(gl.int64) * H, ROW_BITS, D_NOPE, NQ)


@constexpr_function
def _columns_first(layout):  # noqa: ANN001, ANN202
    """`layout` (a `gl.DistributedLinearLayout` of a 2-D tensor) with its register bases along dim 1 first: the same
    elements in each thread, its registers renamed so that a row's columns are consecutive registers (what a vector
    store needs)."""
    cols = [b for b in layout.reg_bases if b[0] == 0]
    rows = [b for b in layout.reg_bases if b[0] != 0]
    return gl.DistributedLinearLayout(reg_bases=cols + rows, lane_bases=layout.lane_bases,
                                      warp_bases=layout.warp_bases, block_bases=layout.block_bases,
                                      shape=layout.shape)  # fmt: skip


@gluon.jit
def _store_partial_head_minor(o, lse, PART_O, PART_LSE, base, ROW_BITS: gl.constexpr, D_NOPE: gl.constexpr,
                              NQ: gl.constexpr):  # fmt: skip
    """A partial stored head-minor, rows ``base .. base + NQ`` of PART_LSE and element (d, n) of the partial at
    ``PART_O[base·D_NOPE + d·NQ + n]`` ((rows, 512, 16), what the reduce reads with ``HEAD_MINOR``), straight from
    the wgmma accumulator, no layout conversion and no shared-memory round trip. Row m goes to the value dim whose
    bits `ROW_BITS` gives.

    fp32: a thread holds 2 adjacent heads of a row (one 8-byte store) and a warp instruction fills 8 whole 32-byte
    sectors. fp16 (`KernelConfig.hopper_partials`): that order would write half sectors (16 bytes per quad of lanes,
    the other half by the next instruction), which the H200 took ~0.5 us longer to store than the fp32 partials; so
    the heads go in the column order of `triton_decode.HEAD_MINOR_COLUMN` (head 8j + 2i + b at column 4i + 2j + b,
    the LSEs too): the 4 heads a thread holds side by side, one 8-byte store per row, a whole 32-byte row per quad."""
    offs_l = gl.arange(0, NQ, layout=lse.type.layout)
    if PART_O.dtype.element_ty == gl.float16:
        gl.static_assert(NQ == 16, "the fp16 partials' column order is written for 16 heads")
        # a relabelling (register and lane bits change places in the layout): column 4i + 2j + b <- head 8j + 2i + b
        o = o.reshape([D_NOPE, 2, 4, 2]).permute([0, 2, 1, 3]).reshape([D_NOPE, NQ])
        o = gl.convert_layout(o, _columns_first(o.type.layout))  # (registers renamed: one 8-byte vector per row)
        lse_at = 4 * ((offs_l >> 1) & 3) + 2 * (offs_l >> 3) + (offs_l & 1)
    else:
        lse_at = offs_l
    L: gl.constexpr = o.type.layout
    offs_m = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, L))
    d = gl.zeros_like(offs_m)
    for i in gl.static_range(9):
        d = d | (((offs_m >> i) & 1) << ROW_BITS[i])
    offs_n = gl.arange(0, NQ, layout=gl.SliceLayout(0, L))
    gl.store(PART_O + base * D_NOPE + d[:, None] * NQ + offs_n[None, :], o.to(PART_O.dtype.element_ty))
    gl.store(PART_LSE + base + lse_at, lse)

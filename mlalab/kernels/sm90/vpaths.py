"""How V reaches the value product ``Oᵀ (512 × 16) += Vᵀ (512 × 64 tokens) · Pᵀ`` of the sm_90 stage 1.

The cache stores V token-major (the first 512 dims of each 576-dim K row), so Vᵀ's reduction dim (tokens) is the
tile's slow dim. wgmma reads a shared-memory A operand transposed only for 16-bit types, hence three paths, chosen by
the operand types (`stage1._stage1_kernel`):

* **fp8 q, fp8 KV (a8w8): V in registers.** Each thread loads 16 tokens × 16 dims of V from the K tile (16-byte
  loads, 0 bank conflicts) in a layout whose lane and warp bits are those of the wgmma A-operand fragment of Vᵀ once
  rows and tokens are relabelled (`_V_REGS`, `_pv_operand`): the operand is built by byte permutes inside each
  thread's registers, no Vᵀ is ever stored. Row m of Oᵀ then holds value dim π(m) and column k of Vᵀ/Pᵀ token σ(k)
  (bit permutations chosen for the conflict-free loads); Pᵀ takes the same σ (`_p_operand`), the epilogue undoes π.
* **bf16 q, bf16 KV: Vᵀ read straight from the K tile** (wgmma transposes 16-bit operands).

On both, a paged cache's unused slots may hold anything, NaN included, and 0 · NaN = NaN: a work's partial last tile
gets its tail rows zeroed in shared memory first (`_zero_tail_rows`).
* **bf16 q, fp8 KV (a16w8): each fp8 ring tile converted into one bf16 tile** by the CUDA cores (`_convert_tile`,
  exact), which the QK and the PV then read as on the bf16 path.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

__all__ = ["V_TO_OPERAND_64", "V_TO_OPERAND_8W", "P_TO_OPERAND"]


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


#: `_V_REGS` for two warpgroups (8 warps), the accumulator Oᵀ split by rows between them (`stage1`'s ``ACC_O``): the
#: operand's warp bits are rows m4, m5, m6, so a thread holds 8 dims (3 row bits) of 16 tokens, 8-byte loads; the 16
#: lanes of a load phase see tokens t0, t1 and dims d3, d6, which the swizzle spreads over 16 distinct 8-byte bank
#: pairs (0 conflicts).
_V_REGS_8W = gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [4, 0], [8, 0], [16, 0], [32, 0]],
    lane_bases=[[1, 0], [2, 0], [0, 8], [0, 64], [0, 16]],
    warp_bases=[[0, 32], [0, 128], [0, 256]],
    block_bases=[],
    shape=[64, 512],
)


#: The relabellings as (factor shape, permutation) pairs for reshape + permute, shared by the kernel and the tests
#: (which check them against `epilogue.VREGS_ROW_BITS` and each other): V of a tile (tokens, 512 dims) -> the PV
#: operand Vᵀ (512 rows m, tokens k); P (tokens, heads) viewed as (tokens / 16, t3 t2, t1 t0, heads), permuted to σ's
#: order: token bits (1, 0) and (3, 2) swapped (the shape's first factor left to the tile).
V_TO_OPERAND_64 = gl.constexpr(((4, 4, 4, 4, 2, 4, 8, 2), (6, 3, 7, 5, 4, 0, 2, 1)))
#: The same for two warpgroups (`_V_REGS_8W`): t = (X, Y, Z), d = (A = d8 d7, B = d6, C = d5, D = d4, E = d3,
#: F = d2 d1, G = d0) -> m = (F, A, C, G, D, B, E), k = (X, Z, Y) (π: m0..m8 -> d3 d6 d4 d0 d5 d7 d8 d1 d2).
V_TO_OPERAND_8W = gl.constexpr(((4, 4, 4, 4, 2, 2, 2, 2, 4, 2), (8, 3, 5, 9, 6, 4, 7, 0, 2, 1)))
P_TO_OPERAND = gl.constexpr(((4, 4), (0, 2, 1, 3)))


@gluon.jit
def _pv_operand(kn, DOT_A: gl.constexpr, REPORT: gl.constexpr):
    """Vᵀ of the fp8 tile in `kn` as the register A operand of the PV wgmma: (512 rows m, 64 tokens k).

    Loaded in `_V_REGS`, then relabelled: row m holds value dim ``d = π(m)`` and column k token ``t = σ(k)``, with
    ``π: m0..m8 -> d6 d4 d5 d0 d7 d8 d1 d2 d3`` and ``σ`` swapping token bits (0, 1) with (2, 3). A paged cache's
    tail rows are already zeroed in shared memory (`_zero_tail_rows`)."""
    if gl.num_warps() == 8:  # two warpgroups, each with its rows of Oᵀ (`V_TO_OPERAND_8W`)
        v = kn.load(_V_REGS_8W)
        if REPORT:  # compile-time count for `build` (printed by the compiler, not at run time)
            gl.static_print("mlalab hopper: V load bank conflicts =", gl.bank_conflicts(v.type, kn.type))
        v = v.reshape(V_TO_OPERAND_8W[0]).permute(V_TO_OPERAND_8W[1]).reshape([512, 64])
    else:
        v = kn.load(_V_REGS)
        if REPORT:
            gl.static_print("mlalab hopper: V load bank conflicts =", gl.bank_conflicts(v.type, kn.type))
        # t = (X = t5 t4, Y = t3 t2, Z = t1 t0), d = (A = d8 d7, B = d6, C = d5 d4, D = d3 d2 d1, E = d0);
        # m = (D, A, E, C, B) and k = (X, Z, Y), most significant first
        v = v.reshape(V_TO_OPERAND_64[0]).permute(V_TO_OPERAND_64[1]).reshape([512, 64])
    return gl.convert_layout(v, DOT_A)


@gluon.jit
def _p_operand(p, fp8: gl.constexpr, NQ: gl.constexpr, BLOCK_N: gl.constexpr):
    """Pᵀ (NQ, BLOCK_N tokens) rounded to the KV's fp8 type (aiter's a8w8 numerics) in the token order σ of
    `_pv_operand` (column k holds token σ(k)): token bits (1, 0) and (3, 2) swapped, the higher ones in place."""
    p8 = p.to(fp8).reshape([BLOCK_N // 16, P_TO_OPERAND[0][0], P_TO_OPERAND[0][1], NQ]).permute(P_TO_OPERAND[1])
    return p8.reshape([BLOCK_N, NQ]).permute([1, 0])


@gluon.jit
def _zero_tail_rows(kn, n_valid, BLOCK_N: gl.constexpr, D_NOPE: gl.constexpr):
    """Zero rows `n_valid` .. of a K tile's value dims in shared memory, before the PV reads V from the tile (a paged
    cache's unused slots may hold anything, NaN included: 0 · NaN = NaN). 64 columns at a time (one
    128-byte swizzle span), 32 values per thread."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
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
#: OR the signs back in (one LOP3, immLut 0xEC = (a & c) | b), multiply — 10 integer / bf16x2 instructions per 4 codes.
#: The NaN codes (0x7F, 0xFF) become ±480: a paged tail's unused slots are zeroed after the conversion, and the
#: quantiser never writes NaN. (Checked for all 256 codes against torch's e4m3fn in the GPU tests.)
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
    """The fp8 codes of a (BLOCK_N, D) ring tile into the bf16 tile `dst` (exact, `_E4M3_TO_BF16`), 64 columns at a
    time, 16 codes per thread per row; with `MASK_TAIL`, rows `n_valid` .. zeroed (a paged cache's unused slots may
    hold NaN, and the PV reads V from this tile: 0 · NaN = NaN)."""
    L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L))
    for c in gl.static_range(D // 64):
        codes = src.slice(c * 64, 64, dim=1).load(L).to(gl.uint8, bitcast=True)
        x = gl.inline_asm_elementwise(_E4M3_TO_BF16, "=r,=r,r", [codes], dtype=gl.bfloat16, is_pure=True, pack=4)
        if MASK_TAIL:
            x = gl.where((rows < n_valid)[:, None], x, gl.zeros_like(x))
        dst.slice(c * 64, 64, dim=1).store(x)

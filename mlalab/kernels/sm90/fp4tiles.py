"""fp4 KV on the sm_90 stage 1 (``v-fp4``): each ring tile of packed E2M1 codes becomes one bf16 tile in shared
memory, which the QK and the PV then read as on the bf16 path (`stage1`), as the a16w8 path does with fp8 tiles.

The cache (`mlalab.kernels.fp4.Fp4Cache`): per token 288 bytes of E2M1 codes, two per byte with the even index in the
low nibble, and block scales in their own tensor: MXFP4 one E8M0 byte per 32 values (18 per token), NVFP4 one E4M3
byte per 16 values (36 per token) and an fp32 scale per cache. What reaches shared memory and how:

* **codes** by TMA, with the ring (`stage1._issue_kv_tile`): 64 tokens × 256 bytes (512 value dims, 128-byte swizzle)
  and 64 × 32 bytes (the 64 rope dims);
* **block scales** by ordinary loads, one tile ahead (`_load_tile_scales`): a scale row of 18 or 36 bytes is no
  multiple of 16, which a TMA descriptor requires of its strides, and its rows are not aligned, so neither TMA nor
  cp.async can fetch them; the loads of tile ``it + 1`` go out once tile ``it`` is converted (9 registers a thread:
  NVFP4's scales are read two bytes at a time), land while its QK and softmax run, and are staged in a small
  shared buffer after its PV is issued (`_scale_buffers`; carried in registers across the loops instead, Triton
  3.6's build spilled), where the conversion of tile ``it + 1`` reads them;
* NVFP4's per-cache scale stays out of the tile: it rides in the KV scale (scores and output, in fp32), as on the
  portable kernel.

The conversion (`_convert_fp4_tile`) works on 32-byte column chunks (64 values, one 128-byte span of the bf16 tile),
16 bytes a thread: E2M1 → bf16 by a byte-table lookup (`_E2M1_TO_BF16X2`: ``prmt`` with the magnitude nibbles as
selectors), the sign bits put back, then one ``mul.rn.bf16x2`` by the block's scale as a bf16. Every product is
exact: E2M1 × 2^k (MXFP4) is a bf16 down to 2^-133 and up to overflow, where fp32 overflows too; E2M1 × an E4M3 scale
(NVFP4) has at most 6 significant bits and lies in [2^-10, 2688]. So the bf16 tile holds exactly the values
`mlalab.kernels.portable._fp4_values` computes in fp32 (E8M0 NaN gives NaN and 254 × 6 gives inf, as there; an E4M3
NaN scale, which the quantiser never writes, decodes as ±480 where the portable kernel gives NaN).

With fp8 q (``a8w4``) the q rows are converted once per work into a bf16 buffer (`_convert_q`, the e4m3 → bf16
conversion of the a16w8 path: exact), so both products run on bf16 operands and P is rounded to bf16.

**The e4m3 route** (``v-fp4-e4m3``: fp8 q with MXFP4 KV, ``E4M3=True``) keeps both products on fp8 wgmma, as a8w8:
each token's values are ``2^F`` times e4m3 codes (`mlalab.kernels.fp4.e4m3_residuals` is its CPU model, bit for
bit). F comes from the token's largest E8M0 byte E (`_token_exponents`: ``F = max(E, 33) - 133``); a block of scale
byte s holds E2M1 × 2^j, j = s - max(E, 33) + 6, which for j >= -5 is an e4m3 code: each block gets its own 8-entry
table of codes (`_block_tables`: the codes at j = -5 plus j + 5 in the exponent field; zeros for a flushed block,
`mlalab.kernels.fp4.E4M3_WINDOW`) from which each code nibble selects its byte (`_E2M1_TO_E4M3X4`). The tile of
e4m3 codes (64 × 576 bytes) is what the QK and the V-in-registers PV read. The factor 2^F runs along the tokens,
which is the M dim of the scores and the K dim of the PV, so it enters the softmax instead: the score column of
token t is multiplied by 2^F_t and F_t is added to its base-2 logit, so ``P̂ = 2^(s + F - m̂)`` (rounded to e4m3 as
a8w8's P) weights the residual rows and the softmax sum adds ``P̂ · 2^-F`` — the same output and LSE, with the
running max m̂ taken over the shifted logits. NVFP4 stays on the bf16 route: its E2M1 × E4M3 products have up to 6
significant bits, which e4m3's 4 cannot hold.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

from .. import fp4 as _fp4
from .vpaths import _E4M3_TO_BF16

__all__ = ["E2M1_BF16_LUT", "E2M1_E4M3_LUT", "BLOCK_BYTES", "FP4_NOPE_BYTES", "FP4_ROPE_BYTES"]

#: Code bytes per scale block (MXFP4 16, NVFP4 8), by the kernel's ``KV_FP4`` (1 MXFP4, 2 NVFP4).
BLOCK_BYTES = gl.constexpr((0, 16, 8))
#: Code bytes of a token's value dims (512 values) and rope dims (64 values): the two TMA boxes of a tile.
FP4_NOPE_BYTES = 256
FP4_ROPE_BYTES = 32

#: The bf16 bits of the 8 E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (index = the code's low 3 bits), as the
#: ``prmt`` tables of `_E2M1_TO_BF16X2`: low bytes (LO_A = entries 0-3, LO_B = 4-7) and high bytes (HI_A, HI_B).
E2M1_BF16_LUT = gl.constexpr((0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0))

#: 4 bytes of packed E2M1 codes ($4; byte k holds codes 2k (low nibble) and 2k + 1) times one block scale ($5, a bf16
#: in both halves) -> 4 bf16x2 words ($0-$3; word k = (value 2k, value 2k + 1)). The 4 magnitude nibbles of two bytes
#: select, with ``prmt``, the low and the high bytes of their bf16 bits from two 8-entry tables (`E2M1_BF16_LUT`);
#: two more ``prmt`` interleave them into words; the sign bits (bit 3 and bit 7 of each code byte, spread to the top
#: bit of each half by a sign-replicating ``prmt``) are OR-ed in (LOP3, immLut 0xF8 = a | (b & c)); one bf16x2
#: multiply by the scale, exact (see the module docstring). 24 instructions per 8 codes.
_E2M1_TO_BF16X2 = gl.constexpr("""{
.reg .b32 s0, s1, l0, h0, l1, h1, w4, g, m, la, lb, ha, hb;
mov.b32 la, 0xC0800000;
mov.b32 lb, 0xC0804000;
mov.b32 ha, 0x3F3F3F00;
mov.b32 hb, 0x40404040;
and.b32 s0, $4, 0x7777;
shr.b32 s1, $4, 16;
and.b32 s1, s1, 0x7777;
prmt.b32 l0, la, lb, s0;
prmt.b32 h0, ha, hb, s0;
prmt.b32 l1, la, lb, s1;
prmt.b32 h1, ha, hb, s1;
shl.b32 w4, $4, 4;
prmt.b32 m, l0, h0, 0x5140;
prmt.b32 g, w4, $4, 0xCC88;
lop3.b32 m, m, g, 0x80008000, 0xF8;
mul.rn.bf16x2 $0, m, $5;
prmt.b32 m, l0, h0, 0x7362;
prmt.b32 g, w4, $4, 0xDD99;
lop3.b32 m, m, g, 0x80008000, 0xF8;
mul.rn.bf16x2 $1, m, $5;
prmt.b32 m, l1, h1, 0x5140;
prmt.b32 g, w4, $4, 0xEEAA;
lop3.b32 m, m, g, 0x80008000, 0xF8;
mul.rn.bf16x2 $2, m, $5;
prmt.b32 m, l1, h1, 0x7362;
prmt.b32 g, w4, $4, 0xFFBB;
lop3.b32 m, m, g, 0x80008000, 0xF8;
mul.rn.bf16x2 $3, m, $5;
}""")

#: The e4m3 route's conversion: 4 bytes of packed E2M1 codes ($2, as in `_E2M1_TO_BF16X2`) of one MXFP4 block with
#: the block's own table of the 8 e4m3 codes of E2M1 magnitude × 2^j ($3 = entries 0-3, $7 = entries 4-7, one byte
#: each; all 0 for a flushed block: `_block_tables`) -> 8 e4m3 codes ($0 = values 0-3, $1 = values 4-7, value 2k + 1
#: in the byte after value 2k): each magnitude nibble selects its code from the table (one ``prmt`` per 4 values), the
#: sign bits are OR-ed in as on the bf16 route. 9 instructions per 8 codes ($4-$6, $8-$10: the same tables again,
#: one per packed code byte).
_E2M1_TO_E4M3X4 = gl.constexpr("""{
.reg .b32 m, s1, w4, t, g;
and.b32 m, $2, 0x77777777;
shr.b32 s1, m, 16;
shl.b32 w4, $2, 4;
prmt.b32 t, $3, $7, m;
prmt.b32 g, w4, $2, 0xD9C8;
lop3.b32 $0, t, g, 0x80808080, 0xF8;
prmt.b32 t, $3, $7, s1;
prmt.b32 g, w4, $2, 0xFBEA;
lop3.b32 $1, t, g, 0x80808080, 0xF8;
}""")

#: The e4m3 codes of the 8 E2M1 magnitudes times 2^-5 (`_block_tables`' base, index = the code's low 3 bits), and the
#: table as the two words ``prmt`` selects from.
E2M1_E4M3_LUT = gl.constexpr((0x00, 0x08, 0x10, 0x14, 0x18, 0x1C, 0x20, 0x24))
_LUT_LO = gl.constexpr(0x14100800)
_LUT_HI = gl.constexpr(0x24201C18)
#: The e4m3 route's constants (`mlalab.kernels.fp4`): the residual binade of a token's largest block, the blocks kept
#: below it, the floor of a token's E8M0 exponent.
E4M3_SHIFT = gl.constexpr(_fp4.E4M3_SHIFT)
E4M3_WINDOW = gl.constexpr(_fp4.E4M3_WINDOW)
E4M3_MIN_SCALE = gl.constexpr(_fp4.E4M3_MIN_SCALE)

#: A tile's code chunk (64 tokens × 32 bytes) as loaded from shared memory: 16 consecutive bytes a thread, lanes
#: along the tokens first (8 lanes of a 16-byte load phase see 8 tokens of one 16-byte column: 0 bank conflicts in the
#: 128-byte and 32-byte swizzles), 2 column halves, 4 warps of 16 tokens. The converted words (int32 = 2 bf16) the
#: same way, 16 consecutive words (64 bytes of a bf16 row) a thread.
_CODES = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [0, 1])


@constexpr_function
def _blocks_layout(KV_FP4):  # noqa: ANN001, ANN202
    """A code chunk as (64 tokens, blocks of the chunk, bytes of a block): the same threads and registers as
    `_CODES` (a thread's 16 bytes are 1 MXFP4 or 2 NVFP4 blocks), so a block's scale broadcasts over its bytes."""
    g = BLOCK_BYTES.value[int(getattr(KV_FP4, "value", KV_FP4))]
    return gl.BlockedLayout([1, 16 // g, g], [16, 2, 1], [4, 1, 1], [0, 2, 1])


#: A tile's value-dim scales as (64 tokens, 8 chunks, 2 scale units of a chunk): a unit is one E8M0 byte (MXFP4: a
#: 32-byte chunk holds 2 blocks) or two E4M3 bytes read as one 16-bit word (NVFP4: 4 blocks, 2 a thread, adjacent
#: and 2-byte aligned), so both formats carry 8 + 1 registers a thread. Each thread holds the units of its own
#: blocks in every chunk (the chunk dim in registers: taking one chunk is free, `_chunk_scales`).
_TILE_SCALES = gl.BlockedLayout([1, 8, 1], [16, 1, 2], [4, 1, 1], [0, 2, 1])
#: One chunk's (or the rope dims') scale units, (64 tokens, 2), as the tile's are held.
_CHUNK_SCALES = gl.SliceLayout(1, _TILE_SCALES)


@gluon.jit
def _load_tile_scales(KV_SCALES, row, live, n_rows, KV_FP4: gl.constexpr, BLOCK_N: gl.constexpr):
    """The block scales of the tile whose first token is KV row `row`, if `live`, as scale units (`_TILE_SCALES`):
    ``(value dims (64, 8, 2), rope dims (64, 2))``. A token's 18 or 36 scale bytes are 18 units (bytes or 16-bit
    words): units ``2c, 2c + 1`` are chunk c's, units 16 and 17 the rope dims'. Rows past the cache's `n_rows` read
    0 (their codes are TMA's zero fill); rows past the work's end are read like the others (their scores are masked,
    their V zeroed)."""
    if KV_FP4 == 2:
        units = KV_SCALES.to(gl.pointer_type(gl.uint16), bitcast=True)
    else:
        units = KV_SCALES
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, _TILE_SCALES)))
    c = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, _TILE_SCALES)))
    u = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, _TILE_SCALES)))
    rows = row + r
    base = units + rows.to(gl.int64) * 18
    ok = (live & (rows < n_rows))[:, None, None]
    nope = gl.load(base[:, None, None] + (2 * c)[None, :, None] + u[None, None, :], mask=ok, other=0)
    rr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, _CHUNK_SCALES))
    ru = gl.arange(0, 2, layout=gl.SliceLayout(0, _CHUNK_SCALES))
    rrows = row + rr
    rope = gl.load(units + rrows.to(gl.int64)[:, None] * 18 + 16 + ru[None, :], mask=(live & (rrows < n_rows))[:, None],
                   other=0)  # fmt: skip
    return nope, rope


@gluon.jit
def _scale_buffers(nope, rope):
    """Shared-memory buffers holding one tile's scale units (`_load_tile_scales`), initialised with `nope`, `rope`.
    A thread reads back only what it wrote (the same layout both ways)."""
    L3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    L2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    return (gl.allocate_shared_memory(nope.dtype, nope.shape, L3, nope),
            gl.allocate_shared_memory(rope.dtype, rope.shape, L2, rope))  # fmt: skip


@gluon.jit
def _chunk_scales(nope, c: gl.constexpr, BLOCK_N: gl.constexpr):
    """Chunk `c` (0-7) of a tile's value-dim scale units: ``nope[:, c, :]`` (64, 2) in `_CHUNK_SCALES` (register
    renaming only: the chunk dim is split off bit by bit, lowest first)."""
    x = nope.permute([0, 2, 1]).reshape([BLOCK_N, 2, 2, 2, 2])  # chunk 4·c2 + 2·c1 + c0 -> dims (c2, c1, c0)
    lo, hi = gl.split(x)
    if (c & 1) == 1:
        x = hi
    else:
        x = lo
    lo, hi = gl.split(x)
    if (c & 2) == 2:
        x = hi
    else:
        x = lo
    lo, hi = gl.split(x)
    if (c & 4) == 4:
        x = hi
    else:
        x = lo
    return gl.convert_layout(x, _CHUNK_SCALES)


@gluon.jit
def _block_scales(units, KV_FP4: gl.constexpr, BLOCK_N: gl.constexpr):
    """A chunk's scale units (64, 2) as its blocks' scale bytes (64, blocks of the chunk), in the layout that
    broadcasts over the blocks' code bytes (`_blocks_layout`): MXFP4 as they are; NVFP4 each 16-bit unit split into
    its two bytes (the lower-addressed, low byte, is the earlier block)."""
    L: gl.constexpr = gl.SliceLayout(2, _blocks_layout(KV_FP4))
    if KV_FP4 == 2:
        w = units.to(gl.int32)
        pair = gl.join(w & 0xFF, w >> 8)  # (64, 2 units, 2 bytes): block 2·unit + byte
        return gl.convert_layout(pair.reshape([BLOCK_N, 4]), L)
    else:
        return gl.convert_layout(units.to(gl.int32), L)


#: An E4M3 byte ($1, in an int32) -> its value as bf16 in both halves of $0, exact, as `vpaths._E4M3_TO_BF16` does it:
#: the 7 magnitude bits shifted into the bf16 exponent and mantissa fields make the value times 2^-120 (normal and
#: subnormal codes alike), the sign goes to bit 15, ``prmt`` copies the half, one bf16x2 multiply by 2^120 scales
#: it back. (The NaN codes 0x7F, 0xFF become ±480: the quantiser never writes them.)
_E4M3_TO_BF16X2 = gl.constexpr("""{
.reg .b32 t, u, k;
and.b32 t, $1, 0x7F;
shl.b32 t, t, 4;
and.b32 u, $1, 0x80;
shl.b32 u, u, 8;
or.b32 t, t, u;
prmt.b32 t, t, 0, 0x1010;
mov.b32 k, 0x7B807B80;
mul.rn.bf16x2 $0, t, k;
}""")


@gluon.jit
def _scale_words(s, KV_FP4: gl.constexpr):
    """Block scale bytes (int32) as bf16 in both halves of an int32 (the multiplier of `_E2M1_TO_BF16X2`), exact:
    E8M0 e -> 2^(e - 127) (e = 0: the bf16 subnormal 2^-127; 255: NaN); E4M3 -> its value (`_E4M3_TO_BF16X2`)."""
    if KV_FP4 == 1:
        bits = gl.where(s == 0, 0x40, gl.where(s == 255, 0x7FC0, s << 7))
        return bits | (bits << 16)
    else:
        return gl.inline_asm_elementwise(_E4M3_TO_BF16X2, "=r,r", [s], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _block_tables(s, e_max, keep):
    """The e4m3 route's per-block tables (`_E2M1_TO_E4M3X4`'s $3, $7) of E8M0 block scale bytes `s` (64 tokens,
    blocks), int32, given each token's floored largest scale byte `e_max` (64,): `E2M1_E4M3_LUT` (the codes at j = -5)
    with j + 5 added to the exponent field of its nonzero entries, j = s - e_max + 6 (no byte carries: the entries are
    <= 0x24 and (j + 5) << 3 <= 0x58), or all 0 where j < -5 (flushed) or not `keep` (a masked tail token)."""
    k = s - gl.convert_layout(e_max, gl.SliceLayout(1, s.type.layout))[:, None] + E4M3_WINDOW  # j + 5
    add = (k << 3) * 0x01010101
    kept = (k >= 0) & keep
    lo = gl.where(kept, _LUT_LO + (add & 0x7FFFFF00), 0)  # (entry 0, the code of ±0, stays 0)
    hi = gl.where(kept, _LUT_HI + add, 0)
    return lo, hi


@gluon.jit
def _convert_chunk(src, dst, scales, e_max, n_valid, MASK_TAIL: gl.constexpr, KV_FP4: gl.constexpr,
                   BLOCK_N: gl.constexpr, E4M3: gl.constexpr, REPORT: gl.constexpr):  # fmt: skip
    """One 32-byte column chunk of codes (`src`, 64 tokens × 32 bytes) times its block `scales` into `dst`: 32 bf16x2
    words a token (int32 view of the bf16 tile), or with `E4M3` 32 pairs of e4m3 codes (int16 view of the fp8 tile;
    `e_max`: the tokens' floored largest scale bytes, `_token_exponents`); with `MASK_TAIL`, tokens `n_valid` ..
    zeroed (a paged cache's unused slots may hold NaN scales: 0 · NaN = NaN in the PV; e4m3: their blocks
    flushed). `REPORT`: print the bank conflicts of the code load and the word store while compiling (`build`)."""
    G: gl.constexpr = BLOCK_BYTES[KV_FP4]
    B3: gl.constexpr = _blocks_layout(KV_FP4)
    raw = src.load(_CODES)
    if REPORT:
        gl.static_print("mlalab hopper: fp4 code load bank conflicts =", gl.bank_conflicts(raw.type, src.type))
    codes = gl.convert_layout(raw.reshape([BLOCK_N, 32 // G, G]), B3)
    if E4M3:
        s = _block_scales(scales, KV_FP4, BLOCK_N)
        rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s.type.layout))
        # (tail tokens flushed like a block out of range: ±0, whatever their codes and scales)
        keep = (rows < n_valid)[:, None] if MASK_TAIL else (rows >= 0)[:, None]
        lo, hi = _block_tables(s, e_max, keep)
        words = gl.inline_asm_elementwise(_E2M1_TO_E4M3X4, "=r,=r,r,r,r,r,r,r,r,r,r",
                                          [codes, gl.expand_dims(lo, 2), gl.expand_dims(hi, 2)], dtype=gl.int16,
                                          is_pure=True, pack=4)  # fmt: skip
    else:
        s = gl.expand_dims(_scale_words(_block_scales(scales, KV_FP4, BLOCK_N), KV_FP4), 2)
        words = gl.inline_asm_elementwise(_E2M1_TO_BF16X2, "=r,=r,=r,=r,r,r,r,r,r", [codes, s], dtype=gl.int32,
                                          is_pure=True, pack=4)  # fmt: skip
    words = gl.convert_layout(words.reshape([BLOCK_N, 32]), _CODES)
    if MASK_TAIL and not E4M3:
        rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, _CODES))
        words = gl.where((rows < n_valid)[:, None], words, gl.zeros_like(words))
    if REPORT:
        gl.static_print("mlalab hopper: fp4 word store bank conflicts =", gl.bank_conflicts(words.type, dst.type))
    dst.store(words)


@gluon.jit
def _token_exponents(sc_nope, sc_rope):
    """Each token's largest E8M0 block scale byte, floored at `E4M3_MIN_SCALE` (64,) int32, from a tile's scale units
    (`_load_tile_scales`, MXFP4 bytes): the e4m3 route's F = result - 127 - `E4M3_SHIFT`."""
    e_nope = gl.max(gl.max(sc_nope.to(gl.int32), axis=2), axis=1)
    e_rope = gl.convert_layout(gl.max(sc_rope.to(gl.int32), axis=1), e_nope.type.layout)
    return gl.maximum(gl.maximum(e_nope, e_rope), E4M3_MIN_SCALE)


@gluon.jit
def _convert_fp4_tile(codes_n, codes_r, scn_smem, scr_smem, kb_words, krb_words, n_valid, MASK_TAIL: gl.constexpr,
                      KV_FP4: gl.constexpr, BLOCK_N: gl.constexpr, E4M3: gl.constexpr,
                      REPORT: gl.constexpr, SKIP: gl.constexpr = False):  # fmt: skip
    """A ring tile of fp4 codes (value dims `codes_n` (64, 256 bytes), rope dims `codes_r` (64, 32 bytes)) with its
    block scales (staged by `_load_tile_scales` in `scn_smem`, `scr_smem`) into the converted tile (`kb_words`,
    `krb_words`: int32 views (64, 256), (64, 32) of the bf16 tile, or with `E4M3` int16 views of the same shapes of
    the e4m3 tile): 8 value chunks and the rope chunk (not masked: a masked token's score is -inf). Returns the
    tokens' floored largest scale bytes (`_token_exponents`: the e4m3 route's F + 133) with `E4M3`, else 0. `SKIP`
    (the ``convert`` ablation, timing only): the scales are read and the exponents taken, nothing is converted."""
    sc_nope = scn_smem.load(_TILE_SCALES)
    sc_rope = scr_smem.load(_CHUNK_SCALES)
    e_max = 0
    if E4M3:
        e_max = _token_exponents(sc_nope, sc_rope)
    if not SKIP:
        for c in gl.static_range(8):
            _convert_chunk(codes_n.slice(c * 32, 32, dim=1), kb_words.slice(c * 32, 32, dim=1),
                           _chunk_scales(sc_nope, c, BLOCK_N), e_max, n_valid, MASK_TAIL, KV_FP4, BLOCK_N, E4M3,
                           False)  # fmt: skip
        # (`gl.bank_conflicts` counts whole buffers only: the rope chunk's. The value chunks' 8 lanes of a 16-byte
        # phase see 8 tokens of one 16-byte column, which the 128-byte swizzle puts in 8 distinct bank groups.)
        _convert_chunk(codes_r, krb_words, sc_rope, e_max, n_valid, False, KV_FP4, BLOCK_N, E4M3, REPORT)
    return e_max


#: q rows (16 heads × 64 dims) of e4m3 codes -> bf16, 8 codes a thread.
_Q_CHUNK = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])


@gluon.jit
def _convert_q(qn8, qr8, qn16, qr16, D_NOPE: gl.constexpr, D_ROPE: gl.constexpr):
    """fp8 q rows (`qn8` (16, 512), `qr8` (16, 64) as TMA brought them) into the bf16 buffers the QK reads, exact
    (`vpaths._E4M3_TO_BF16`), 64 dims at a time."""
    for c in gl.static_range(D_NOPE // 64):
        codes = qn8.slice(c * 64, 64, dim=1).load(_Q_CHUNK).to(gl.uint8, bitcast=True)
        x = gl.inline_asm_elementwise(_E4M3_TO_BF16, "=r,=r,r", [codes], dtype=gl.bfloat16, is_pure=True, pack=4)
        qn16.slice(c * 64, 64, dim=1).store(x)
    for c in gl.static_range(D_ROPE // 64):
        codes = qr8.slice(c * 64, 64, dim=1).load(_Q_CHUNK).to(gl.uint8, bitcast=True)
        x = gl.inline_asm_elementwise(_E4M3_TO_BF16, "=r,=r,r", [codes], dtype=gl.bfloat16, is_pure=True, pack=4)
        qr16.slice(c * 64, 64, dim=1).store(x)


#: Shared-memory descriptors: ``reinterpret`` from Triton 3.7 on, ``_reinterpret`` up to 3.6 (the H200 machine's).
_HAS_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _as_words(tile, ROWS: gl.constexpr, COLS: gl.constexpr, SWIZZLE: gl.constexpr, WORD: gl.constexpr):
    """The converted tile buffer `tile` (1, ROWS, COLS) with a `SWIZZLE`-byte swizzle, viewed as (1, ROWS, COLS · bits
    / WORD's bits) of `WORD` (int32 for a bf16 tile, int16 for an e4m3 one) in the same bytes (the swizzle permutes
    16-byte units, so a word never straddles two)."""
    WB: gl.constexpr = WORD.primitive_bitwidth
    W: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=WB, rank=2)
    n: gl.constexpr = COLS * tile.dtype.primitive_bitwidth // WB
    if _HAS_REINTERPRET:
        return tile.reinterpret(WORD, [1, ROWS, n], W)
    else:
        return tile._reinterpret(WORD, [1, ROWS, n], W)

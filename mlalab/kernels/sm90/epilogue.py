"""How a work of the sm_90 stage 1 ends: normalise its Oᵀ accumulator and store it, as the final bf16 output (a
request that was not split) or as a partial for the reduce (one split of it), plus the natural-log LSE.

The accumulator is Oᵀ (512 value rows × 16 heads) in the wgmma layout. On the fp8 path (V from registers,
`vpaths._pv_operand`) row m holds value dim π(m) (`VREGS_ROW_BITS`); on the 16-bit paths (V read from the K tile)
row m is value dim m (`NATURAL_ROW_BITS`). Undoing π is a relabelling of register dims: no data moves.

Partials are ours alone (only the reduce reads them), so they are stored *head-minor*, (rows, 512, 16), straight
from the accumulator with no layout conversion. fp8 KV: in fp16, holding V in units of its fp8 codes (|o| ≤ the fp8
maximum, so no overflow whatever the KV scale; the reduce applies the scale), with the heads in the column order
`portable.HEAD_MINOR_COLUMN` so that a thread's 4 heads of a row are one 8-byte store and a quad of lanes fills a
32-byte sector. bf16 KV: in fp32, heads in natural order.

The normalisation runs on the SFU (``MUFU.RCP``, ``MUFU.LG2``): the epilogue is a chain of dependent instructions of
one warp per scheduler, where the IEEE division's Newton steps and the software log are pure latency.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

__all__ = ["VREGS_ROW_BITS", "VREGS_ROW_BITS_8W", "NATURAL_ROW_BITS", "O_TO_NATURAL_64", "O_TO_NATURAL_8W"]

#: Row m of the Oᵀ accumulator holds value dim d: bit i of m is bit ``ROW_BITS[i]`` of d. The fp8 path's π
#: (`vpaths._pv_operand`) and the 16-bit paths' identity.
VREGS_ROW_BITS = gl.constexpr((6, 4, 5, 0, 7, 8, 1, 2, 3))
#: π with two warpgroups (`vpaths.V_TO_OPERAND_8W`).
VREGS_ROW_BITS_8W = gl.constexpr((3, 6, 4, 0, 5, 7, 8, 1, 2))
NATURAL_ROW_BITS = gl.constexpr((0, 1, 2, 3, 4, 5, 6, 7, 8))

#: Oᵀ's rows m (with the 16 heads last) -> natural value dims, as a (factor shape, permutation) pair for reshape +
#: permute (`_store_work_vregs`; checked against `VREGS_ROW_BITS` in the tests).
O_TO_NATURAL_64 = gl.constexpr(((8, 4, 2, 4, 2, 16), (1, 4, 3, 0, 2, 5)))
#: The same with two warpgroups: m = (F = d2 d1, A = d8 d7, C = d5, G = d0, D = d4, B = d6, E = d3) -> d = (A, B, C,
#: D, E, F, G).
O_TO_NATURAL_8W = gl.constexpr(((4, 4, 2, 2, 2, 2, 2, 16), (1, 5, 2, 4, 6, 0, 3, 7)))


@constexpr_function
def _rows_first(layout):  # noqa: ANN001, ANN202
    """`layout` (Oᵀ relabelled to natural value-dim order, a `gl.DistributedLinearLayout`) with its register bases
    along dim 0 first: the same elements in each thread, its registers renamed so that a thread's consecutive dims
    are consecutive registers (16-byte stores of 8 or 16 dims)."""
    rows = sorted(b for b in layout.reg_bases if b[1] == 0)
    cols = [b for b in layout.reg_bases if b[1] != 0]
    return gl.DistributedLinearLayout(reg_bases=rows + cols, lane_bases=layout.lane_bases,
                                      warp_bases=layout.warp_bases, block_bases=layout.block_bases,
                                      shape=layout.shape)  # fmt: skip


@constexpr_function
def _o_to_natural(nq, num_warps):  # noqa: ANN001, ANN202
    """The (factor shape, permutation) that relabels Oᵀ's rows to natural value dims for `nq` columns (`nq` is the
    last factor, left in place): `O_TO_NATURAL_64` (one warpgroup) or `O_TO_NATURAL_8W` (two)."""
    nq, num_warps = (int(getattr(v, "value", v)) for v in (nq, num_warps))
    shape, perm = (O_TO_NATURAL_8W if num_warps == 8 else O_TO_NATURAL_64).value
    return gl.constexpr((tuple(shape[:-1]) + (nq,), tuple(perm)))


@constexpr_function
def _vregs_row_bits(num_warps):  # noqa: ANN001, ANN202
    """π of the fp8 path's Oᵀ rows for one or two warpgroups (`VREGS_ROW_BITS`, `VREGS_ROW_BITS_8W`)."""
    return VREGS_ROW_BITS_8W if int(getattr(num_warps, "value", num_warps)) == 8 else VREGS_ROW_BITS


@gluon.jit
def _lg2_approx(x):
    """log2 on the SFU (``MUFU.LG2``, |error| < 2^-22 here): ``gl.log2`` compiles to a ~25-instruction software log."""
    return gl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _rcp_approx(x):
    """1 / x on the SFU (``MUFU.RCP``, 1 ulp) instead of the IEEE division's Newton steps and slow-path branch."""
    return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _normaliser(m_i, l, v_scale):
    """A work's softmax sum per head `l` (base-2 running max `m_i`) as (LSE in natural log, the factor that normalises
    Oᵀ's columns). ``l >= 1`` whenever the work has a token (its maximum contributes exp2(0); on the e4m3 fp4 route
    ``2^-F >= 2^-121``, still a normal fp32), so the SFU's flush-to-zero never applies; an empty work (0 tokens)
    gets LSE -inf and factor v_scale (Oᵀ is 0)."""
    has = l > 0.0
    l_safe = gl.where(has, l, 1.0)
    lse = gl.where(has, (m_i + _lg2_approx(l_safe)) * 0.6931471805599453, float("-inf"))
    return lse, v_scale * _rcp_approx(l_safe)


@gluon.jit
def _partial_value_scale(v_scale, partial_loc, PART_O):
    """The factor of V in what a work stores: the KV scale, except in fp16 partials, which hold V in units of its fp8
    codes (the reduce applies the scale once)."""
    if PART_O.dtype.element_ty == gl.float16:
        return gl.where(partial_loc < 0, v_scale, 1.0)
    return v_scale


@gluon.jit
def _store_work_vregs(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                      H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr):  # fmt: skip
    """Normalise one work's Oᵀ (512, NQ) of the fp8 path (row m = value dim π(m)) and store it: final bf16 output +
    LSE, or a head-minor partial + LSE."""
    lse, scale = _normaliser(m_i, l_sum, _partial_value_scale(v_scale, partial_loc, PART_O))
    # (two warpgroups: the softmax state is split by columns, Oᵀ by rows; one: the same layout, nothing moves)
    o = o * gl.convert_layout(scale, gl.SliceLayout(0, o.type.layout))[None, :]
    if partial_loc < 0:  # the request is whole: final output (bf16) at its q rows
        # relabel to natural order (one warpgroup: m = (D, A, E, C, B) -> d = (A, B, C, D, E), `vpaths._pv_operand`)
        NAT: gl.constexpr = _o_to_natural(NQ, gl.num_warps())
        o_nat = o.reshape(NAT[0]).permute(NAT[1]).reshape([D_NOPE, NQ])
        OS: gl.constexpr = _rows_first(o_nat.type.layout)
        ob = gl.convert_layout(o_nat, OS)
        offs_d = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, OS))
        offs_n = gl.arange(0, NQ, layout=gl.SliceLayout(0, OS))
        base = qo_start.to(gl.int64) * H
        gl.store(OUT + (base + offs_n[None, :]) * D_NOPE + offs_d[:, None], ob.to(OUT.dtype.element_ty))
        gl.store(OUT_LSE + base + gl.arange(0, NQ, layout=lse.type.layout), lse)
    else:  # one split of it: a head-minor partial at the plan's partial row
        BITS: gl.constexpr = _vregs_row_bits(gl.num_warps())
        _store_partial_head_minor(o, lse, PART_O, PART_LSE, partial_loc.to(gl.int64) * H, BITS, D_NOPE, NQ)


@gluon.jit
def _store_work_natural(o, m_i, l_sum, v_scale, OUT, OUT_LSE, PART_O, PART_LSE, partial_loc, qo_start,
                        H: gl.constexpr, NQ: gl.constexpr, D_NOPE: gl.constexpr):  # fmt: skip
    """Normalise one work's Oᵀ (512, NQ) of a 16-bit path (row m = value dim m) and store it: final bf16 output +
    LSE (128-dim chunks converted so each warp stores 512 contiguous bytes), or a head-minor partial + LSE."""
    lse, scale = _normaliser(m_i, l_sum, _partial_value_scale(v_scale, partial_loc, PART_O))  # empty: 0, LSE -inf
    o = o * scale[None, :]
    if partial_loc < 0:  # the request is whole: final output (bf16) at its q rows
        # rows [128·c, 128·c + 128) are dims [128·c, 128·c + 128) for each chunk c (register bits: split is free)
        o_nat = o.reshape([4, 128, NQ]).permute([1, 2, 0])
        even, odd = gl.split(o_nat.reshape([128, NQ, 2, 2]))  # chunk c = 2·a + b: split takes b (the last axis) first
        o0, o2 = gl.split(even)
        o1, o3 = gl.split(odd)
        n_valid = H  # one q row of 16 heads per work (NQ == H): every column is valid
        _store_rows(o0, o1, o2, o3, lse, OUT, OUT_LSE, qo_start.to(gl.int64) * H, n_valid, D_NOPE, NQ)
    else:  # one split of it: a head-minor partial at the plan's partial row
        _store_partial_head_minor(o, lse, PART_O, PART_LSE, partial_loc.to(gl.int64) * H, NATURAL_ROW_BITS, D_NOPE,
                                  NQ)  # fmt: skip


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
    """A partial stored head-minor, rows ``base .. base + NQ`` of PART_LSE and element (d, n = 16 r + h) of q row r's
    partial at ``PART_O[(base + 16 r)·D_NOPE + 16 d + h]`` ((rows, 512, 16), what the reduces read), straight from the
    wgmma accumulator. Row m goes to the value dim whose bits `ROW_BITS` gives.

    fp32: a thread holds 2 adjacent heads of a row (one 8-byte store) and a warp instruction fills 8 whole 32-byte
    sectors. fp16: that order would write half sectors, so the heads go in the column order
    `portable.HEAD_MINOR_COLUMN` (head 8j + 2i + b at column 4i + 2j + b, the LSEs too): a thread's 4 heads are one
    8-byte store per row, a quad of lanes a whole 32-byte row."""
    gl.static_assert(NQ == 16 or NQ == 32 or NQ == 64, "one, two or four q rows of 16 heads")
    R: gl.constexpr = NQ // 16  # q rows: row r's partial is partial row base / 16 + r
    offs_l = gl.arange(0, NQ, layout=lse.type.layout)
    if PART_O.dtype.element_ty == gl.float16:
        # a relabelling (register and lane bits change places in the layout): column 4i + 2j + b <- head 8j + 2i + b
        o = o.reshape([D_NOPE, R, 2, 4, 2]).permute([0, 1, 3, 2, 4]).reshape([D_NOPE, NQ])
        o = gl.convert_layout(o, _columns_first(o.type.layout))  # (registers renamed: one 8-byte vector per row)
        lse_at = (offs_l & ~15) + 4 * ((offs_l >> 1) & 3) + 2 * ((offs_l >> 3) & 1) + (offs_l & 1)
    else:
        lse_at = offs_l
    L: gl.constexpr = o.type.layout
    offs_m = gl.arange(0, D_NOPE, layout=gl.SliceLayout(1, L))
    d = gl.zeros_like(offs_m)
    for i in gl.static_range(9):
        d = d | (((offs_m >> i) & 1) << ROW_BITS[i])
    offs_n = gl.arange(0, NQ, layout=gl.SliceLayout(0, L))
    if R == 1:
        ptrs = PART_O + base * D_NOPE + d[:, None] * NQ + offs_n[None, :]
    else:  # column n = 16 r + c: row r's (512, 16) partial, column c, at (base + 16 r)·512 + 16 d + c; written as
        # n + r·(16·512 - 16) so the compiler sees runs of 16 consecutive columns (8-byte vector stores)
        ptrs = PART_O + base * D_NOPE + d[:, None] * 16 + (offs_n + (offs_n // 16) * (16 * D_NOPE - 16))[None, :]
    gl.store(ptrs, o.to(PART_O.dtype.element_ty))
    gl.store(PART_LSE + base + lse_at, lse)

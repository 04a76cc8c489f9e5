"""Token tables on the sm_90 kernel: page size 1 with any token table (sglang's and aiter's token pool,
`host.tokens`), each ring stage filled with a tile's 64 KV rows by cp.async (`_copy_token_rows`), every thread of the
CTA copying its share and arriving on the stage's barrier once its copies land. Hopper's TMA has no gather: a row
each would be 64 TMA boxes a tile, and the 128-byte swizzle takes no slice of fewer than 8 rows.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.runtime.jit import constexpr_function

__all__: list[str] = []

#: cp.async global -> shared: ``async_copy_global_to_shared`` up to Triton 3.6 (the H200 machine's), ``async_load``
#: later.
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@constexpr_function
def _row_copy_layout(bits, warps):  # noqa: ANN001, ANN202
    """The layout of a cp.async of token rows of `bits`-bit values: 16 bytes a thread, 4 lanes along a row and 8 rows
    a warp, so a warp's copy reads 64 contiguous bytes (2 sectors) of each of 8 rows, and a thread copies 2 of a
    tile's 64 rows with 4 warps, 1 with 8 (their numbers: a register each, the same for the value and the rope
    dims)."""
    bits, warps = (int(getattr(v, "value", v)) for v in (bits, warps))
    return gl.BlockedLayout([1, 128 // bits], [8, 4], [warps, 1], [1, 0])


@gluon.jit
def _token_rows(rows_ptr, kn_smem, ok):
    """The 64 KV row numbers of a token-table tile (`rows_ptr`; 0 where not `ok`) in the copies' layout
    (`_copy_token_rows`): loaded a while before the copies are issued, so that no warp waits for them there."""
    L: gl.constexpr = _row_copy_layout(kn_smem.dtype.primitive_bitwidth, gl.num_warps())
    return gl.load(rows_ptr + gl.arange(0, kn_smem.shape[0], layout=gl.SliceLayout(1, L)), mask=ok, other=0)


@gluon.jit
def _copy_token_rows(KV, kn_smem, kr_smem, bar, rows):
    """A tile of 64 arbitrary KV rows (`rows`: their row numbers, `_token_rows`) into one ring stage (`kn_smem` value
    dims, `kr_smem` rope dims) by cp.async, 16 bytes a copy (`_row_copy_layout`); then each thread arrives on `bar`
    once its copies have landed (the stage's barrier counts one arrival per thread)."""
    D_N: gl.constexpr = kn_smem.shape[1]
    D_R: gl.constexpr = kr_smem.shape[1]
    L: gl.constexpr = _row_copy_layout(kn_smem.dtype.primitive_bitwidth, gl.num_warps())
    base = KV + (rows.to(gl.int64) * (D_N + D_R))[:, None]
    _cp_async(kn_smem, base + gl.arange(0, D_N, layout=gl.SliceLayout(0, L))[None, :])
    _cp_async(kr_smem, base + D_N + gl.arange(0, D_R, layout=gl.SliceLayout(0, L))[None, :])
    async_copy.mbarrier_arrive(bar, increment_count=False)

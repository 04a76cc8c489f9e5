"""Host side of the sm_90 stage 1: whether it can run these inputs (`unsupported`), the per-plan tables it reads (the
tile stream, the CTA headers), the ring it runs per path, and its launch (`Sm90Stage1`).

This module imports no Triton at load time (the tables and the refusals are computed on any machine); the kernel
modules are imported when a launcher is built.
"""

from __future__ import annotations

from typing import Any

import torch

from ...config import MLA
from ...inputs import kv_lens_from_layout
from ...quant.precision import Precision
from ..config import SIDE_BY_SIDE
from ..prepare import PreparedInputs

__all__ = ["PATHS", "path_of", "SUB_TILE_PAGES", "tokens",
           "RING", "ABLATABLE", "FIRST_BURST",
           "INFO_COLS", "unsupported", "import_error", "row_passes", "rows_per_cta_of", "SIDE_BY_SIDE_FROM_TOKENS",
           "batch_kv_tokens", "kv_box", "tile_stream",
           "cta_info",
           "first_burst", "Sm90Stage1"]  # fmt: skip

#: The path each precision takes through stage 1 (`vpaths`): how V reaches the value product.
PATHS = {Precision.A8W8: "v-regs", Precision.BF16: "v-tile", Precision.A16W8: "v-conv",
         **dict.fromkeys((Precision.A16W4_MXFP4, Precision.A8W4_MXFP4, Precision.A16W4_NVFP4, Precision.A8W4_NVFP4),
                         "v-fp4")}  # fmt: skip

#: Page sizes below a tile's 64 tokens that the kernel reads page by page (one TMA box per page, `tile_stream`).
SUB_TILE_PAGES = (16, 32)
#: The TMA ring of each path, in 64-token tiles: 3 fp8 tiles (36 KB each); 2 bf16 tiles (72 KB each, all that fits
#: beside q and P in the 227 KB of shared memory); 2 fp8 tiles beside the converted bf16 tile; 3 tiles of fp4 codes
#: (18 KB each) beside it.
RING = {"v-regs": 3, "v-tile": 2, "v-conv": 2, "v-fp4": 3, "v-fp4-e4m3": 3}

#: The measurement hook ``ABLATE`` (the work a timing experiment skips) and the path that has it: 1 the score
#: wgmma, 2 both wgmmas (the fp8 path), 3 the fp4 -> e4m3 conversion, 4 also the block scales' loads (the e4m3
#: route).
ABLATABLE = {1: "v-regs", 2: "v-regs", 3: "v-fp4-e4m3", 4: "v-fp4-e4m3"}

#: The ring tiles a CTA issues at its start when it streams more tiles than that and its ring is deeper; the rest
#: follow once its first tile has arrived (`first_burst`).
FIRST_BURST = 2

#: Columns of `cta_info`'s table (the kernel's ``INFO_COLS``): 5 + the rows of the deepest ring's first tiles.
INFO_COLS = 5 + max(RING.values())

#: Tokens per tile (the kernel's ``BLOCK_N``).
BLOCK_N = 64


def path_of(prepared: PreparedInputs, *, p_fp8: bool = True) -> str:
    """The stage-1 path these inputs take (`PATHS`); a8w4-mxfp4 takes the e4m3 route (``v-fp4-e4m3``: P rounded to
    e4m3, both products on fp8 wgmma) unless `p_fp8` is False (then the bf16 route, P in bf16)."""
    if p_fp8 and prepared.precision is Precision.A8W4_MXFP4:
        return "v-fp4-e4m3"
    return PATHS[prepared.precision]


def import_error() -> str | None:
    """Why the Gluon sm_90 kernel modules cannot be imported here (None when they can)."""
    try:
        from . import stage1  # noqa: F401
    except Exception as e:  # a Triton without Gluon's Hopper API, or no Triton at all
        return f"triton.experimental.gluon (Hopper) is unavailable: {type(e).__name__}: {e}"
    return None


def unsupported(
    prepared: PreparedInputs,
    work_info: torch.Tensor | None,
    *,
    pv_exact: bool = False,
    out_dtype: torch.dtype = torch.bfloat16,
    p_fp8: bool = True,
) -> str | None:
    """Why the sm_90 kernel cannot run these inputs and plan (None when it can): first what the inputs ask for, then
    what this machine lacks. `work_info`: the plan's works in tokens (`mlalab.kernels.decoder.token_work_info`), or
    None before any plan exists (no plan can make the inputs runnable or not today: any q rows per work run, as
    `row_passes`). The one place that decides: the decoder (kernel "auto") and the backend's plan default both ask
    it."""
    if prepared.spec.kv_fp4:
        expect = (prepared.kv.shape[0], MLA.qk_dim // (32 if prepared.spec.kv_format == "mxfp4" else 16))
        if (prepared.kv.dtype != torch.uint8 or prepared.kv.shape[-1] != MLA.qk_dim // 2 or prepared.kv_scales is None
                or tuple(prepared.kv_scales.shape) != expect):  # fmt: skip
            return (f"{prepared.spec.kv_format} KV must be (rows, {MLA.qk_dim // 2}) uint8 codes with (rows, "
                    f"{expect[1]}) block scales (mlalab.kernels.fp4.Fp4Cache)")  # fmt: skip
    if prepared.spec.kv_fp8 and prepared.kv.dtype != torch.float8_e4m3fn:
        return f"needs e4m3fn codes (what sm_90 wgmma reads), not {prepared.kv.dtype}"
    if prepared.spec.q_fp8 and prepared.q.dtype != torch.float8_e4m3fn:
        return f"needs e4m3fn q codes (what sm_90 wgmma and the q conversion read), not {prepared.q.dtype}"
    if pv_exact or out_dtype != torch.bfloat16:
        return "production numerics only (bf16 output, fp8 or bf16 products): exact mode runs on the portable kernel"
    if prepared.precision is Precision.A8W8 and not p_fp8:
        return "P kept in fp16 (p_fp8=False): the sm_90 value product runs on fp8 operands; the portable kernel runs it"
    kv_dim = MLA.qk_dim // 2 if prepared.spec.kv_fp4 else MLA.qk_dim  # (fp4: two codes per byte)
    if tuple(prepared.q.shape[1:]) != (MLA.num_heads, MLA.qk_dim) or prepared.kv.shape[-1] != kv_dim:
        return f"written for {MLA.num_heads} heads x {MLA.qk_dim} dims"
    ps = prepared.page_size
    if ps != 1 and ps % BLOCK_N and ps not in SUB_TILE_PAGES:
        pages = " or ".join(map(str, SUB_TILE_PAGES))
        return (f"tiles of {BLOCK_N} tokens must be rows of a token table or whole pages: page size 1, {pages} "
                f"tokens, or a multiple of {BLOCK_N} (got page size {ps})")  # fmt: skip
    if (ps in SUB_TILE_PAGES or tokens(prepared)) and prepared.spec.kv_fp4:
        return (f"fp4 KV needs contiguous tiles: pages of {BLOCK_N} tokens or more, or the identity token table (its "
                f"block scales are read per tile), got page size {ps}")  # fmt: skip
    dev = prepared.q.device
    if dev.type != "cuda" or torch.version.cuda is None:
        return "needs an NVIDIA GPU"
    if torch.cuda.get_device_capability(dev) != (9, 0):
        return f"needs compute capability 9.0 (Hopper), this GPU has {torch.cuda.get_device_capability(dev)}"
    return import_error()


def row_passes(work_indptr: torch.Tensor, work_info: torch.Tensor,
               rows_per_cta: int = 1) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(cta_indptr, row_work_info)`` on the CPU: the plan as the sm_90 kernel runs it, `rows_per_cta` q rows per work
    (1, or 2 or 4 where the kernel puts the q rows side by side in the wgmmas' N: `rows_per_cta_of`).

    A work of q rows ``[qs, qe)`` (speculative decode: q_len rows per request) becomes ``(qe - qs) / P`` works of
    ``P = rows_per_cta`` rows each, over the same KV range, writing the same outputs: rows ``qs + g·P ..`` and, when
    the work is split, partial rows ``partial_qo_loc + g·P ..``. Plan slot ``c``'s works become ``G`` CTAs (``G`` =
    the most row groups of any work), CTA ``c·G + g`` running group ``g`` of each of them: the G CTAs of a slot stream
    the same KV tiles side by side, so the G reads of a tile are one read from HBM and G - 1 from L2. With
    ``slots·G`` <= the SM count all of them run at once (the backend's default plan has ``SMs // G`` slots). A work
    without q rows runs nowhere (the kernel would write rows of the next request). When every work is one group of
    ``P`` rows the tables are the plan's own."""
    if type(rows_per_cta) is not int or rows_per_cta not in (1, 2, 4):
        raise ValueError(f"rows_per_cta must be 1, 2 or 4, got {rows_per_cta!r}")
    wp = work_indptr.to("cpu", torch.int64)
    wi = work_info.to("cpu", torch.int64)
    n_cu = wp.numel() - 1
    rows = (wi[:, 3] - wi[:, 2]).clamp(min=0)
    if bool((rows % rows_per_cta).any()):
        raise ValueError(f"every work must cover a multiple of rows_per_cta={rows_per_cta} q rows")
    groups = rows // rows_per_cta
    G = max(1, int(groups.max())) if groups.numel() else 1
    if bool((rows == rows_per_cta).all()):
        return wp.to(torch.int32), wi.to(torch.int32).contiguous()
    cu = torch.repeat_interleave(torch.arange(n_cu), wp.diff())  # each work's plan slot
    w = torch.repeat_interleave(torch.arange(wi.shape[0]), groups)  # a (work, group) pair per row group of every work
    g = torch.arange(w.numel()) - torch.repeat_interleave(torch.cumsum(groups, 0) - groups, groups)
    cta = cu[w] * G + g
    order = torch.sort(cta * max(1, wi.shape[0]) + w).indices  # CTA-major, works in plan order inside a CTA
    w, g, cta = w[order], g[order], cta[order]
    out = wi[w].clone()
    out[:, 1] = torch.where(out[:, 1] >= 0, out[:, 1] + g * rows_per_cta, out[:, 1])
    out[:, 2] = wi[w, 2] + g * rows_per_cta
    out[:, 3] = out[:, 2] + rows_per_cta
    cta_indptr = torch.zeros(n_cu * G + 1, dtype=torch.int64)
    cta_indptr[1:] = torch.cumsum(torch.bincount(cta, minlength=n_cu * G), 0)
    return cta_indptr.to(torch.int32), out.to(torch.int32).contiguous()


#: KV tokens in a batch from which the e4m3 route runs two CTAs an SM (`ctas_per_sm`)
TWO_CTAS_FROM_TOKENS = 1 << 17


def ctas_per_sm(prepared: PreparedInputs, kv_tokens: int, p_fp8: bool = True) -> int:
    """Persistent CTAs a default plan puts on each SM: 2 on the e4m3 route (``v-fp4-e4m3``: 255 registers and 114 KB
    of shared memory, so two fit, and one CTA's fp4 conversion overlaps the other's wgmmas) once the batch holds
    `TWO_CTAS_FROM_TOKENS` KV tokens or more; else 1 (smaller batches lose more to the extra splits' merges than
    they gain)."""
    if kv_tokens < 0:
        raise ValueError(f"kv_tokens must be >= 0, got {kv_tokens}")
    two = path_of(prepared, p_fp8=p_fp8) == "v-fp4-e4m3" and kv_tokens >= TWO_CTAS_FROM_TOKENS
    return 2 if two else 1


#: KV tokens in a batch from which `KernelConfig.side_by_side="auto"` puts q rows side by side (`rows_per_cta_of`):
#: H100, a8w8, q_len 2 and 4 (data/ab/h100_2026-12-07_mtp_2wg_q*.csv): one row a CTA faster at every batch of 32K
#: tokens or fewer (by 2-17 %), side by side at every one of 128K or more; the rule within 1 % of the faster at each
#: (data/ab/h100_2026-12-07_mtp_hybrid_q*.csv)
SIDE_BY_SIDE_FROM_TOKENS = 1 << 16


def batch_kv_tokens(prepared: PreparedInputs) -> int:
    """The KV tokens of all requests of `prepared` (`mlalab.inputs.kv_lens_from_layout`, summed)."""
    return int(kv_lens_from_layout(prepared.kv_indptr, prepared.kv_last_page_len, prepared.page_size).sum())


def rows_per_cta_of(
    prepared: PreparedInputs, q_rows: torch.Tensor, p_fp8: bool = True, side_by_side: str = "auto"
) -> int:
    """q rows a CTA of the sm_90 kernel runs per work: on the fp8 path (``v-regs``), 4 when every
    count in `q_rows` (the q rows of each work, or of each request before a plan exists) is a multiple of 4, else 2
    when every count is even (some not 0: q_len 2, 4), on two warpgroups sharing each tile (`stage1`); else 1.
    `side_by_side` (`KernelConfig.side_by_side`): ``"off"`` always 1, ``"auto"`` 1 below `SIDE_BY_SIDE_FROM_TOKENS` KV
    tokens."""
    if side_by_side not in SIDE_BY_SIDE:
        raise ValueError(f"side_by_side must be one of {', '.join(map(repr, SIDE_BY_SIDE))}, got {side_by_side!r}")
    rows = q_rows.to("cpu", torch.int64)
    if path_of(prepared, p_fp8=p_fp8) != "v-regs" or not bool((rows > 0).any()):
        return 1
    if side_by_side == "off" or (side_by_side == "auto" and batch_kv_tokens(prepared) < SIDE_BY_SIDE_FROM_TOKENS):
        return 1
    return next(r for r in (4, 2, 1) if bool((rows % r == 0).all()))


def tokens(prepared: PreparedInputs) -> bool:
    """Page size 1 with a token table other than the identity: every row of a tile fetched on its own (the kernel's
    ``TOKENS``, `tokenrows._copy_token_rows`)."""
    return prepared.page_size == 1 and not prepared.contiguous


def kv_box(prepared: PreparedInputs) -> int:
    """Rows of one KV TMA box: a page where pages are shorter than a tile (`SUB_TILE_PAGES`), one row of a token table
    (`tokens`: the tile stream lists each row; no TMA reads them), else a tile."""
    if tokens(prepared):
        return 1
    return prepared.page_size if prepared.page_size in SUB_TILE_PAGES else BLOCK_N


def tile_stream(prepared: PreparedInputs, work_indptr: torch.Tensor,
                work_info: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(tile_indptr, tile_rows)`` int32 on the CPU: the sm_90 kernel's tile stream. CTA ``c`` consumes the 64-token
    tiles of its works in order; ``tile_rows[t]`` is the KV row of tile t's first token (its position itself with the
    identity page table, else through ``kv_indices``: tiles never cross a page because pages are multiples of 64
    tokens and works start on page boundaries). Pages of 16 or 32 tokens (`kv_box`): ``64 / page`` rows per tile,
    one per page (a page past the work's end repeats the tile's last page: read, then masked); a token table
    (`tokens`): 64 rows per tile, one per token, the same way."""
    wi = work_info.to("cpu", torch.int64)
    ks, ke = wi[:, 4], wi[:, 5]
    counts = torch.clamp((ke - ks + BLOCK_N - 1) // BLOCK_N, min=0)
    n = int(counts.sum())
    owner = torch.repeat_interleave(torch.arange(wi.shape[0]), counts)
    first = torch.cumsum(counts, 0) - counts
    pos = ks[owner] + BLOCK_N * (torch.arange(n) - first[owner])
    box = kv_box(prepared)
    if prepared.contiguous and prepared.page_size == 1:
        rows = pos
    else:
        ps = prepared.page_size
        if box < BLOCK_N:  # every page of every tile, those past the work's end clamped to its last page
            if bool((ks % ps != 0).any()):
                raise ValueError(f"works must start on page boundaries (page size {ps})")
            sub = pos[:, None] + box * torch.arange(BLOCK_N // box)[None, :]
            sub = torch.minimum(sub, (ke[owner] - 1)[:, None] // ps * ps).reshape(-1)
            pos = sub
        rows = prepared.kv_indices.to("cpu", torch.int64)[pos // ps] * ps + pos % ps
    csum = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    tile_indptr = csum[work_indptr.to("cpu", torch.int64)]
    if rows.numel() and int(rows.max()) >= 2**31:
        raise ValueError("KV rows beyond 2^31: TMA coordinates are int32")
    return tile_indptr.to(torch.int32), rows.to(torch.int32)


def cta_info(work_indptr: torch.Tensor, tile_indptr: torch.Tensor, tile_rows: torch.Tensor,
             work_info: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``(n_cu, INFO_COLS)`` int32 on the CPU, one row per CTA, read in one round trip at its start: first work, end
    work, first tile, end tile, the q row of its first work (0 if none), then the KV rows of its first tiles, as many
    as the deepest ring holds (0 where absent)."""
    wp = work_indptr.to("cpu", torch.int64)
    tp = tile_indptr.to("cpu", torch.int64)
    rows = tile_rows.to("cpu", torch.int64)
    wi = work_info.to("cpu", torch.int64)
    n_cu = wp.numel() - 1
    info = torch.zeros((n_cu, INFO_COLS), dtype=torch.int64)
    info[:, 0], info[:, 1], info[:, 2], info[:, 3] = wp[:-1], wp[1:], tp[:-1], tp[1:]
    has_work = wp[:-1] < wp[1:]
    if wi.numel():
        info[has_work, 4] = wi[wp[:-1][has_work], 2]
    for i in range(INFO_COLS - 5):
        has = tp[:-1] + i < tp[1:]
        info[has, 5 + i] = rows[tp[:-1][has] + i]
    return info.to(torch.int32).contiguous()


def first_burst(most_tiles: int, stages: int) -> int:
    """The ring tiles issued at a CTA's start (the kernel's ``FIRST_BURST``; `stages` = all at once) for a plan whose
    longest CTA tile stream is `most_tiles` tiles and a ring of `stages` tiles: `FIRST_BURST` when some CTA streams
    more tiles than that and the ring is deeper, else the whole ring (the two would issue the same tiles, and the
    kernel without the deferred branch is the shorter one)."""
    if type(most_tiles) is not int or most_tiles < 0:
        raise ValueError(f"most_tiles must be an int >= 0, got {most_tiles!r}")
    if type(stages) is not int or stages < 1:
        raise ValueError(f"stages must be an int >= 1, got {stages!r}")
    return FIRST_BURST if stages > FIRST_BURST and most_tiles > FIRST_BURST else stages


class Sm90Stage1:
    """The sm_90 stage 1 for one plan: its tables on the device, its compile-time arguments, and a launch that
    caches the TMA descriptors per (q, kv) buffer pair (e.g. per rotated KV copy). `work_indptr` / `work_info`:
    `rows_per_cta` q rows per work, one row of `work_indptr` per CTA (`row_passes`)."""

    def __init__(self, prepared: PreparedInputs, work_indptr: torch.Tensor, work_info: torch.Tensor, *,
                 launch_dependents: bool, p_fp8: bool = True, rows_per_cta: int = 1) -> None:  # fmt: skip
        from . import stage1

        self.K = stage1
        self.path = path_of(prepared, p_fp8=p_fp8)
        self.stages = RING[self.path]
        t_indptr, t_rows = tile_stream(prepared, work_indptr, work_info)
        self.kv_box = kv_box(prepared)
        self.tiles_per_cta = t_indptr.diff()
        self.works_per_cta = work_indptr.to("cpu", torch.int64).diff()
        most = int(self.tiles_per_cta.max()) if t_indptr.numel() > 1 else 0
        dev = prepared.q.device
        self.tile_rows = t_rows.to(dev)
        # (the header's first-tile rows: the first page of each; the kernel reads pages from TILE_ROWS itself)
        firsts = t_rows.reshape(-1, BLOCK_N // self.kv_box)[:, 0]
        self.cta_info = cta_info(work_indptr, t_indptr, firsts, work_info).to(dev)
        self.n_cu = int(work_indptr.numel() - 1)
        self.p = prepared
        self._descs: dict[tuple[int, int], tuple] = {}
        #: q rows per work (`rows_per_cta_of`), side by side in the wgmmas' N; more than one on two warpgroups
        self.rows = rows_per_cta
        self.kw: dict[str, Any] = dict(
            H=MLA.num_heads, NQ=MLA.num_heads * rows_per_cta, D_NOPE=MLA.v_dim, D_ROPE=MLA.rope_dim, BLOCK_N=BLOCK_N,
            NUM_STAGES=self.stages, MASK_TAIL=not (prepared.contiguous and prepared.page_size == 1),
            LAUNCH_DEPENDENTS=launch_dependents, FIRST_BURST=first_burst(most, self.stages), REPORT=False,
            KV_FP4={"mxfp4": 1, "nvfp4": 2}.get(prepared.spec.kv_format, 0), FP4_E4M3=self.path == "v-fp4-e4m3",
            TOKENS=tokens(prepared), CAUSAL=prepared.causal and rows_per_cta > 1,
            num_warps=4 if rows_per_cta == 1 else 8,
        )  # fmt: skip
        #: fp4 KV: the block scales as bytes (what the kernel reads, `fp4tiles._load_tile_scales`), else a stand-in
        self.kv_scales = prepared.kv_scale if prepared.kv_scales is None else prepared.kv_scales.view(torch.uint8)

    def descriptors(self, q: torch.Tensor, kv: torch.Tensor) -> tuple:
        """The TMA descriptors of this (q, kv) pair: built once per buffer pair, then cached."""
        p = self.p
        if (q.dtype, q.shape, kv.dtype, kv.shape) != (p.q.dtype, p.q.shape, p.kv.dtype, p.kv.shape):
            raise ValueError("q / kv must have the prepared tensors' dtype and shape (TMA descriptors are cached)")
        if not (q.is_contiguous() and kv.is_contiguous()):
            raise ValueError("q / kv must be contiguous (their TMA descriptors assume the prepared strides)")
        key = (q.data_ptr(), kv.data_ptr())
        descs = self._descs.get(key)
        if descs is None:
            if kv.shape[0] == 0:  # every request empty: no tile is read, but a TMA descriptor needs a non-empty box
                kv = torch.zeros((BLOCK_N, kv.shape[-1]), dtype=kv.dtype, device=kv.device)
                self._empty_kv = kv  # (kept alive with its descriptor)
            # (a token table's rows come by cp.async: its descriptors only give the ring its layout)
            box = BLOCK_N if self.kv_box == 1 else self.kv_box
            descs = self.K.make_descriptors(q.reshape(-1, q.shape[-1]), kv, MLA.num_heads * self.rows, box)
            self._descs[key] = descs
        return descs

    def launch(self, q: torch.Tensor, kv: torch.Tensor, work_info: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor, part_o: torch.Tensor, part_lse: torch.Tensor, sm_scale: float, *,
               timeline: torch.Tensor | None = None, ablate: int = 0) -> None:  # fmt: skip
        """One launch (no host synchronisation). `timeline`: an (n_cu, TIMELINE_COLS) int64 buffer to stamp;
        `ablate`: skip the score wgmma (1), both wgmmas (2), the e4m3 route's conversion (3) or also its scales'
        loads (4; `ABLATABLE`) —
        outputs wrong, for timing experiments only. With fp4
        KV, `kv` holds the codes and the block scales are the prepared ones (as on the portable kernel)."""
        stamps = lse if timeline is None else timeline  # (any tensor when not stamping: never touched)
        kv_rows = int(kv.shape[0]) if self.kw["KV_FP4"] else 0
        self.K.stage1_kernel[(self.n_cu,)](
            *self.descriptors(q, kv), self.cta_info, work_info, self.tile_rows, out, lse, part_o, part_lse,
            self.p.q_scale, self.p.kv_scale, self.kv_scales, kv_rows, kv, sm_scale, stamps,
            TIMELINE=timeline is not None, ABLATE=ablate, **self.kw,
        )  # fmt: skip

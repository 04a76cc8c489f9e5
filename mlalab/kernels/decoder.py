"""`Decoder`: one WorkPlan executed on the GPU by stage 1 + reduce, planned once, run many times.

    prepared = prepare(inputs, "a8w8")                       # quantise once (mlalab.kernels.prepare)
    plan = make_plan("simple", qo_indptr, kv_indptr, 132)    # split once (mlalab.plan)
    dec = Decoder(prepared, plan)                            # tables, buffers, the kernel choice: once
    out, lse = dec()                                         # no host synchronisation: CUDA-graph capturable

Stage 1 runs on the sm_90 kernel (`mlalab.kernels.sm90`) where it applies and on the portable Triton kernel
(`mlalab.kernels.portable`) elsewhere; ``Decoder.sm90_reason`` says why not, ``Decoder.ran`` what ran. The reduce
merges the partials of split requests: the Gluon reduce for the sm_90 kernel's fp16 partials (fp8 KV), the Triton one
for fp32 partials (bf16 and fp4 KV on sm_90, and the portable kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import MLA
from ..inputs import kv_lens_from_layout
from ..plan import WorkPlan
from ..quant.precision import Precision
from .config import KernelConfig
from .prepare import PreparedInputs
from .sm90 import host as sm90_host
from .sm90.timeline import CtaTimeline, launch_clock_ghz, measure_clock_ghz, timeline_from_stamps

__all__ = ["Decoder", "decode", "check_plan", "token_work_info", "causal_work_info", "ABLATIONS", "L2_BYTES"]

#: `Decoder.ablation`: which compute the sm_90 stage 1 skips (the kernel's ``ABLATE``, `sm90.host.ABLATABLE`).
ABLATIONS = {"qk": 1, "qk+pv": 2, "convert": 3, "convert+scales": 4}

#: The H200's L2 (60 MB): `Decoder.stage1_timeline` reads twice this much before a stamped launch.
L2_BYTES = 60 * 1024 * 1024


def check_plan(plan: WorkPlan, batch: int, total_q: int, *, page_size: int | None = None) -> None:
    """Reject a plan that cannot belong to these tensors (not a WorkPlan, wrong batch or page size, q rows out of
    range). `WorkPlan.validate` checks the rest of the contract."""
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan (mlalab.plan.make_plan), got {type(plan).__name__}")
    if plan.batch != batch:
        raise ValueError(f"plan was built for batch {plan.batch} but the inputs have batch {batch}")
    if page_size is not None and plan.page_size != page_size:
        raise ValueError(f"plan was built for page size {plan.page_size} but the inputs have page size {page_size}")
    wi = plan.work_info
    if wi.numel():
        wc = wi.cpu()
        if int(wc[:, 3].max()) > total_q or int(wc[:, 2].min()) < 0:
            raise ValueError(f"plan.work_info q rows lie outside [0, {total_q}): built for other inputs?")


def token_work_info(plan: WorkPlan, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor) -> torch.Tensor:
    """``plan.work_info`` (CPU int32 copy) with kv_start / kv_end turned from ``kv_indices`` positions (pages) into
    the token positions of the page-expanded list that the kernels walk.

    Pages are page-aligned and only a request's last page is partial: ``tok_start = kv_start·page_size``,
    ``tok_end = min(kv_end·page_size, kv_indptr[b]·page_size + kv_len[b])``. Identity at page size 1.
    """
    ps = plan.page_size
    wi = plan.work_info.to("cpu", torch.int64).clone()
    if wi.numel() == 0:
        return wi.to(torch.int32)
    b = wi[:, 0]
    wi[:, 4] = wi[:, 4] * ps
    wi[:, 5] = torch.minimum(wi[:, 5] * ps, _request_ends(kv_indptr, kv_last_page_len, ps)[b])
    return wi.to(torch.int32).contiguous()


def _request_ends(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """The first token position after each request in the page-expanded list (CPU int64)."""
    lens = kv_lens_from_layout(kv_indptr, kv_last_page_len, page_size)
    return kv_indptr.to("cpu", torch.int64)[:-1] * page_size + lens


def causal_work_info(row_info: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                     kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:  # fmt: skip
    """Works (token positions, as `sm90.host.row_passes` groups them) under the causal mask: row ``qi`` of request b,
    whose q rows are ``[qo[b], qo[b+1])``, sees the positions before ``end[b] - (qo[b+1] - 1 - qi)``
    (`mlalab.reference.causal_visible`). Column 7 (unused by the plan) gets that end for the work's last q row, and
    kv_end is cut to it: a work of one row is then masked by its KV end alone; in a work of several the kernel masks
    row r of R at ``min(kv_end, column 7 - (R - 1 - r))`` (the sm_90 kernel's ``CAUSAL``). A work whose range lies
    past the prefix keeps kv_end = kv_start: it streams nothing and writes the merge's identity (output 0, LSE -inf)
    to its partial rows."""
    wi = row_info.to("cpu", torch.int64).clone()
    if wi.numel() == 0:
        return wi.to(torch.int32)
    qo = qo_indptr.to("cpu", torch.int64)
    b = wi[:, 0]
    wi[:, 7] = _request_ends(kv_indptr, kv_last_page_len, page_size)[b] - (qo[b + 1] - wi[:, 3])
    wi[:, 5] = torch.maximum(torch.minimum(wi[:, 5], wi[:, 7]), wi[:, 4])
    return wi.to(torch.int32).contiguous()


class Decoder:
    """Stage 1 + reduce for one plan and one set of tensor shapes; `__call__` launches without host syncs.

    ``out_dtype=torch.float32`` keeps the output before the final bf16 cast, and ``pv_exact=True`` runs both products
    on fp32 operands so the only kernel error is fp32 accumulation (both portable kernel only: the exactness tests).
    ``sm_scale`` defaults to 1/sqrt(576).
    """

    def __init__(self, prepared: PreparedInputs, plan: WorkPlan, *, config: KernelConfig | None = None,
                 out_dtype: torch.dtype = torch.bfloat16, pv_exact: bool = False,
                 sm_scale: float | None = None) -> None:  # fmt: skip
        from . import portable  # (imports triton: a clear ImportError before any work)

        if not isinstance(prepared, PreparedInputs):
            raise TypeError(f"prepared must be a PreparedInputs (see prepare()), got {type(prepared).__name__}")
        config = KernelConfig() if config is None else config
        if not isinstance(config, KernelConfig):
            raise TypeError(f"config must be a KernelConfig, got {type(config).__name__}")
        if out_dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
        if not isinstance(pv_exact, bool):
            raise TypeError(f"pv_exact must be True or False, got {pv_exact!r}")
        if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and sm_scale > 0):
            raise ValueError(f"sm_scale must be a positive number or None (1/sqrt(576)), got {sm_scale!r}")
        check_plan(plan, prepared.batch, int(prepared.q.shape[0]), page_size=prepared.page_size)
        plan.validate(prepared.qo_indptr, prepared.kv_indptr)  # once per plan: a broken plan never reaches the GPU
        # the kernels walk token positions; WorkPlan counts kv_indices positions (pages): translate once, here
        work_info = token_work_info(plan, prepared.kv_indptr, prepared.kv_last_page_len)
        self.pv_exact = bool(pv_exact or (portable.INTERPRET and prepared.precision is not Precision.A8W8))
        why_not = None
        if config.kernel != "portable":
            why_not = sm90_host.unsupported(prepared, work_info, pv_exact=self.pv_exact, out_dtype=out_dtype,
                                            p_fp8=config.p_fp8)  # fmt: skip
            if why_not is not None and config.kernel == "sm90":
                raise ValueError(f"kernel='sm90' cannot run here: {why_not}")
        #: which stage-1 kernel runs ("sm90" or "portable")
        self.kernel = "portable" if config.kernel == "portable" or why_not is not None else "sm90"
        #: why the sm_90 kernel does not run (None when it does, or when the portable one was asked for)
        self.sm90_reason = why_not
        dev = prepared.q.device
        if dev.type == "cpu" and not portable.INTERPRET:
            raise RuntimeError("the Triton backend needs a GPU (or TRITON_INTERPRET=1 for tiny CPU runs)")
        self.portable = portable
        self.p = prepared
        self.plan = plan.to(dev)
        #: stage 1's tables: the plan's (token positions), or its works regrouped (`sm90.host.row_passes`): 1, 2 or 4 q
        #: rows a work on the sm_90 kernel, one a work on the portable kernel under the causal mask (it masks by KV end)
        self.work_indptr, self.work_info = self.plan.work_indptr, work_info.to(dev)
        #: q rows a work of stage 1 runs (the sm_90 kernel puts 2 or 4 side by side where it can:
        #: `sm90.host.rows_per_cta_of`)
        self.rows_per_cta = 1
        if self.kernel == "sm90":
            q_rows = work_info[:, 3] - work_info[:, 2]
            self.rows_per_cta = sm90_host.rows_per_cta_of(
                prepared, q_rows, p_fp8=config.p_fp8, side_by_side=config.side_by_side
            )
        if self.kernel == "sm90" or prepared.causal:
            cta_indptr, work_info = sm90_host.row_passes(plan.work_indptr, work_info, self.rows_per_cta)
            if prepared.causal:
                work_info = causal_work_info(work_info, prepared.qo_indptr, prepared.kv_indptr,
                                             prepared.kv_last_page_len, prepared.page_size)  # fmt: skip
            self.work_indptr, self.work_info = cta_indptr.to(dev), work_info.to(dev)
        self.config = config
        self.sm_scale = MLA.sm_scale if sm_scale is None else float(sm_scale)
        total_q, H, DV = int(prepared.q.shape[0]), MLA.num_heads, MLA.v_dim
        self.out = torch.empty((total_q, H, DV), dtype=out_dtype, device=dev)
        self.lse = torch.empty((total_q, H), dtype=torch.float32, device=dev)
        self.n_cu = int(self.work_indptr.numel() - 1)
        n_part = max(1, plan.n_partial_rows)
        sm90 = self.kernel == "sm90"
        # Partials: the sm_90 stage 1 stores them head-minor, (rows, 512, 16), straight from its accumulator, in fp16
        # holding V in units of its fp8 codes when the KV is fp8 (half the bytes; |o| <= the fp8 maximum: no overflow
        # whatever the KV scale), else fp32; the portable stage 1 head-major fp32, (rows, 16, 512).
        part_dtype = torch.float16 if sm90 and prepared.spec.kv_fp8 else torch.float32
        shape = (n_part, DV, H) if sm90 else (n_part, H, DV)
        self.part_o = torch.empty(shape, dtype=part_dtype, device=dev)
        self.part_lse = torch.empty((n_part, H), dtype=torch.float32, device=dev)
        counts = (plan.reduce_indptr[1:] - plan.reduce_indptr[:-1]).cpu()
        most = max(1, int(counts.max())) if counts.numel() else 1
        #: the reduce tiles with >= 2 partials: the reduce's grid (none: no reduce launch at all)
        self.split_tiles = torch.nonzero(counts >= 2).flatten().to(device=dev, dtype=torch.int32)
        #: the reduce is a programmatic dependent launch of the sm_90 stage 1 (its launch overlaps stage 1)
        self.use_pdl = sm90 and config.pdl and portable.gdc_wait is not None
        self._reduce_launch = self._gluon_reduce(most) if part_dtype == torch.float16 else self._triton_reduce(most)
        #: the sm_90 stage 1 (None on the portable path); it runs 1, 2 or 4 q rows per work (in the wgmmas' N)
        #: (`sm90.host.row_passes`, `sm90.host.rows_per_cta_of`)
        self.sm90 = None
        if sm90:
            self.sm90 = sm90_host.Sm90Stage1(prepared, self.work_indptr.cpu(), self.work_info.cpu(),
                                             launch_dependents=self.use_pdl, p_fp8=config.p_fp8,
                                             rows_per_cta=self.rows_per_cta)  # fmt: skip

    def _gluon_reduce(self, most: int) -> Callable[[], None]:
        from .sm90 import reduce as R

        shape = R.launch_shape(most)
        grid = (self.split_tiles.numel(), MLA.v_dim // (shape["DPT"] * 8 // shape["LP"]))
        pdl = {"launch_pdl": True} if self.use_pdl else {}
        plan = self.plan

        def run() -> None:
            R.reduce_kernel[grid](
                self.part_o, self.part_lse, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map,
                self.split_tiles, self.out, self.lse, self.p.kv_scale, self.out.stride(0), self.out.stride(1),
                H=MLA.num_heads, DV=MLA.v_dim, USE_PDL=self.use_pdl, **shape, **pdl,
            )  # fmt: skip

        return run

    def _triton_reduce(self, most: int) -> Callable[[], None]:
        import triton

        # partials read per block load: all of a tile's, up to 32. Each program merges a value slice of BLOCK_DV
        # dims x 16 heads: one warp of 32-64 fp32 per thread when a tile has >= 16 partials, else two warps of 16
        block_p = min(32, triton.next_power_of_2(max(2, most)))
        block_dv = max(4, 64 // block_p)
        warps = 1 if block_p >= 16 else 2
        grid = (self.split_tiles.numel(), MLA.v_dim // block_dv)
        pdl = {"launch_pdl": True} if self.use_pdl else {}
        plan, K = self.plan, self.portable

        def run() -> None:
            K.reduce_kernel[grid](
                self.part_o, self.part_lse, plan.reduce_indptr, plan.reduce_final_map, plan.reduce_partial_map,
                self.split_tiles, self.out, self.lse, self.out.stride(0), self.out.stride(1), H=MLA.num_heads,
                DV=MLA.v_dim, BLOCK_DV=block_dv, BLOCK_P=block_p, HEAD_MINOR=self.kernel == "sm90",
                USE_PDL=self.use_pdl, num_warps=warps, **pdl,
            )  # fmt: skip

        return run

    @property
    def ran(self) -> str:
        """The stage-1 kernel that runs: ``portable``, or ``sm90:`` and its path (``v-regs`` for fp8 q and KV,
        ``v-tile`` for bf16, ``v-conv`` for bf16 q with fp8 KV, ``v-fp4-e4m3`` for a8w4-mxfp4 (``v-fp4`` with
        ``p_fp8=False``), ``v-fp4`` for the other fp4-KV precisions)."""
        return "portable" if self.sm90 is None else f"sm90:{self.sm90.path}"

    def __call__(self, q: torch.Tensor | None = None, kv: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Run on the prepared tensors, or on same-shaped `q` / `kv` (e.g. rotated copies for timing): ``(out,
        lse)``."""
        self.stage1(q, kv)
        self.reduce()
        return self.out, self.lse

    def stage1(self, q: torch.Tensor | None = None, kv: torch.Tensor | None = None) -> None:
        """Stage 1 alone: whole requests' outputs into ``out`` / ``lse``, split ones' partials into ``part_o`` /
        ``part_lse``."""
        q = self.p.q if q is None else q
        kv = self.p.kv if kv is None else kv
        if self.sm90 is not None:
            self.sm90.launch(q, kv, self.work_info, self.out, self.lse, self.part_o, self.part_lse, self.sm_scale)
        else:
            self._stage1_portable(q, kv)

    def reduce(self) -> None:
        """The reduce alone: merges the partials of the split requests (nothing to launch when none is split)."""
        if self.split_tiles.numel():
            self._reduce_launch()

    def _stage1_portable(self, q: torch.Tensor, kv: torch.Tensor) -> None:
        p, K = self.p, self.portable
        gpu = {} if K.INTERPRET else {"num_warps": K.NUM_WARPS, "num_stages": K.NUM_STAGES}
        scales = p.kv_scale if p.kv_scales is None else p.kv_scales.view(torch.uint8)
        K.stage1_kernel[(self.n_cu,)](
            q, kv, p.kv_indices, self.work_indptr, self.work_info,
            self.out, self.lse, self.part_o, self.part_lse, p.q_scale, p.kv_scale, scales, self.sm_scale,
            q.stride(0), q.stride(1), kv.stride(0), scales.stride(0), self.out.stride(0), self.out.stride(1),
            H=MLA.num_heads, D_NOPE=MLA.v_dim, D_ROPE=MLA.rope_dim, BLOCK_N=K.block_n(self.pv_exact),
            PAGE_SIZE=p.page_size, QK_FP8=p.spec.q_fp8 and p.spec.kv_fp8, KV_FP8=p.spec.kv_fp8,
            PV_EXACT=self.pv_exact, P_FP8=self.config.p_fp8 and p.spec.q_fp8,
            KV_FP4={"mxfp4": 1, "nvfp4": 2}.get(p.spec.kv_format, 0), CONTIGUOUS=p.contiguous, **gpu,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------ measurement
    def _require_sm90(self, what: str) -> sm90_host.Sm90Stage1:
        if self.sm90 is None:
            raise ValueError(f"{what} is a measurement hook of the sm_90 kernel; this decoder runs {self.ran!r}"
                             + (f" ({self.sm90_reason})" if self.sm90_reason else ""))  # fmt: skip
        return self.sm90

    def ablation(self, skip: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        """A call like this decoder's (``call(q=None, kv=None)``) whose sm_90 stage 1 skips compute: ``"qk"`` the
        score wgmma (scores 0), ``"qk+pv"`` also the value wgmma and its V operand (the fp8 path, a8w8);
        ``"convert"`` the fp4 -> e4m3 conversion of each tile (the e4m3 route, a8w4-mxfp4: the products read a tile
        never written), ``"convert+scales"`` also the loads of the block scales (every scale 0). **The outputs are
        wrong**: for timing what the decode would take if that work were free (`experiments/profile_sm90.py`)."""
        if skip not in ABLATIONS:
            raise ValueError(f"skip must be one of {', '.join(map(repr, ABLATIONS))}, got {skip!r}")
        s1 = self._require_sm90("an ablation")
        path = sm90_host.ABLATABLE[ABLATIONS[skip]]
        if s1.path != path:
            raise ValueError(f"ablation {skip!r} is written for the {path} path "
                             f"({'a8w8' if path == 'v-regs' else 'a8w4-mxfp4'}), not {s1.path}")  # fmt: skip

        def call(q: torch.Tensor | None = None, kv: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
            s1.launch(self.p.q if q is None else q, self.p.kv if kv is None else kv, self.work_info, self.out,
                      self.lse, self.part_o, self.part_lse, self.sm_scale, ablate=ABLATIONS[skip])  # fmt: skip
            self.reduce()
            return self.out, self.lse

        return call

    def stage1_timeline(self, q: torch.Tensor | None = None, kv: torch.Tensor | None = None, *,
                        cold_l2: bool = True) -> CtaTimeline:  # fmt: skip
        """Run stage 1 once with per-CTA time stamps and return when each CTA did what (`sm90.timeline`).

        GPU and the sm_90 kernel only. Run the decoder a few times first: the first launch compiles. The reduce is
        not run, so `out` holds only the unsplit requests afterwards. `cold_l2` (default): read twice the L2 of other
        data first, so the KV comes from HBM as in the timed calls (which rotate KV copies past the L2)."""
        s1 = self._require_sm90("the time line")
        from .sm90 import stage1

        cols, most = stage1.TIMELINE_COLS.value, stage1.TIMELINE_MAX.value
        buf = torch.zeros((s1.n_cu, cols), dtype=torch.int64, device=self.out.device)
        if cold_l2:  # read (not write: dirty lines would cost the kernel write-backs) twice the L2 of other data
            torch.empty(2 * L2_BYTES // 4, dtype=torch.float32, device=self.out.device).sum()
        s1.launch(self.p.q if q is None else q, self.p.kv if kv is None else kv, self.work_info, self.out, self.lse,
                  self.part_o, self.part_lse, self.sm_scale, timeline=buf)  # fmt: skip
        stamps = buf.cpu().numpy()  # (waits for the launch)
        # the clock of this launch (its CTAs stamp cycles and the global timer); an idle spin's if all were too short
        ghz = None if launch_clock_ghz(stamps) is not None else measure_clock_ghz(self.out.device)
        return timeline_from_stamps(
            stamps, s1.tiles_per_cta.numpy(), s1.works_per_cta.numpy(), clock_ghz=ghz,
            kernel=self.ran, max_events=most, clock_source="idle-spin",
        )  # fmt: skip


def decode(prepared: PreparedInputs, plan: WorkPlan, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode: ``Decoder(prepared, plan, **kw)()``."""
    return Decoder(prepared, plan, **kw)()

"""Triton backend: our GPU kernels (`mlalab.kernels`) executing a WorkPlan: the sm_90 kernel on the H200, the portable
Triton kernel elsewhere (and in Triton's CPU interpreter).

Options of `decode` / `make_callable`: ``precision`` (a8w8 | a16w8 | bf16, `mlalab.quant.precision`), ``fp8_format``
(e4m3fn | e4m3fnuz), ``fp4_recipe`` (the fp4-KV precisions: an MXFP4 recipe of `mlalab.kernels.fp4.FP4_RECIPES`,
default aiter's), ``planner`` (a name from `mlalab.plan.PLANNERS`; default "simple", the one-wave even split),
``num_cus`` (plan slots; default: the GPU's SM count times `sm90.host.ctas_per_sm`, divided by the CTAs a
request's q rows take where the sm_90 kernel runs), ``plan_block``
(the simple planner's ``block``: minimum work size in kv_indices positions; default `SIMPLE_PLAN_BLOCK` tokens in
pages where the sm_90 kernel runs), ``plan`` (a ready WorkPlan),
the planner's own knobs (e.g. ``kv_granularity``, ``max_split_per_batch``), the `KernelConfig` knobs (``kernel``,
``pdl``, ``p_fp8``), ``sm_scale``, and for the exactness tests ``out_dtype`` / ``pv_exact``. Any page size works: the
decoder turns the plan's page positions into token ranges once.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

from ..inputs import DecodeInputs
from ..kernels import Decoder, KernelConfig, prepare
from ..kernels.sm90 import host as sm90_host
from ..plan import PLANNERS, WorkPlan, make_plan
from ..quant.precision import PRECISIONS as ALL_PRECISIONS

__all__ = ["probe", "decode", "make_callable", "build_plan", "SIMPLE_PLAN_BLOCK", "PRECISIONS"]

#: Every precision of the precision table runs here.
PRECISIONS = tuple(str(p) for p in ALL_PRECISIONS)

#: The simple planner's minimum work (tokens) when the sm_90 kernel runs: one 64-token tile (docs/journal.md: 64
#: against 128 tokens).
SIMPLE_PLAN_BLOCK = 64


def probe() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install triton)"
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return "no GPU (torch.cuda.is_available() is False); set TRITON_INTERPRET=1 for tiny CPU runs"


def build_plan(inputs: DecodeInputs, planner: str = "simple", num_cus: int | None = None, **knobs: Any) -> WorkPlan:
    """A WorkPlan for `inputs` (any page size): `mlalab.plan.make_plan(planner, ...)` with `num_cus` plan slots
    (default: this GPU's SM count, 8 without a GPU); `knobs` go to the planner."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    if num_cus is None:
        num_cus = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 8
    return make_plan(planner, inputs.qo_indptr.cpu(), inputs.kv_indptr.cpu(), num_cus, page_size=inputs.page_size,
                     kv_last_page_len=inputs.kv_last_page_len.cpu(), **knobs)  # fmt: skip


def make_callable(
    inputs: DecodeInputs,
    *,
    precision: str = "a8w8",
    fp8_format: str = "e4m3fn",
    fp4_recipe: str | None = None,
    planner: str = "simple",
    num_cus: int | None = None,
    plan_block: int | None = None,
    plan: WorkPlan | None = None,
    n_copies: int = 1,
    out_dtype: torch.dtype = torch.bfloat16,
    pv_exact: bool = False,
    sm_scale: float | None = None,
    **knobs: Any,
) -> tuple[Callable[[int], torch.Tensor], dict[str, Any]]:
    """(call(i) -> output on KV copy i, info). Everything (quantisation, plan, buffers) is built here, once.
    `knobs` are `KernelConfig` fields or the planner's own knobs; info holds ``prepared``, ``plan``, ``decoder``,
    ``kv_bytes`` and ``kv_copies``."""
    kernel_knobs = set(KernelConfig.knobs())
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}; valid: {', '.join(PLANNERS)}")
    # the planner's own knobs (kv_granularity, max_split_per_batch, ...) go to the planner, e.g. from the CLI
    plan_valid = {n for n, p in inspect.signature(PLANNERS[planner]).parameters.items() if p.kind is p.KEYWORD_ONLY}
    plan_valid -= {"page_size", "kv_last_page_len"}  # taken from the inputs
    plan_knobs = {k: knobs.pop(k) for k in list(knobs) if k in plan_valid and k not in kernel_knobs}
    unknown = sorted(set(knobs) - kernel_knobs)
    if unknown:
        raise TypeError(
            f"unknown triton option(s) {', '.join(unknown)}; kernel knobs: {', '.join(sorted(kernel_knobs))}; "
            f"planner {planner!r} knobs: {', '.join(sorted(plan_valid))}"
        )
    cfg = KernelConfig(**knobs)
    reason = probe()
    if reason is not None:
        raise RuntimeError(f"triton backend unavailable: {reason}")
    prep = prepare(inputs, precision, fp8_format, fp4_recipe)
    # the plan options the caller gave (recorded with the timings)
    given = {
        **plan_knobs,
        **({"plan_block": plan_block} if plan_block is not None else {}),
        **({"slots_given": True} if num_cus is not None or plan is not None else {}),
    }
    why_not_sm90 = sm90_host.unsupported(prep, None, pv_exact=pv_exact, out_dtype=out_dtype, p_fp8=cfg.p_fp8)
    sm90 = cfg.kernel != "portable" and why_not_sm90 is None
    if plan_block is not None:
        plan_knobs["block"] = plan_block
    elif planner == "simple" and "block" not in plan_knobs and sm90:
        # one 64-token tile, counted in kv_indices positions (pages of page_size tokens)
        plan_knobs["block"] = max(1, SIMPLE_PLAN_BLOCK // inputs.page_size)
    if plan is None:
        if num_cus is None and sm90:
            # the sm_90 kernel runs a slot's q rows on CTAs side by side, 1, 2 or 4 rows each (`row_passes`), the e4m3
            # route two CTAs an SM on large batches (`ctas_per_sm`): SMs x that // CTAs a slot
            q_rows = int(inputs.qo_indptr.diff().max()) if inputs.batch else 1
            per = sm90_host.rows_per_cta_of(
                prep, inputs.qo_indptr.diff(), p_fp8=cfg.p_fp8, side_by_side=cfg.side_by_side
            )  # (as the decoder decides)
            ctas = max(1, q_rows // per)
            kv_tokens = int(inputs.kv_lens.sum()) if inputs.batch else 0
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            num_cus = max(1, sms * sm90_host.ctas_per_sm(prep, kv_tokens, p_fp8=cfg.p_fp8) // ctas)
        plan = build_plan(inputs, planner, num_cus, **plan_knobs)
    dec = Decoder(prep, plan, config=cfg, out_dtype=out_dtype, pv_exact=pv_exact, sm_scale=sm_scale)
    # what ran, for the timing records: the kernel config, the plan options a caller gave, the plan, the kernel path
    record = {**dataclasses.asdict(cfg), **given, "num_cus": int(plan.num_cus), "plan": plan.digest(), "ran": dec.ran}
    copies = [prep.kv] + [prep.kv.clone() for _ in range(max(0, n_copies - 1))]
    info = {"prepared": prep, "plan": plan, "decoder": dec, "kv_bytes": prep.kv.numel() * prep.kv.element_size(),
            "kv_copies": copies, "record": record}  # fmt: skip
    return (lambda i: dec(kv=copies[i % len(copies)])[0]), info


def decode(inputs: DecodeInputs, **options: Any) -> tuple[torch.Tensor, torch.Tensor]:
    call, info = make_callable(inputs, **options)
    out = call(0)
    return out, info["decoder"].lse

"""Triton backend: the persistent split-KV kernels of `mlalab.splitkv.triton_decode` executing a WorkPlan.

Options of `decode` / `make_callable`: ``precision`` (a8w8 | a16w8 | bf16), ``fp8_format`` (e4m3fn | e4m3fnuz),
``planner`` (a name from `mlalab.splitkv.PLANNERS`; default "simple", the one-wave even split), ``num_cus``
(plan slots; default: the GPU's SM count), ``plan_block`` (the simple planner's `block`: minimum work size in
kv_indices positions, i.e. tokens at page size 1; default 64, also where the Hopper kernel runs:
`HOPPER_PLAN_BLOCK`), ``plan`` (a ready WorkPlan), the planner's own knobs (e.g. ``kv_granularity``,
``max_split_per_batch``), and the `KernelConfig` knobs (``kernel``, ``hopper_variant``, ``hopper_stages``, ``pdl``,
``block_n``, ``num_warps``, ``num_stages``, ``transposed``, ``mma_fp16``, ``p_fp8``, ``contiguous``,
``qk_tokens_m``, ``d_chunk``, ``chunk_pv``); unset knobs take KernelConfig's defaults, the configuration tuned
on the H200. Any page size works: the decoder turns the plan's page positions into token ranges once.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

from ..inputs import DecodeInputs
from ..splitkv import PLANNERS, WorkPlan, make_plan

__all__ = ["probe", "decode", "make_callable", "build_plan"]


def probe() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install triton)"
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return "no GPU (torch.cuda.is_available() is False); set TRITON_INTERPRET=1 for tiny CPU runs"


def build_plan(inputs: DecodeInputs, planner: str = "simple", num_cus: int | None = None, **knobs: Any) -> WorkPlan:
    """A WorkPlan for `inputs` (any page size): `mlalab.splitkv.make_plan(planner, ...)` with `num_cus` plan slots
    (default: this GPU's SM count, 8 without a GPU); `knobs` go to the planner."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    if num_cus is None:
        num_cus = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 8
    return make_plan(
        planner,
        inputs.qo_indptr.cpu(),
        inputs.kv_indptr.cpu(),
        num_cus,
        page_size=inputs.page_size,
        kv_last_page_len=inputs.kv_last_page_len.cpu(),
        **knobs,
    )


#: The simple planner's minimum work (tokens) when the Hopper kernel runs: one 64-token tile. Measured on the H200
#: in one process (2026-12-02, session 4, after the reduce was cut to one round trip): 7.46 vs 8.40 us at 4 x 1024,
#: 8.90 vs 9.26 at 8 x 1024 against 128 tokens; other shapes have two or more tiles per CTA either way. (With the
#: older two-pass reduce, 128 had won: data/timings/h200_2026-12-02_hopper_dev5.csv.)
HOPPER_PLAN_BLOCK = 64


def make_callable(
    inputs: DecodeInputs,
    *,
    precision: str = "a8w8",
    fp8_format: str = "e4m3fn",
    planner: str = "simple",
    num_cus: int | None = None,
    plan_block: int | None = None,
    plan: WorkPlan | None = None,
    n_copies: int = 1,
    out_dtype: torch.dtype = torch.bfloat16,
    pv_exact: bool = False,
    **knobs: Any,
) -> tuple[Callable[[int], torch.Tensor], dict[str, Any]]:
    """(call(i) -> output on KV copy i, info). Everything (quantisation, plan, buffers) is built here, once.
    `knobs` are `KernelConfig` fields (block_n, num_warps, ...); unset ones take the tuned defaults."""
    from ..splitkv.triton_mla import KernelConfig, TritonDecoder, hopper_unsupported, prepare

    valid = {f.name for f in dataclasses.fields(KernelConfig)}
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}; valid: {', '.join(PLANNERS)}")
    # the planner's own knobs (kv_granularity, max_split_per_batch, ...) go to the planner, e.g. from the CLI
    plan_valid = {n for n, p in inspect.signature(PLANNERS[planner]).parameters.items() if p.kind is p.KEYWORD_ONLY}
    plan_valid -= {"page_size", "kv_last_page_len"}  # taken from the inputs
    plan_knobs = {k: knobs.pop(k) for k in list(knobs) if k in plan_valid and k not in valid}
    unknown = sorted(set(knobs) - valid)
    if unknown:
        raise TypeError(
            f"unknown triton option(s) {', '.join(unknown)}; kernel knobs: {', '.join(sorted(valid))}; "
            f"planner {planner!r} knobs: {', '.join(sorted(plan_valid))}"
        )
    reason = probe()
    if reason is not None:
        raise RuntimeError(f"triton backend unavailable: {reason}")
    prep = prepare(inputs, precision, fp8_format)
    wide = 128 if knobs.get("hopper_block") == 128 else 64  # tokens per tile of the sm_90 kernel
    variant = knobs.get("hopper_variant", "auto")  # (bf16 and a16w8 run one sm_90 path each: v-tile, v-conv)
    if plan_block is not None:
        plan_knobs["block"] = plan_block
    elif (
        planner == "simple"
        and "block" not in plan_knobs
        and knobs.get("kernel", "auto") != "portable"
        and hopper_unsupported(prep, None, pv_exact=pv_exact, out_dtype=out_dtype, block=wide, variant=variant) is None
    ):
        # (tokens at page size 1, where a cut on 128 keeps 128-token tiles whole; pages otherwise, whole tiles anyway)
        plan_knobs["block"] = 128 if wide == 128 and prep.page_size == 1 else HOPPER_PLAN_BLOCK
    if plan is None:
        plan = build_plan(inputs, planner, num_cus, **plan_knobs)
    cfg = KernelConfig(**knobs)
    dec = TritonDecoder(prep, plan, config=cfg, out_dtype=out_dtype, pv_exact=pv_exact)
    copies = [prep.kv] + [prep.kv.clone() for _ in range(max(0, n_copies - 1))]
    info = {"prepared": prep, "plan": plan, "decoder": dec, "kv_bytes": prep.kv.numel() * prep.kv.element_size(),
            "kv_copies": copies}  # fmt: skip
    return (lambda i: dec(kv=copies[i % len(copies)])[0]), info


def decode(inputs: DecodeInputs, **options: Any) -> tuple[torch.Tensor, torch.Tensor]:
    call, info = make_callable(inputs, **options)
    out = call(0)
    return out, info["decoder"].lse

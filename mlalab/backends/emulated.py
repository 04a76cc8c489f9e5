"""The CPU emulator of a split-KV `WorkPlan` as a decode backend: plan with a named planner, run stage 1
per work item and the LSE reduce (float64 by default, so it doubles as an exactness check of the plan)."""

from __future__ import annotations

import inspect

import torch

from ..inputs import DecodeInputs
from ..plan import PLANNERS, emulate_plan, make_plan


def probe() -> str | None:
    return None  # pure torch on the CPU: always available


def decode(
    inputs: DecodeInputs,
    planner: str = "aiter-intra-batch",
    target: str | int = "mi355x",
    q_scheme: str | None = None,
    kv_scheme: str | None = None,
    fp8_format: str = "e4m3fn",
    compute_dtype: torch.dtype = torch.float64,
    **knobs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plan `inputs` with `planner` for `target` (planner knobs pass through), then emulate the plan.

    Returns ``(out, lse)`` in `compute_dtype` on the CPU."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    if planner in PLANNERS:  # (an unknown planner is named by make_plan)
        knob_names = [n for n, p in inspect.signature(PLANNERS[planner]).parameters.items() if p.kind is p.KEYWORD_ONLY]
        knob_names = [n for n in knob_names if n not in ("page_size", "kv_last_page_len")]  # from the inputs
        bad = [k for k in knobs if k not in knob_names]
        if bad:
            own = [n for n in inspect.signature(decode).parameters if n not in ("inputs", "knobs")]
            raise TypeError(
                f"decode(backend='emulated') has no option {', '.join(map(repr, bad))}; its options: {', '.join(own)}"
                f", and the knobs of planner {planner!r}: {', '.join(knob_names)}"
            )
    plan = make_plan(
        planner,
        inputs.qo_indptr,
        inputs.kv_indptr,
        target,
        page_size=inputs.page_size,
        kv_last_page_len=inputs.kv_last_page_len,
        **knobs,
    )
    res = emulate_plan(
        inputs, plan, q_scheme=q_scheme, kv_scheme=kv_scheme, fp8_format=fp8_format, compute_dtype=compute_dtype
    )
    return res.out, res.lse

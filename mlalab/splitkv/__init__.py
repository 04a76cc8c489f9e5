"""Persistent split-KV decode: aiter-layout work plans (`WorkPlan`), planners, and a CPU emulator.

One `WorkPlan` drives three executors: `emulate_plan` here (CPU, float64 for exactness), the Triton kernels in
``mlalab.splitkv.triton_*`` and, on ROCm, a comparison with aiter's own metadata.
"""

from __future__ import annotations

from .emulate import EmulationResult, ReduceTrace, WorkTrace, dequantized_inputs, emulate_plan
from .plan import WORK_INFO_COLUMNS, PlanError, WorkPlan
from .planners import PLANNERS, indptrs_for, intra_batch_splits, make_plan

__all__ = [
    "WorkPlan",
    "PlanError",
    "WORK_INFO_COLUMNS",
    "PLANNERS",
    "make_plan",
    "indptrs_for",
    "intra_batch_splits",
    "emulate_plan",
    "EmulationResult",
    "WorkTrace",
    "ReduceTrace",
    "dequantized_inputs",
]

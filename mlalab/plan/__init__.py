"""Persistent split-KV scheduling, independent of any executor: `WorkPlan` (aiter's v1 metadata layout), the
planners that build one, the LSE merge, and the CPU emulator that executes one exactly.

One `WorkPlan` drives three executors: `emulate_plan` here (CPU, float64), the GPU kernels of `mlalab.kernels`, and,
on ROCm, a comparison with aiter's own metadata (`mlalab.backends.aiter_plan`).
"""

from __future__ import annotations

from .emulate import EmulationResult, ReduceTrace, WorkTrace, dequantized_inputs, emulate_plan
from .merge import lse_merge
from .planners import INT32_MAX, PLANNERS, indptrs_for, intra_batch_splits, make_plan
from .workplan import WORK_INFO_COLUMNS, PlanError, WorkPlan

__all__ = [
    "WorkPlan",
    "PlanError",
    "WORK_INFO_COLUMNS",
    "PLANNERS",
    "INT32_MAX",
    "make_plan",
    "indptrs_for",
    "intra_batch_splits",
    "lse_merge",
    "emulate_plan",
    "EmulationResult",
    "WorkTrace",
    "ReduceTrace",
    "dequantized_inputs",
]

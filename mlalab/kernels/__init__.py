"""What runs on the GPU: quantise for the kernels (`prepare`), the live knobs (`KernelConfig`), and the decoder that
executes a `mlalab.plan.WorkPlan` (`Decoder`: plan once, run many) on the sm_90 kernel (`sm90`) or the portable
Triton kernel (`portable`).

    from mlalab.kernels import Decoder, prepare
    dec = Decoder(prepare(inputs, "a8w8"), plan)
    out, lse = dec()
"""

from __future__ import annotations

from .config import KERNELS, KernelConfig
from .decoder import Decoder, check_plan, decode, token_work_info
from .prepare import PreparedInputs, naive_decode, prepare

__all__ = [
    "KERNELS",
    "KernelConfig",
    "Decoder",
    "decode",
    "check_plan",
    "token_work_info",
    "PreparedInputs",
    "prepare",
    "naive_decode",
]

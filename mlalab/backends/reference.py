"""The exact decode as a backend (fp64 on CPU, fp32 on GPU)."""

from __future__ import annotations

import torch

from ..inputs import DecodeInputs
from ..reference import EmptyPolicy, decode_inputs_reference


def probe() -> str | None:
    return None


def decode(
    inputs: DecodeInputs,
    *,
    compute_dtype: torch.dtype | None = None,
    sm_scale: float | None = None,
    empty_policy: EmptyPolicy = "error",
    allow_nonfinite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    return decode_inputs_reference(
        inputs,
        compute_dtype=compute_dtype,
        sm_scale=sm_scale,
        empty_policy=empty_policy,
        allow_nonfinite=allow_nonfinite,
    )

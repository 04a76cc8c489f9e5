"""The exact decode as a backend (fp64 on CPU, fp32 on GPU)."""

from __future__ import annotations

import torch

from ..inputs import DecodeInputs
from ..reference import decode_inputs_reference


def probe() -> str | None:
    return None


def decode(inputs: DecodeInputs, **options: object) -> tuple[torch.Tensor, torch.Tensor]:
    return decode_inputs_reference(inputs, **options)

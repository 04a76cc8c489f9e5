"""`KernelConfig`: the choices a user makes about how the GPU kernels run a decode. Everything else is decided by the
inputs and the plan (which sm_90 path a precision takes, the ring depth, the partials' type, which reduce), measured
on the H200 and recorded in docs/journal.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["KernelConfig", "KERNELS"]

#: `KernelConfig.kernel`: ``"sm90"`` the Hopper kernel (`mlalab.kernels.sm90`), ``"portable"`` the Triton kernel of
#: `mlalab.kernels.portable` (any GPU, every layout, Triton's CPU interpreter), ``"auto"`` sm90 where it applies.
KERNELS = ("auto", "sm90", "portable")


@dataclass(frozen=True)
class KernelConfig:
    """How the decoder runs stage 1 and the reduce.

    Attributes:
        kernel: ``"auto"`` (default: the sm_90 kernel where it applies, else the portable one; the decoder says why
            in ``sm90_reason``), ``"sm90"`` (refused with the reason where it cannot run) or ``"portable"``.
        pdl: launch the reduce as a programmatic dependent of the sm_90 stage 1 (its launch overlaps stage 1 and it
            starts the moment stage 1's writes are visible). Default True; False launches it plainly.
        p_fp8: fp8 q: round the softmax probabilities P through an fp8 type before the value product, as aiter (and
            the competition's reference) does: the KV's for a8w8, e4m3 for a8w4. Default True. False keeps P in
            fp16 (a8w8: the portable kernel only, the sm_90 value product runs on fp8 operands) or bf16 (a8w4: on
            sm_90 a8w4-mxfp4 then takes the bf16 route instead of the e4m3 one). The sm_90 kernel rounds P to bf16
            for a8w4-nvfp4 whatever this says (its E2M1 × E4M3 values do not fit e4m3).
    """

    kernel: str = "auto"
    pdl: bool = True
    p_fp8: bool = True

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"KernelConfig.kernel must be one of {', '.join(map(repr, KERNELS))}, got {self.kernel!r}")
        for f in ("pdl", "p_fp8"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"KernelConfig.{f} must be True or False, got {getattr(self, f)!r}")

    @classmethod
    def knobs(cls) -> tuple[str, ...]:
        """The field names (what `mlalab.backends.triton` accepts as kernel options)."""
        return tuple(f.name for f in dataclasses.fields(cls))

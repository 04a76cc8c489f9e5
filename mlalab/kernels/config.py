"""`KernelConfig`: the choices a user makes about how the GPU kernels run a decode. Everything else is decided by the
inputs and the plan (which sm_90 path a precision takes, the ring depth, the partials' type, which reduce), measured
on the H200 and recorded in docs/journal.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["KernelConfig", "KERNELS", "SIDE_BY_SIDE"]

#: `KernelConfig.kernel`: ``"sm90"`` the Hopper kernel (`mlalab.kernels.sm90`), ``"portable"`` the Triton kernel of
#: `mlalab.kernels.portable` (any GPU, every layout, Triton's CPU interpreter), ``"auto"`` sm90 where it applies.
KERNELS = ("auto", "sm90", "portable")
#: `KernelConfig.side_by_side`: where the sm_90 kernel runs a work's q rows side by side (`sm90.host.rows_per_cta_of`)
SIDE_BY_SIDE = ("auto", "on", "off")


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
        side_by_side: speculative decode on the sm_90 fp8 path: ``"on"`` runs a work's 2 or 4 q rows side by side on
            two warpgroups (one tile read and multiplied once for all of them), ``"off"`` one q row a CTA (a slot's
            CTAs stream the same tiles), ``"auto"`` (default) side by side once the batch holds
            `sm90.host.SIDE_BY_SIDE_FROM_TOKENS` KV tokens (measured: one row a CTA is faster on small batches).
    """

    kernel: str = "auto"
    pdl: bool = True
    p_fp8: bool = True
    side_by_side: str = "auto"

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"KernelConfig.kernel must be one of {', '.join(map(repr, KERNELS))}, got {self.kernel!r}")
        if self.side_by_side not in SIDE_BY_SIDE:
            raise ValueError(f"KernelConfig.side_by_side must be one of {', '.join(map(repr, SIDE_BY_SIDE))}, "
                             f"got {self.side_by_side!r}")  # fmt: skip
        for f in ("pdl", "p_fp8"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"KernelConfig.{f} must be True or False, got {getattr(self, f)!r}")

    @classmethod
    def knobs(cls) -> tuple[str, ...]:
        """The field names (what `mlalab.backends.triton` accepts as kernel options)."""
        return tuple(f.name for f in dataclasses.fields(cls))

"""Inputs as the kernels read them: q and the KV quantised for a precision (per-tensor scales; block-scaled fp4 KV),
the pages flattened to token rows, and the readable version of what the kernels must compute (`naive_decode`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..inputs import DecodeInputs
from ..quant import fp8_dtype, quantize_fp8_per_tensor
from ..quant.precision import Precision, PrecisionSpec, get_precision
from ..reference import check_decode_args, decode_reference

__all__ = ["PreparedInputs", "prepare", "naive_decode"]


@dataclass(frozen=True)
class PreparedInputs:
    """Inputs as the kernels read them. ``kv`` is the buffer flattened to ``(pages·page_size, 576)`` rows; with fp4 KV
    it holds the packed E2M1 codes ``(rows, 288)``, ``kv_scales`` their block scales and ``kv_scale`` the per-tensor
    scale (`mlalab.kernels.fp4.Fp4Cache`)."""

    q: torch.Tensor
    kv: torch.Tensor
    q_scale: torch.Tensor  # (1,) float32 dequantisation scale (1.0 when bf16)
    kv_scale: torch.Tensor
    kv_indices: torch.Tensor  # int32 page ids
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor  # in pages
    kv_last_page_len: torch.Tensor
    page_size: int
    spec: PrecisionSpec
    fp8_format: str
    #: kv_indices is the identity (checked once here, never per call): the kernels may skip the gather.
    contiguous: bool = False
    #: fp4 KV: the block scales of ``kv``'s rows, and the recipe they were written with (`mlalab.kernels.fp4`)
    kv_scales: torch.Tensor | None = None
    kv_recipe: str | None = None
    #: speculative verification's causal mask (`mlalab.config.DecodeCase.causal`)
    causal: bool = False

    @property
    def precision(self) -> Precision:
        return self.spec.precision

    @property
    def batch(self) -> int:
        return int(self.qo_indptr.numel() - 1)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, kv as (pages, page_size, 1, 576)) in float64 on the CPU: what the kernel's math sees."""
        q = self.q.to("cpu", torch.float64) * float(self.q_scale.cpu()[0])
        kv = self.kv_values().to("cpu", torch.float64)
        if not self.spec.kv_fp4:
            kv = kv * float(self.kv_scale.cpu()[0])
        return q, kv.reshape(-1, self.page_size, 1, kv.shape[-1])

    def kv_values(self) -> torch.Tensor:
        """The KV rows as values, ``(rows, 576)`` float32 on the KV's device: the codes times their scales (for
        fp8 and bf16 the codes; the per-tensor scale is applied by the caller, as the kernels do)."""
        if not self.spec.kv_fp4:
            return self.kv.float()
        from .fp4 import Fp4Cache

        return Fp4Cache(self.kv, self.kv_scales, self.kv_scale, self.kv_recipe).dequantize().to(self.kv.device)


def prepare(inputs: DecodeInputs, precision: str | Precision = "a8w8", fp8_format: str = "e4m3fn",
            fp4_recipe: str | None = None) -> PreparedInputs:  # fmt: skip
    """Quantise `inputs` for `precision` (`mlalab.quant.precision`: per-tensor amax scales for its fp8 operands, block
    scales for fp4 KV written with `fp4_recipe`, default `mlalab.kernels.fp4.DEFAULT_RECIPES`) and flatten the KV
    pages to token rows."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    spec = get_precision(precision)
    if spec.q_fp8 or spec.kv_fp8:
        fp8_dtype(fp8_format)  # validates the flavour name
    q, kv = inputs.q, inputs.kv_buffer
    # the page table against the buffer (indices in range, a table as long as kv_indptr says, last-page lengths):
    # a kernel would read out of bounds, not fail
    check_decode_args(q, kv, inputs.qo_indptr, inputs.kv_indptr, inputs.kv_indices, inputs.kv_last_page_len,
                      empty_policy="zeros", causal=inputs.case.causal)  # fmt: skip
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise TypeError(f"prepare expects bf16 q and kv_buffer (as make_inputs builds them), got {q.dtype}, {kv.dtype}")
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    idx = inputs.kv_indices
    contiguous = bool(torch.equal(idx.cpu(), torch.arange(idx.numel(), dtype=idx.dtype)))
    kv_rows = kv.reshape(-1, kv.shape[-1])
    kv_scales = recipe = None
    if spec.kv_fp4:
        from .fp4 import DEFAULT_RECIPES, FP4_RECIPES, to_fp4_cache

        recipe = DEFAULT_RECIPES[spec.kv_format] if fp4_recipe is None else fp4_recipe
        if recipe not in FP4_RECIPES or (recipe == "nvfp4") != (spec.kv_format == "nvfp4"):
            valid = [r for r in FP4_RECIPES if (r == "nvfp4") == (spec.kv_format == "nvfp4")]
            raise ValueError(f"fp4_recipe for {spec.precision} must be one of {', '.join(valid)}, got {recipe!r}")
        cache = to_fp4_cache(kv_rows, recipe)
        kvk, ks, kv_scales = cache.codes, cache.global_scale, cache.scales
    elif fp4_recipe is not None:
        raise ValueError(f"fp4_recipe applies to the fp4-KV precisions, not {spec.precision}")
    else:
        kvk, ks = quantize_fp8_per_tensor(kv_rows, fp8_format) if spec.kv_fp8 else (kv_rows, one)
    qk, qs = quantize_fp8_per_tensor(q, fp8_format) if spec.q_fp8 else (q, one)
    return PreparedInputs(
        q=qk.contiguous(),
        kv=kvk.contiguous(),
        q_scale=qs.to(q.device),
        kv_scale=ks.to(q.device),
        kv_indices=inputs.kv_indices.to(torch.int32),
        qo_indptr=inputs.qo_indptr,
        kv_indptr=inputs.kv_indptr,
        kv_last_page_len=inputs.kv_last_page_len,
        page_size=inputs.page_size,
        spec=spec,
        fp8_format=fp8_format,
        contiguous=contiguous,
        kv_scales=kv_scales,
        kv_recipe=recipe,
        causal=inputs.case.causal,
    )


def naive_decode(prepared: PreparedInputs, sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The readable version: fp64 reference attention on the dequantised codes (what a kernel must reproduce up to
    fp32 accumulation, and the rounding of P in the production numerics)."""
    if not isinstance(prepared, PreparedInputs):
        raise TypeError(f"prepared must be a PreparedInputs (see prepare()), got {type(prepared).__name__}")
    q, kv = prepared.dequantized()
    return decode_reference(
        q,
        kv,
        prepared.qo_indptr.cpu(),
        prepared.kv_indptr.cpu(),
        prepared.kv_indices.cpu(),
        prepared.kv_last_page_len.cpu(),
        sm_scale=sm_scale,
        empty_policy="zeros",
        causal=prepared.causal,
    )

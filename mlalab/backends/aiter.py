"""Backend ``"aiter"``: AMD aiter's persistent MLA decode (ROCm only: MI300X gfx942, MI355X gfx950).

What it does (the seeds' pattern, made safe; the facts are in docs/aiter.md):

1. `probe()` (from `aiter_runtime`) finds out, once per process, whether aiter can run here: installed, a supported
   release (`aiter_abi.abi_for_version`), a ROCm torch with a gfx942/gfx950 GPU, ``import aiter`` succeeds,
   signatures match what we call, and aiter's ``dtypes.fp8`` is the flavour of the architecture. Anything else: the
   reason, e.g. ``"aiter is not installed ..."``.
2. `AiterDecoder` builds, once per (batch, q_len, kv_lens, dtypes), the metadata buffers
   (`get_mla_metadata_info_v1` sizes, `get_mla_metadata_v1` fills), the page-size-1 `kv_indices`,
   `kv_last_page_lens`, the fp32 partial (`logits`) and `attn_lse` buffers and the output, checks the plan
   against the documented hazards (`aiter_guards`), then calls `mla_decode_stage1_asm_fwd` and `mla_reduce_v1`
   directly (``path="direct"``) or aiter's one-call `mla_decode_fwd` (``path="mla_decode_fwd"``), always with
   keywords.
3. `decode(inputs, **options)` is the registry entry: options are `AiterSettings` fields plus `return_lse`.

fp8 inputs are quantized here with `mlalab.quant.quantize_fp8_per_tensor` in the architecture's flavour
(e4m3fnuz on gfx942, e4m3fn on gfx950), and both dequantization scales are always passed. The spec for the
result is `quantized_reference`: the exact decode of the dequantized inputs, computable on any machine.

NOTHING in this module has been run on an AMD GPU by its authors (none was available): it is written against
aiter's source; the ``rocm`` tests in tests/test_aiter_rocm.py check it wherever aiter imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..config import MLA
from ..inputs import DecodeInputs
from ..quant.precision import PRECISIONS as PRECISION_TABLE
from ..reference import decode_reference
from .aiter_args import (
    _PRECISIONS,
    AiterSettings,
    arch_from_gcn_name,
    fp8_torch_dtype,
    info_kwargs,
    metadata_buffer_shapes,
    metadata_kwargs,
    mla_decode_fwd_kwargs,
    reduce_kwargs,
    settings_for_precision,
    stage1_kwargs,
    token_kv_indices,
)
from .aiter_guards import check_fragments, check_metadata_pointers, check_request
from .aiter_plan import compare_plans, plan_from_aiter_buffers
from .aiter_runtime import AiterRuntime, describe, installed_version, load, probe, signature

__all__ = [
    "probe",
    "decode",
    "AiterRuntime",
    "load",
    "AiterDecoder",
    "get_decoder",
    "QuantizedInputs",
    "quantize_inputs",
    "quantized_reference",
    "compare_plans",
    "installed_version",
    "describe",
    "plan_knobs",
    "make_callable",
    "PRECISIONS",
]

_BUFFER_ORDER = (  # get_mla_metadata_info_v1's return order (NOT get_mla_metadata_v1's argument order)
    "work_metadata",
    "work_indptr",
    "work_info_set",
    "reduce_indptr",
    "reduce_final_map",
    "reduce_partial_map",
)


# --------------------------------------------------------------------------------------------------------------
# Quantized inputs and their exact reference (CPU-computable)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantizedInputs:
    """q and the KV buffer as aiter reads them, with per-tensor dequantization scales (None for bf16)."""

    q: torch.Tensor  # (total_q, 16, 576) bf16 or fp8 codes
    kv_buffer: torch.Tensor  # (num_pages, page_size, 1, 576) bf16 or fp8 codes
    q_scale: torch.Tensor | None  # float32 (1,)
    kv_scale: torch.Tensor | None  # float32 (1,)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 q and KV: codes x scale (what the kernel computes with, before its own rounding)."""
        q = self.q.float() * (self.q_scale if self.q_scale is not None else 1.0)
        kv = self.kv_buffer.float() * (self.kv_scale if self.kv_scale is not None else 1.0)
        return q, kv


def quantize_inputs(inputs: DecodeInputs, settings: AiterSettings, fp8_flavour: str) -> QuantizedInputs:
    """Quantize q / KV to `fp8_flavour` where `settings` asks for fp8 (dynamic per-tensor amax scale)."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    if not isinstance(settings, AiterSettings):
        raise TypeError(f"settings must be an AiterSettings, got {type(settings).__name__}")
    fp8_torch_dtype(fp8_flavour)  # validates the name
    from ..quant import quantize_fp8_per_tensor

    if settings.q_dtype == "fp8":
        q, qs = quantize_fp8_per_tensor(inputs.q, fp8_flavour, math=settings.quant_math)
    else:
        q, qs = inputs.q.to(torch.bfloat16), None
    if settings.kv_dtype == "fp8":
        kv, kvs = quantize_fp8_per_tensor(inputs.kv_buffer, fp8_flavour, math=settings.quant_math)
        if qs is None:  # a16w8: pass a unit q scale anyway (C++ treats a missing scale as optional, we don't)
            qs = torch.ones(1, dtype=torch.float32, device=inputs.q.device)
    else:
        kv, kvs = inputs.kv_buffer.to(torch.bfloat16), None
    return QuantizedInputs(q, kv, qs, kvs)


def quantized_reference(
    inputs: DecodeInputs, settings: AiterSettings, fp8_flavour: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec for an aiter decode: the exact (fp64, CPU) decode of the quantized-then-dequantized inputs."""
    qi = quantize_inputs(inputs.to("cpu"), settings, fp8_flavour)
    q, kv = qi.dequantized()
    c = inputs.to("cpu")
    return decode_reference(q, kv, c.qo_indptr, c.kv_indptr, c.kv_indices, c.kv_last_page_len,
                            config=inputs.case.config, causal=inputs.case.causal)  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# The decoder
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """Everything built once per (batch, q_len, kv_lens, page_size, dtypes) and reused, at fixed addresses."""

    key: tuple[Any, ...]
    q_len: int
    causal: bool  # DecodeCase.causal: passed to the metadata and the kernels
    total_q: int
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor  # token indptr (page size 1)
    kv_indices: torch.Tensor  # token rows; refreshed in place each call (the page table may change)
    kv_last_page_lens: torch.Tensor  # ones
    buffers: dict[str, torch.Tensor]
    logits: torch.Tensor
    attn_lse: torch.Tensor
    out: torch.Tensor
    final_lse: torch.Tensor
    q_scale: torch.Tensor  # float32 (1,), refreshed in place
    kv_scale: torch.Tensor
    n_work: int
    max_partials_per_tile: int
    notes: list[str] = field(default_factory=list)


class AiterDecoder:
    """Persistent aiter decode with cached buffers. ``AiterDecoder(settings)(inputs) -> (out, lse)``."""

    def __init__(self, settings: AiterSettings | None = None, runtime: AiterRuntime | None = None) -> None:
        self.settings = settings if settings is not None else AiterSettings()
        if not isinstance(self.settings, AiterSettings):
            raise TypeError(f"settings must be an AiterSettings, got {type(self.settings).__name__}")
        self.rt = runtime if runtime is not None else load()
        self._cache: dict[tuple[Any, ...], Prepared] = {}

    # -- dtypes ------------------------------------------------------------------------------------------
    def _torch_dtype(self, name: str) -> torch.dtype:
        return self.rt.fp8_dtype if name == "fp8" else torch.bfloat16

    @property
    def fp8(self) -> bool:
        return "fp8" in (self.settings.q_dtype, self.settings.kv_dtype)

    # -- building ----------------------------------------------------------------------------------------
    def prepare(self, inputs: DecodeInputs) -> Prepared:
        """Build (or fetch) the cached metadata and buffers for `inputs`' shape; runs the planner once."""
        if not isinstance(inputs, DecodeInputs):
            raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
        kv_lens = tuple(int(x) for x in inputs.kv_lens.tolist())
        qo = inputs.qo_indptr.to("cpu", torch.int64)
        q_lens = (qo[1:] - qo[:-1]).tolist()
        s, rt = self.settings, self.rt
        check_request(kv_lens=kv_lens, q_lens=q_lens, arch=rt.arch, settings=s)
        if inputs.case.causal and not rt.abi.stage1_has_causal:
            raise ValueError(f"causal decode needs aiter >= v0.1.20 (the kernels' `causal` flag); aiter "
                             f"{rt.abi.version} has none")  # fmt: skip
        key = (len(kv_lens), q_lens[0], kv_lens, inputs.page_size, s, inputs.case.causal)
        if key in self._cache:
            return self._cache[key]

        dev, a, q_len, batch = rt.device, rt.module, int(q_lens[0]), len(kv_lens)
        qdt, kvdt = self._torch_dtype(s.q_dtype), self._torch_dtype(s.kv_dtype)
        tok_indptr, tok_indices = token_kv_indices(
            inputs.kv_indptr.cpu(), inputs.kv_indices.cpu(), inputs.kv_last_page_len.cpu(), inputs.page_size
        )
        qo_indptr = inputs.qo_indptr.to(dev, torch.int32)
        kv_indptr = tok_indptr.to(dev, torch.int32)
        kv_indices = tok_indices.to(dev, torch.int32)
        last = torch.ones(batch, dtype=torch.int32, device=dev)  # page size 1: every last page holds 1 token

        info = a.get_mla_metadata_info_v1(
            **info_kwargs(rt.abi, settings=s, batch=batch, q_len=q_len, q_torch_dtype=qdt, kv_torch_dtype=kvdt)
        )
        buffers = {name: torch.empty(shape, dtype=dt, device=dev) for name, (shape, dt) in zip(_BUFFER_ORDER, info)}
        notes = []
        ours = metadata_buffer_shapes(
            batch=batch,
            q_len=q_len,
            num_cus=rt.num_cus,
            settings=s,
            arch=rt.arch,
            info_has_max_split_per_batch=rt.abi.info_has_max_split_per_batch,
        )
        for name in _BUFFER_ORDER:
            if tuple(buffers[name].shape) != tuple(ours[name][0]):
                notes.append(f"{name}: aiter sized {tuple(buffers[name].shape)}, documented formula {ours[name][0]}")
        a.get_mla_metadata_v1(
            **metadata_kwargs(
                rt.abi,
                settings=s,
                qo_indptr=qo_indptr,
                kv_indptr=kv_indptr,
                kv_last_page_lens=last,
                buffers=buffers,
                q_len=q_len,
                q_torch_dtype=qdt,
                kv_torch_dtype=kvdt,
                causal=inputs.case.causal,
            )
        )
        torch.cuda.synchronize(dev)
        check_metadata_pointers(
            buffers["work_metadata"].cpu().view(torch.int64).tolist(),
            buffers["work_indptr"].data_ptr(),
            buffers["work_info_set"].data_ptr(),
        )
        wi = buffers["work_indptr"].cpu()
        n_work = int(wi[-1])
        if n_work > buffers["work_info_set"].shape[0]:
            raise RuntimeError(f"aiter planned {n_work} works into a {buffers['work_info_set'].shape[0]}-row buffer")
        if self.fp8:
            check_fragments(buffers["work_info_set"].cpu(), n_work)
        ri = buffers["reduce_indptr"].cpu().to(torch.int64)
        max_parts = int((ri[1:] - ri[:-1]).max()) if ri.numel() > 1 else 0
        if max_parts > max(rt.num_cus, s.num_kv_splits):
            raise RuntimeError(
                f"a reduce tile has {max_parts} partials, above the reduce's scratch of max(CUs, num_kv_splits)"
            )
        rows = buffers["reduce_partial_map"].shape[0] * q_len
        H, Dv = MLA.num_heads, MLA.v_dim
        total_q = int(qo[-1])
        p = Prepared(
            key=key,
            q_len=q_len,
            causal=inputs.case.causal,
            total_q=total_q,
            qo_indptr=qo_indptr,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            kv_last_page_lens=last,
            buffers=buffers,
            logits=torch.empty((rows, 1, H, Dv), dtype=torch.float32, device=dev),
            attn_lse=torch.empty((rows, 1, H, 1), dtype=torch.float32, device=dev),
            out=torch.empty((total_q, H, Dv), dtype=torch.bfloat16, device=dev),
            final_lse=torch.empty((total_q, H), dtype=torch.float32, device=dev),
            q_scale=torch.ones(1, dtype=torch.float32, device=dev),
            kv_scale=torch.ones(1, dtype=torch.float32, device=dev),
            n_work=n_work,
            max_partials_per_tile=max_parts,
            notes=notes,
        )
        self._cache[key] = p
        return p

    # -- running -----------------------------------------------------------------------------------------
    def run(self, p: Prepared, qi: QuantizedInputs, *, return_lse: bool = False) -> None:
        """Launch on prepared buffers (no host sync, no allocation on the direct path): fills `p.out`
        (and `p.final_lse` where the kernels write it). For timing loops."""
        s, rt, a = self.settings, self.rt, self.rt.module
        # The page table is positional, not part of the cache key: refresh the token rows at the same address.
        kv_view = qi.kv_buffer.reshape(-1, 1, MLA.num_kv_heads, MLA.qk_dim)  # (pages*page_size, 1, 1, 576)
        if qi.q_scale is not None:
            p.q_scale.copy_(qi.q_scale.reshape(1))
        if qi.kv_scale is not None:
            p.kv_scale.copy_(qi.kv_scale.reshape(1))
        q_scale = p.q_scale if qi.q_scale is not None else None
        kv_scale = p.kv_scale if qi.kv_scale is not None else None
        fp8 = self.fp8
        if return_lse:
            p.final_lse.fill_(float("nan"))  # rows no kernel writes stay NaN -> reported as "no LSE"
        if s.path == "mla_decode_fwd":
            from aiter.mla import mla_decode_fwd

            sig = signature(mla_decode_fwd)
            accepts = tuple(sig.parameters) if sig is not None else ()
            _, lse = mla_decode_fwd(
                **mla_decode_fwd_kwargs(
                    q=qi.q,
                    kv_buffer=kv_view,
                    out=p.out,
                    qo_indptr=p.qo_indptr,
                    kv_indptr=p.kv_indptr,
                    kv_indices=p.kv_indices,
                    kv_last_page_lens=p.kv_last_page_lens,
                    buffers=p.buffers,
                    q_len=p.q_len,
                    sm_scale=MLA.sm_scale,
                    num_kv_splits=max(rt.num_cus, s.num_kv_splits),
                    settings=s,
                    q_scale=q_scale,
                    kv_scale=kv_scale,
                    accepts=accepts,
                    return_lse=return_lse,
                    abi=rt.abi,
                    causal=p.causal,
                )
            )
            if return_lse and isinstance(lse, torch.Tensor):
                p.final_lse.copy_(lse.reshape(p.final_lse.shape))
            return
        a.mla_decode_stage1_asm_fwd(
            **stage1_kwargs(
                rt.abi,
                q=qi.q,
                kv_buffer=kv_view,
                qo_indptr=p.qo_indptr,
                kv_indptr=p.kv_indptr,
                kv_indices=p.kv_indices,
                kv_last_page_lens=p.kv_last_page_lens,
                buffers=p.buffers,
                q_len=p.q_len,
                sm_scale=MLA.sm_scale,
                logits=p.logits,
                attn_lse=p.attn_lse,
                out=p.out,
                final_lse=p.final_lse if return_lse else None,
                q_scale=q_scale,
                kv_scale=kv_scale,
                fp8=fp8,
                causal=p.causal,
            )
        )
        a.mla_reduce_v1(
            **reduce_kwargs(
                rt.abi,
                logits=p.logits,
                attn_lse=p.attn_lse,
                buffers=p.buffers,
                q_len=p.q_len,
                num_kv_splits=max(rt.num_cus, s.num_kv_splits),
                out=p.out,
                final_lse=p.final_lse if return_lse else None,
            )
        )

    def __call__(self, inputs: DecodeInputs, *, return_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decode: ``(out (total_q, 16, 512) bf16, lse (total_q, 16) float32 or None)`` — copies, so the
        cached buffers may be reused. LSE is None when some rows were not written (unsplit works on releases
        whose stage 1 has no ``lse`` argument, or kernels that ignore it)."""
        p = self.prepare(inputs)
        x = inputs.to(self.rt.device)
        qi = quantize_inputs(x, self.settings, self.rt.fp8_flavour)
        tok_indptr, tok_indices = token_kv_indices(x.kv_indptr, x.kv_indices, x.kv_last_page_len, x.page_size)
        p.kv_indices.copy_(tok_indices.to(torch.int32))
        self.run(p, qi, return_lse=return_lse)
        out = p.out.clone()
        lse = None
        if return_lse:
            lse = p.final_lse.clone()
            if bool(torch.isnan(lse).any()):
                lse = None
        return out, lse

    # -- plans -------------------------------------------------------------------------------------------
    def planner_name(self) -> str:
        return "aiter-intra-batch" if self.settings.intra_batch_mode else "aiter-fast"

    def aiter_plan(self, inputs: DecodeInputs) -> Any:
        """aiter's own work map for `inputs`, as a `mlalab.plan.WorkPlan` (CPU copy)."""
        p = self.prepare(inputs)
        return plan_from_aiter_buffers(
            p.buffers,
            num_cus=self.rt.num_cus,
            batch=inputs.batch,
            planner=f"{self.planner_name()} (aiter)",
            kv_lens=tuple(int(n) for n in inputs.kv_lens.tolist()),
        )

    def our_plan(self, inputs: DecodeInputs) -> Any:
        """Our re-implemented planner for the same inputs, target and knobs (page size 1, token indptr)."""
        from ..config import get_target
        from ..plan import make_plan

        tok_indptr, _ = token_kv_indices(
            inputs.kv_indptr.cpu(), inputs.kv_indices.cpu(), inputs.kv_last_page_len.cpu(), inputs.page_size
        )
        target = get_target(self.rt.arch)
        if target.num_cus != self.rt.num_cus:  # e.g. MI325X / MI308X report other counts: plan for the real one
            target = get_target(self.rt.num_cus)
        return make_plan(
            self.planner_name(),
            inputs.qo_indptr.cpu().to(torch.int32),
            tok_indptr,
            target,
            **plan_knobs(self.settings, self.rt.arch, int(inputs.case.q_len)),
        )

    def compare_with_ours(self, inputs: DecodeInputs) -> Any:
        """`compare_plans(our plan, aiter's plan)` for `inputs` (on ROCm)."""
        return compare_plans(self.our_plan(inputs), self.aiter_plan(inputs))


def plan_knobs(settings: AiterSettings, arch: str, q_len: int) -> dict[str, Any]:
    """Keyword knobs for `mlalab.splitkv.make_plan` that mirror our `get_mla_metadata_v1` call."""
    knobs: dict[str, Any] = {
        "max_split_per_batch": settings.split_arg,
        "kv_granularity": settings.kv_granularity,
        "q_len": q_len,
    }
    if settings.intra_batch_mode:
        knobs["rule"] = arch_from_gcn_name(arch)  # the v1.0 split rule differs between gfx942 and gfx950
    return knobs


_DECODERS: dict[AiterSettings, AiterDecoder] = {}


def get_decoder(settings: AiterSettings) -> AiterDecoder:
    """One cached decoder per settings (so repeated `decode` calls reuse buffers, as the seeds do)."""
    if settings not in _DECODERS:
        _DECODERS[settings] = AiterDecoder(settings)
    return _DECODERS[settings]


_SETTING_NAMES = tuple(f.name for f in fields(AiterSettings))


def decode(inputs: DecodeInputs, **options: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Registry entry. Options: `AiterSettings` fields (mode, num_kv_splits, max_split_per_batch,
    kv_granularity, q_dtype, kv_dtype, path, quant_math) and ``return_lse`` (default True)."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs, got {type(inputs).__name__}")
    return_lse = bool(options.pop("return_lse", True))
    unknown = sorted(set(options) - set(_SETTING_NAMES))
    if unknown:
        raise TypeError(f"unknown aiter option(s) {unknown}; valid: {', '.join(_SETTING_NAMES + ('return_lse',))}")
    return get_decoder(AiterSettings(**options))(inputs, return_lse=return_lse)


PRECISIONS = tuple(p.value for p in PRECISION_TABLE if p.value in _PRECISIONS)  # the fp8 / bf16 ones


def make_callable(inputs: DecodeInputs, *, precision: str = "a8w8", fp8_format: str | None = None,
                  n_copies: int = 1, **overrides: Any) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """ROCm only: aiter's persistent MLA decode as a timeable ``call(i)`` (the backend interface of `mlalab.timing`).
    Everything (settings, quantisation, metadata buffers, page table) is built once here; ``call(i)`` is
    `AiterDecoder.run` on KV copy ``i``. The fp8 flavour is the architecture's (`fp8_format` must match it if
    given); `overrides` are `AiterSettings` fields."""
    reason = probe()
    if reason is not None:
        raise RuntimeError(f"aiter backend unavailable: {reason}")
    dec = AiterDecoder(settings_for_precision(precision, **overrides))
    if fp8_format is not None and fp8_format != dec.rt.fp8_flavour:
        raise ValueError(f"fp8_format {fp8_format!r}: aiter on {dec.rt.arch} runs {dec.rt.fp8_flavour}")
    prepared = dec.prepare(inputs)
    qi = quantize_inputs(inputs, dec.settings, dec.rt.fp8_flavour)
    _, tok_indices = token_kv_indices(inputs.kv_indptr, inputs.kv_indices, inputs.kv_last_page_len, inputs.page_size)
    prepared.kv_indices.copy_(tok_indices.to(torch.int32))
    copies = [qi] + [
        QuantizedInputs(qi.q, qi.kv_buffer.clone(), qi.q_scale, qi.kv_scale) for _ in range(max(0, n_copies - 1))
    ]

    def call(i: int) -> torch.Tensor:
        dec.run(prepared, copies[i % len(copies)])
        return prepared.out

    record = {f.name: getattr(dec.settings, f.name) for f in fields(dec.settings)}
    return call, {"kv_bytes": qi.kv_buffer.numel() * qi.kv_buffer.element_size(), "record": record}

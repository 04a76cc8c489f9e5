"""One ``decode(...)`` entry point over several executors.

Each backend is a module ``mlalab/backends/<name>.py`` defining

* ``probe() -> str | None``: None when usable here, else the reason it is not (never raises);
* ``decode(inputs: DecodeInputs, **options) -> tuple[Tensor, Tensor]``: output ``(total_q, 16, 512)`` and
  natural-log LSE ``(total_q, 16)`` (LSE may be None where a backend cannot return it);
* the GPU ones also ``PRECISIONS`` (the names of `mlalab.quant.precision` they run) and
  ``make_callable(inputs, *, precision, fp8_format, n_copies, **options) -> (call, info)``: everything built once,
  ``call(i)`` one decode on KV copy ``i`` (what `mlalab.timing` times), ``info["kv_bytes"]`` and, where the backend
  has choices to record, ``info["record"]`` (a JSON-able dict of what ran: the timing CSV's ``config`` column).

Backends are imported lazily: importing ``aiter`` off ROCm raises RuntimeError (not ImportError), and the
GPU peers pull in CUDA libraries; none of that may break ``import mlalab``.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType

import torch

from ..inputs import DecodeInputs

__all__ = ["BACKENDS", "available", "get_backend", "decode"]

# name -> (module, one-line description)
BACKENDS: dict[str, tuple[str, str]] = {
    "reference": ("mlalab.backends.reference", "exact decode (fp64 on CPU, fp32 on GPU); the specification"),
    "emulated": ("mlalab.backends.emulated", "CPU/GPU emulation of a split-KV WorkPlan: stage 1 + LSE reduce"),
    "triton": ("mlalab.backends.triton", "persistent split-KV Triton kernels executing a WorkPlan"),
    "aiter": ("mlalab.backends.aiter", "AMD aiter persistent MLA decode (ROCm only)"),
    "flashmla": ("mlalab.backends.flashmla", "FlashMLA (sgl-flash-mla) dense sm90 decode, peer"),
    "flashinfer": ("mlalab.backends.flashinfer", "FlashInfer fa3 MLA decode, peer"),
    "reference-torch": ("mlalab.backends.reference_torch", "batched bf16 torch matmuls: what a user would write"),
}


def get_backend(name: str) -> ModuleType:
    """Import a backend module; raises ValueError naming the valid backends, RuntimeError if unusable."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    mod_name = BACKENDS[name][0]
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name == mod_name:
            raise RuntimeError(f"backend {name!r} is not implemented in this version of mlalab") from None
        raise
    return mod


def available() -> dict[str, str]:
    """``{backend: "available" | "unavailable: <reason>"}`` for every known backend (never raises), followed by
    ``" [<detail>]"`` where the backend module has a ``describe()`` (aiter: the installed version, its window, what
    works with it)."""
    status: dict[str, str] = {}
    for name in BACKENDS:
        detail = None
        try:
            mod = get_backend(name)
            reason = mod.probe()
            detail = mod.describe() if hasattr(mod, "describe") else None  # e.g. aiter: version, window, what works
        except Exception as e:  # a probe must never break the listing
            reason = f"{type(e).__name__}: {e}"
        status[name] = "available" if reason is None else f"unavailable: {reason}"
        if detail:
            status[name] += f" [{detail}]"
    return status


def decode(
    inputs: DecodeInputs, backend: str = "reference", **options: object
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one decode with the named backend (see `available()`)."""
    if not isinstance(inputs, DecodeInputs):
        raise TypeError(f"inputs must be a DecodeInputs (see mlalab.make_inputs), got {type(inputs).__name__}")
    mod = get_backend(backend)
    params = inspect.signature(mod.decode).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        valid = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        bad = [k for k in options if k not in valid]
        if bad:
            raise TypeError(
                f"decode(backend={backend!r}) has no option {', '.join(map(repr, bad))}; "
                f"its options: {', '.join(valid)}"
            )
    reason = mod.probe()
    if reason is not None:
        raise RuntimeError(f"backend {backend!r} unavailable: {reason}")
    return mod.decode(inputs, **options)

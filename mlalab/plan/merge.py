"""The LSE merge, written once for the CPU: how the partial outputs of a split request combine into its output.

A work that streams part of a request's KV stores ``O_i`` (its softmax-normalised output over that part) and
``L_i = m_i + ln l_i`` (the natural log of its softmax denominator). The merged output and LSE are

    M = max_i L_i,   w_i = exp(L_i - M),   O = Σ_i w_i O_i / Σ_i w_i,   L = M + ln Σ_i w_i

(every weight ≤ 1, so nothing overflows; an empty partial has L_i = -inf and weight 0; a request whose partials are
all empty gets O = 0 and L = -inf). docs/kernels.md states the same contract for the GPU reduces, whose block helper
carries the same name (`mlalab.kernels.portable._lse_merge`, `mlalab.kernels.sm90.reduce._lse_merge`, in base 2).
"""

from __future__ import annotations

import torch

__all__ = ["lse_merge"]


def lse_merge(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge partials along dim 0: `outs` ``(n, ..., D)`` and `lses` ``(n, ...)`` (natural log) ->
    ``(out (..., D), lse (...), weights (n, ...))`` with the normalised weights ``w_i / Σ w`` (0 where every partial
    is empty)."""
    if not isinstance(outs, torch.Tensor) or not isinstance(lses, torch.Tensor):
        raise TypeError("outs and lses must be torch.Tensors")
    if outs.dim() < 2 or tuple(outs.shape[:-1]) != tuple(lses.shape) or outs.shape[0] < 1:
        raise ValueError(f"outs (n, ..., D) and lses (n, ...) must agree on their leading dims, got "
                         f"{tuple(outs.shape)} and {tuple(lses.shape)}")  # fmt: skip
    m = lses.amax(0)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(lses - m_safe)
    den = w.sum(0)
    den_safe = torch.where(den > 0, den, torch.ones_like(den))
    out = (w.unsqueeze(-1) * outs).sum(0) / den_safe.unsqueeze(-1)
    lse = torch.where(den > 0, m_safe + torch.log(den_safe), torch.full_like(m, float("-inf")))
    return out, lse, w / den_safe

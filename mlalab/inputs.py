"""Seeded input generators: q, the latent KV buffer, indptrs and (optionally) a paged layout.

Layout conventions follow aiter's persistent decode (and FlashInfer's paged layout):

* ``q``: ``(total_q, 16, 576)`` bf16, request ``b`` owns rows ``qo_indptr[b]:qo_indptr[b+1]``.
* ``kv_buffer``: ``(num_pages, page_size, 1, 576)`` bf16 — the one latent KV head. Keys are all 576 dims,
  values the first 512.
* ``kv_indptr`` (batch+1, int32) indexes ``kv_indices`` (page ids); request ``b`` has
  ``(n_pages - 1) * page_size + kv_last_page_len[b]`` tokens. With page size 1 this is plain token indexing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .checks import check_indptr, check_int, ensure_fits
from .config import DecodeCase, InputDist

__all__ = [
    "DecodeInputs",
    "make_inputs",
    "sample",
    "uniform_kv_lens",
    "ragged_kv_lens",
    "paged_layout",
    "kv_lens_from_layout",
    "gather_request_kv",
]


@dataclass(frozen=True)
class DecodeInputs:
    """Tensors of one decode call (all on one device). Build with `make_inputs`."""

    q: torch.Tensor  # (total_q, H, 576)
    kv_buffer: torch.Tensor  # (num_pages, page_size, 1, 576)
    qo_indptr: torch.Tensor  # (B+1,) int32
    kv_indptr: torch.Tensor  # (B+1,) int32, in pages
    kv_indices: torch.Tensor  # (kv_indptr[-1],) int32 page ids
    kv_last_page_len: torch.Tensor  # (B,) int32
    case: DecodeCase

    @property
    def page_size(self) -> int:
        return int(self.kv_buffer.shape[1])

    @property
    def batch(self) -> int:
        return int(self.qo_indptr.numel() - 1)

    @property
    def kv_lens(self) -> torch.Tensor:
        """Tokens per request (int64, on CPU)."""
        return kv_lens_from_layout(self.kv_indptr, self.kv_last_page_len, self.page_size)

    def token_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The KV as one contiguous ``(total_kv, 1, 576)`` buffer in request order plus its token indptr
        (what page-size-1 kernels consume)."""
        parts = [gather_request_kv(self, b) for b in range(self.batch)]
        kv = torch.cat(parts, 0) if parts else self.kv_buffer.new_empty((0, 1, self.kv_buffer.shape[-1]))
        indptr = torch.zeros(self.batch + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(self.kv_lens, 0).to(torch.int32)
        return kv, indptr.to(self.qo_indptr.device)

    def to(self, device: str | torch.device) -> DecodeInputs:
        return DecodeInputs(
            self.q.to(device),
            self.kv_buffer.to(device),
            self.qo_indptr.to(device),
            self.kv_indptr.to(device),
            self.kv_indices.to(device),
            self.kv_last_page_len.to(device),
            self.case,
        )


def sample(
    shape: tuple[int, ...],
    dist: InputDist | str,
    generator: torch.Generator,
    *,
    scale: float | None = None,
    outlier_magnitude: float = 20.0,
    outlier_channels: int = 8,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Draw a tensor of `shape` from a named distribution on the CPU generator.

    The competition draws ``torch.randn(shape, dtype=bf16) * 0.02``: a bf16 normal sample times the scale, rounded
    to bf16 again. Here the normal sample is drawn in fp32 and rounded to bf16 (what torch >= 2.13 does for a bf16
    ``randn`` on the CPU; torch 2.11 drew other bf16 values from the same seed), so a seed gives the same tensors
    under every torch version.
    Outlier channels are the same channels (picked by the generator) for every token, as activation
    outliers in real models are channel-wise.
    """
    d = InputDist.parse(dist)
    std = d.default_scale if scale is None else float(scale)
    if not (math.isfinite(std) and std > 0):
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if d in (InputDist.COMPETITION, InputDist.UNIT):
        return torch.randn(shape, dtype=torch.float32, generator=generator).to(dtype) * std
    if d is InputDist.OUTLIERS:
        x = torch.randn(shape, dtype=torch.float32, generator=generator) * std
        if outlier_channels > 0:
            ch = torch.randperm(shape[-1], generator=generator)[:outlier_channels]
            x[..., ch] *= outlier_magnitude
        return x.to(dtype)
    if d is InputDist.HEAVY_TAIL:
        # Student-t with 3 dof = normal / sqrt(chi2_3 / 3); rescaled to unit variance (var of t3 is 3).
        z = torch.randn(shape, dtype=torch.float64, generator=generator)
        chi2 = (torch.randn((*shape, 3), dtype=torch.float64, generator=generator) ** 2).sum(-1)
        t = z / torch.sqrt(chi2 / 3.0) / (3.0**0.5)
        return (t * std).to(dtype)
    raise AssertionError(d)  # pragma: no cover


def uniform_kv_lens(batch: int, kv_len: int) -> tuple[int, ...]:
    check_int("batch", batch, minimum=1)
    check_int("kv_len", kv_len, minimum=1)
    return (kv_len,) * batch


def ragged_kv_lens(
    batch: int, mean_len: int, seed: int = 0, *, min_len: int = 1, max_len: int | None = None
) -> tuple[int, ...]:
    """Ragged lengths: log-uniform between `min_len` and `max_len` (default 4 × mean), rescaled so the mean
    is close to `mean_len` — short and very long requests side by side, as in real serving."""
    check_int("batch", batch, minimum=1)
    check_int("mean_len", mean_len, minimum=1)
    check_int("min_len", min_len, minimum=0)
    check_int("seed", seed)
    hi = check_int("max_len", max_len, minimum=1) if max_len is not None else 4 * mean_len
    if not min_len <= mean_len <= hi:
        raise ValueError(f"need min_len <= mean_len <= max_len, got {min_len}, {mean_len}, {hi}")
    g = torch.Generator().manual_seed(seed)
    lo = max(min_len, 1)
    u = torch.rand(batch, generator=g, dtype=torch.float64)
    lens = torch.exp(
        torch.log(torch.tensor(float(lo)))
        + u * (torch.log(torch.tensor(float(hi))) - torch.log(torch.tensor(float(lo))))
    )
    lens = lens * (mean_len / lens.mean())
    lens = lens.round().clamp(min_len, hi).to(torch.int64)
    return tuple(int(x) for x in lens)


def paged_layout(
    kv_lens: tuple[int, ...] | list[int], page_size: int, *, permute: bool, generator: torch.Generator | None = None,
    pool_factor: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:  # fmt: skip
    """Page table for `kv_lens`: returns (kv_indptr in pages, kv_indices, kv_last_page_len, num_pages).

    A request with 0 tokens gets 0 pages and last_page_len 0. With `permute` the physical pages are a random
    permutation (so a correct reader must follow the table); with `pool_factor` > 1 the buffer has that many times
    the pages used, and the used ones are a random subset of them (the first ones without `permute`)."""
    check_int("page_size", page_size, minimum=1)
    check_int("pool_factor", pool_factor, minimum=1)
    for i, n in enumerate(kv_lens):
        check_int(f"kv_lens[{i}]", n, minimum=0)
    n_pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(n_pages, dtype=torch.int64), 0).to(torch.int32)
    total = int(indptr[-1])
    if permute:
        indices = torch.randperm(total * pool_factor, generator=generator)[:total].to(torch.int32)
    else:
        indices = torch.arange(total, dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size if p > 0 else 0 for n, p in zip(kv_lens, n_pages)], dtype=torch.int32)
    return indptr, indices, last, total * pool_factor


def kv_lens_from_layout(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Tokens per request from an aiter-style page table (int64 CPU tensor)."""
    check_indptr("kv_indptr", kv_indptr, length=kv_last_page_len.numel() + 1)
    check_int("page_size", page_size, minimum=1)
    pages = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int64).cpu()
    last = kv_last_page_len.to(torch.int64).cpu()
    return torch.where(pages > 0, (pages - 1) * page_size + last, torch.zeros_like(pages))


def gather_request_kv(inputs: DecodeInputs, b: int) -> torch.Tensor:
    """Request `b`'s KV tokens in order, ``(n_b, 1, 576)``, following the page table."""
    p0, p1 = int(inputs.kv_indptr[b]), int(inputs.kv_indptr[b + 1])
    pages = inputs.kv_indices[p0:p1].long()
    n = int(inputs.kv_lens[b])
    buf = inputs.kv_buffer[pages]  # (n_pages, page_size, 1, D)
    return buf.reshape(-1, *buf.shape[2:])[:n]


def make_inputs(case: DecodeCase, device: str | torch.device = "cpu") -> DecodeInputs:
    """Draw q and the KV buffer for `case` (always on the CPU generator, so results do not depend on the
    device), build the page table, and move everything to `device`."""
    if not isinstance(case, DecodeCase):
        raise TypeError(f"case must be a DecodeCase, got {type(case).__name__}")
    cfg = case.config
    n_tokens_padded = sum(-(-n // case.page_size) * case.page_size for n in case.kv_lens)
    est = (case.total_kv + n_tokens_padded * case.pool_factor) * cfg.qk_dim * 2
    est += case.total_q * cfg.num_heads * cfg.qk_dim * 2
    ensure_fits(est, f"make_inputs({case.short_str()})")
    g = torch.Generator().manual_seed(case.seed)
    kw = {"scale": case.scale, "outlier_magnitude": case.outlier_magnitude, "outlier_channels": case.outlier_channels}
    q = sample((case.total_q, cfg.num_heads, cfg.qk_dim), case.dist, g, **kw)
    # Draw the tokens in logical order first, then lay them out in (possibly permuted) pages, so the same seed
    # gives the same logical q and KV for every page size.
    kv_tokens = sample((case.total_kv, 1, cfg.qk_dim), case.dist, g, **kw)
    indptr, indices, last, num_pages = paged_layout(
        case.kv_lens, case.page_size, permute=case.permute_pages, generator=g, pool_factor=case.pool_factor
    )
    buf = torch.zeros((max(num_pages, 0), case.page_size, 1, cfg.qk_dim), dtype=kv_tokens.dtype)
    start = 0
    for b, n in enumerate(case.kv_lens):
        p0, p1 = int(indptr[b]), int(indptr[b + 1])
        if n == 0:
            continue
        flat = torch.zeros(((p1 - p0) * case.page_size, 1, cfg.qk_dim), dtype=kv_tokens.dtype)
        flat[:n] = kv_tokens[start : start + n]
        buf[indices[p0:p1].long()] = flat.view(p1 - p0, case.page_size, 1, cfg.qk_dim)
        start += n
    qo_indptr = torch.arange(case.batch + 1, dtype=torch.int32) * case.q_len
    return DecodeInputs(q, buf, qo_indptr, indptr, indices, last, case).to(device)

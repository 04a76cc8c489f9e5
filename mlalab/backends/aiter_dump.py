"""Dump aiter's split-KV metadata from a real run into the doctor's file (docs/splitkv.md), so a plan aiter built on
ROCm can be checked anywhere with ``python -m mlalab doctor FILE``.

Typical use on ROCm, right after aiter's ``get_mla_metadata_v1`` filled its buffers::

    from mlalab.backends.aiter_dump import dump_aiter_metadata
    dump_aiter_metadata("plan.pt", {"work_indptr": work_indptr, "work_info_set": work_info_set,
                        "reduce_indptr": reduce_indptr, "reduce_final_map": reduce_final_map,
                        "reduce_partial_map": reduce_partial_map}, qo_indptr, kv_indptr,
                        kv_last_page_len=kv_last_page_len, page_size=page_size, num_kv_splits=num_kv_splits)

Nothing here imports aiter: the function only copies tensors to the CPU and writes them (atomically).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from ..plan.doctor import save_metadata

__all__ = ["dump_aiter_metadata"]


def dump_aiter_metadata(
    path: str | os.PathLike[str],
    buffers: Mapping[str, torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    kv_last_page_len: torch.Tensor | None = None,
    page_size: int = 1,
    num_kv_splits: int | None = None,
    n_partial_rows: int | None = None,
) -> Path:
    """Write aiter's metadata buffers (``work_indptr``, ``work_info_set`` or ``work_info``, ``reduce_indptr``,
    ``reduce_final_map``, ``reduce_partial_map``; device tensors are fine) with the batch they were made for.
    `n_partial_rows`: rows of the partial buffer the kernel was given (then partial ids are checked against it)."""
    if not isinstance(buffers, Mapping):
        raise TypeError(f"buffers must be a dict of aiter's metadata tensors, got {type(buffers).__name__}")
    d: dict[str, object] = {k: v.detach().to("cpu").clone() for k, v in buffers.items() if isinstance(v, torch.Tensor)}
    bad = [k for k, v in buffers.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"buffers[{bad[0]!r}] must be a tensor, got {type(buffers[bad[0]]).__name__}")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        d[name] = t.detach().to("cpu").clone()
    d["page_size"] = page_size
    if num_kv_splits is not None:
        d["num_kv_splits"] = num_kv_splits
    if n_partial_rows is not None:
        d["n_partial_rows"] = n_partial_rows
    return save_metadata(path, d)

"""Shared pytest set-up: markers for hardware-bound tests are skipped with a clear reason elsewhere."""

from __future__ import annotations

import functools

import pytest
import torch


@functools.cache
def _aiter_reason() -> str | None:
    try:
        from mlalab.backends import get_backend

        return get_backend("aiter").probe()
    except Exception as e:  # the backend may not exist yet, or aiter may raise anything on import
        return f"{type(e).__name__}: {e}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = torch.cuda.is_available() and torch.version.cuda is not None
    for item in items:
        if "gpu" in item.keywords and not (has_cuda or (torch.cuda.is_available() and torch.version.hip)):
            item.add_marker(pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False on this machine)"))
        if "rocm" in item.keywords:
            reason = _aiter_reason()
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"aiter unavailable: {reason}"))

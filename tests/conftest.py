"""Shared pytest set-up: markers for hardware-bound tests are skipped with a clear reason elsewhere."""

from __future__ import annotations

import functools
import os

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's torch gets its share of the cores: the fp64 CPU oracles are many small ops,
    and N workers with a thread per core each thrash (on the 16-core H100 machine 8 workers took > 300 s for a
    speculative-decode test that runs in 4 s alone)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


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

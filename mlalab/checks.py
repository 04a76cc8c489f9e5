"""Input validation shared by every public entry point: clear messages naming the argument.

Every public function of the library validates with these helpers, so a wrong shape, dtype or indptr fails
the same way everywhere (``ValueError`` for values and shapes, ``TypeError`` for types).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

__all__ = [
    "TooLargeError",
    "check_tensor",
    "check_indptr",
    "check_finite",
    "check_int",
    "available_memory_bytes",
    "ensure_fits",
    "format_bytes",
]


class TooLargeError(ValueError):
    """A request would need more memory than this machine can give; the message carries the estimate."""


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | Iterable[int] | None = None,
    shape: tuple[int | None, ...] | None = None,
    dtypes: Iterable[torch.dtype] | None = None,
) -> torch.Tensor:
    """Check that `t` is a tensor of the given rank, shape (None = any size in that position) and dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            raise ValueError(f"{name} must have rank {' or '.join(map(str, allowed))}, got shape {tuple(t.shape)}")
    if shape is not None and (t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape))):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if dtypes is not None:
        allowed_dt = tuple(dtypes)
        if t.dtype not in allowed_dt:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed_dt)
            raise TypeError(f"{name} must have dtype {names}; got {str(t.dtype).replace('torch.', '')}")
    return t


def check_int(name: str, v: object, *, minimum: int | None = None) -> int:
    """An int (not a bool, not a float that happens to be whole), optionally >= `minimum`."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_indptr(name: str, t: object, *, length: int | None = None, total: int | None = None) -> torch.Tensor:
    """An indptr: 1-D int32/int64, starts at 0, non-decreasing, optionally of `length` and ending at `total`."""
    t = check_tensor(name, t, ndim=1, dtypes=(torch.int32, torch.int64))
    if t.numel() < 2:
        raise ValueError(f"{name} must have at least 2 entries (batch + 1), got {t.numel()}")
    if length is not None and t.numel() != length:
        raise ValueError(f"{name} must have {length} entries (batch + 1), got {t.numel()}")
    c = t.detach().to("cpu", torch.int64)
    if int(c[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(c[0])}")
    d = c[1:] - c[:-1]
    if bool((d < 0).any()):
        i = int(torch.nonzero(d < 0)[0])
        raise ValueError(f"{name} must be non-decreasing; {name}[{i}]={int(c[i])} > {name}[{i + 1}]={int(c[i + 1])}")
    if total is not None and int(c[-1]) != total:
        raise ValueError(f"{name}[-1] = {int(c[-1])} does not match the tensor it indexes ({total} rows)")
    return t


def check_finite(name: str, t: torch.Tensor) -> None:
    """Refuse NaN/inf with a count and the first position, instead of letting them propagate silently."""
    if t.is_floating_point() and t.element_size() >= 2 and t.dtype not in _FP8_DTYPES:
        bad = ~torch.isfinite(t)
    elif t.dtype in _FP8_DTYPES:
        bad = ~torch.isfinite(t.float())
    else:
        return
    n = int(bad.sum())
    if n:
        first = tuple(int(i) for i in torch.nonzero(bad)[0])
        n_nan = int(torch.isnan(t.float()).sum())
        raise ValueError(f"{name} contains {n} non-finite values ({n_nan} NaN, {n - n_nan} inf); first at {first}")


_FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 62


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def ensure_fits(nbytes: int, what: str, *, fraction: float = 0.8, limit: int | None = None) -> None:
    """Refuse (with the estimate) work whose peak memory exceeds `fraction` of available memory or `limit`."""
    budget = int(available_memory_bytes() * fraction) if limit is None else int(limit)
    if nbytes > budget:
        raise TooLargeError(
            f"{what} needs about {format_bytes(nbytes)}, more than the {format_bytes(budget)} this machine can give; "
            "use a smaller batch / kv_len, or a GPU backend"
        )

"""Arguments shared by several subcommands: the decode case, and JSON output."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ..config import DecodeCase, InputDist
from ..inputs import ragged_kv_lens


def parse_csv_items(text: str) -> tuple[str, ...]:
    """The items of a comma-separated list (spaces ignored); an empty item (``3,,5``, a trailing comma) or an empty
    list is an error, never silently dropped."""
    items = tuple(x.strip() for x in text.split(","))
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a comma-separated list, got nothing")
    if any(x == "" for x in items):
        raise argparse.ArgumentTypeError(f"empty item in the comma-separated list {text!r}")
    return items


def parse_int_list(text: str) -> tuple[int, ...]:
    """Comma-separated non-negative integers (``1024,512,0``); anything else is an error naming the list."""
    items = parse_csv_items(text)
    try:
        vals = tuple(int(x) for x in items)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return vals


def add_case_arguments(p: argparse.ArgumentParser, *, default_batch: int = 4, default_kv_len: int = 1024) -> None:
    g = p.add_argument_group("decode case")
    g.add_argument("--batch", type=int, default=default_batch, help="requests in the batch (default %(default)s)")
    g.add_argument("--kv-len", type=int, default=default_kv_len, help="KV tokens per request (default %(default)s)")
    g.add_argument(
        "--kv-lens",
        type=parse_int_list,
        default=None,
        help="comma-separated per-request KV lengths (ragged batch); overrides --batch/--kv-len",
    )
    g.add_argument(
        "--ragged", action="store_true", help="draw ragged lengths around --kv-len (log-uniform, seeded by --seed)"
    )
    g.add_argument("--q-len", type=int, default=1, help="query tokens per request: 1, or 2/4 for speculative decode")
    g.add_argument(
        "--causal",
        action="store_true",
        help="speculative verification's mask: q row i of q_len sees all but the q_len-1-i newest KV tokens",
    )
    g.add_argument("--page-size", type=int, default=1, help="KV page size (default 1)")
    g.add_argument("--permute-pages", action="store_true", help="shuffle physical pages (tests the page table)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--dist",
        default="competition",
        choices=[d.value for d in InputDist],
        help="input distribution (default competition = randn*0.02)",
    )
    g.add_argument("--scale", type=float, default=None, help="std of the distribution (default: its own)")
    g.add_argument("--outlier-magnitude", type=float, default=20.0)


def case_from_args(a: argparse.Namespace) -> DecodeCase:
    if a.kv_lens is not None:
        lens = a.kv_lens
    elif a.ragged:
        lens = ragged_kv_lens(a.batch, a.kv_len, seed=a.seed)
    else:
        if a.batch < 1 or a.kv_len < 1:
            raise ValueError(f"--batch and --kv-len must be >= 1 (got {a.batch}, {a.kv_len})")
        lens = (a.kv_len,) * a.batch
    return DecodeCase(
        kv_lens=tuple(lens),
        q_len=a.q_len,
        seed=a.seed,
        dist=a.dist,
        scale=a.scale,
        outlier_magnitude=a.outlier_magnitude,
        page_size=a.page_size,
        permute_pages=a.permute_pages,
        causal=a.causal,
    )


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return _jsonable(x.item())
    if hasattr(x, "tolist"):
        return _jsonable(x.tolist())
    return x


def print_json(obj: Any) -> None:
    """Strict JSON on stdout (NaN -> null, inf -> "inf")."""
    json.dump(_jsonable(obj), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def print_record(rec: dict[str, Any], as_json: bool) -> None:
    """A flat result record: strict JSON, or aligned ``key: value`` lines (floats to 6 significant digits)."""
    if as_json:
        print_json(rec)
        return
    width = max((len(str(k)) for k in rec), default=0)
    for k, v in rec.items():
        print(f"{k:>{width}}: {v:.6g}" if isinstance(v, float) else f"{k:>{width}}: {v}")

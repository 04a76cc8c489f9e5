"""``python -m mlalab sweep``: a grid of accuracy records (cases × fp8 formats × Q schemes × KV schemes) -> table."""

from __future__ import annotations

import argparse

from ..accuracy import DEFAULT_TOLERANCES, save_table, sweep
from ..config import DecodeCase
from ..quant import FP8_FORMATS, KV_SCHEMES, Q_SCHEMES, concrete_names
from ._common import parse_int_list
from .accuracy import add_scheme_arguments

NAME = "sweep"
HELP = "accuracy grid over kv lengths, distributions, seeds, fp8 formats and schemes; writes CSV/Parquet"
ORDER = 21


def _list(text: str, all_names: tuple[str, ...]) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    return concrete_names(all_names) if items == ("all",) else items


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=parse_int_list, default=(4,), help="batch sizes, comma-separated (default 4)")
    p.add_argument("--kv-len", type=parse_int_list, default=(1024,), help="KV lengths, comma-separated")
    p.add_argument("--q-len", type=parse_int_list, default=(1,), help="query lengths, comma-separated")
    p.add_argument("--seed", type=parse_int_list, default=(0,), help="seeds, comma-separated")
    p.add_argument("--dist", default="competition", help="input distributions, comma-separated")
    p.add_argument("--scale", type=float, default=None, help="std of the distribution (default: its own)")
    add_scheme_arguments(p, plural=True)
    p.add_argument("--out", default=None, help="write the table here (.csv or .parquet); else print it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(a: argparse.Namespace) -> int:
    cases = [
        DecodeCase.uniform(b, L, q_len=ql, seed=s, dist=d, scale=a.scale)
        for d in _list(a.dist, ())
        for b in a.batch
        for L in a.kv_len
        for ql in a.q_len
        for s in a.seed
    ]
    df = sweep(
        cases,
        _list(a.q_schemes, Q_SCHEMES),
        _list(a.kv_schemes, KV_SCHEMES),
        _list(a.fp8_formats, tuple(FP8_FORMATS)),
        tolerances=a.tol or DEFAULT_TOLERANCES,
        progress=not a.no_progress,
    )
    if a.out:
        print(f"wrote {len(df)} rows to {save_table(df, a.out)}")
    else:
        cols = ["case", "fp8_format", "q_scheme", "kv_scheme", "rel_l2", "sqnr_db", "max_abs", "nan_count"]
        print(df[cols].to_string(index=False))
    return 0

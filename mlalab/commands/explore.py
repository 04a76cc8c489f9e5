"""``python -m mlalab explore``: the ragged-batch split explorer (`mlalab.plan.explore`): length mixes x split
policies under one cost model; prints the mean of each metric per policy (or every row with --json / --csv)."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from ..io import atomic_write
from ..plan.explore import MIXES, POLICIES, CostModel, explore
from ._common import parse_csv_items, print_json

NAME = "explore"
HELP = "ragged-batch split explorer: mixes x policies, modelled makespan, idle CUs, partial bytes, regret vs oracle"
ORDER = 32


def _names(text: str, valid: dict, what: str) -> list[str]:
    try:
        names = list(parse_csv_items(text))
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{what} list: {e}") from None
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"unknown {what} {bad}; valid: {', '.join(valid)}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mixes", default=",".join(MIXES), help="comma-separated length mixes (default: all)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies (default: all)")
    p.add_argument("--seeds", type=int, default=3, help="batches drawn per mix (default %(default)s)")
    p.add_argument("--target", default="h200", help="h200, mi300x, mi355x or a CU count (default %(default)s)")
    p.add_argument("--overhead", type=int, default=64, help="cost model: tokens per work (default %(default)s)")
    p.add_argument(
        "--reduce-row",
        type=int,
        default=CostModel().reduce_row,
        help="cost model: tokens per partial row the reduce reads (default %(default)s; 0: makespan only)",
    )
    p.add_argument("--json", action="store_true", help="print every row as JSON")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write every row to FILE (atomically)")


def run(a: argparse.Namespace) -> int:
    target = int(a.target) if a.target.strip().lstrip("-").isdigit() else a.target
    model = CostModel(overhead=a.overhead, reduce_row=a.reduce_row)
    df = explore(_names(a.mixes, MIXES, "mix"), _names(a.policies, POLICIES, "policy"), seeds=a.seeds, target=target,
                 model=model, progress=lambda s: print(s, file=sys.stderr))  # fmt: skip
    if a.csv:
        atomic_write(a.csv, lambda tmp: df.to_csv(tmp, index=False))
    if a.json:
        print_json(df.to_dict(orient="records"))
        return 0
    cols = ["cost", "makespan", "regret", "idle_share", "idle_cus", "works", "partial_bytes", "reduce_reads"]
    table = df.groupby("policy", sort=False)[cols].mean()
    table["partial_bytes"] = (table["partial_bytes"] / 2**20).round(2)
    table = table.rename(columns={"partial_bytes": "partial_MiB"})
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(f"means over {df.groupby(['mix', 'seed']).ngroups} batches ({a.mixes}) on {df.target.iloc[0]}, "
              f"overhead {a.overhead} tokens/work, reduce {a.reduce_row} tokens/partial row:")  # fmt: skip
        print(table.round(3).to_string())
    return 0

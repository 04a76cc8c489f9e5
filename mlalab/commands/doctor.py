"""``python -m mlalab doctor FILE``: check split-KV metadata dumped with ``torch.save`` (docs/splitkv.md) and name
every problem. Exit 0: clean; 1: findings; 2: the file cannot be read as metadata."""

from __future__ import annotations

import argparse
import sys

from ..plan.doctor import DoctorInputError, doctor
from ._common import print_json

NAME = "doctor"
HELP = "check split-KV metadata (aiter v1 layout, a torch.save dict) against its batch; exit 0 clean / 1 / 2"
ORDER = 31


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="torch.save dict: work_indptr, work_info, reduce_*, qo_indptr, kv_indptr (+ optional)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--limit", type=int, default=5, help="findings shown per kind in text mode (default %(default)s)")


def run(a: argparse.Namespace) -> int:
    if a.limit < 1:
        print(f"error: --limit must be >= 1, got {a.limit}", file=sys.stderr)
        return 2
    try:
        rep = doctor(a.file)
    except (DoctorInputError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print_json(rep.to_dict())
    else:
        print(rep.text(limit=a.limit))
    return 0 if rep.clean else 1

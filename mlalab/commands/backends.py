"""``python -m mlalab backends``: which executors run on this machine, and why the others do not."""

from __future__ import annotations

import argparse

from ..backends import BACKENDS, available
from ._common import print_json

NAME = "backends"
HELP = "list the decode backends and whether each is usable here (with the reason when not)"
ORDER = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(a: argparse.Namespace) -> int:
    status = available()
    if a.json:
        print_json({name: {"status": status[name], "about": BACKENDS[name][1]} for name in BACKENDS})
        return 0
    width = max(map(len, BACKENDS))
    for name, (_, about) in BACKENDS.items():
        print(f"{name:<{width}}  {status[name]}\n{'':<{width}}  ({about})")
    return 0

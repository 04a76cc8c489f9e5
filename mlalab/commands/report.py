"""``python -m mlalab report --out report.html``: a standalone HTML page of the key figures (opens offline)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import GPU_TARGETS
from ..report import SECTION_BUILDERS, ReportOptions, default_data_dir, write_report
from ._common import parse_csv_items


def _sections(text: str) -> list[str]:
    names = list(parse_csv_items(text))
    unknown = [n for n in names if n not in SECTION_BUILDERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTION_BUILDERS)}"
        )
    return names


NAME = "report"
HELP = "write a standalone HTML report (timings, experiments, accuracy, bandwidth floor, work map) to share offline"
ORDER = 90


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="report.html", help="output .html file (default %(default)s)")
    p.add_argument("--kv-len", type=int, default=1024, help="KV tokens per request for computed figures (default 1024)")
    p.add_argument("--batch", type=int, default=4, help="requests per batch for computed figures (default 4)")
    p.add_argument("--target", default="mi300x", choices=sorted(GPU_TARGETS), help="GPU target of the work map")
    p.add_argument("--planner", default="aiter-fast", help="split-KV planner of the work map (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=None, help="recorded measurements (default: the repo's data/)")
    p.add_argument(
        "--sections",
        type=_sections,
        default=None,
        help=f"comma-separated subset of: {','.join(SECTION_BUILDERS)} (default: all)",
    )
    p.add_argument(
        "--details",
        action="store_true",
        help="also each design experiment's own per-shape figure (by default the page summarises them in one)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-section progress on stderr")
    p.add_argument(
        "--strict",
        action="store_true",
        help=f"fail (exit 2, nothing written) if any section ({', '.join(SECTION_BUILDERS)}) is unavailable",
    )


def run(a: argparse.Namespace) -> int:
    opts = ReportOptions(
        kv_len=a.kv_len,
        batch=a.batch,
        target=a.target,
        planner=a.planner,
        seed=a.seed,
        data_dir=a.data_dir if a.data_dir is not None else default_data_dir(),
        details=a.details,
    )
    path, sections = write_report(
        a.out,
        opts,
        a.sections,
        progress=None if a.quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
        strict=a.strict,
    )
    missing = [s for s in sections if s.unavailable]
    for s in sections:
        state = f"unavailable: {s.unavailable}" if s.unavailable else f"{len(s.figures)} figure(s)"
        print(f"  {s.key:<10} {state}")
    has_figures = any(s.figures for s in sections)
    inline = "plotly.js inline, compressed: opens offline" if has_figures else "no figures"
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {inline})")
    if missing:
        print(f"warning: {len(missing)} section(s) unavailable (the page says why)", file=sys.stderr)
    return 0

"""``python -m mlalab sm90-build``: compile the sm_90 kernels for Hopper on any machine and print what ptxas made of
them (registers, local memory, shared memory, bank conflicts, the wgmma and memory instructions). No GPU needed."""

from __future__ import annotations

import argparse
import json

from ._common import parse_csv_items, parse_int_list

NAME = "sm90-build"
HELP = "compile the sm_90 kernels for Hopper (no GPU needed) and print registers, spills, shared memory, SASS mix"
ORDER = 70

_PATHS = ("v-regs", "v-tile", "v-conv", "v-fp4", "v-fp4-e4m3")


def _rows(text: str) -> tuple[int, ...]:
    rows = parse_int_list(text)
    if any(r not in (1, 2, 4) for r in rows):
        raise argparse.ArgumentTypeError(f"each must be 1, 2 or 4, got {text}")
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paths", type=parse_csv_items, default=_PATHS, help="stage-1 paths: v-regs (a8w8), v-tile "
                   "(bf16), v-conv (a16w8), v-fp4 (the four fp4-KV precisions), v-fp4-e4m3 (a8w4-mxfp4 on fp8 wgmma); "
                   "default all")  # fmt: skip
    p.add_argument("--paged", action="store_true", help="with the masked tiles of a paged cache")
    p.add_argument("--rows", type=_rows, default=(1,), help="q rows a CTA of the v-regs builds: 1, or 2 / 4 "
                   "side by side on two warpgroups (speculative decode); e.g. 1,2,4 (default 1)")  # fmt: skip
    p.add_argument("--reduce", type=parse_int_list, default=(2, 8, 16, 64),
                   help="max partials per request of the Gluon reduce builds")  # fmt: skip
    p.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> int:
    paths = list(a.paths)
    bad = [x for x in paths if x not in _PATHS]
    if bad:
        raise ValueError(f"--paths: unknown {', '.join(bad)}; valid: {', '.join(_PATHS)}")
    counts = list(a.reduce)
    from ..kernels.sm90.host import import_error

    reason = import_error()
    if reason is not None:
        raise RuntimeError(f"cannot compile the sm_90 kernels here: {reason}")
    from ..kernels.sm90.build import FP4_BUILDS, compile_reduce, compile_stage1

    paged = " paged" if a.paged else ""
    reports = []
    for p in paths:  # v-fp4: one build per fp4 precision (q type x MXFP4 / NVFP4); v-regs: one per q rows a CTA
        for prec in FP4_BUILDS if p == "v-fp4" else (None,):
            for rows in a.rows if p == "v-regs" else (1,):
                name = f"stage1 {p}{f' {prec}' if prec else ''}{f' {rows} q rows' if rows > 1 else ''}{paged}"
                reports.append((name, compile_stage1(p, mask_tail=a.paged, precision=prec, rows=rows)))
    reports += [(f"reduce <= {n} partials", compile_reduce(n)) for n in counts]
    rows = []
    for name, r in reports:
        top = dict(sorted(r.sass.items(), key=lambda kv: -kv[1])[:12])
        rows.append({"kernel": name, "registers": r.registers, "local_bytes": r.stack_bytes,
                     "shared_bytes": r.shared_bytes, "bank_conflicts": list(r.bank_conflicts),
                     "top_sass": top})  # fmt: skip
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['kernel']}: {row['registers']} registers, {row['local_bytes']} B local, {row['shared_bytes']} B "
              f"shared, V bank conflicts {row['bank_conflicts'] or '-'}")  # fmt: skip
        print("   ", ", ".join(f"{k} {v}" for k, v in row["top_sass"].items()))
    return 0

"""``python -m mlalab sweep``: a grid of accuracy records (cases × fp8 formats × KV schemes × Q schemes) -> table.

With ``--out`` the table is resumable: re-running the same command skips the rows already there and computes only
the rest (failed rows are retried). ``--workers N`` / ``--scheduler ADDRESS|local:N`` spread the work over local
processes or a Dask cluster; ``--device cuda`` evaluates on the GPU; ``--agreement PATH`` compares the CPU with the
device on the grid and records rows/s on both; ``--estimate`` prints the study's size without computing it.
``--preset NAME`` takes a competition's benchmark shapes, each with its seed, and its input distribution
(`mlalab.accuracy.PRESETS`); every row reports the named checks (``passes@NAME``) and the baselines'.
"""

from __future__ import annotations

import argparse
import sys

from ..accuracy import (
    DEFAULT_TOLERANCES,
    Grid,
    ResultStore,
    check_output_path,
    device_agreement,
    get_preset,
    parse_shapes,
    sweep,
)
from ..config import DecodeCase
from ..quant import FP8_FORMATS, KV_SCHEMES, Q_SCHEMES, concrete_names
from ._common import parse_int_list
from .accuracy import add_preset_argument, add_scheme_arguments

NAME = "sweep"
HELP = "accuracy grid over shapes, distributions, seeds, fp8 formats and schemes; resumable CSV/Parquet; Dask/GPU"
ORDER = 21


def _list(text: str, all_names: tuple[str, ...], what: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(","))
    if not text.strip() or any(not t for t in items):
        raise ValueError(f"--{what}: expected a comma-separated list without empty items, got {text!r}")
    return concrete_names(all_names) if items == ("all",) else items


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return parse_shapes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=parse_int_list, default=None, help="batch sizes, comma-separated (default 4)")
    p.add_argument("--kv-len", type=parse_int_list, default=None, help="KV lengths, comma-separated (default 1024)")
    p.add_argument(
        "--shapes",
        type=_shapes,
        default=None,
        help="BxL shapes instead of --batch x --kv-len, e.g. 'competition,256x1024' (competition = the 12 shapes "
        "4..128 x 1024, 8192)",
    )
    p.add_argument("--q-len", type=parse_int_list, default=(1,), help="query lengths, comma-separated")
    p.add_argument("--causal", action="store_true",
                   help="cases of q_len > 1 under speculative verification's causal mask")  # fmt: skip
    p.add_argument("--seed", type=parse_int_list, default=None, help="seeds, comma-separated (default 0)")
    p.add_argument(
        "--dist", default=None, help="input distributions, comma-separated ('all': every one; default competition)"
    )
    p.add_argument("--scale", type=float, default=None, help="std of the distribution (default: its own)")
    add_scheme_arguments(p, plural=True)
    add_preset_argument(p)
    p.add_argument("--device", default="cpu", help="where quantization and the fp64 decode run: cpu (default), cuda")
    ex = p.add_mutually_exclusive_group()
    ex.add_argument("--workers", type=int, default=None, help="run on N local worker processes")
    ex.add_argument(
        "--scheduler",
        default=None,
        help="run on Dask: a scheduler address (tcp://host:8786) or local:N (starts a LocalCluster of N workers)",
    )
    p.add_argument("--chunk-rows", type=int, default=None, help="most rows per task (default: one task per case)")
    p.add_argument("--out", default=None, help="write the table here (.csv or .parquet); resumes when it exists")
    p.add_argument("--overwrite", action="store_true", help="replace --out instead of resuming it")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long, keeping the rows done (exit code 3 while rows are left; re-run to continue)",
    )
    p.add_argument("--estimate", action="store_true", help="print the study's size (rows, tasks, GFLOP) and stop")
    p.add_argument(
        "--agreement",
        default=None,
        metavar="PATH",
        help="evaluate the grid on the CPU and on --device, compare (<= 1e-12 relative) and time them; write PATH",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _grid_args(a: argparse.Namespace) -> tuple[list[DecodeCase], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    from ..config import InputDist

    if a.preset is not None:
        opts = {"--batch": a.batch, "--kv-len": a.kv_len, "--shapes": a.shapes, "--seed": a.seed, "--dist": a.dist,
                "--scale": a.scale}  # fmt: skip
        given = [f for f, v in opts.items() if v is not None]
        if given:
            raise ValueError(f"--preset {a.preset} sets the shapes, seeds and inputs; drop {given}")
        preset = get_preset(a.preset)
        cases = [preset.case(b, L, q_len=ql, causal=a.causal and ql > 1) for b, L in preset.shapes for ql in a.q_len]
    else:
        batches, kv_lens = a.batch or (4,), a.kv_len or (1024,)
        shapes = a.shapes if a.shapes is not None else tuple((b, L) for b in batches for L in kv_lens)
        dists = _list(a.dist or "competition", tuple(d.value for d in InputDist), "dist")
        cases = [
            DecodeCase.uniform(b, L, q_len=ql, seed=s, dist=d, scale=a.scale, causal=a.causal and ql > 1)
            for d in dists
            for b, L in shapes
            for ql in a.q_len
            for s in a.seed or (0,)
        ]
    return (
        cases,
        _list(a.q_schemes, Q_SCHEMES, "q-schemes"),
        _list(a.kv_schemes, KV_SCHEMES, "kv-schemes"),
        _list(a.fp8_formats, tuple(FP8_FORMATS), "fp8-formats"),
    )


def run(a: argparse.Namespace) -> int:
    # everything checked before any work: paths, counts, names
    out = check_output_path(a.out) if a.out else None
    agreement = check_output_path(a.agreement) if a.agreement else None
    if a.workers is not None and a.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {a.workers}")
    if a.chunk_rows is not None and a.chunk_rows < 1:
        raise ValueError(f"--chunk-rows must be >= 1, got {a.chunk_rows}")
    cases, qs, kvs, fmts = _grid_args(a)
    tols = a.tol or DEFAULT_TOLERANCES
    grid = Grid(cases, qs, kvs, fmts, tols)
    if a.estimate:
        done = 0
        if out is not None:
            have = ResultStore(out, grid).load()
            done = int((have.error == "").sum()) if len(have) else 0
        tasks = grid.tasks(chunk_rows=a.chunk_rows)
        print(
            f"{len(grid)} rows ({len(cases)} cases x {len(fmts)} fp8 formats x {len(grid.kv_schemes)} KV x "
            f"{len(grid.q_schemes)} Q schemes), {len(tasks)} tasks, {grid.fp64_gflop():.4g} GFLOP of fp64 decode"
            + (f"; {done} rows already in {out}" if out is not None else "")
        )
        return 0
    if agreement is not None:
        res = device_agreement(cases, qs, kvs, fmts, device=a.device, tolerances=tols, out=agreement)
        cols = ["case", "rows", "cpu_rows_per_s", "device_rows_per_s", "speedup", "max_rel_diff", "agree"]
        print(res[cols].to_string(index=False))
        print(f"wrote {agreement}")
        return 0 if bool(res.agree.all()) else 1
    executor = a.scheduler or (f"processes:{a.workers}" if a.workers else "serial")
    try:
        df = sweep(
            cases,
            qs,
            kvs,
            fmts,
            tolerances=tols,
            progress=not a.no_progress,
            device=a.device,
            executor=executor,
            out=out,
            overwrite=a.overwrite,
            chunk_rows=a.chunk_rows,
            time_limit=a.time_limit,
            log=lambda m: print(m, file=sys.stderr),
        )
    except ConnectionError as e:  # an unreachable scheduler: nothing was computed
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = df.attrs["sweep"]
    summary = (
        f"{s['rows']} rows: {s['skipped']} already done, {s['computed']} computed, {s['failed']} failed, "
        f"{s['left']} left ({s['seconds']:.1f} s)"
    )
    if out is not None:
        print(f"{summary}; table: {out}")
    else:
        cols = ["case", "fp8_format", "q_scheme", "kv_scheme", "rel_l2", "sqnr_db", "max_abs", "nan_count", "error"]
        if a.preset is not None:
            cols[-1:-1] = [f"passes@{a.preset}", f"halfkv_passes@{a.preset}"]
        print(df[[c for c in cols if c in df]].to_string(index=False))
        print(summary)
    return 1 if s["failed"] else (3 if s["left"] else 0)

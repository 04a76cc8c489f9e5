"""``python -m mlalab bench``: time the decode backends on the GPU, or summarise the recorded H200 data."""

from __future__ import annotations

import argparse
import json

from ..timing import SUITE_PRECISIONS
from ._common import parse_csv_items as _csv_list
from ._common import parse_int_list

NAME = "bench"
HELP = "GPU timings (CUDA graphs, L2-rotated KV) of triton / flashmla / flashinfer / reference-torch; CSV"
ORDER = 60


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--suite",
        default="competition",
        help="competition (12 shapes), mixed-mla-2026 (8), layouts (q_len x layout), smoke (2 shapes)",
    )
    p.add_argument(
        "--q-lens",
        type=parse_int_list,
        default=None,
        help="keep only these q_lens of the suite's cases, e.g. 1,2",
    )
    p.add_argument(
        "--layouts",
        type=_csv_list,
        default=None,
        help="keep only these layouts (contiguous, paged64, paged16, tokens) of the suite's cases",
    )
    p.add_argument(
        "--causal",
        action="store_true",
        help="time every case under speculative verification's causal mask (q_len > 1; every backend given the flag)",
    )
    p.add_argument("--backends", type=_csv_list, default=("triton", "flashmla", "flashinfer", "reference-torch"))
    p.add_argument("--precisions", type=_csv_list, default=SUITE_PRECISIONS)
    p.add_argument("--planners", type=_csv_list, default=("simple",), help="triton planners (mlalab.plan.PLANNERS)")
    p.add_argument(
        "--triton-configs",
        type=json.loads,
        default=[{}],
        help='JSON list of kernel configs (KernelConfig knobs and plan options), e.g. \'[{}, {"kernel":"portable"}]\'',
    )
    p.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (>= 1, default 20)")
    p.add_argument("--replays", type=int, default=10, help="graph replays (>= 3, default 10)")
    p.add_argument("--out", default=None, help="CSV path for the records (rewritten atomically after each shape)")
    p.add_argument("--recorded", action="store_true", help="summarise data/timings/*.csv instead of measuring")
    p.add_argument("--run", default=None, help="with --recorded: the file to show (default: newest full suite run)")
    p.add_argument(
        "--best-of-all",
        action="store_true",
        help="with --recorded: fastest row per shape over every run and config (labelled, winners listed)",
    )
    p.add_argument(
        "--layout-costs",
        action="store_true",
        help="with --recorded: each layout's time over our contiguous time per GPU, precision and q_len (12 shapes)",
    )


def summarise_recorded(data_dir: str | None = None, *, best_of_all: bool = False, run: str | None = None) -> int:
    """Print the recorded µs per (backend, precision) x shape of one view (`mlalab.records.timings.recorded_view`):
    one run by default, or best of all with the winning run · planner · config per shape."""
    from ..records.timings import TIMINGS_DIR, load_recorded, recorded_view, speedup_table, winners_table

    try:
        df = load_recorded(data_dir or TIMINGS_DIR)
    except FileNotFoundError as e:
        print(str(e))
        return 1
    view = recorded_view(df, best_of_all=best_of_all, run=run)
    rows = view.rows
    print(f"recorded data: {view.label}")
    print(f"files read: {', '.join(view.files)}; {rows['gpu'].iloc[0]}, {', '.join(sorted(set(rows['date'])))}")
    table = rows.set_index(["backend", "precision", "batch", "kv_len"])["us_median"].unstack(["batch", "kv_len"])
    print("µs per call (median of the graph replays; columns: batch × kv_len):")
    print(table.round(2).to_string())
    have = set(zip(rows["backend"], rows["precision"]))
    peers = [s for s in (("flashmla", "a8w8"), ("flashmla", "bf16")) if s in have]
    if ("triton", "a8w8") in have and peers:
        t = speedup_table(view, ("triton", "a8w8"), peers)
        print("speedup (peer µs / triton a8w8 µs; > 1: ours faster):")
        print(t.round(2).to_string())
    if best_of_all:
        print("winning run · planner · config per shape:")
        print(winners_table(view, sorted(have)).round(2).to_string(index=False))
    return 0


def summarise_layout_costs(data_dirs: tuple[str, ...] | None = None) -> int:
    """Print `mlalab.records.timings.layout_costs` for every GPU with recorded layout runs (data/layouts and
    data/timings by default)."""
    from ..records.timings import LAYOUTS_DIR, TIMINGS_DIR, layout_costs_by_gpu, load_recorded

    try:
        df = load_recorded(data_dirs or (TIMINGS_DIR, LAYOUTS_DIR))
    except FileNotFoundError as e:
        print(str(e))
        return 1
    print("our default Triton time / our contiguous time, geomean over the 12 competition shapes (each side one run;")
    print("same_run False: the contiguous side is another run's); goal: the layouts issue's, a8w8")
    costs = layout_costs_by_gpu(df)
    for gpu, t in costs.items():
        print(f"\n{gpu}:")
        print(t.drop(columns=["shapes"]).round(3).to_string(index=False))
    if not costs:
        print("no GPU has a layout run and a contiguous run covering the 12 competition shapes")
    return 0


def run(a: argparse.Namespace) -> int:
    import torch

    from ..timing import check_suite_args

    if a.recorded:
        if a.out is not None:
            raise ValueError("--out is for measuring; --recorded only reads data/timings")
        if a.best_of_all and a.run is not None:
            raise ValueError("--run and --best-of-all exclude each other")
        if a.layout_costs:
            if a.best_of_all or a.run is not None:
                raise ValueError("--layout-costs reads every run: no --run or --best-of-all")
            return summarise_layout_costs()
        return summarise_recorded(best_of_all=a.best_of_all, run=a.run)
    if a.best_of_all or a.run is not None or a.layout_costs:
        raise ValueError("--best-of-all, --run and --layout-costs select recorded data: add --recorded")
    if not isinstance(a.triton_configs, list):
        raise TypeError(f"--triton-configs must be a JSON list of objects, got {a.triton_configs!r}")
    kw = dict(
        backends=a.backends,
        precisions=a.precisions,
        planners=a.planners,
        triton_configs=tuple(a.triton_configs),
        calls_per_graph=a.calls,
        replays=a.replays,
        out=a.out,
        q_lens=a.q_lens,
        layouts=a.layouts,
        causal=a.causal,
    )
    check_suite_args(a.suite, **kw)  # every argument checked before anything is measured
    if not torch.cuda.is_available():
        raise RuntimeError(
            "measuring needs a GPU (torch.cuda.is_available() is False); "
            "`python -m mlalab bench --recorded` shows the recorded H200 runs"
        )
    from ..timing import run_suite

    recs = run_suite(a.suite, **kw)
    if a.out:
        print(f"wrote {len(recs)} records to {a.out}")
    return 0

"""``python -m mlalab bench``: time the decode backends on the GPU, or summarise the recorded H200 data."""

from __future__ import annotations

import argparse
import glob
import json
import os

NAME = "bench"
HELP = "GPU timings (CUDA graphs, L2-rotated KV) of triton / flashmla / flashinfer / reference-torch; CSV"
ORDER = 60

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "timings")


def _csv_list(text: str) -> tuple[str, ...]:
    vals = tuple(v for v in text.replace(" ", "").split(",") if v)
    if not vals:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="competition", help="competition (12 shapes) or smoke (2 shapes)")
    p.add_argument("--backends", type=_csv_list, default=("triton", "flashmla", "flashinfer", "reference-torch"))
    p.add_argument("--precisions", type=_csv_list, default=("a8w8", "a16w8", "bf16"))
    p.add_argument("--planners", type=_csv_list, default=("simple",), help="triton planners (simple or splitkv's)")
    p.add_argument(
        "--triton-configs",
        type=json.loads,
        default=[{}],
        help='JSON list of kernel configs, e.g. \'[{"block_n":64,"transposed":true}]\'',
    )
    p.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (default 20)")
    p.add_argument("--replays", type=int, default=10, help="graph replays (default 10)")
    p.add_argument("--out", default=None, help="CSV path for the records")
    p.add_argument("--recorded", action="store_true", help="summarise data/timings/*.csv instead of measuring")


def summarise_recorded(data_dir: str = DATA_DIR) -> int:
    import pandas as pd

    files = sorted(glob.glob(os.path.join(data_dir, "*.csv")))
    if not files:
        print(f"no recorded timings under {data_dir}")
        return 1
    df = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    df = df[df["status"] == "ok"]
    print(f"recorded data ({', '.join(os.path.basename(f) for f in files)}): {df['gpu'].iloc[0]}, {df['date'].iloc[0]}")
    best = df.groupby(["backend", "precision", "batch", "kv_len"])["us_median"].min().unstack(["batch", "kv_len"])
    print(best.round(2).to_string())
    return 0


def run(a: argparse.Namespace) -> int:
    import torch

    if a.recorded or not torch.cuda.is_available():
        if not a.recorded:
            print("no GPU here (torch.cuda.is_available() is False): showing the recorded H200 data instead")
        return summarise_recorded()
    from ..timing import run_suite, write_csv

    if a.calls < 1 or a.replays < 3:
        raise ValueError("--calls must be >= 1 and --replays >= 3")
    recs = run_suite(
        a.suite,
        backends=a.backends,
        precisions=a.precisions,
        planners=a.planners,
        triton_configs=tuple(a.triton_configs),
        calls_per_graph=a.calls,
        replays=a.replays,
    )
    if a.out:
        write_csv(recs, a.out)
        print(f"wrote {len(recs)} records to {a.out}")
    return 0


if __name__ == "__main__":
    import sys

    ap = argparse.ArgumentParser(prog="mlalab.commands.bench")
    add_arguments(ap)
    sys.exit(run(ap.parse_args()))

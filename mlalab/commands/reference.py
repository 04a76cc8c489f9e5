"""``python -m mlalab reference``: run the exact decode on a generated case and print statistics."""

from __future__ import annotations

import argparse
import time

import torch

from ..inputs import make_inputs
from ..reference import decode_inputs_reference
from ._common import add_case_arguments, case_from_args, print_record

NAME = "reference"
HELP = "exact fp64 decode of a generated case: shapes, output RMS, LSE statistics"
ORDER = 10


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_arguments(p)
    p.add_argument(
        "--empty-policy",
        choices=("error", "zeros"),
        default="error",
        help="a request with 0 KV tokens: refuse (default) or output 0 with LSE -inf",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(a: argparse.Namespace) -> int:
    case = case_from_args(a)
    x = make_inputs(case)
    t0 = time.perf_counter()
    out, lse = decode_inputs_reference(x, empty_policy=a.empty_policy)
    dt = time.perf_counter() - t0
    rec = {
        "case": case.short_str(),
        "batch": case.batch,
        "q_len": case.q_len,
        "causal": case.causal,
        "kv_lens": list(case.kv_lens),
        "page_size": case.page_size,
        "dist": case.dist.value,
        "std": case.std,
        "seed": case.seed,
        "q_shape": list(x.q.shape),
        "kv_buffer_shape": list(x.kv_buffer.shape),
        "out_shape": list(out.shape),
        "lse_shape": list(lse.shape),
        "compute_dtype": str(out.dtype).replace("torch.", ""),
        "out_rms": float(out.pow(2).mean().sqrt()),
        "out_max_abs": float(out.abs().max()),
        "lse_min": float(lse[torch.isfinite(lse)].min()) if bool(torch.isfinite(lse).any()) else float("-inf"),
        "lse_mean": float(lse[torch.isfinite(lse)].mean()) if bool(torch.isfinite(lse).any()) else float("-inf"),
        "lse_max": float(lse.max()),
        "empty_requests": sum(1 for n in case.kv_lens if n == 0),
        "log_kv_len_mean": float(torch.log(torch.tensor([float(n) for n in case.kv_lens])).mean()),
        "seconds": dt,
    }
    print_record(rec, a.json)
    return 0

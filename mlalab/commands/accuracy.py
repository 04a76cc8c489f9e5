"""``python -m mlalab accuracy``: quantization error of one (Q scheme, KV scheme, fp8 format) on a generated case."""

from __future__ import annotations

import argparse

from ..accuracy import DEFAULT_TOLERANCES, evaluate
from ..quant import FP8_FORMATS, KV_SCHEMES, Q_SCHEMES
from ._common import add_case_arguments, case_from_args, print_record

NAME = "accuracy"
HELP = "error of quantized Q/KV decode vs the fp64 reference (rel-L2, SQNR, mismatch at tolerances, baselines)"
ORDER = 20


def parse_tolerance(text: str) -> tuple[float, float]:
    try:
        r, a = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RTOL,ATOL (e.g. 2e-2,8e-3), got {text!r}") from None
    return r, a


def add_scheme_arguments(p: argparse.ArgumentParser, *, plural: bool = False) -> None:
    s = "s" if plural else ""
    many = " (comma-separated list; 'all' = every parameter-free name)" if plural else ""
    p.add_argument(f"--q-scheme{s}", default="bf16", help=f"Q scheme{many}: {', '.join(Q_SCHEMES)}")
    p.add_argument(f"--kv-scheme{s}", default="bf16", help=f"KV scheme{many}: {', '.join(KV_SCHEMES)}")
    p.add_argument(f"--fp8-format{s}", default="e4m3fn", help=f"fp8 flavour{many}: {', '.join(FP8_FORMATS)}")
    p.add_argument(
        "--tol",
        type=parse_tolerance,
        action="append",
        default=None,
        metavar="RTOL,ATOL",
        help="tolerance pair for mismatch fractions (repeatable; default: "
        + " ".join(f"{r:g},{a:g}" for r, a in DEFAULT_TOLERANCES)
        + ")",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_arguments(p)
    add_scheme_arguments(p)
    p.add_argument("--device", default="cpu", help="where quantization and the fp64 decode run: cpu (default), cuda")
    p.add_argument("--json", action="store_true", help="print the metrics record as JSON")


def run(a: argparse.Namespace) -> int:
    case = case_from_args(a)
    tols = a.tol or DEFAULT_TOLERANCES
    rec = evaluate(case, a.q_scheme, a.kv_scheme, a.fp8_format, tolerances=tols, device=a.device)
    print_record(rec, a.json)
    return 0

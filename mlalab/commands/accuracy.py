"""``python -m mlalab accuracy``: quantization error of one (Q scheme, KV scheme, fp8 format) on a generated case.

``--preset NAME`` draws the case as a competition does (`mlalab.accuracy.PRESETS`: its distribution, std and the seed
of the shape) and ends with its check's verdict for the output and the zeros / mean(V) / half-KV baselines."""

from __future__ import annotations

import argparse

from ..accuracy import DEFAULT_TOLERANCES, PRESETS, CompetitionPreset, check_key, evaluate, get_preset
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


def add_preset_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        default=None,
        choices=list(PRESETS),
        # (argparse %-formats help: a description's "5 %" must reach it as "5 %%")
        help="a competition's inputs and check: "
        + "; ".join(f"{n} = {v.description}" for n, v in PRESETS.items()).replace("%", "%%"),
    )


def preset_verdict(rec: dict, preset: CompetitionPreset) -> str:
    """One line: the preset's check on the output and on the three baselines (mismatch share, pass or fail)."""
    c = preset.check
    parts = []
    for label, prefix in (("output", ""), ("zeros", "zeros_"), ("mean(V)", "meanv_"), ("half-KV cheat", "halfkv_")):
        share, ok = rec[check_key(c, "mismatch", prefix)], rec[check_key(c, "passes", prefix)]
        parts.append(f"{label} {100 * share:.2f} % {'passes' if ok else 'FAILS'}")
    return f"{c.describe()}: " + "; ".join(parts)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_arguments(p)
    add_scheme_arguments(p)
    add_preset_argument(p)
    p.add_argument("--device", default="cpu", help="where quantization and the fp64 decode run: cpu (default), cuda")
    p.add_argument("--json", action="store_true", help="print the metrics record as JSON")


def run(a: argparse.Namespace) -> int:
    tols = a.tol or DEFAULT_TOLERANCES
    if a.preset is None:
        rec = evaluate(case_from_args(a), a.q_scheme, a.kv_scheme, a.fp8_format, tolerances=tols, device=a.device)
        print_record(rec, a.json)
        return 0
    preset = get_preset(a.preset)
    set_by_user = {
        "--dist": a.dist != "competition",
        "--scale": a.scale is not None,
        "--seed": a.seed != 0,
        "--kv-lens": a.kv_lens is not None,
        "--ragged": a.ragged,
        "--page-size": a.page_size != 1,
        "--permute-pages": a.permute_pages,
    }
    given = [f for f, on in set_by_user.items() if on]
    if given:
        raise ValueError(f"--preset {preset.name} sets the inputs (distribution, std, seed, layout); drop {given}")
    case = preset.case(a.batch, a.kv_len, q_len=a.q_len)
    rec = evaluate(case, a.q_scheme, a.kv_scheme, a.fp8_format, tolerances=tols, device=a.device)
    rec["preset"] = preset.name
    print_record(rec, a.json)
    if not a.json:
        print(preset_verdict(rec, preset))
    return 0

"""``python -m mlalab decode``: run one decode through any backend; ``--check`` compares with the fp64 reference."""

from __future__ import annotations

import argparse
import time

import torch

from ..backends import BACKENDS
from ..backends import decode as backend_decode
from ..inputs import make_inputs
from ..plan import dequantized_inputs
from ..reference import decode_inputs_reference
from ._common import add_case_arguments, case_from_args, print_record
from .plan import add_plan_arguments, plan_knobs

NAME = "decode"
HELP = "decode a generated case with a backend (emulated split-KV, triton, aiter, ...); --check vs reference"
ORDER = 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_case_arguments(p)
    p.add_argument("--backend", default="emulated", choices=list(BACKENDS), help="backend (default %(default)s)")
    add_plan_arguments(p, default_planner=None)
    g = p.add_argument_group("quantization")
    g.add_argument("--q-scheme", default=None, help="q quantization scheme (mlalab.quant), default none")
    g.add_argument("--kv-scheme", default=None, help="KV quantization scheme (mlalab.quant), default none")
    g.add_argument("--fp8-format", default=None, help="fp8 flavour: e4m3fn (default), e4m3fnuz, e4m3fnuz-224 or e5m2")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare with the fp64 reference (on the same dequantized inputs when schemes are given)",
    )
    p.add_argument("--device", default="cpu", help="device for the inputs (default cpu)")
    p.add_argument("--json", action="store_true", help="print JSON")


def options_from_args(a: argparse.Namespace) -> dict[str, object]:
    """Only the options the user gave: each backend keeps its own defaults, and a backend that does not know an
    option fails with a TypeError naming it instead of silently ignoring it."""
    opts: dict[str, object] = {}
    for key in ("planner", "target", "q_scheme", "kv_scheme", "fp8_format"):
        v = getattr(a, key)
        if v is not None:
            opts[key] = v
    opts.update(plan_knobs(a))
    return opts


def run(a: argparse.Namespace) -> int:
    case = case_from_args(a)
    if str(a.device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {a.device}: no GPU here (torch.cuda.is_available() is False); use --device cpu")
    try:
        device = torch.device(a.device)
    except RuntimeError:
        raise ValueError(f"--device {a.device!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    x = make_inputs(case, device)
    opts = options_from_args(a)
    t0 = time.perf_counter()
    out, lse = backend_decode(x, backend=a.backend, **opts)
    dt = time.perf_counter() - t0
    rec: dict[str, object] = {
        "case": case.short_str(),
        "backend": a.backend,
        "options": opts,
        "out_shape": list(out.shape),
        "out_dtype": str(out.dtype).replace("torch.", ""),
        "seconds": dt,
    }
    if a.check:
        if a.q_scheme or a.kv_scheme:
            ref_in = dequantized_inputs(
                x.to("cpu"), q_scheme=a.q_scheme, kv_scheme=a.kv_scheme, fp8_format=a.fp8_format or "e4m3fn"
            )
            rec["reference_on"] = "dequantized inputs"
        else:
            ref_in = x.to("cpu")
            rec["reference_on"] = "original inputs"
        empty = "zeros" if 0 in case.kv_lens else "error"  # a 0-token request: output 0, LSE -inf
        ref, ref_lse = decode_inputs_reference(ref_in, compute_dtype=torch.float64, empty_policy=empty)
        o = out.to("cpu", torch.float64)
        rec["rel_l2"] = float((o - ref).norm() / ref.norm())
        rec["max_abs"] = float((o - ref).abs().max())
        if lse is not None:
            d = lse.to("cpu", torch.float64) - ref_lse
            d = torch.where(torch.isneginf(ref_lse) & torch.isneginf(lse.cpu()), torch.zeros_like(d), d)
            rec["lse_max_abs"] = float(d.abs().max())
    print_record(rec, a.json)
    return 0

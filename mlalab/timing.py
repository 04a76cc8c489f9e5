"""GPU timing of MLA decode backends through the backend interface (`mlalab.backends`: ``make_callable`` once, then
``call(i)``): CUDA-graph replay over KV copies rotated past the L2, copy bandwidth measured in the same run, error
against the exact and the emulated-quantised references, CSV records (`mlalab.records.schema`).

Method (one shape, one backend): build the backend's callable once (quantisation, plan, buffers, JIT outside the
timing), run it `warmup` times, capture ``calls_per_graph`` calls into one CUDA graph with call ``i`` reading KV copy
``i mod n_copies`` (enough copies that the rotation spans > 4x the 60 MB L2, at most `MAX_ROTATION` / 1 GB; at least
one call per copy, so every replay reads every copy), replay the graph ``replays`` times between CUDA events and
report the median and IQR of (replay time / calls). Bytes counted once (`mlalab.traffic`): KV + q + bf16 output;
TB/s = bytes / median time. A suite times every backend and shape first and fills the error columns in a second
pass: fp32 references computed between timings leave the next timed kernel in different conditions.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
from typing import Any

import torch

from .config import COMPETITION_SHAPES, MIXED_MLA_2026_SHAPES, DecodeCase
from .inputs import make_inputs
from .quant.precision import CORE_PRECISIONS, PRECISIONS, get_precision
from .records.schema import ACCURACY_PENDING, PROVENANCE_COLUMNS, TimingRecord, config_cell, write_csv
from .traffic import decode_traffic

__all__ = [
    "SUITES",
    "LAYOUTS",
    "suite_cases",
    "case_inputs",
    "BACKENDS",
    "L2_BYTES",
    "MAX_ROTATION",
    "kv_cache_bytes",
    "call_bytes",
    "rate_columns",
    "rotation_copies",
    "gpu_info",
    "provenance",
    "copy_bandwidth",
    "time_callable",
    "rel_l2",
    "quantised_reference",
    "bench_one",
    "fill_accuracy",
    "fill_accuracy_by_shape",
    "check_suite_args",
    "run_suite",
]

#: KV layouts a suite times (`case_inputs`): the page size, whether the page table is random, and the pool size in
#: multiples of the batch's KV. ``tokens`` is page size 1 with random token indices into a pool 4x the batch's KV
#: (the layout aiter and sglang hand a decode kernel: any slots of a token pool).
LAYOUTS = {"contiguous": (1, False, 1), "paged64": (64, True, 1), "paged16": (16, True, 1), "tokens": (1, True, 4)}

#: The cases of each suite: ``(batch, kv_len, q_len, layout)``. ``competition``: the 12 shapes of the GPU MODE MLA
#: decode problem (q_len 1, contiguous); ``mixed-mla-2026``: the 2026 problem's 8 shapes; ``layouts``: q_len 1, 2, 4
#: x every layout at the 12 shapes and batch 256 x 1024 / 8192.
SUITES: dict[str, list[tuple[int, int, int, str]]] = {
    "competition": [(b, n, 1, "contiguous") for b, n in COMPETITION_SHAPES],
    "smoke": [(4, 1024, 1, "contiguous"), (128, 8192, 1, "contiguous")],
    "mixed-mla-2026": [(b, n, 1, "contiguous") for b, n in MIXED_MLA_2026_SHAPES],
    "layouts": [
        (b, n, q, lay) for lay in LAYOUTS for q in (1, 2, 4) for b, n in (*COMPETITION_SHAPES, (256, 1024), (256, 8192))
    ],  # fmt: skip
}


def suite_cases(suite: str, shapes: list[tuple[int, int]] | None = None, q_lens: tuple[int, ...] | None = None,
                layouts: tuple[str, ...] | None = None) -> list[tuple[int, int, int, str]]:  # fmt: skip
    """The ``(batch, kv_len, q_len, layout)`` cases a run times: `suite`'s, or `shapes` x `q_lens` (default 1) x
    `layouts` (default contiguous); with a suite, `q_lens` / `layouts` keep only those of its cases."""
    if shapes is not None:
        return [(b, n, q, lay) for lay in (layouts or ("contiguous",)) for q in (q_lens or (1,)) for b, n in shapes]
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    return [c for c in SUITES[suite] if (not q_lens or c[2] in q_lens) and (not layouts or c[3] in layouts)]


def layout_of(x: Any) -> str:
    """The `LAYOUTS` name of inputs made by `make_inputs` (``pageN`` / ``pageN-permuted`` for other page tables)."""
    key = (int(x.case.page_size), bool(x.case.permute_pages), int(x.case.pool_factor))
    for name, v in LAYOUTS.items():
        if v == key:
            return name
    return f"page{key[0]}" + ("-permuted" if key[1] else "") + (f"-pool{key[2]}" if key[2] > 1 else "")


def case_inputs(batch: int, kv_len: int, q_len: int = 1, layout: str = "contiguous", causal: bool = False) -> Any:
    """The seeded inputs of one case (CPU): `batch` requests of `kv_len` tokens, `q_len` query rows each (under the
    causal mask of speculative verification with `causal`), the KV in `layout` (`LAYOUTS`). The same logical q and KV
    whatever the layout and the mask."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    page_size, permute, pool = LAYOUTS[layout]
    return make_inputs(DecodeCase.uniform(batch, kv_len, q_len=q_len, page_size=page_size, permute_pages=permute,
                                          pool_factor=pool, causal=causal))  # fmt: skip


L2_BYTES = 60 * 1024 * 1024
#: The backends a suite times (each through its `make_callable`).
BACKENDS = ("triton", "flashmla", "flashinfer", "reference-torch", "aiter")
#: Every precision of the precision table (`mlalab.quant.precision`).
ALL_PRECISIONS = tuple(str(p) for p in PRECISIONS)
#: What a suite times unless told otherwise: the sm_90 kernel's precisions (`CORE_PRECISIONS`).
SUITE_PRECISIONS = tuple(str(p) for p in CORE_PRECISIONS)


def gpu_info() -> dict[str, Any]:
    """GPU name, SM count, driver and library versions (raises RuntimeError without a GPU)."""
    if not torch.cuda.is_available():
        raise RuntimeError("timing needs a GPU: torch.cuda.is_available() is False (use the recorded data/timings)")
    p = torch.cuda.get_device_properties(0)
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "n/a"
    drv = "n/a"
    try:
        import subprocess

        drv = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except Exception:
        pass
    return {
        "gpu": p.name,
        "sm_count": p.multi_processor_count,
        "driver": drv,
        "torch": torch.__version__,
        "triton": tv,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def provenance() -> dict[str, Any]:
    """`gpu_info` restricted to `PROVENANCE_COLUMNS` (raises RuntimeError without a GPU)."""
    info = gpu_info()
    return {k: info[k] for k in PROVENANCE_COLUMNS}


def _events_ms(fn: Any, reps: int) -> list[float]:
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return ts


#: The most KV copies one timed graph rotates through (one call per copy): the smallest competition shape, 4 x 1024
#: (2.4 MB of fp8 KV), needs 107 of them to span 4 L2s (16 copies would stay inside the 60 MB L2).
MAX_ROTATION = 256


def rotation_copies(kv_bytes: int) -> int:
    """How many KV copies a timed graph rotates through: enough that the rotation spans > 4x the L2 (so no call
    finds its KV there), at least 2, at most `MAX_ROTATION` copies and 1 GB of them (a KV under 4 x L2 /
    `MAX_ROTATION`, ~1 MB, rotates through less than 4 L2s)."""
    if not isinstance(kv_bytes, int) or isinstance(kv_bytes, bool) or kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be a positive int, got {kv_bytes!r}")
    return int(min(MAX_ROTATION, max(2, math.ceil(4 * L2_BYTES / kv_bytes)), max(2, (1 << 30) // kv_bytes)))


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read + written."""
    if nbytes < 1 << 20:
        raise ValueError(f"nbytes must be >= 1 MiB, got {nbytes}")
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = statistics.median(_events_ms(lambda: dst.copy_(src), reps))
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def time_callable(call: Any, n_copies: int, *, calls_per_graph: int = 20, replays: int = 10, warmup: int = 3) -> dict:
    """Median / IQR of one call's time (µs) from CUDA-graph replays of rotated calls: `calls_per_graph` of them, or
    `n_copies` if more (every replay reads every KV copy once)."""
    if calls_per_graph < 1 or replays < 3:
        raise ValueError("calls_per_graph must be >= 1 and replays >= 3")
    if isinstance(n_copies, bool) or not isinstance(n_copies, int) or n_copies < 1:
        raise ValueError(f"n_copies must be an int >= 1, got {n_copies!r}")
    calls_per_graph = max(calls_per_graph, n_copies)
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):
            call(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls_per_graph):
            call(i % n_copies)
    g.replay()
    torch.cuda.synchronize()
    us = [t * 1e3 / calls_per_graph for t in _events_ms(g.replay, replays)]
    q = statistics.quantiles(us, n=4)
    return {"us_median": statistics.median(us), "us_iqr": q[2] - q[0], "replays": replays, "calls": calls_per_graph}


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """rel-L2 of `x` against `ref`: `mlalab.accuracy.output_metrics`'s definition (NaN for a zero reference), with
    `x` reshaped to `ref`'s shape (a backend may return (B, H, Dv) where the reference gives (B*q_len, H, Dv))."""
    from .accuracy import output_metrics

    for name, t in (("x", x), ("ref", ref)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.numel() != ref.numel():
        raise ValueError(f"x has {x.numel()} elements, ref {ref.numel()}")
    return output_metrics(x.reshape(ref.shape).cpu(), ref.cpu())["rel_l2"]


def call_bytes(batch: int, kv_len: int, precision: str, q_len: int = 1) -> int:
    """The `bytes` column: `mlalab.traffic.decode_traffic` of B x L (x q_len query rows) at `precision` (KV, q and
    the bf16 output, each counted once, in the precision table's element sizes)."""
    spec = get_precision(precision)
    t = decode_traffic(DecodeCase.uniform(batch, kv_len, q_len=q_len), spec.kv_format, float(spec.q_bytes))
    return int(round(t.total_bytes))


def rate_columns(nbytes: int, copy_tbps: float, us_median: float = math.nan) -> dict[str, float]:
    """The rate columns of a timed row from its `bytes`, the run's copy bandwidth (TB/s) and the median time (µs):
    ``floor_us`` = bytes / copy bandwidth, ``tbps`` = bytes / time, ``pct_copy`` = 100 x tbps / copy bandwidth (NaN
    while the time is NaN: not timed yet)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    if not (isinstance(copy_tbps, (int, float)) and math.isfinite(copy_tbps) and copy_tbps > 0):
        raise ValueError(f"copy_tbps must be a positive finite number (TB/s), got {copy_tbps!r}")
    if not (isinstance(us_median, (int, float)) and (math.isnan(us_median) or us_median > 0)):
        raise ValueError(f"us_median must be a positive number of microseconds or NaN, got {us_median!r}")
    tbps = nbytes / (us_median * 1e-6) / 1e12
    return {"floor_us": nbytes / (copy_tbps * 1e12) * 1e6, "tbps": tbps, "pct_copy": 100.0 * tbps / copy_tbps}


def kv_cache_bytes(batch: int, kv_len: int, precision: str) -> int:
    """Bytes of one KV cache of B x L tokens at `precision` (block scales included): one rotated copy."""
    return int(batch * kv_len * get_precision(precision).kv_token_bytes)


def quantised_reference(x: Any, precision: str, cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact fp32 reference on the bf16 inputs, fp32 reference on the dequantised inputs of `precision`), cached
    per input set in `cache`."""
    from .kernels import prepare
    from .reference import decode_reference

    if "exact" not in cache:
        cache["exact"] = decode_reference(x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, x.kv_indices,
                                          x.kv_last_page_len, causal=x.case.causal)[0]  # fmt: skip
    if precision not in cache:
        p = prepare(x, precision)
        q = p.q.float() * p.q_scale
        kv = p.kv_values() if p.spec.kv_fp4 else p.kv.float() * p.kv_scale
        kv = kv.view(x.kv_buffer.shape)
        cache[precision] = decode_reference(q, kv, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len,
                                            causal=x.case.causal)[0]  # fmt: skip
    return cache["exact"], cache[precision]


def bench_one(
    backend: str, x: Any, precision: str, *, copy_tbps: float, env: dict, refs: dict | None,
    calls_per_graph: int = 20, replays: int = 10, outputs: list | None = None, **opts: Any,
) -> TimingRecord:  # fmt: skip
    """Time one backend on one input set through its ``make_callable`` (`opts` go to it; ``planner`` is recorded in
    the planner column); failures are recorded in `status`, never raised. With `refs` (a per-input cache), the error
    columns are filled before the timing; with ``refs=None`` they are left to `fill_accuracy`: the record gets
    status `ACCURACY_PENDING` and ``(record, output on the CPU)`` is appended to `outputs`."""
    if refs is None and outputs is None:
        raise ValueError("bench_one: give refs (errors now) or outputs (errors later, fill_accuracy)")
    from .backends import get_backend

    B, L, Q = x.batch, int(x.kv_lens[0]), int(x.case.q_len)
    rec = TimingRecord(backend, str(opts.get("planner", "-")), precision, config_cell(opts), B, L, Q,
                       bool(x.case.causal), layout_of(x), copy_tbps=copy_tbps, env=env)  # fmt: skip
    nbytes = call_bytes(B, L, precision, Q)
    rec.bytes = nbytes
    rec.floor_us = rate_columns(nbytes, copy_tbps)["floor_us"]
    n_copies = rotation_copies(kv_cache_bytes(B, L, precision))
    try:
        call, info = get_backend(backend).make_callable(x, precision=precision, n_copies=n_copies, **opts)
        if "record" in info:  # what actually ran, not only what was asked for
            rec.config = config_cell(opts, info["record"])
        out = call(0).float()
        torch.cuda.synchronize()
        if refs is not None:
            _set_errors(rec, out, *quantised_reference(x, precision, refs))
        t = time_callable(call, n_copies, calls_per_graph=calls_per_graph, replays=replays)
        rec.us_median, rec.us_iqr = t["us_median"], t["us_iqr"]
        rates = rate_columns(nbytes, copy_tbps, rec.us_median)
        rec.tbps, rec.pct_copy = rates["tbps"], rates["pct_copy"]
        if refs is None:
            rec.status = ACCURACY_PENDING
            outputs.append((rec, out.cpu()))
    except Exception as e:  # record and continue: one failing peer must not lose the whole run
        rec.status = _error_status(e)
    return rec


def _error_status(e: Exception, what: str = "") -> str:
    """A failed row's `status`: ``error: [what]<Exception>: <first line of its message, 200 characters at most>``."""
    msg = str(e).splitlines()[0][:200] if str(e) else ""
    return f"error: {what}{type(e).__name__}: {msg}"


def _set_errors(rec: TimingRecord, out: torch.Tensor, exact: torch.Tensor, emul: torch.Tensor) -> None:
    rec.err_vs_exact = rel_l2(out, exact)
    rec.err_quant_emulated = rel_l2(emul.to(torch.bfloat16), exact)
    rec.err_vs_emulated = rel_l2(out, emul)


def fill_accuracy(pending: list[tuple[TimingRecord, torch.Tensor]], x: Any, log: Any = print,
                  refs: dict | None = None) -> None:  # fmt: skip
    """Fill the error columns of records timed with ``refs=None`` (`bench_one`, status `ACCURACY_PENDING`) from
    their kept outputs, against references on `x` (the same inputs they were timed on, or the same logical q and KV
    in another layout); status becomes "ok". `refs`: `quantised_reference`'s cache, to share the references between
    calls on the same logical inputs (filled here). A reference that cannot be computed leaves the errors NaN, says
    so in the log and keeps the timing ("ok"); an output that cannot be compared with it (wrong size: a backend bug)
    makes the row ``error: accuracy: ...``."""
    if refs is not None and not isinstance(refs, dict):
        raise TypeError(f"refs must be a dict (quantised_reference's cache) or None, got {type(refs).__name__}")
    refs = {} if refs is None else refs
    for rec, out in pending:
        if rec.status != ACCURACY_PENDING:
            raise ValueError(f"fill_accuracy: {rec.backend} {rec.precision} B={rec.batch} L={rec.kv_len} has status "
                             f"{rec.status!r}, not {ACCURACY_PENDING!r}")  # fmt: skip
        if (x.batch, int(x.kv_lens[0])) != (rec.batch, rec.kv_len):
            raise ValueError(f"fill_accuracy: record of B={rec.batch} L={rec.kv_len}, inputs of B={x.batch} "
                             f"L={int(x.kv_lens[0])}")  # fmt: skip
        rec.status = "ok"
        try:
            exact, emul = quantised_reference(x, rec.precision, refs)
        except Exception as e:  # noqa: BLE001 (the timing stays valid without its error columns)
            log(f"reference of {rec.precision} B={rec.batch} L={rec.kv_len} failed: {type(e).__name__}: {e}")
            continue
        try:
            _set_errors(rec, out, exact, emul)
        except Exception as e:  # noqa: BLE001 (recorded in the row, like any failure of the backend)
            rec.status = _error_status(e, "accuracy: ")


def fill_accuracy_by_shape(pending: dict[tuple, list], log: Any = print, after_shape: Any = None,
                           device: str = "cuda") -> None:  # fmt: skip
    """The second pass of a timing run: for each case ``(batch, kv_len[, q_len, layout[, causal]])`` of `pending`
    (case -> [(record, output)], as `bench_one` with ``refs=None`` kept them), `fill_accuracy` against references on
    its regenerated inputs (`case_inputs` is seeded: the same inputs that were timed), log each row's errors and call
    ``after_shape()`` (e.g. rewrite the CSV). The layouts of one logical case (same batch, kv_len, q_len and mask)
    hold the same q and KV values (unused pool slots are zeros, so even per-tensor scales agree): their inputs are
    made and their references computed once, on `device`."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a str such as 'cuda' or 'cpu', got {type(device).__name__}")
    groups: dict[tuple, list] = {}  # logical case (the key without its layout) -> its cases, in pending's order
    for key, kept in pending.items():
        if kept:
            groups.setdefault(tuple(v for i, v in enumerate(key) if i != 3), []).append((key, kept))
    for cases in groups.values():
        first = cases[0][0]  # (the logical case's inputs laid out contiguously: the smallest buffer)
        logical = (*first[:3], "contiguous", *first[4:]) if len(first) > 3 else first
        x, refs = case_inputs(*logical).to(device), {}
        for key, kept in cases:
            fill_accuracy(kept, x, log, refs)
            for rec, _ in kept:
                log(f"{rec.backend:16s} {rec.planner:10s} {rec.precision:6s} B={key[0]:4d} L={key[1]:5d} q{rec.q_len} "
                    f"{rec.layout} err {rec.err_vs_exact:.2e} (quant {rec.err_quant_emulated:.2e}, "
                    f"vs emul {rec.err_vs_emulated:.2e}) {rec.status} {rec.config}")  # fmt: skip
            if after_shape is not None:
                after_shape()
        del x, refs
        torch.cuda.empty_cache()


def check_suite_args(
    suite: str = "competition",
    backends: tuple[str, ...] = ("triton",),
    precisions: tuple[str, ...] = SUITE_PRECISIONS,
    planners: tuple[str, ...] = ("simple",),
    triton_configs: tuple[dict, ...] = ({},),
    calls_per_graph: int = 20,
    replays: int = 10,
    out: str | os.PathLike[str] | None = None,
    shapes: list[tuple[int, int]] | None = None,
    q_lens: tuple[int, ...] | None = None,
    layouts: tuple[str, ...] | None = None,
    causal: bool = False,
) -> None:
    """Validate `run_suite`'s arguments before any GPU work (ValueError/TypeError naming the argument)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal (--causal) must be True or False, got {causal!r}")
    if shapes is None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    for q in q_lens or ():
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 16:
            raise ValueError(f"q_lens (--q-lens) must be ints in [1, 16], got {q!r}")
    for lay in layouts or ():
        if lay not in LAYOUTS:
            raise ValueError(f"layouts (--layouts) must be among {', '.join(LAYOUTS)}, got {lay!r}")
    if not suite_cases(suite, shapes, q_lens, layouts):
        raise ValueError(f"suite {suite!r} has no case with q_lens {q_lens} and layouts {layouts}")
    for name, v, lo in (("calls_per_graph (--calls)", calls_per_graph, 1), ("replays (--replays)", replays, 3)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    for name, vals, valid in (("backends", backends, BACKENDS), ("precisions", precisions, ALL_PRECISIONS)):
        if not vals or any(v not in valid for v in vals):
            raise ValueError(f"{name} must be a non-empty subset of {', '.join(valid)}; got {', '.join(vals) or '()'}")
    from .plan import PLANNERS

    if not planners or any(p not in PLANNERS for p in planners):
        raise ValueError(f"planners must be a non-empty subset of {', '.join(PLANNERS)}; got {planners!r}")
    if not triton_configs or not all(isinstance(c, dict) for c in triton_configs):
        raise TypeError(f"triton_configs must be a non-empty sequence of dicts, got {triton_configs!r}")
    if shapes is not None:
        for b, L in shapes:
            DecodeCase.uniform(b, L)  # raises ValueError naming batch / kv_len
    if out is not None:
        p = os.fspath(out)
        if not str(p).endswith(".csv"):
            raise ValueError(f"out must be a .csv path, got {p!r}")
        folder = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(folder):
            raise ValueError(f"out: folder {folder!r} does not exist")


def run_suite(
    suite: str = "competition",
    backends: tuple[str, ...] = ("triton", "flashmla", "flashinfer", "reference-torch"),
    precisions: tuple[str, ...] = SUITE_PRECISIONS,
    planners: tuple[str, ...] = ("simple",),
    triton_configs: tuple[dict, ...] = ({},),
    shapes: list[tuple[int, int]] | None = None,
    calls_per_graph: int = 20,
    replays: int = 10,
    log: Any = print,
    out: str | os.PathLike[str] | None = None,
    q_lens: tuple[int, ...] | None = None,
    layouts: tuple[str, ...] | None = None,
    causal: bool = False,
) -> list[TimingRecord]:
    """Time every backend x precision (x planner x kernel config for triton) on every shape of `suite`. With
    `out`, the CSV is rewritten atomically after each shape, so a crash keeps every finished shape.

    Two passes: first every timing, back to back, then the accuracy columns (fp32 references on the same inputs,
    regenerated from their seed, against each record's kept output). The references are heavy at large shapes (the
    whole KV in fp32, twice); computed between timings they left the next timed kernel in different conditions
    (docs/journal.md). Rows whose accuracy is not filled yet say `ACCURACY_PENDING` in `status`. A backend is timed
    in the precisions it declares (its ``PRECISIONS``); Triton with every planner x kernel config. The cases:
    `suite_cases` (`shapes`, `q_lens`, `layouts` narrow or replace the suite's), each under the causal mask of
    speculative verification with `causal` (every backend given the flag; its cases of q_len 1 are the same)."""
    check_suite_args(suite, backends, precisions, planners, triton_configs, calls_per_graph, replays, out, shapes,
                     q_lens, layouts, causal)  # fmt: skip
    env = gpu_info()
    bw = copy_bandwidth()
    log(f"# {env}  copy {bw:.3f} TB/s")
    recs: list[TimingRecord] = []
    pending: dict[tuple, list] = {}  # case -> [(record, output)] whose errors are filled in pass 2
    for case in suite_cases(suite, shapes, q_lens, layouts):
        B, L, Q, lay = case
        case = (*case, causal)
        x = case_inputs(*case).to("cuda")
        kept = pending.setdefault(case, [])
        for be in backends:
            for prec in precisions:
                if not _supported(be, prec):
                    continue
                combos = [{"planner": pl, **c} for pl in planners for c in triton_configs] if be == "triton" else [{}]
                for opts in combos:
                    rec = bench_one(be, x, prec, copy_tbps=bw, env=env, refs=None, outputs=kept,
                                    calls_per_graph=calls_per_graph, replays=replays, **opts)  # fmt: skip
                    recs.append(rec)
                    short = ",".join(f"{k}={v}" for k, v in sorted(opts.items()) if k != "planner") or "defaults"
                    log(
                        f"{be:16s} {rec.planner:10s} {prec:6s} {short:30s} B={B:4d} L={L:5d} q{Q} {lay:10s} "
                        f"{rec.us_median:9.2f} us "
                        f"{rec.tbps:5.2f} TB/s {rec.pct_copy:5.1f}% {rec.status}"
                    )  # (errors: logged by the accuracy pass)
        del x
        torch.cuda.empty_cache()
        if out is not None:
            write_csv(recs, out)
    # pass 2: the accuracy columns, once every timing is done
    fill_accuracy_by_shape(pending, log, None if out is None else (lambda: write_csv(recs, out)))
    return recs


def _supported(backend: str, precision: str) -> bool:
    """Whether `backend` declares `precision` (its module's ``PRECISIONS``; an unimportable backend: no)."""
    from .backends import get_backend

    try:
        return precision in get_backend(backend).PRECISIONS
    except Exception:  # noqa: BLE001 (aiter off ROCm raises on import: its rows are simply not timed)
        return backend == "triton"

"""GPU timing of MLA decode backends: CUDA-graph replay over KV copies rotated past the L2, copy bandwidth
measured in the same run, error against the exact and the emulated-quantised references, CSV records.

Method (one shape, one backend): build the backend's callable once (quantisation, plan, buffers, JIT outside
the timing), run it `warmup` times, capture ``calls_per_graph`` calls into one CUDA graph with call ``i`` reading
KV copy ``i mod n_copies`` (enough copies that the rotation spans > 4x the 60 MB L2, at most `MAX_ROTATION` / 1 GB;
at least one call per copy, so every replay reads every copy), replay
the graph ``replays`` times between CUDA events and report the median and IQR of (replay time / calls). Bytes
counted once: KV bytes (576 B/token fp8, 1152 bf16) + q + bf16 output; TB/s = bytes / median time.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .config import MLA, DecodeCase
from .inputs import make_inputs
from .io import atomic_write
from .traffic import decode_traffic

__all__ = [
    "COMPETITION_SHAPES",
    "MAX_ROTATION",
    "kv_cache_bytes",
    "rotation_copies",
    "SUITES",
    "TimingRecord",
    "gpu_info",
    "copy_bandwidth",
    "time_callable",
    "rel_l2",
    "bench_one",
    "fill_accuracy",
    "fill_accuracy_by_shape",
    "ACCURACY_PENDING",
    "aiter_callable",
    "run_suite",
    "CSV_COLUMNS",
    "call_bytes",
    "config_string",
    "parse_config",
    "plan_digest",
    "check_suite_args",
    "write_csv",
    "main",
    "provenance",
    "PROVENANCE_COLUMNS",
]

COMPETITION_SHAPES = [(b, L) for b in (4, 8, 16, 32, 64, 128) for L in (1024, 8192)]
SUITES = {"competition": COMPETITION_SHAPES, "smoke": [(4, 1024), (128, 8192)]}
L2_BYTES = 60 * 1024 * 1024


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


#: The columns that say where and with what a GPU script's table was measured (`gpu_info`); the scripts under
#: scripts/ append them to every row they record (data/profiles), as the bench does.
PROVENANCE_COLUMNS = ("date", "gpu", "sm_count", "driver", "torch", "triton")


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


#: The most KV copies one timed graph rotates through (one call per copy). Up to 2026-12-03 (run 12) it was 16, so the
#: smallest competition shape, 4 x 1024 (2.4 MB of fp8 KV), rotated through 38 MB: less than the L2, for every backend.
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


CSV_COLUMNS = [
    "date", "gpu", "sm_count", "driver", "torch", "triton", "backend", "planner", "precision", "config",
    "batch", "kv_len", "us_median", "us_iqr", "bytes", "tbps", "copy_tbps", "pct_copy", "floor_us",
    "err_vs_exact", "err_quant_emulated", "err_vs_emulated", "status",
]  # fmt: skip


@dataclass
class TimingRecord:
    backend: str
    planner: str
    precision: str
    config: str
    batch: int
    kv_len: int
    us_median: float = math.nan
    us_iqr: float = math.nan
    bytes: int = 0
    tbps: float = math.nan
    copy_tbps: float = math.nan
    pct_copy: float = math.nan
    floor_us: float = math.nan
    err_vs_exact: float = math.nan
    err_quant_emulated: float = math.nan
    err_vs_emulated: float = math.nan
    status: str = "ok"
    env: dict = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        env = d.pop("env")
        d.update({k: env.get(k, "") for k in ("date", "gpu", "sm_count", "driver", "torch", "triton")})
        return {k: d[k] for k in CSV_COLUMNS}


PRECISIONS = ("a8w8", "a16w8", "bf16")


def call_bytes(batch: int, kv_len: int, precision: str) -> int:
    """The `bytes` column: `mlalab.traffic.decode_traffic` of B x L at `precision` (KV 576 B/token fp8 or 1152
    bf16, q fp8 for a8w8 else bf16, bf16 output; each counted once)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    t = decode_traffic(DecodeCase.uniform(batch, kv_len), _kv_format(precision), float(_q_itemsize(precision)))
    return int(round(t.total_bytes))


def kv_cache_bytes(batch: int, kv_len: int, precision: str) -> int:
    """Bytes of one KV cache of B x L tokens at `precision` (576 per token in fp8, 1152 in bf16): one rotated copy."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return batch * kv_len * MLA.qk_dim * _kv_itemsize(precision)


def _kv_format(precision: str) -> str:
    return "bf16" if precision == "bf16" else "fp8"


def _kv_itemsize(precision: str) -> int:
    return 2 if precision == "bf16" else 1


def _q_itemsize(precision: str) -> int:
    return 1 if precision == "a8w8" else 2


def plan_digest(plan: Any) -> dict[str, Any]:
    """A short fingerprint of a WorkPlan for the record: planner name, its knobs, plan slots, number of works and
    the first 12 hex digits of a SHA-256 over ``work_indptr`` and ``work_info`` (int32, CPU). Two plans with the
    same digest assign the same KV ranges to the same slots."""
    from .splitkv import WorkPlan

    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    h = hashlib.sha256()
    for t in (plan.work_indptr, plan.work_info):
        h.update(t.to("cpu", torch.int32).contiguous().numpy().tobytes())
    params = {k: v for k, v in sorted(plan.params.items()) if isinstance(v, (int, float, str, bool)) or v is None}
    return {"planner": plan.planner, "params": params, "num_cus": int(plan.num_cus), "n_work": plan.n_work,
            "hash": h.hexdigest()[:12]}  # fmt: skip


def _refs(x: Any, precision: str, cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact fp32 reference on the bf16 inputs, fp32 reference on the dequantised inputs of `precision`)."""
    from .reference import decode_reference
    from .splitkv.triton_mla import prepare

    if "exact" not in cache:
        cache["exact"] = decode_reference(x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len)[
            0
        ]
    if precision not in cache:
        p = prepare(x, precision)
        q = p.q.float() * p.q_scale
        kv = (p.kv.float() * p.kv_scale).view(x.kv_buffer.shape)
        cache[precision] = decode_reference(q, kv, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len)[0]
    return cache["exact"], cache[precision]


def config_string(backend: str, opts: dict[str, Any], plan: Any = None, ran: str | None = None) -> str:
    """The `config` column. Triton: the full `KernelConfig` the run used plus the plan options, as compact JSON
    (``num_cus`` = the plan's slot count and ``plan`` = its `plan_digest` when `plan` is given; ``ran`` = the
    stage-1 kernel ``kernel="auto"`` chose, "hopper" or "portable"). Other backends: ``k=v,...`` of their options."""
    if not isinstance(opts, dict):
        raise TypeError(f"opts must be a dict, got {type(opts).__name__}")
    legacy = ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
    if backend != "triton":
        return legacy
    from .splitkv.triton_mla import KernelConfig

    fields = {f.name for f in dataclasses.fields(KernelConfig)}
    try:
        kernel = dataclasses.asdict(KernelConfig(**{k: v for k, v in opts.items() if k in fields}))
    except TypeError:
        return legacy  # unknown knobs: the run records the error; keep what was asked
    d = {**kernel, **{k: v for k, v in sorted(opts.items()) if k not in fields}}
    if plan is not None:
        d["num_cus"] = int(plan.num_cus)
        d["plan"] = plan_digest(plan)
    if ran is not None:
        d["ran"] = str(ran)
    return json.dumps(d, separators=(",", ":"))


def parse_config(s: object) -> dict[str, Any]:
    """Read a `config` cell of any recorded run: ``""``/NaN (the defaults of that run's commit) -> ``{}``;
    ``{json}`` (new runs) or ``k=v,...`` (old runs) -> the knobs; a ``name:`` prefix (scripts/perf_sweep.py's
    variant) -> ``{"variant": name, ...}``; a bare word (e.g. ``bmm``) -> ``{"variant": word}``."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return {}
    if not isinstance(s, str):
        raise TypeError(f"config must be a string (or NaN for an empty cell), got {type(s).__name__}")
    s = s.strip()
    out: dict[str, Any] = {}
    brace = s.find("{")
    head = s[:brace] if brace >= 0 else s.split("=", 1)[0] if "=" in s else s
    if ":" in head:
        name, s = s.split(":", 1)
        out["variant"] = name
    if not s:
        return out
    if s.startswith("{"):
        try:
            return {**out, **json.loads(s)}
        except json.JSONDecodeError as e:
            raise ValueError(f"config {s!r} is not valid JSON: {e}") from None
    if "=" not in s:
        return {**out, "variant": s}
    for part in s.split(","):
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            out[k.strip()] = v.strip()
    return out


#: `TimingRecord.status` of a row timed whose accuracy columns `fill_accuracy` has not filled yet
ACCURACY_PENDING = "accuracy pending"


def bench_one(
    backend: str, x: Any, precision: str, *, planner: str = "-", copy_tbps: float, env: dict, refs: dict | None,
    calls_per_graph: int = 20, replays: int = 10, outputs: list | None = None, **opts: Any,
) -> TimingRecord:  # fmt: skip
    """Time one backend on one prepared input set; failures are recorded in `status`, never raised. With `refs` (a
    per-input cache), the error columns are filled before the timing; with ``refs=None`` they are left to
    `fill_accuracy`: the record gets status `ACCURACY_PENDING` and ``(record, output on the CPU)`` is appended to
    `outputs` (so the fp32 references are computed away from the timed calls)."""
    if refs is None and outputs is None:
        raise ValueError("bench_one: give refs (errors now) or outputs (errors later, fill_accuracy)")
    from .backends import get_backend

    B, L = x.batch, int(x.kv_lens[0])
    rec = TimingRecord(backend, planner, precision, config_string(backend, opts), B, L, copy_tbps=copy_tbps, env=env)
    nbytes = call_bytes(B, L, precision)
    rec.bytes = nbytes
    rec.floor_us = nbytes / (copy_tbps * 1e12) * 1e6
    n_copies = rotation_copies(kv_cache_bytes(B, L, precision))
    try:
        kw = dict(opts)
        if backend == "aiter":
            call = aiter_callable(x, precision, n_copies, **kw)
        else:
            mod = get_backend(backend)
            if backend == "triton":
                kw["planner"] = planner
            call, info = mod.make_callable(x, precision=precision, n_copies=n_copies, **kw)
            if backend == "triton":  # the config and plan slots actually used, not only the ones asked for
                rec.config = config_string(backend, opts, info["plan"], info["decoder"].ran)
        out = call(0).float()
        torch.cuda.synchronize()
        if refs is not None:
            _set_errors(rec, out, *_refs(x, precision, refs))
        t = time_callable(call, n_copies, calls_per_graph=calls_per_graph, replays=replays)
        rec.us_median, rec.us_iqr = t["us_median"], t["us_iqr"]
        rec.tbps = nbytes / (rec.us_median * 1e-6) / 1e12
        rec.pct_copy = 100.0 * rec.tbps / copy_tbps
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


def fill_accuracy(pending: list[tuple[TimingRecord, torch.Tensor]], x: Any, log: Any = print) -> None:
    """Fill the error columns of records timed with ``refs=None`` (`bench_one`, status `ACCURACY_PENDING`) from
    their kept outputs, against references on `x` (the same inputs they were timed on); status becomes "ok". A
    reference that cannot be computed leaves the errors NaN, says so in the log and keeps the timing ("ok"); an
    output that cannot be compared with it (wrong size: a backend bug) makes the row ``error: accuracy: ...``."""
    refs: dict = {}
    for rec, out in pending:
        if rec.status != ACCURACY_PENDING:
            raise ValueError(f"fill_accuracy: {rec.backend} {rec.precision} B={rec.batch} L={rec.kv_len} has status "
                             f"{rec.status!r}, not {ACCURACY_PENDING!r}")  # fmt: skip
        if (x.batch, int(x.kv_lens[0])) != (rec.batch, rec.kv_len):
            raise ValueError(f"fill_accuracy: record of B={rec.batch} L={rec.kv_len}, inputs of B={x.batch} "
                             f"L={int(x.kv_lens[0])}")  # fmt: skip
        rec.status = "ok"
        try:
            exact, emul = _refs(x, rec.precision, refs)
        except Exception as e:  # noqa: BLE001 (the timing stays valid without its error columns)
            log(f"reference of {rec.precision} B={rec.batch} L={rec.kv_len} failed: {type(e).__name__}: {e}")
            continue
        try:
            _set_errors(rec, out, exact, emul)
        except Exception as e:  # noqa: BLE001 (recorded in the row, like any failure of the backend)
            rec.status = _error_status(e, "accuracy: ")


def fill_accuracy_by_shape(pending: dict[tuple[int, int], list], log: Any = print, after_shape: Any = None) -> None:
    """The second pass of a timing run: for each uniform shape ``(batch, kv_len)`` of `pending` (shape -> [(record,
    output)], as `bench_one` with ``refs=None`` kept them), regenerate its inputs (`make_inputs` is seeded: the
    same inputs that were timed), `fill_accuracy`, log each row's errors and call ``after_shape()`` (e.g. rewrite
    the CSV)."""
    for (B, L), kept in pending.items():
        if not kept:
            continue
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        fill_accuracy(kept, x, log)
        for rec, _ in kept:
            log(f"{rec.backend:16s} {rec.planner:10s} {rec.precision:6s} B={B:4d} L={L:5d} "
                f"err {rec.err_vs_exact:.2e} (quant {rec.err_quant_emulated:.2e}, "
                f"vs emul {rec.err_vs_emulated:.2e}) {rec.status} {rec.config}")  # fmt: skip
        del x
        torch.cuda.empty_cache()
        if after_shape is not None:
            after_shape()


def aiter_callable(x: Any, precision: str, n_copies: int, **overrides: Any) -> Any:
    """ROCm only: aiter's persistent MLA decode as a timeable ``call(i)``. Everything (settings, quantisation,
    metadata buffers, page table) is built once here; ``call(i)`` is `AiterDecoder.run` on KV copy ``i``."""
    from .backends.aiter import AiterDecoder, QuantizedInputs, probe, quantize_inputs
    from .backends.aiter_args import settings_for_precision, token_kv_indices

    reason = probe()
    if reason is not None:
        raise RuntimeError(f"aiter backend unavailable: {reason}")
    dec = AiterDecoder(settings_for_precision(precision, **overrides))
    prepared = dec.prepare(x)
    qi = quantize_inputs(x, dec.settings, dec.rt.fp8_flavour)
    _, tok_indices = token_kv_indices(x.kv_indptr, x.kv_indices, x.kv_last_page_len, x.page_size)
    prepared.kv_indices.copy_(tok_indices.to(torch.int32))
    copies = [qi] + [
        QuantizedInputs(qi.q, qi.kv_buffer.clone(), qi.q_scale, qi.kv_scale) for _ in range(max(0, n_copies - 1))
    ]

    def call(i: int) -> torch.Tensor:
        dec.run(prepared, copies[i % len(copies)])
        return prepared.out

    return call


def reference_torch_callable(x: Any, n_copies: int) -> Any:
    """What a user would write: batched bf16 matmuls over a (B, L, 576) cache, fp32 softmax."""
    B, L = x.batch, int(x.kv_lens[0])
    kv = x.kv_buffer.view(B, L, MLA.qk_dim)
    copies = [kv] + [kv.clone() for _ in range(n_copies - 1)]
    q = x.q.view(B, MLA.num_heads, MLA.qk_dim)

    def call(i: int) -> torch.Tensor:
        k = copies[i % len(copies)]
        s = torch.bmm(q, k.transpose(1, 2)).float() * MLA.sm_scale
        p = torch.softmax(s, -1).to(torch.bfloat16)
        return torch.bmm(p, k[..., : MLA.v_dim])

    return call


BACKENDS = ("triton", "flashmla", "flashinfer", "reference-torch", "aiter")


def check_suite_args(
    suite: str = "competition",
    backends: tuple[str, ...] = ("triton",),
    precisions: tuple[str, ...] = PRECISIONS,
    planners: tuple[str, ...] = ("simple",),
    triton_configs: tuple[dict, ...] = ({},),
    calls_per_graph: int = 20,
    replays: int = 10,
    out: str | os.PathLike[str] | None = None,
    shapes: list[tuple[int, int]] | None = None,
) -> None:
    """Validate `run_suite`'s arguments before any GPU work (ValueError/TypeError naming the argument)."""
    if shapes is None and suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    for name, v, lo in (("calls_per_graph (--calls)", calls_per_graph, 1), ("replays (--replays)", replays, 3)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    for name, vals, valid in (("backends", backends, BACKENDS), ("precisions", precisions, PRECISIONS)):
        if not vals or any(v not in valid for v in vals):
            raise ValueError(f"{name} must be a non-empty subset of {', '.join(valid)}; got {', '.join(vals) or '()'}")
    from .splitkv import PLANNERS

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
    precisions: tuple[str, ...] = PRECISIONS,
    planners: tuple[str, ...] = ("simple",),
    triton_configs: tuple[dict, ...] = ({},),
    shapes: list[tuple[int, int]] | None = None,
    calls_per_graph: int = 20,
    replays: int = 10,
    log: Any = print,
    out: str | os.PathLike[str] | None = None,
) -> list[TimingRecord]:
    """Time every backend x precision (x planner x kernel config for triton) on every shape of `suite`. With
    `out`, the CSV is rewritten atomically after each shape, so a crash keeps every finished shape.

    Two passes: first every timing, back to back, then the accuracy columns (fp32 references on the same inputs,
    regenerated from their seed, against each record's kept output). The references are heavy at large shapes (the
    whole KV in fp32, twice); computed between timings they left the next timed kernel in different conditions (the
    a8w8 rows of 64 x 8192 and 128 x 8192, timed right after them, measured 158-167 us with IQRs up to 21 us in runs
    4-10, where `scripts/hopper_ab.py`, which computes no references, measured 140-145 us for the same code). Rows
    whose accuracy is not filled yet say `ACCURACY_PENDING` in `status`."""
    check_suite_args(suite, backends, precisions, planners, triton_configs, calls_per_graph, replays, out, shapes)
    env = gpu_info()
    bw = copy_bandwidth()
    log(f"# {env}  copy {bw:.3f} TB/s")
    peers_prec = {"flashmla": ("bf16", "a8w8"), "flashinfer": ("bf16", "a16w8"), "reference-torch": ("bf16",),
                  "aiter": ("bf16", "a16w8", "a8w8")}  # fmt: skip
    recs: list[TimingRecord] = []
    pending: dict[tuple[int, int], list] = {}  # shape -> [(record, output)] whose errors are filled in pass 2
    for B, L in shapes or SUITES[suite]:
        x = make_inputs(DecodeCase.uniform(B, L)).to("cuda")
        kept = pending.setdefault((B, L), [])
        for be in backends:
            for prec in precisions:
                if be != "triton" and prec not in peers_prec.get(be, ()):
                    continue
                combos = [(pl, c) for pl in planners for c in triton_configs] if be == "triton" else [("-", {})]
                for pl, c in combos:
                    if be == "reference-torch":
                        rec = _bench_reference_torch(x, bw, env, kept, calls_per_graph, replays)
                    else:
                        rec = bench_one(be, x, prec, planner=pl, copy_tbps=bw, env=env, refs=None, outputs=kept,
                                        calls_per_graph=calls_per_graph, replays=replays, **c)  # fmt: skip
                    recs.append(rec)
                    short = ",".join(f"{k}={v}" for k, v in sorted(c.items())) if be == "triton" else rec.config
                    short = short or "defaults"
                    log(
                        f"{be:16s} {pl:10s} {prec:6s} {short:40s} B={B:4d} L={L:5d} {rec.us_median:9.2f} us "
                        f"{rec.tbps:5.2f} TB/s {rec.pct_copy:5.1f}% {rec.status}"
                    )  # (errors: logged by the accuracy pass)
        del x
        torch.cuda.empty_cache()
        if out is not None:
            write_csv(recs, out)
    # pass 2: the accuracy columns, once every timing is done
    fill_accuracy_by_shape(pending, log, None if out is None else (lambda: write_csv(recs, out)))
    return recs


def _bench_reference_torch(x: Any, bw: float, env: dict, outputs: list, cpg: int, reps: int) -> TimingRecord:
    B, L = x.batch, int(x.kv_lens[0])
    rec = TimingRecord("reference-torch", "-", "bf16", "bmm", B, L, copy_tbps=bw, env=env)
    rec.bytes = call_bytes(B, L, "bf16")
    rec.floor_us = rec.bytes / (bw * 1e12) * 1e6
    try:
        n = rotation_copies(kv_cache_bytes(B, L, "bf16"))
        call = reference_torch_callable(x, n)
        out = call(0).float()
        t = time_callable(call, n, calls_per_graph=cpg, replays=reps)
        rec.us_median, rec.us_iqr = t["us_median"], t["us_iqr"]
        rec.tbps = rec.bytes / (rec.us_median * 1e-6) / 1e12
        rec.pct_copy = 100 * rec.tbps / bw
        rec.status = ACCURACY_PENDING  # (errors: fill_accuracy, after every timing)
        outputs.append((rec, out.cpu()))
    except Exception as e:
        rec.status = _error_status(e)
    return rec


def write_csv(recs: list[TimingRecord], path: str | os.PathLike[str]) -> None:
    """Write the records as CSV (`CSV_COLUMNS`) atomically (`mlalab.io.atomic_write`): readers and crashes never
    see a half-written file."""
    import csv

    if not all(isinstance(r, TimingRecord) for r in recs):
        raise TypeError("recs must be a list of TimingRecord")

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for r in recs:
                w.writerow(r.row())

    atomic_write(path, write)


def main() -> None:
    """Demo: the smoke suite on this GPU (or a clear message without one)."""
    if not torch.cuda.is_available():
        print("no GPU here: see data/timings/*.csv for the H200 measurements (python -m mlalab bench --recorded)")
        return
    run_suite("smoke")


if __name__ == "__main__":
    main()

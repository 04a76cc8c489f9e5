"""The schema of a recorded timing run (data/timings/*.csv): its columns, one row (`TimingRecord`), how the
``config`` cell is written and read back, and which cells mean "the backend's default configuration" — for today's
`KernelConfig` and for the runs recorded before its knobs were retired.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..io import atomic_write
from ..kernels import KernelConfig

__all__ = ["DATA_ROOT", "CSV_COLUMNS", "PROVENANCE_COLUMNS", "ACCURACY_PENDING", "TimingRecord", "write_csv",
           "config_cell", "parse_config", "RETIRED_KNOBS", "default_slot_counts", "is_default_config"]  # fmt: skip

#: data/ of this checkout: recorded GPU measurements (data/README.md)
DATA_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data")

CSV_COLUMNS = [
    "date", "gpu", "sm_count", "driver", "torch", "triton", "backend", "planner", "precision", "config",
    "batch", "kv_len", "q_len", "causal", "layout", "us_median", "us_iqr", "bytes", "tbps", "copy_tbps", "pct_copy",
    "floor_us", "err_vs_exact", "err_quant_emulated", "err_vs_emulated", "status",
]  # fmt: skip

#: The columns that say where and with what a table was measured (`mlalab.timing.gpu_info`); every GPU table of
#: data/ carries them.
PROVENANCE_COLUMNS = ("date", "gpu", "sm_count", "driver", "torch", "triton")

#: `TimingRecord.status` of a row timed whose accuracy columns the suite's second pass has not filled yet
ACCURACY_PENDING = "accuracy pending"


@dataclass
class TimingRecord:
    """One row of a timing CSV (`CSV_COLUMNS`; ``env`` holds the `PROVENANCE_COLUMNS`)."""

    backend: str
    planner: str
    precision: str
    config: str
    batch: int
    kv_len: int
    q_len: int = 1
    causal: bool = False  # speculative verification's causal mask (`DecodeCase.causal`)
    layout: str = "contiguous"
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
        d.update({k: env.get(k, "") for k in PROVENANCE_COLUMNS})
        return {k: d[k] for k in CSV_COLUMNS}


def write_csv(recs: list[TimingRecord], path: str | os.PathLike[str]) -> None:
    """Write the records as CSV (`CSV_COLUMNS`) atomically (`mlalab.io.atomic_write`): readers and crashes never
    see a half-written file."""
    if not all(isinstance(r, TimingRecord) for r in recs):
        raise TypeError("recs must be a list of TimingRecord")

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for r in recs:
                w.writerow(r.row())

    atomic_write(path, write)


def config_cell(opts: dict[str, Any], record: dict[str, Any] | None = None) -> str:
    """The ``config`` column: the options a backend was given (``k=v,...``, sorted), or, when the backend reports
    what ran (`mlalab.backends` ``info["record"]``), that record as compact JSON."""
    if not isinstance(opts, dict):
        raise TypeError(f"opts must be a dict, got {type(opts).__name__}")
    if record is None:
        return ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
    if not isinstance(record, dict):
        raise TypeError(f"record must be a dict, got {type(record).__name__}")
    return json.dumps(record, separators=(",", ":"))


def parse_config(s: object) -> dict[str, Any]:
    """Read a `config` cell of any recorded run: ``""``/NaN (the defaults of that run's commit) -> ``{}``;
    ``{json}`` (new runs) or ``k=v,...`` (old runs) -> the knobs; a ``name:`` prefix (an old sweep's variant) ->
    ``{"variant": name, ...}``; a bare word (e.g. ``bmm``) -> ``{"variant": word}``."""
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


#: Knobs of runs recorded before the kernel's experiments were deleted (tag ``experiments-2026-12``, docs/journal.md),
#: with the values that selected what the code does now (a path's own choice, ``None``, or the value it resolved to).
#: A recorded cell that names one of them with such a value is still a default configuration of its run.
RETIRED_KNOBS: dict[str, tuple[object, ...]] = {
    "hopper_variant": ("auto",),
    "hopper_stages": (None, 3),
    "hopper_refill_after_pv": (None, True),
    "hopper_q_first": (True,),
    "hopper_first_burst": (None,),
    "hopper_partials": ("auto",),
    "hopper_reduce": ("auto",),
    "hopper_ablate": ("none",),
    "hopper_warp_exchange": (False,),
    "hopper_merge_splits": (0,),
    "hopper_block": (64,),
    "hopper_warpgroups": (1,),
    "pdl_chain": (False,),
    "block_n": (64,),
    "num_warps": (8,),
    "num_stages": (2,),
    "transposed": (False,),
    "mma_fp16": (True,),
    "contiguous": (True,),
    "qk_tokens_m": (False,),
    "d_chunk": (0,),
    "chunk_pv": (True,),
}


def default_slot_counts(sm_count: int, q_len: int = 1) -> frozenset[int]:
    """The plan slots a row of `q_len` q rows a request may have run on with the Triton backend's default plan
    (`mlalab.backends.triton.make_callable`): the SMs times the CTAs an SM (1, or 2 where `ctas_per_sm` says so), over
    the CTAs a slot's q rows take (q_len over the rows a CTA runs side by side: 1, 2 or 4 dividing q_len)."""
    if isinstance(sm_count, bool) or not isinstance(sm_count, int) or sm_count < 1:
        raise ValueError(f"sm_count must be an int >= 1, got {sm_count!r}")
    if isinstance(q_len, bool) or not isinstance(q_len, int) or q_len < 1:
        raise ValueError(f"q_len must be an int >= 1, got {q_len!r}")
    ctas = {q_len // rows for rows in (1, 2, 4) if q_len % rows == 0}
    return frozenset(max(1, sm_count * per_sm // c) for per_sm in (1, 2) for c in ctas)


def is_default_config(cell: object, sm_count: int | None = None, q_len: int = 1) -> bool:
    """Whether a Triton `config` cell is the backend's default: an empty cell (that run's defaults), or JSON whose
    kernel knobs equal today's ``KernelConfig()`` (retired knobs: a value of `RETIRED_KNOBS`), with no plan knobs
    beyond ``num_cus`` (one of `default_slot_counts` for `sm_count` and `q_len`; a count the caller gave is recorded
    with ``slots_given`` and is a variant), the recorded ``plan`` digest and the kernel that ran (``ran``). ``k=v``
    cells (old runs wrote only the knobs they were given) and sweep variants (``name:``) are not defaults."""
    cfg = parse_config(cell)
    if not cfg:
        return True
    if "variant" in cfg or not isinstance(cell, str) or "{" not in cell:
        return False
    default = dataclasses.asdict(KernelConfig())
    for k, v in cfg.items():
        if k in default:
            if v != default[k]:
                return False
        elif k in RETIRED_KNOBS:
            if v not in RETIRED_KNOBS[k]:
                return False
        elif k not in ("num_cus", "plan", "ran"):
            return False
    return sm_count is None or "num_cus" not in cfg or int(cfg["num_cus"]) in default_slot_counts(int(sm_count), q_len)

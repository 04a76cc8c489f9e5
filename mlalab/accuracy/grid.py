"""An accuracy study as a grid of rows (case × fp8 format × KV scheme × Q scheme), each with a stable key, cut into
tasks that a serial loop, local processes or a Dask cluster evaluate.

A row's key is a hash of its full configuration (every `DecodeCase` field, the canonical scheme and format names,
the tolerance pairs) and the library version, so a table written by another grid or another version of mlalab never
matches. A task is one case and some of its rows: the case's inputs are drawn and its fp64 reference computed once
per task, each fake-quantized KV once per (format, KV scheme) and the Q schemes of one KV scheme decoded together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import __version__
from ..config import DecodeCase
from ..quant import get_fp8_format, get_kv_scheme, get_q_scheme
from .metrics import (
    DEFAULT_TOLERANCES,
    check_tolerances,
    config_columns,
    decode_q_variants,
    evaluate_prepared,
    prepare,
)

__all__ = ["GridRow", "Grid", "Task", "run_task", "failed_row", "COMPETITION_SHAPES", "parse_shapes"]

#: The competition's 12 decode shapes (batch, kv_len).
COMPETITION_SHAPES: tuple[tuple[int, int], ...] = tuple((b, L) for b in (4, 8, 16, 32, 64, 128) for L in (1024, 8192))


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """``"competition,256x1024"`` -> the 12 competition shapes and (256, 1024); items are ``BxL`` or
    ``competition``, comma-separated, duplicates dropped (first one kept)."""
    if not isinstance(text, str):
        raise TypeError(f"shapes must be a str, got {type(text).__name__}")
    out: list[tuple[int, int]] = []
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise ValueError(f"shapes must be comma-separated BxL items or 'competition', got {text!r}")
    for t in items:
        if t == "competition":
            out.extend(COMPETITION_SHAPES)
            continue
        b, sep, L = t.lower().partition("x")
        if not sep or not b.isdigit() or not L.isdigit() or int(b) < 1 or int(L) < 1:
            raise ValueError(f"shape {t!r}: expected BATCHxKV_LEN with positive integers, e.g. 4x1024")
        out.append((int(b), int(L)))
    return tuple(dict.fromkeys(out))


def _case_json(case: DecodeCase) -> dict[str, Any]:
    """The case as a row key hashes it. ``causal`` appears only when set, so the keys of rows recorded before the
    field existed (every one non-causal) stay what they were and a study resumes across the change."""
    d = dataclasses.asdict(case)
    d["dist"] = case.dist.value
    d["kv_lens"] = list(case.kv_lens)
    if not case.causal:
        del d["causal"]
    return d


@dataclass(frozen=True)
class GridRow:
    """One configuration of the study (names are canonical: as `get_q_scheme(...).name` spells them)."""

    case: DecodeCase
    fp8_format: str
    kv_scheme: str
    q_scheme: str


@dataclass(frozen=True)
class Task:
    """One case and some of its rows (grouped by (format, KV scheme) so Q schemes decode together)."""

    case: DecodeCase
    rows: tuple[GridRow, ...]
    keys: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.keys) or any(r.case != self.case for r in self.rows):
            raise ValueError("a Task needs one key per row, and every row of its own case")


class Grid:
    """The rows of a study and their keys, in order: case, fp8 format, KV scheme, Q scheme."""

    def __init__(
        self,
        cases: DecodeCase | Sequence[DecodeCase],
        q_schemes: str | Sequence[str] = ("bf16",),
        kv_schemes: str | Sequence[str] = ("bf16",),
        fp8_formats: str | Sequence[str] = ("e4m3fn",),
        tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    ) -> None:
        cs = (cases,) if isinstance(cases, DecodeCase) else tuple(cases)
        if not cs or not all(isinstance(c, DecodeCase) for c in cs):
            raise TypeError("cases must be a DecodeCase or a non-empty sequence of them")
        if len(set(cs)) != len(cs):
            raise ValueError("cases must not repeat a case (each row must be unique)")
        qn, kn = _names(q_schemes, "q_schemes"), _names(kv_schemes, "kv_schemes")
        fn = _names(fp8_formats, "fp8_formats")
        fmts = tuple(dict.fromkeys(get_fp8_format(f).name for f in fn))
        # canonical names per format, every name validated before any work
        self._q = {f: tuple(dict.fromkeys(get_q_scheme(n, f).name for n in qn)) for f in fmts}
        self._kv = {f: tuple(dict.fromkeys(get_kv_scheme(n, f).name for n in kn)) for f in fmts}
        self.cases, self.fp8_formats = cs, fmts
        self.q_schemes, self.kv_schemes = self._q[fmts[0]], self._kv[fmts[0]]
        self.tolerances = check_tolerances(tolerances)
        self.version = __version__  # part of every key
        self.rows: tuple[GridRow, ...] = tuple(
            GridRow(c, f, k, q) for c in cs for f in fmts for k in self._kv[f] for q in self._q[f]
        )
        self.keys: tuple[str, ...] = tuple(self.key(r) for r in self.rows)
        self._index = {k: i for i, k in enumerate(self.keys)}

    def __len__(self) -> int:
        return len(self.rows)

    def key(self, row: GridRow) -> str:
        """Hash of the row's full configuration, the tolerances and the mlalab version (20 hex digits)."""
        spec = {
            "case": _case_json(row.case),
            "fp8_format": row.fp8_format,
            "kv_scheme": row.kv_scheme,
            "q_scheme": row.q_scheme,
            "tolerances": [list(t) for t in self.tolerances],
            "mlalab": self.version,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]

    def index(self, key: str) -> int | None:
        """Position of the row with this key, or None if the key is not in this grid."""
        return self._index.get(key)

    def tasks(self, keys: Iterable[str] | None = None, chunk_rows: int | None = None) -> list[Task]:
        """Tasks covering the rows with these keys (default: every row): one per case, or pieces of at most
        `chunk_rows` rows cut along (format, KV scheme) groups where possible."""
        bad = isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
        if chunk_rows is not None and bad:
            raise ValueError(f"chunk_rows must be a positive int or None, got {chunk_rows!r}")
        want = set(self.keys) if keys is None else set(keys)
        unknown = want - set(self.keys)
        if unknown:
            raise ValueError(f"{len(unknown)} keys are not rows of this grid")
        by_case: dict[DecodeCase, list[tuple[GridRow, str]]] = {}
        for r, k in zip(self.rows, self.keys):
            if k in want:
                by_case.setdefault(r.case, []).append((r, k))
        out = []
        for case, items in by_case.items():
            limit = chunk_rows or len(items)
            groups: list[list[tuple[GridRow, str]]] = []
            for it in items:  # (format, KV scheme) groups, each split at `limit`
                g = groups[-1] if groups else None
                same = g is not None and (g[0][0].fp8_format, g[0][0].kv_scheme) == (it[0].fp8_format, it[0].kv_scheme)
                if same and len(g) < limit:  # type: ignore[arg-type]
                    g.append(it)  # type: ignore[union-attr]
                else:
                    groups.append([it])
            chunk: list[tuple[GridRow, str]] = []
            for g in groups:  # pack whole groups into chunks of at most `limit` rows
                if chunk and len(chunk) + len(g) > limit:
                    out.append(Task(case, tuple(r for r, _ in chunk), tuple(k for _, k in chunk)))
                    chunk = []
                chunk.extend(g)
            if chunk:
                out.append(Task(case, tuple(r for r, _ in chunk), tuple(k for _, k in chunk)))
        return out

    def fp64_gflop(self) -> float:
        """fp64 work of the whole grid in GFLOP: scores and values of the reference and of every stacked decode
        (one per case, format and KV scheme, covering all Q schemes), 2 FLOP per multiply-add."""
        total = 0.0
        for c in self.cases:
            cfg = c.config
            per_head = 2.0 * c.q_len * sum(c.kv_lens) * (cfg.qk_dim + cfg.v_dim)  # one head, one decode
            decodes = 1 + sum(len(self._kv[f]) * len(self._q[f]) for f in self.fp8_formats)
            total += per_head * cfg.num_heads * decodes
        return total / 1e9


def _names(names: str | Sequence[str], kind: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    out = tuple(names)
    if not out or not all(isinstance(n, str) and n for n in out):
        raise ValueError(f"{kind} must name at least one entry, each a non-empty str")
    return out


def _error_text(e: BaseException) -> str:
    last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return f"{type(e).__name__}: {e}{where}".replace("\n", " ")


def failed_row(row: GridRow, key: str, error: str) -> dict[str, Any]:
    """The record of a row whose evaluation raised: its configuration, the error, no metrics."""
    rec = config_columns(row.case, row.q_scheme, row.kv_scheme, row.fp8_format)
    rec.update({"row_key": key, "error": error})
    return rec


def run_task(
    task: Task, tolerances: Sequence[tuple[float, float]], device: str | torch.device = "cpu"
) -> list[dict[str, Any]]:
    """Evaluate a task's rows on `device`; a row whose evaluation raises is returned with its error (``error``
    column) instead of its metrics. Each record carries ``row_key``, ``error`` ("" when fine) and ``eval_seconds``
    (the task's wall time shared over its rows)."""
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task, got {type(task).__name__}")
    tols = check_tolerances(tolerances)
    t0 = time.perf_counter()
    recs: list[dict[str, Any]] = []
    try:
        p = prepare(task.case, device)
    except Exception as e:  # the whole task fails: every row says why
        err = _error_text(e)
        recs = [failed_row(r, k, err) for r, k in zip(task.rows, task.keys)]
    else:
        q_cache: dict[tuple[str, str], tuple[torch.Tensor, dict[str, float]]] = {}
        groups: dict[tuple[str, str], list[tuple[GridRow, str]]] = {}
        for r, k in zip(task.rows, task.keys):
            groups.setdefault((r.fp8_format, r.kv_scheme), []).append((r, k))
        for (f, kv), items in groups.items():
            try:
                for r, _ in items:
                    if (r.q_scheme, f) not in q_cache:
                        sch = get_q_scheme(r.q_scheme, f)
                        q_cache[(r.q_scheme, f)] = (sch.fake_quant(p.inputs.q), sch.range_stats(p.inputs.q))
                kd = get_kv_scheme(kv, f).fake_quant(p.kv)
                decoded = decode_q_variants(p, [q_cache[(r.q_scheme, f)][0] for r, _ in items], kd)
                group_recs = []
                for (r, k), dec in zip(items, decoded):
                    qd, qst = q_cache[(r.q_scheme, f)]
                    rec = evaluate_prepared(
                        p, r.q_scheme, kv, f, tolerances=tols, kv_deq=kd, q_deq=qd, q_stats=qst, decoded=dec
                    )
                    rec.update({"row_key": k, "error": ""})
                    group_recs.append(rec)
                recs.extend(group_recs)
            except Exception as e:  # this group fails; the task's other groups still count
                err = _error_text(e)
                recs.extend(failed_row(r, k, err) for r, k in items)
    dt = (time.perf_counter() - t0) / max(len(recs), 1)
    for rec in recs:
        rec["eval_seconds"] = dt
    return recs

"""The metadata doctor: check split-KV metadata (a `WorkPlan`, or aiter's tensors dumped from a real run) against the
batch it is used with, and name every problem in words.

Input (docs/splitkv.md, "The doctor's file"): a `WorkPlan` with the batch's ``qo_indptr`` / ``kv_indptr``, or a dict
(in memory, or a file written by ``torch.save``) holding aiter's five metadata tensors under their names
(``work_indptr``, ``work_info`` (or aiter's buffer name ``work_info_set``), ``reduce_indptr``, ``reduce_final_map``,
``reduce_partial_map``) plus ``qo_indptr`` and ``kv_indptr``, and optionally ``kv_last_page_len``, ``page_size``,
``num_kv_splits`` and ``n_partial_rows`` (the partial buffer's rows, to check partial ids against it).
`save_metadata` writes such a file; `mlalab.backends.aiter_dump` writes one from aiter's buffers on ROCm.

The checks are `mlalab.plan.invariants.check_metadata` (the same ones `WorkPlan.validate` raises on); the doctor
reports all findings, grouped by kind, with the known bug patterns named (a plan built for other lengths than the
batch, metadata for q_len 1 used with q_len > 1, partial ids of a stale buffer).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checks import check_indptr
from ..io import atomic_write
from .invariants import FINDING_KINDS, Finding, check_metadata
from .workplan import WorkPlan

__all__ = ["doctor", "DoctorReport", "DoctorInputError", "save_metadata", "load_metadata", "metadata_dict",
           "METADATA_KEYS", "BATCH_KEYS", "OPTIONAL_KEYS"]  # fmt: skip

METADATA_KEYS = ("work_indptr", "work_info", "reduce_indptr", "reduce_final_map", "reduce_partial_map")
BATCH_KEYS = ("qo_indptr", "kv_indptr")
OPTIONAL_KEYS = ("kv_last_page_len", "page_size", "num_kv_splits", "n_partial_rows")

#: what each finding kind means for a user, in one line (the report's headings)
KIND_TITLES = {
    "structure": "malformed metadata",
    "other_lengths": "plan built for other KV lengths than this batch",
    "field": "bad field values",
    "kv_range": "works beyond their request's KV",
    "q_rows": "q rows missing or outside qo_indptr",
    "uncovered": "KV tokens not covered",
    "covered_twice": "KV tokens covered twice",
    "kv_offset": "wrong kv_offset",
    "split": "split / unsplit requests inconsistent",
    "partial_range": "partial ids out of range (stale buffer?)",
    "partial_overlap": "partial rows written twice",
    "reduce": "reduce maps inconsistent",
}
assert set(KIND_TITLES) == set(FINDING_KINDS)


class DoctorInputError(ValueError):
    """The doctor's input cannot be read as metadata (the CLI's exit code 2)."""


@dataclass(frozen=True)
class DoctorReport:
    """Every finding for one piece of metadata, plus what was checked."""

    findings: list[Finding]
    source: str
    batch: int
    n_work: int
    num_cus: int
    checked: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.findings

    def counts(self) -> dict[str, int]:
        """Findings per kind, in `FINDING_KINDS` order."""
        c = Counter(f.kind for f in self.findings)
        return {k: c[k] for k in FINDING_KINDS if c[k]}

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "clean": self.clean, "batch": self.batch, "n_work": self.n_work,
                "num_cus": self.num_cus, "checked": dict(self.checked), "counts": self.counts(),
                "findings": [f.to_dict() for f in self.findings]}  # fmt: skip

    def text(self, limit: int = 5) -> str:
        """A readable report: a verdict line, then per kind its count and the first `limit` findings."""
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        head = f"{self.source}: {self.n_work} works on {self.num_cus} CUs for {self.batch} requests"
        if self.clean:
            return f"{head}: clean (every KV token covered once, reduce maps and partial rows consistent)"
        lines = [f"{head}: {len(self.findings)} finding(s)"]
        for kind, n in self.counts().items():
            lines.append(f"- {KIND_TITLES[kind]} ({n}):")
            shown = [f for f in self.findings if f.kind == kind][:limit]
            lines += [f"    {f.message}" for f in shown]
            if n > len(shown):
                lines.append(f"    ... {n - len(shown)} more")
        return "\n".join(lines)


def metadata_dict(
    plan: WorkPlan, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, *, kv_last_page_len: torch.Tensor | None = None
) -> dict[str, Any]:
    """The doctor's dict for `plan` used with the batch ``(qo_indptr, kv_indptr)`` (CPU tensors)."""
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    check_indptr("qo_indptr", qo_indptr)
    check_indptr("kv_indptr", kv_indptr, length=qo_indptr.numel())
    d: dict[str, Any] = {k: v.to("cpu").clone() for k, v in plan.tensors().items()}
    d["qo_indptr"], d["kv_indptr"] = qo_indptr.to("cpu").clone(), kv_indptr.to("cpu").clone()
    d["page_size"], d["n_partial_rows"] = plan.page_size, plan.n_partial_rows
    if kv_last_page_len is not None:
        d["kv_last_page_len"] = kv_last_page_len.to("cpu").clone()
    return d


def save_metadata(path: str | os.PathLike[str], metadata: Mapping[str, Any]) -> Path:
    """Write a doctor's dict with ``torch.save``, atomically (tensors moved to the CPU). Checks the keys first."""
    d = _normalise(metadata)
    return atomic_write(path, lambda tmp: torch.save(d, tmp))


def load_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a doctor's file; `DoctorInputError` if it is missing, not a ``torch.save`` dict, or lacks a key."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    p = Path(path)
    if not p.is_file():
        raise DoctorInputError(f"{p}: no such file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (any unpickling failure means: not our format)
        raise DoctorInputError(f"{p}: not a torch.save file of tensors ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(obj, Mapping):
        raise DoctorInputError(f"{p}: holds a {type(obj).__name__}, expected a dict of metadata tensors")
    return _normalise(obj, where=str(p))


def _normalise(m: Mapping[str, Any], where: str = "metadata") -> dict[str, Any]:
    if not isinstance(m, Mapping):
        raise DoctorInputError(f"{where} must be a dict of metadata tensors, got {type(m).__name__}")
    d = dict(m)
    if "work_info" not in d and "work_info_set" in d:  # aiter's buffer name
        d["work_info"] = d.pop("work_info_set")
    missing = [k for k in METADATA_KEYS + BATCH_KEYS if k not in d]
    if missing:
        raise DoctorInputError(f"{where}: missing {', '.join(missing)} (needs {', '.join(METADATA_KEYS + BATCH_KEYS)})")
    out: dict[str, Any] = {}
    for k in METADATA_KEYS + BATCH_KEYS + ("kv_last_page_len",):
        if k not in d:
            continue
        t = d[k]
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise DoctorInputError(f"{where}: {k} must be an int32/int64 tensor, got {what}")
        out[k] = t.detach().to("cpu")
    for k in ("page_size", "num_kv_splits", "n_partial_rows"):
        if d.get(k) is None:
            continue
        v = d[k]
        v = int(v.item()) if isinstance(v, torch.Tensor) and v.numel() == 1 else v
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if k == "page_size" else 0):
            raise DoctorInputError(f"{where}: {k} must be a non-negative int (page_size >= 1), got {v!r}")
        out[k] = v
    unknown = sorted(set(d) - set(METADATA_KEYS + BATCH_KEYS + OPTIONAL_KEYS))
    if unknown:
        raise DoctorInputError(
            f"{where}: unknown keys {unknown}; valid: {', '.join(METADATA_KEYS + BATCH_KEYS + OPTIONAL_KEYS)}"
        )
    return out


def _batch_tokens(kvp: torch.Tensor, page_size: int, last: torch.Tensor | None) -> list[int] | None:
    pages = (kvp[1:] - kvp[:-1]).to(torch.int64)
    if page_size == 1:
        return pages.tolist()
    if last is None or last.numel() != pages.numel():
        return None  # token counts unknown: kv_offset cannot be checked
    return torch.where(pages > 0, (pages - 1) * page_size + last.to(torch.int64), 0).tolist()


def doctor(
    source: WorkPlan | Mapping[str, Any] | str | os.PathLike[str],
    qo_indptr: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    *,
    kv_last_page_len: torch.Tensor | None = None,
) -> DoctorReport:
    """Check metadata against the batch it is used with and return every finding (`DoctorReport`).

    `source`: a `WorkPlan` (then `qo_indptr` and `kv_indptr` are the batch: required), a doctor's dict, or the path
    of a file holding one (the batch is in the dict). `DoctorInputError` for input that cannot be read.
    """
    if isinstance(source, WorkPlan):
        if qo_indptr is None or kv_indptr is None:
            raise ValueError("doctor(plan, qo_indptr, kv_indptr): a WorkPlan needs the batch it is used with")
        d = metadata_dict(source, qo_indptr, kv_indptr, kv_last_page_len=kv_last_page_len)
        name, pad = f"WorkPlan {source.planner!r}", True
    else:
        if qo_indptr is not None or kv_indptr is not None:
            raise ValueError("a dict or file carries its own qo_indptr / kv_indptr: do not pass them")
        if isinstance(source, (str, os.PathLike)):
            d, name = load_metadata(source), str(source)
        elif isinstance(source, Mapping):
            d, name = _normalise(source), "metadata"
        else:
            raise TypeError(f"source must be a WorkPlan, a dict or a path, got {type(source).__name__}")
        pad = False  # aiter leaves the pad dword undefined
    ps = int(d.get("page_size", 1))
    lens = _batch_tokens(d["kv_indptr"].flatten(), ps, d.get("kv_last_page_len"))
    findings = check_metadata(*(d[k] for k in METADATA_KEYS + BATCH_KEYS), n_partial_rows=d.get("n_partial_rows"),
                              kv_lens=lens, page_size=ps, check_pad=pad)  # fmt: skip
    wip = d["work_indptr"].flatten()
    return DoctorReport(
        findings=findings,
        source=name,
        batch=max(d["qo_indptr"].numel() - 1, 0),
        n_work=int(wip[-1]) if wip.numel() else 0,
        num_cus=max(wip.numel() - 1, 0),
        checked={
            "kv_offset": lens is not None,
            "partial_buffer_size": d.get("n_partial_rows"),
            "page_size": ps,
            "num_kv_splits": d.get("num_kv_splits"),
        },  # fmt: skip
    )

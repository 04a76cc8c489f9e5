"""Our work map vs aiter's: read aiter's metadata tensors into a `WorkPlan` and diff two plans.

`mlalab.plan` re-implements aiter's planners (intra-batch v1.0, fast v1.2). On ROCm the `aiter` backend can
hand back the metadata aiter itself wrote (`AiterDecoder.aiter_plan`); `plan_from_aiter_buffers` trims those
over-sized buffers to the entries that are defined, and `compare_plans` names every difference.

Only defined entries are compared (docs/aiter.md, "The metadata"): the first ``work_indptr[-1]`` rows of `work_info`
(columns 0–6; column 7 is padding), `reduce_indptr`, the `reduce_final_map` rows of tiles with at least one
partial (aiter leaves the others unwritten), and the first ``reduce_indptr[-1]`` entries of
`reduce_partial_map`. Pure torch on the CPU; nothing here imports aiter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..plan import WorkPlan

__all__ = ["PlanDiff", "compare_plans", "plan_from_aiter_buffers", "defined_entries", "WORK_INFO_FIELDS"]

WORK_INFO_FIELDS = ("batch_idx", "partial_qo_loc", "qo_start", "qo_end", "kv_start", "kv_end", "kv_offset", "pad")
_PLAN_TENSORS = ("work_indptr", "work_info", "reduce_indptr", "reduce_final_map", "reduce_partial_map")


@dataclass(frozen=True)
class PlanDiff:
    """The differences between two plans: an empty `differences` list means identical defined entries.

    `differences` names each mismatch (at most `limit` of them); `count` is the total number found."""

    differences: tuple[str, ...]
    count: int
    ours: str = ""
    theirs: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.count == 0

    def __str__(self) -> str:
        head = f"plans {self.ours!r} vs {self.theirs!r}: "
        if self.identical:
            return head + "identical"
        more = f" (showing {len(self.differences)})" if len(self.differences) < self.count else ""
        return head + f"{self.count} difference(s){more}\n  " + "\n  ".join(self.differences)


def defined_entries(plan: Any) -> dict[str, torch.Tensor]:
    """The entries of a plan that are defined (see the module docstring), as int64 CPU tensors."""
    missing = [n for n in _PLAN_TENSORS if not isinstance(getattr(plan, n, None), torch.Tensor)]
    if missing:
        raise TypeError(f"plan must be a WorkPlan (tensors {', '.join(_PLAN_TENSORS)}); missing {missing}")
    wi = plan.work_indptr.to("cpu", torch.int64).flatten()
    info = plan.work_info.to("cpu", torch.int64)
    ri = plan.reduce_indptr.to("cpu", torch.int64).flatten()
    fm = plan.reduce_final_map.to("cpu", torch.int64)
    pm = plan.reduce_partial_map.to("cpu", torch.int64).flatten()
    if wi.numel() < 1 or ri.numel() < 1:
        raise ValueError("work_indptr and reduce_indptr must have at least one entry")
    if info.dim() != 2 or info.shape[1] != 8:
        raise ValueError(f"work_info must be (n_work, 8), got {tuple(info.shape)}")
    if fm.dim() != 2 or fm.shape[1] != 2 or fm.shape[0] < ri.numel() - 1:
        raise ValueError(f"reduce_final_map must be (T, 2) with T >= {ri.numel() - 1}, got {tuple(fm.shape)}")
    n_work, n_partial = int(wi[-1]), int(ri[-1])
    if not 0 <= n_work <= info.shape[0]:
        raise ValueError(f"work_indptr[-1] = {n_work} but work_info has {info.shape[0]} rows")
    if not 0 <= n_partial <= pm.numel():
        raise ValueError(f"reduce_indptr[-1] = {n_partial} but reduce_partial_map has {pm.numel()} entries")
    counts = ri[1:] - ri[:-1]
    return {
        "work_indptr": wi,
        "work_info": info[:n_work, :7],
        "reduce_indptr": ri,
        "reduce_final_map": fm[: ri.numel() - 1],
        "reduce_tile_written": counts >= 1,
        "reduce_partial_map": pm[:n_partial],
    }


def _cu_of_work(work_indptr: torch.Tensor, w: int) -> int:
    return int(torch.searchsorted(work_indptr[1:], torch.tensor(w), right=True))


def compare_plans(ours: Any, theirs: Any, *, limit: int = 20) -> PlanDiff:
    """Diff two `WorkPlan`s (e.g. our re-implemented planner vs aiter's metadata for the same inputs).

    Compares the scalar fields (`num_cus`, `batch`, `page_size`) and every defined tensor entry; each
    difference is named with its position (CU, work row and field, reduce tile). Work order matters: it is
    what a persistent workgroup executes in sequence."""
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    a, b = defined_entries(ours), defined_entries(theirs)
    diffs: list[str] = []
    count = 0

    def add(msg: str) -> None:
        nonlocal count
        count += 1
        if len(diffs) < limit:
            diffs.append(msg)

    for name in ("num_cus", "batch", "page_size"):
        va, vb = getattr(ours, name, None), getattr(theirs, name, None)
        if va is not None and vb is not None and int(va) != int(vb):
            add(f"{name}: {va} vs {vb}")

    wa, wb = a["work_indptr"], b["work_indptr"]
    if wa.numel() != wb.numel():
        add(f"work_indptr: {wa.numel() - 1} vs {wb.numel() - 1} CUs")
    n = min(wa.numel(), wb.numel())
    for c in torch.nonzero(wa[:n] != wb[:n]).flatten().tolist():
        add(f"work_indptr[{c}] (start of CU {c}): {int(wa[c])} vs {int(wb[c])}")

    ia, ib = a["work_info"], b["work_info"]
    if ia.shape[0] != ib.shape[0]:
        add(f"number of works: {ia.shape[0]} vs {ib.shape[0]}")
    m = min(ia.shape[0], ib.shape[0])
    for w, f in torch.nonzero(ia[:m] != ib[:m]).tolist():
        add(
            f"work {w} (CU {_cu_of_work(wa, w)}) {WORK_INFO_FIELDS[f]}: {int(ia[w, f])} vs {int(ib[w, f])} "
            f"(request {int(ia[w, 0])} vs {int(ib[w, 0])})"
        )

    ra, rb = a["reduce_indptr"], b["reduce_indptr"]
    if ra.numel() != rb.numel():
        add(f"reduce tiles: {ra.numel() - 1} vs {rb.numel() - 1}")
    t = min(ra.numel(), rb.numel())
    for i in torch.nonzero(ra[:t] != rb[:t]).flatten().tolist():
        add(f"reduce_indptr[{i}]: {int(ra[i])} vs {int(rb[i])}")

    written = a["reduce_tile_written"][: t - 1] & b["reduce_tile_written"][: t - 1]
    fa, fb = a["reduce_final_map"][: t - 1], b["reduce_final_map"][: t - 1]
    for i in torch.nonzero(written & (fa != fb).any(1)).flatten().tolist():
        add(f"reduce_final_map[{i}] (tile {i} output rows): {fa[i].tolist()} vs {fb[i].tolist()}")

    pa, pb = a["reduce_partial_map"], b["reduce_partial_map"]
    if pa.numel() != pb.numel():
        add(f"partials: {pa.numel()} vs {pb.numel()}")
    p = min(pa.numel(), pb.numel())
    for i in torch.nonzero(pa[:p] != pb[:p]).flatten().tolist():
        add(f"reduce_partial_map[{i}]: {int(pa[i])} vs {int(pb[i])}")

    summary = {
        "works": (int(ia.shape[0]), int(ib.shape[0])),
        "busy_cus": (int(((wa[1:] - wa[:-1]) > 0).sum()), int(((wb[1:] - wb[:-1]) > 0).sum())),
        "partials": (int(pa.numel()), int(pb.numel())),
    }
    return PlanDiff(
        tuple(diffs),
        count,
        str(getattr(ours, "planner", "ours")),
        str(getattr(theirs, "planner", "theirs")),
        summary,
    )


def plan_from_aiter_buffers(
    buffers: Mapping[str, torch.Tensor],
    *,
    num_cus: int,
    batch: int,
    planner: str,
    page_size: int = 1,
    kv_lens: tuple[int, ...] = (),
) -> WorkPlan:
    """A `WorkPlan` from aiter's metadata buffers (device tensors as `get_mla_metadata_v1` filled them): copied
    to the CPU (the originals stay at their addresses) and trimmed to their defined entries."""
    from ..plan import WorkPlan

    for name in ("work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map", "reduce_partial_map"):
        if not isinstance(buffers.get(name), torch.Tensor):
            raise ValueError(f"buffers[{name!r}] must be a tensor")
    wi = buffers["work_indptr"].to("cpu", torch.int32).clone()
    ri = buffers["reduce_indptr"].to("cpu", torch.int32).clone()
    n_work, n_tiles, n_partial = int(wi[-1]), ri.numel() - 1, int(ri[-1])
    info = buffers["work_info_set"].to("cpu", torch.int32)[:n_work].clone()
    info[:, 7] = 0  # padding dword: undefined in aiter's buffer
    fm = buffers["reduce_final_map"].to("cpu", torch.int32)[:n_tiles].clone()
    counts = (ri[1:] - ri[:-1]).to(torch.int64)
    fm[counts < 1] = 0  # rows aiter never writes (unsplit tiles in fast mode) hold garbage
    pm = buffers["reduce_partial_map"].to("cpu", torch.int32)[:n_partial].clone()
    split = info[:, 1] >= 0  # partial rows used: the end of the furthest partial slot
    rows = info[split, 1].to(torch.int64) + (info[split, 3] - info[split, 2]).to(torch.int64)
    return WorkPlan(
        work_indptr=wi,
        work_info=info,
        reduce_indptr=ri,
        reduce_final_map=fm,
        reduce_partial_map=pm,
        num_cus=num_cus,
        batch=batch,
        page_size=page_size,
        planner=planner,
        n_partial_rows=int(rows.max()) if rows.numel() else 0,
        kv_lens=tuple(int(n) for n in kv_lens),
    )

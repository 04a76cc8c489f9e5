"""The invariants of split-KV metadata in aiter's v1 layout, checked all at once and named in words.

`check_metadata` takes the five metadata tensors plus the batch they are used with (``qo_indptr``, ``kv_indptr``) and
returns every `Finding`, not only the first: `WorkPlan.validate` raises the first one, the doctor
(`mlalab.plan.doctor`) reports them all. The contract is the one documented on `WorkPlan`:

* every (request, KV position) is covered by exactly one work (no gap, no overlap, nothing beyond the request's KV);
* every work covers exactly its request's q rows (``qo_indptr``);
* a request with one work writes its output directly (``partial_qo_loc = -1``) and is not merged; a request with
  several works writes partial rows and is merged by exactly one reduce tile listing exactly those rows;
* partial rows of different works never overlap and lie inside the partial buffer (when its size is known);
* ``kv_offset`` = KV tokens of the request after the work's range (when the token counts are known); ``pad = 0``.

Finding kinds: ``structure`` (indptrs or shapes malformed: nothing else is checked), ``other_lengths`` (the works
describe another batch's KV lengths), ``kv_range`` (a work outside its request's KV), ``uncovered``,
``covered_twice``, ``q_rows``, ``partial_range``, ``partial_overlap``, ``split`` (split/unsplit inconsistent),
``reduce``, ``kv_offset``, ``field`` (pad, batch_idx, partial_qo_loc < -1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

__all__ = ["Finding", "FINDING_KINDS", "check_metadata"]

FINDING_KINDS = (
    "structure",
    "other_lengths",
    "field",
    "kv_range",
    "q_rows",
    "uncovered",
    "covered_twice",
    "kv_offset",
    "split",
    "partial_range",
    "partial_overlap",
    "reduce",
)


@dataclass(frozen=True)
class Finding:
    """One broken invariant: its kind (`FINDING_KINDS`), a sentence naming it, and where (request / work / first KV
    position and how many positions, when they apply)."""

    kind: str
    message: str
    request: int | None = None
    work: int | None = None
    first: int | None = None
    count: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _ints(t: torch.Tensor) -> list:
    return t.to("cpu", torch.int64).tolist()


def _structure(name: str, v: list[int], n_last: int | None) -> str | None:
    if not v or v[0] != 0:
        return f"{name} must start at 0"
    bad = next((i for i in range(1, len(v)) if v[i] < v[i - 1]), None)
    if bad is not None:
        return f"{name} must be non-decreasing ({name}[{bad}] = {v[bad]} < {v[bad - 1]})"
    if n_last is not None and v[-1] != n_last:
        return f"{name}[-1] = {v[-1]} but the table it indexes has {n_last} rows"
    return None


def check_metadata(
    work_indptr: torch.Tensor,
    work_info: torch.Tensor,
    reduce_indptr: torch.Tensor,
    reduce_final_map: torch.Tensor,
    reduce_partial_map: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    n_partial_rows: int | None = None,
    kv_lens: Sequence[int] | None = None,
    page_size: int = 1,
    check_pad: bool = True,
) -> list[Finding]:
    """Every broken invariant of the metadata for the batch ``(qo_indptr, kv_indptr)``; ``[]`` when it is sound.

    `n_partial_rows` (rows of the partial buffer) and `kv_lens` (tokens per request, for ``kv_offset``) are checked
    when given. Only ``work_info[:work_indptr[-1]]`` is read (aiter's buffers are larger than the plan), and
    ``reduce_final_map`` only for tiles the reduce runs; ``check_pad=False`` skips the pad dword (aiter leaves it
    undefined).
    """
    for name, t in (
        ("work_indptr", work_indptr),
        ("work_info", work_info),
        ("reduce_indptr", reduce_indptr),
        ("reduce_final_map", reduce_final_map),
        ("reduce_partial_map", reduce_partial_map),
        ("qo_indptr", qo_indptr),
        ("kv_indptr", kv_indptr),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    out: list[Finding] = []
    qo, kvp = _ints(qo_indptr.flatten()), _ints(kv_indptr.flatten())
    for name, v in (("qo_indptr", qo), ("kv_indptr", kvp)):
        msg = _structure(name, v, None)
        if msg:
            return [Finding("structure", msg)]
    if len(qo) != len(kvp):
        return [Finding("structure", f"qo_indptr has {len(qo)} entries, kv_indptr {len(kvp)}: not the same batch")]
    B = len(qo) - 1
    wip = _ints(work_indptr.flatten())
    if work_info.dim() != 2 or work_info.shape[1] != 8:
        return [Finding("structure", f"work_info must be (n, 8), got {tuple(work_info.shape)}")]
    msg = _structure("work_indptr", wip, None)
    if msg is None and wip[-1] > work_info.shape[0]:
        msg = f"work_indptr[-1] = {wip[-1]} but work_info has only {work_info.shape[0]} rows"
    if msg:
        return [Finding("structure", msg)]
    works = _ints(work_info[: wip[-1]])
    rip = _ints(reduce_indptr.flatten())
    fmap = _ints(reduce_final_map.reshape(-1, 2)) if reduce_final_map.numel() % 2 == 0 else None
    pmap = _ints(reduce_partial_map.flatten())
    msg = _structure("reduce_indptr", rip, None)
    if msg is None and rip[-1] > len(pmap):
        msg = f"reduce_indptr[-1] = {rip[-1]} > reduce_partial_map size {len(pmap)}"
    if msg is None and (fmap is None or len(fmap) < len(rip) - 1):
        msg = f"reduce_final_map must hold (start, end) for each of the {len(rip) - 1} reduce tiles"
    if msg:
        return [Finding("structure", msg)]
    lens = list(kv_lens) if kv_lens else None
    if lens is not None and len(lens) != B:
        return [Finding("structure", f"kv_lens has {len(lens)} entries for {B} requests")]

    per_req: list[list[tuple[int, int, int, int]]] = [[] for _ in range(B)]  # (ks, ke, slot, work), clipped
    rows_used: list[tuple[int, int, int]] = []
    for w, (b, slot, qs, qe, ks, ke, off, pad) in enumerate(works):
        if not 0 <= b < B:
            out.append(Finding("field", f"work {w}: batch_idx {b} out of range [0, {B})", work=w))
            continue
        if check_pad and pad != 0:
            out.append(Finding("field", f"work {w}: pad must be 0, got {pad}", request=b, work=w))
        if slot < -1:
            out.append(Finding("field", f"work {w}: partial_qo_loc {slot} < -1", request=b, work=w))
        if (qs, qe) != (qo[b], qo[b + 1]):
            if qo[b] <= qs < qe <= qo[b + 1]:
                miss = (qo[b + 1] - qo[b]) - (qe - qs)
                text = (
                    f"work {w}: computes q rows [{qs}, {qe}) but request {b} has rows [{qo[b]}, {qo[b + 1]}): "
                    f"{miss} q row(s) missing (metadata for q_len {qe - qs} used with q_len {qo[b + 1] - qo[b]}?)"
                )
            else:
                text = f"work {w}: q rows [{qs}, {qe}) lie outside request {b}'s [{qo[b]}, {qo[b + 1]}) (qo_indptr)"
            out.append(Finding("q_rows", text, request=b, work=w))
        lo, hi = kvp[b], kvp[b + 1]
        if ke < ks:
            out.append(Finding("kv_range", f"work {w}: kv_end {ke} < kv_start {ks}", request=b, work=w))
            continue
        if ks < lo or ke > hi:
            out.append(
                Finding(
                    "kv_range",
                    f"work {w}: kv [{ks}, {ke}) reaches beyond request {b}'s KV [{lo}, {hi})",
                    request=b,
                    work=w,
                    first=ks,
                    count=ke - ks,
                )
            )
        if ks == ke and hi != lo:
            out.append(
                Finding("kv_range", f"work {w}: empty kv range for request {b}, which has KV", request=b, work=w)
            )
        if lens is not None and lo <= ke <= hi:
            after = max(0, lens[b] - (ke - lo) * page_size)
            if off != after:
                out.append(
                    Finding(
                        "kv_offset",
                        f"work {w}: kv_offset {off} but {after} tokens of request {b} follow kv_end",
                        request=b,
                        work=w,
                    )
                )
        if slot >= 0:
            rows_used.append((slot, slot + max(qe - qs, 1), w))
            if n_partial_rows is not None and slot + (qe - qs) > n_partial_rows:
                out.append(
                    Finding(
                        "partial_range",
                        f"work {w}: partial rows [{slot}, {slot + qe - qs}) exceed the "
                        f"{n_partial_rows}-row partial buffer",
                        request=b,
                        work=w,
                    )
                )
        per_req[b].append((max(ks, lo), min(ke, hi), slot, w))

    short = {(f.work, qo[f.request + 1] - qo[f.request]) for f in out if f.kind == "q_rows" and "missing" in f.message}
    if short:
        planned = {works[w][3] - works[w][2] for w, _ in short}
        has = {n for _, n in short}
        if len(planned) == 1 and len(has) == 1 and len(short) > 1:  # one pattern across works: name it
            (pq,), (hq,) = planned, has
            out.insert(
                0,
                Finding(
                    "q_rows",
                    f"metadata for q_len {pq} used with q_len {hq}: {len(short)} works compute "
                    f"{pq} of their request's {hq} q rows, the others are never computed",
                ),
            )
    rows_used.sort()
    end_so_far, owner = -1, -1
    for a0, a1, w in rows_used:
        if a0 < end_so_far:
            out.append(
                Finding(
                    "partial_overlap",
                    f"works {owner} and {w} write overlapping partial rows (row {a0} is written by both)",
                    work=w,
                    first=a0,
                    count=min(a1, end_so_far) - a0,
                )
            )
        if a1 > end_so_far:
            end_so_far, owner = a1, w
    written = {r for a0, a1, _ in rows_used for r in range(a0, a1)} if len(rows_used) < 1 << 16 else None

    # KV coverage, per request: the lengths the works describe first (a plan reused for another batch)
    other = []
    for b in range(B):
        fr = sorted(per_req[b])
        lo, hi = kvp[b], kvp[b + 1]
        if not fr:
            out.append(
                Finding(
                    "uncovered",
                    f"request {b} has no work: its {hi - lo} KV positions [{lo}, {hi}) and q rows are never computed",
                    request=b,
                    first=lo,
                    count=hi - lo,
                )
            )
            continue
        pos = lo
        for ks, ke, _, w in fr:
            if ks > pos:
                out.append(
                    Finding(
                        "uncovered",
                        f"request {b}: KV positions [{pos}, {ks}) are not covered by any work "
                        f"({ks - pos} uncovered, first {pos})",
                        request=b,
                        first=pos,
                        count=ks - pos,
                    )
                )
            elif ks < pos and ke > ks:
                e = min(pos, ke)
                out.append(
                    Finding(
                        "covered_twice",
                        f"request {b}: KV positions [{ks}, {e}) are covered twice "
                        f"(work {w} overlaps an earlier work; {e - ks} positions, first {ks})",
                        request=b,
                        work=w,
                        first=ks,
                        count=e - ks,
                    )
                )
            pos = max(pos, ke)
        if pos < hi:
            out.append(
                Finding(
                    "uncovered",
                    f"request {b}: KV positions [{pos}, {hi}) are not covered: the works stop "
                    f"at {pos} ({hi - pos} uncovered, first {pos})",
                    request=b,
                    first=pos,
                    count=hi - pos,
                )
            )
        if hi == lo and len(fr) != 1:
            out.append(
                Finding(
                    "split", f"request {b} has no KV and must have exactly one (empty) work, has {len(fr)}", request=b
                )
            )
    # the unclipped extents: what lengths were these works planned for?
    # (contiguous works whose last one says no token follows it, yet the extent is not the request's)
    raw: list[list[tuple[int, int, int]]] = [[] for _ in range(B)]
    for b, _, _, _, ks, ke, off, _ in works:
        if 0 <= b < B and ke >= ks:
            raw[b].append((ks, ke, off))
    for b in range(B):
        if raw[b]:
            s, e = min(k for k, _, _ in raw[b]), max(k for _, k, _ in raw[b])
            last_off = max(raw[b], key=lambda r: r[1])[2]
            contiguous = sum(k1 - k0 for k0, k1, _ in raw[b]) == e - s
            if (s, e) != (kvp[b], kvp[b + 1]) and contiguous and last_off == 0:
                other.append((b, e - s, kvp[b + 1] - kvp[b]))
    if other:
        b, planned, has = other[0]
        out.insert(
            0,
            Finding(
                "other_lengths",
                f"the works describe other KV lengths than this batch: request {b} "
                f"has {has} KV positions but its works cover {planned} ({len(other)} of {B} requests "
                "differ): metadata planned for one batch used with another (rebuild it when lengths "
                "change)",
                request=b,
                count=len(other),
            ),
        )

    # reduce tiles
    merged: dict[int, tuple[int, list[int]]] = {}
    req_of_rows = {(qo[b], qo[b + 1]): b for b in range(B)}
    for t in range(len(rip) - 1):
        entries = pmap[rip[t] : rip[t + 1]]
        bad = [p for p in entries if p < -1 or (n_partial_rows is not None and p >= n_partial_rows)]
        if bad:
            size = "" if n_partial_rows is None else f" (the buffer has {n_partial_rows} rows)"
            out.append(
                Finding(
                    "partial_range",
                    f"reduce tile {t}: partial rows {bad[:8]} out of range{size}: a stale "
                    "or freed partial-offset table?",
                )
            )
        if len(entries) < 2:
            continue  # skipped by the reduce, as in aiter
        stale = [p for p in entries if p >= 0 and written is not None and p not in written]
        if stale and not bad:
            out.append(
                Finding(
                    "partial_range",
                    f"reduce tile {t}: reads partial rows {stale[:8]} that no work writes "
                    "(a stale or freed partial-offset table?)",
                )
            )
        rows = tuple(fmap[t])
        if rows not in req_of_rows:
            out.append(Finding("reduce", f"reduce tile {t}: output rows {list(rows)} are not one request's q rows"))
            continue
        b = req_of_rows[rows]
        if b in merged:
            out.append(
                Finding("reduce", f"request {b} is reduced twice (reduce tiles {merged[b][0]} and {t})", request=b)
            )
            continue
        merged[b] = (t, entries)
    for b in range(B):
        fr = per_req[b]
        if not fr:
            continue
        slots = [s for _, _, s, _ in sorted(fr)]
        if len(fr) == 1:
            if slots[0] != -1:
                out.append(
                    Finding(
                        "split",
                        f"request {b} is not split but its work writes partial row {slots[0]} instead of the output",
                        request=b,
                    )
                )
            if b in merged:
                out.append(
                    Finding("reduce", f"request {b} is not split but reduce tile {merged[b][0]} merges it", request=b)
                )
        else:
            if any(s < 0 for s in slots):
                out.append(
                    Finding(
                        "split",
                        f"request {b} is split in {len(fr)} works but one writes the output directly",
                        request=b,
                    )
                )
            elif b not in merged:
                out.append(
                    Finding(
                        "reduce", f"request {b} is split in {len(fr)} works but no reduce tile merges it", request=b
                    )
                )
            elif sorted(merged[b][1]) != sorted(slots):
                t, entries = merged[b]
                out.append(
                    Finding(
                        "reduce",
                        f"request {b}: reduce tile {t} merges partial rows {entries[:8]}, its works wrote {slots[:8]}",
                        request=b,
                    )
                )
    return out

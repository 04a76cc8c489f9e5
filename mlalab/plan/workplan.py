"""`WorkPlan`: a persistent split-KV decode schedule in AMD aiter's v1 metadata layout.

A persistent decode launches one workgroup per compute unit (CU). Each CU walks a list of *work items*; a
work item is "request b's q rows against KV positions [kv_start, kv_end)". A request whose KV was cut into
several works produces several partial outputs that a second kernel (the reduce) merges with LSE weights.

The tensors, shapes, dtypes and column order are those of aiter's ``get_mla_metadata_v1`` (docs/aiter.md, "The
metadata"), so one plan drives the CPU emulator and the GPU kernels and can be compared with aiter's own metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from ..checks import check_indptr, check_tensor
from .invariants import check_metadata

__all__ = ["WorkPlan", "WORK_INFO_COLUMNS", "Fragment", "build_plan", "PlanError"]

WORK_INFO_COLUMNS = ("batch_idx", "partial_qo_loc", "qo_start", "qo_end", "kv_start", "kv_end", "kv_offset", "pad")


class PlanError(ValueError):
    """A WorkPlan that breaks the contract (raised by `WorkPlan.validate`)."""


@dataclass(frozen=True)
class Fragment:
    """One work item as a planner emits it, before partial rows are numbered."""

    cu: int
    batch: int
    kv_start: int  # position in kv_indices (token for page size 1)
    kv_end: int


@dataclass(frozen=True)
class WorkPlan:
    """A split-KV work map with aiter v1's tensors (all contiguous int32 on one device, CPU by default).

    Tensors:
        work_indptr ``(num_cus + 1,)``: CU ``c`` runs works ``work_info[work_indptr[c]:work_indptr[c+1]]`` in
            order (empty ranges = idle CU).
        work_info ``(n_work, 8)``: per work ``batch_idx, partial_qo_loc, qo_start, qo_end, kv_start, kv_end,
            kv_offset, pad`` (see `WORK_INFO_COLUMNS`). ``partial_qo_loc = -1``: the request is not split and
            this work writes the final output. ``kv_start/kv_end`` are positions in ``kv_indices`` (tokens
            for page size 1, pages otherwise; ``kv_indptr[0] == 0``). ``kv_offset`` = KV tokens of the request
            after this work's range. ``pad`` = 0.
        reduce_indptr ``(T + 1,)``: one reduce tile per request here (H = 16 and q_len <= 8 give one q tile).
        reduce_final_map ``(T, 2)``: ``(q_start, q_end)`` output rows of tile t (filled for every tile here;
            aiter leaves it undefined for unsplit tiles, which the reduce never reads).
        reduce_partial_map ``(P,)``: partial-buffer rows of tile t's pieces are
            ``reduce_partial_map[reduce_indptr[t]:reduce_indptr[t+1]]`` (-1 entries only in skipped tiles).

    The executor contract (CPU emulator, Triton kernels):

    * **Stage 1**, for each CU ``c`` and each work ``w`` in its range: read ``(b, slot, qs, qe, ks, ke)``;
      gather the request's KV tokens at positions ``ks:ke`` (through ``kv_indices``; the last page of a
      request holds ``kv_last_page_len`` tokens); for each q row ``i`` in ``qs:qe`` and head ``h``:
      ``s_j = sm_scale * <q[i,h], k_j>``, ``m = max_j s_j``, ``l = sum_j exp(s_j - m)``,
      ``O = sum_j exp(s_j - m) v_j / l`` (v = first 512 dims of k), ``lse = m + ln l`` (natural log).
      An empty range (only for a request with 0 KV tokens) gives ``O = 0, lse = -inf``.
      If ``slot < 0`` write ``O`` (cast to the output dtype) to ``out[qs:qe]`` and ``lse`` to ``lse_out[qs:qe]``;
      else write float32 ``O`` to ``partial_out[slot + (i - qs)]`` and ``lse`` to ``partial_lse[slot + (i - qs)]``.
      The partial buffers have ``n_partial_rows`` rows of ``(16, 512)`` / ``(16,)``; nothing needs zeroing.
    * **Reduce**, for each tile ``t`` with ``e - s >= 2`` entries (``s, e = reduce_indptr[t], reduce_indptr[t+1]``;
      tiles with fewer entries are skipped, as in aiter): for each row ``r`` in ``reduce_final_map[t]`` with
      local index ``u``: ``L_i = partial_lse[p_i + u]``, ``M = max_i L_i``, ``w_i = exp(L_i - M)``,
      ``out[r] = sum_i w_i partial_out[p_i + u] / sum_i w_i``, ``lse_out[r] = M + ln sum_i w_i``.

    Attributes beyond the tensors: ``num_cus``, ``batch``, ``page_size``, ``planner`` (name),
    ``n_partial_rows`` (q rows of the float32 partial buffer; each row holds all 16 heads), ``kv_lens``
    (tokens per request, for loads in tokens) and ``params`` (the knobs the planner used, for display).
    """

    work_indptr: torch.Tensor
    work_info: torch.Tensor
    reduce_indptr: torch.Tensor
    reduce_final_map: torch.Tensor
    reduce_partial_map: torch.Tensor
    num_cus: int
    batch: int
    page_size: int
    planner: str
    n_partial_rows: int
    kv_lens: tuple[int, ...] = ()
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("work_indptr", "work_info", "reduce_indptr", "reduce_final_map", "reduce_partial_map"):
            t = check_tensor(f"WorkPlan.{name}", getattr(self, name), dtypes=(torch.int32,))
            if not t.is_contiguous():
                raise ValueError(f"WorkPlan.{name} must be contiguous")
        check_tensor("WorkPlan.work_indptr", self.work_indptr, shape=(self.num_cus + 1,))
        check_tensor("WorkPlan.work_info", self.work_info, shape=(None, 8))
        check_tensor("WorkPlan.reduce_final_map", self.reduce_final_map, shape=(None, 2))
        check_tensor("WorkPlan.reduce_partial_map", self.reduce_partial_map, ndim=1)
        check_tensor("WorkPlan.reduce_indptr", self.reduce_indptr, shape=(self.reduce_final_map.shape[0] + 1,))
        if self.kv_lens and len(self.kv_lens) != self.batch:
            raise ValueError(f"WorkPlan.kv_lens has {len(self.kv_lens)} entries for batch {self.batch}")

    # ------------------------------------------------------------------ views
    @property
    def n_work(self) -> int:
        return int(self.work_info.shape[0])

    @property
    def n_tiles(self) -> int:
        return int(self.reduce_final_map.shape[0])

    def work_cus(self) -> torch.Tensor:
        """CU of every work (int64, CPU)."""
        counts = (self.work_indptr[1:] - self.work_indptr[:-1]).to("cpu", torch.int64)
        return torch.repeat_interleave(torch.arange(self.num_cus), counts)

    def work_tokens(self) -> torch.Tensor:
        """KV tokens of every work (int64, CPU): exact when `kv_lens` is known, else positions × page size."""
        wi = self.work_info.to("cpu", torch.int64)
        if not self.kv_lens or self.n_work == 0:
            return (wi[:, 5] - wi[:, 4]) * self.page_size
        # tokens after kv_start minus tokens after kv_end (kv_offset) gives the exact count on partial pages
        lens = torch.tensor(self.kv_lens, dtype=torch.int64)
        return (lens[wi[:, 0]] - wi[:, 6]) - self._tokens_before(wi)

    def _tokens_before(self, wi: torch.Tensor) -> torch.Tensor:
        # tokens of the request before kv_start; needs the request's first position: recover it from the
        # work with the smallest kv_start of each request (plans always cover a request from its start).
        first = {}
        for b, ks in zip(wi[:, 0].tolist(), wi[:, 4].tolist()):
            first[b] = min(first.get(b, ks), ks)
        base = torch.tensor([first[b] for b in wi[:, 0].tolist()], dtype=torch.int64)
        return (wi[:, 4] - base) * self.page_size

    def cu_loads(self) -> torch.Tensor:
        """KV tokens per CU (int64, CPU, length num_cus)."""
        loads = torch.zeros(self.num_cus, dtype=torch.int64)
        if self.n_work:
            loads.index_add_(0, self.work_cus(), self.work_tokens())
        return loads

    def to_frame(self) -> pd.DataFrame:
        """One row per work: its CU, slot on that CU, the 8 work_info fields, tokens, fragment number."""
        wi = self.work_info.to("cpu", torch.int64)
        df = pd.DataFrame(wi.numpy(), columns=list(WORK_INFO_COLUMNS)).drop(columns="pad")
        cus = self.work_cus()
        df.insert(0, "cu", cus.numpy())
        starts = self.work_indptr.to("cpu", torch.int64)[cus] if self.n_work else torch.zeros(0, dtype=torch.int64)
        df.insert(1, "slot", (torch.arange(self.n_work) - starts).numpy())
        df.insert(0, "work", range(self.n_work))
        df["kv_tokens"] = self.work_tokens().numpy()
        df["split"] = df["partial_qo_loc"] >= 0
        df["fragment"] = df.groupby("batch_idx")["kv_start"].rank(method="first").astype(int) - 1
        df["n_fragments"] = df.groupby("batch_idx")["work"].transform("count")
        return df

    def summary(self) -> dict[str, Any]:
        """Counts a reader wants first: works, busy/idle CUs, works per request, CU loads in tokens."""
        loads = self.cu_loads()
        counts = (self.work_indptr[1:] - self.work_indptr[:-1]).to("cpu", torch.int64)
        per_req = torch.bincount(self.work_info[:, 0].to("cpu", torch.int64), minlength=self.batch)
        busy = counts > 0
        busy_loads = loads[busy]
        tiles = (self.reduce_indptr[1:] - self.reduce_indptr[:-1]).to("cpu", torch.int64)
        return {
            "planner": self.planner,
            "num_cus": self.num_cus,
            "batch": self.batch,
            "works": self.n_work,
            "busy_cus": int(busy.sum()),
            "idle_cus": int((~busy).sum()),
            "max_works_per_cu": int(counts.max()) if self.num_cus else 0,
            "works_per_request": per_req.tolist(),
            "split_requests": int((per_req > 1).sum()),
            "reduce_tiles_merged": int((tiles >= 2).sum()),
            "partial_rows": self.n_partial_rows,
            "max_cu_load_tokens": int(loads.max()) if self.num_cus else 0,
            "min_busy_cu_load_tokens": int(busy_loads.min()) if busy_loads.numel() else 0,
            "min_cu_load_tokens": int(loads.min()) if self.num_cus else 0,
            "mean_cu_load_tokens": float(loads.double().mean()) if self.num_cus else 0.0,
            "params": dict(self.params),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        """The five aiter tensors by name, in aiter's field order."""
        return {
            "work_indptr": self.work_indptr,
            "work_info": self.work_info,
            "reduce_indptr": self.reduce_indptr,
            "reduce_final_map": self.reduce_final_map,
            "reduce_partial_map": self.reduce_partial_map,
        }

    def digest(self) -> dict[str, Any]:
        """A short fingerprint for records: planner name, its knobs, plan slots, number of works and the first 12 hex
        digits of a SHA-256 over ``work_indptr`` and ``work_info`` (int32, CPU). Two plans with the same digest assign
        the same KV ranges to the same slots."""
        h = hashlib.sha256()
        for t in (self.work_indptr, self.work_info):
            h.update(t.to("cpu", torch.int32).contiguous().numpy().tobytes())
        params = {k: v for k, v in sorted(self.params.items()) if isinstance(v, (int, float, str, bool)) or v is None}
        return {"planner": self.planner, "params": params, "num_cus": int(self.num_cus), "n_work": self.n_work,
                "hash": h.hexdigest()[:12]}  # fmt: skip

    def to(self, device: str | torch.device) -> WorkPlan:
        """The same plan with its tensors on `device` (contiguous int32 kept)."""
        return dataclasses.replace(self, **{k: v.to(device).contiguous() for k, v in self.tensors().items()})

    def for_request(self, b: int) -> WorkPlan:
        """The sub-plan of request `b` alone, rebased to a one-request batch (same CUs, same fragments,
        partial rows renumbered compactly): lets a notebook step through one request without the batch."""
        if not isinstance(b, int) or not 0 <= b < self.batch:
            raise ValueError(f"request index b must be in [0, {self.batch}), got {b!r}")
        wi = self.work_info.to("cpu", torch.int64)
        sel = torch.nonzero(wi[:, 0] == b).flatten()
        rows = wi[sel].clone()
        cus = self.work_cus()[sel]
        q0, kv0 = int(rows[:, 2].min()), int(rows[:, 4].min())
        nq = int(rows[0, 3] - rows[0, 2])
        split = bool((rows[:, 1] >= 0).any())
        rows[:, 0] = 0
        rows[:, 2:4] -= q0
        rows[:, 4:6] -= kv0
        order = torch.argsort(rows[:, 4], stable=True)
        slot_of = torch.empty_like(order)
        slot_of[order] = torch.arange(len(order))
        rows[:, 1] = slot_of * nq if split else -1
        counts = torch.bincount(cus, minlength=self.num_cus)
        indptr = torch.zeros(self.num_cus + 1, dtype=torch.int64)
        indptr[1:] = torch.cumsum(counts, 0)
        k = len(sel) if split else 0
        return WorkPlan(
            work_indptr=indptr.to(torch.int32),
            work_info=rows.to(torch.int32).contiguous(),
            reduce_indptr=torch.tensor([0, k], dtype=torch.int32),
            reduce_final_map=torch.tensor([[0, nq]], dtype=torch.int32),
            reduce_partial_map=(rows[order, 1] if split else torch.zeros(0, dtype=torch.int64)).to(torch.int32),
            num_cus=self.num_cus,
            batch=1,
            page_size=self.page_size,
            planner=f"{self.planner}[request {b}]",
            n_partial_rows=k * nq,
            kv_lens=(self.kv_lens[b],) if self.kv_lens else (),
            params=dict(self.params),
        )

    # ------------------------------------------------------------------ contract
    def validate(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor) -> WorkPlan:
        """Check the plan against the batch it is used with; raise `PlanError` naming the first problem.

        Every KV position of every request is covered exactly once (no gap, no overlap); every split request is
        merged by exactly one reduce tile whose partials are exactly its works' rows; every unsplit request has one
        work with ``partial_qo_loc = -1``; partial rows never overlap and fit ``n_partial_rows``; ``kv_offset`` is
        right; indices are in range. The checks are `mlalab.plan.invariants.check_metadata` (the doctor reports all
        of its findings). Returns self so calls chain.
        """
        check_indptr("qo_indptr", qo_indptr)
        check_indptr("kv_indptr", kv_indptr, length=qo_indptr.numel())
        B = qo_indptr.numel() - 1
        if self.batch != B:
            raise PlanError(f"plan is for batch {self.batch}, indptrs describe {B} requests")
        if int(self.work_indptr[-1]) != self.n_work:
            raise PlanError(f"work_indptr[-1] = {int(self.work_indptr[-1])} but work_info has {self.n_work} rows")
        findings = check_metadata(
            *self.tensors().values(),
            qo_indptr,
            kv_indptr,
            n_partial_rows=self.n_partial_rows,
            kv_lens=self.kv_lens or None,
            page_size=self.page_size,
        )
        if findings:
            more = (
                f" (and {len(findings) - 1} more findings: mlalab.plan.doctor lists them)" if len(findings) > 1 else ""
            )
            raise PlanError(findings[0].message + more)
        return self

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"WorkPlan({self.planner!r}, {self.num_cus} CUs, batch {self.batch}: {s['works']} works on "
            f"{s['busy_cus']} CUs, {s['split_requests']} split requests, {self.n_partial_rows} partial rows)"
        )


def build_plan(
    fragments: Sequence[Fragment],
    *,
    num_cus: int,
    qo: Sequence[int],
    kvp: Sequence[int],
    kv_lens: Sequence[int],
    page_size: int,
    planner: str,
    partial_rows: str = "compact",
    reduce_tiles: str = "split",
    params: dict[str, Any] | None = None,
) -> WorkPlan:
    """Turn planner fragments into aiter's tensors.

    Args:
        fragments: works in emission order; works of one CU keep this order (a stable sort by CU).
        partial_rows: ``"compact"`` (aiter v1.1/v1.2: only split requests own partial rows, request by request,
            fragments in KV order) or ``"work_index"`` (aiter v1.0: a work's row = q rows of all works emitted
            before it, so unsplit requests leave holes).
        reduce_tiles: ``"split"`` (v1.1/v1.2: an unsplit request's tile has 0 entries) or ``"all"`` (v1.0: every
            request lists its works' rows, -1 for an unsplit one; the reduce skips tiles with < 2 entries).
    """
    if partial_rows not in ("compact", "work_index") or reduce_tiles not in ("split", "all"):
        raise ValueError(f"bad partial_rows={partial_rows!r} / reduce_tiles={reduce_tiles!r}")
    B = len(qo) - 1
    nq = [qo[b + 1] - qo[b] for b in range(B)]
    n_frag = [0] * B
    for f in fragments:
        n_frag[f.batch] += 1
    slot = [-1] * len(fragments)
    if partial_rows == "work_index":
        run = 0
        for i, f in enumerate(fragments):
            if n_frag[f.batch] > 1:
                slot[i] = run
            run += nq[f.batch]
    else:
        by_req: list[list[int]] = [[] for _ in range(B)]
        for i, f in enumerate(fragments):
            by_req[f.batch].append(i)
        run = 0
        for b in range(B):
            if n_frag[b] > 1:
                for i in sorted(by_req[b], key=lambda i: fragments[i].kv_start):
                    slot[i] = run
                    run += nq[b]
    n_partial = max((slot[i] + nq[f.batch] for i, f in enumerate(fragments) if slot[i] >= 0), default=0)
    order = sorted(range(len(fragments)), key=lambda i: fragments[i].cu)  # stable: keeps emission order per CU
    rows = []
    for i in order:
        f = fragments[i]
        after = max(0, kv_lens[f.batch] - (f.kv_end - kvp[f.batch]) * page_size)
        rows.append([f.batch, slot[i], qo[f.batch], qo[f.batch + 1], f.kv_start, f.kv_end, after, 0])
    counts = [0] * num_cus
    for f in fragments:
        counts[f.cu] += 1
    indptr = [0]
    for c in counts:
        indptr.append(indptr[-1] + c)
    rip, pmap = [0], []
    per_req_slots: list[list[tuple[int, int]]] = [[] for _ in range(B)]
    for i, f in enumerate(fragments):
        per_req_slots[f.batch].append((f.kv_start, slot[i]))
    for b in range(B):
        entries = [s for _, s in sorted(per_req_slots[b])]
        if reduce_tiles == "all" or n_frag[b] > 1:
            pmap.extend(entries)
        rip.append(len(pmap))
    return WorkPlan(
        work_indptr=torch.tensor(indptr, dtype=torch.int32),
        work_info=torch.tensor(rows, dtype=torch.int32).reshape(-1, 8).contiguous(),
        reduce_indptr=torch.tensor(rip, dtype=torch.int32),
        reduce_final_map=torch.tensor([[qo[b], qo[b + 1]] for b in range(B)], dtype=torch.int32).reshape(-1, 2),
        reduce_partial_map=torch.tensor(pmap, dtype=torch.int32),
        num_cus=num_cus,
        batch=B,
        page_size=page_size,
        planner=planner,
        n_partial_rows=n_partial,
        kv_lens=tuple(int(x) for x in kv_lens),
        params=dict(params or {}),
    )

"""Planners: ``(qo_indptr, kv_indptr, target, **knobs) -> WorkPlan``.

Three re-implement AMD aiter's metadata planners from the rules written down in docs/aiter.md ("Planners"; source:
``ROCm/aiter`` ``csrc/kernels/mla/metadata/``), two are our own:

=====================  ==========================================================================================
``aiter-intra-batch``  v1.0 "fake non-persistent" (``intra_batch_mode=True``; the seeds and sglang): a fixed number
                       of even splits per request, works dealt to CUs by count.
``aiter-fast``         v1.2 (``fast_mode=True``; vLLM): greedy linear fill of CUs in request order with a 16-block
                       overhead per work.
``aiter-cost-heap``    v1.1 (``fast_mode=False, intra_batch_mode=False``): requests by decreasing cost, each
                       fragment to the least-loaded CU.
``balanced``           ours: the smallest per-CU capacity (tokens + a per-work overhead) whose in-order fill fits
                       the CUs, found by bisection: it minimises the most-loaded CU.
``simple``             ours, the Triton default on the H200: even contiguous split in one wave (chunks of about
                       total / CUs, grown until every work gets its own CU when the batch allows).
=====================  ==========================================================================================

Shared knobs (all keyword-only): ``kv_granularity`` (power of two, units of kv_indptr; default 16),
``q_len`` (asserts every request has that many q rows; aiter's ``uni_seqlen_qo``), ``page_size`` (default 1)
and ``kv_last_page_len`` (tokens in each request's last page; required when page_size > 1), and
``max_split_per_batch`` (alias ``num_kv_splits``) with a planner-specific meaning. Units: positions in
``kv_indices`` — tokens for page size 1 (the only layout aiter's bf16 persistent kernels are correct with).

A request with 0 KV tokens gets one unsplit work with an empty range (it writes output 0 and LSE -inf);
aiter's planners have no rule for it (v1.0 would divide by zero).
"""

from __future__ import annotations

import heapq
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..checks import check_indptr, check_tensor
from ..config import GpuTarget, get_target
from ..inputs import DecodeInputs
from .workplan import Fragment, WorkPlan, build_plan

__all__ = [
    "PLANNERS",
    "make_plan",
    "plan_intra_batch",
    "plan_fast",
    "plan_cost_heap",
    "plan_balanced",
    "plan_simple",
    "intra_batch_splits",
    "indptrs_for",
    "INT32_MAX",
]

_ceil = lambda a, b: -(-a // b)


@dataclass(frozen=True)
class _Batch:
    """Validated planner inputs as Python ints."""

    qo: list[int]
    kvp: list[int]
    lens: list[int]  # tokens per request
    target: GpuTarget
    gran: int
    page_size: int

    @property
    def B(self) -> int:
        return len(self.qo) - 1

    @property
    def N(self) -> int:
        return self.target.num_cus

    def positions(self, b: int) -> int:
        return self.kvp[b + 1] - self.kvp[b]

    def q_rows(self, b: int) -> int:
        return self.qo[b + 1] - self.qo[b]


def _pos_int(name: str, v: object, *, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _prepare(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    target: str | int | GpuTarget,
    *,
    kv_granularity: int,
    q_len: int | None,
    page_size: int,
    kv_last_page_len: torch.Tensor | None,
) -> _Batch:
    check_indptr("qo_indptr", qo_indptr)
    check_indptr("kv_indptr", kv_indptr, length=qo_indptr.numel())
    if isinstance(target, str) and target.strip().lstrip("-").isdigit():
        target = int(target)  # "-3" must say "CU count must be >= 1", not "unknown target"
    tgt = get_target(target)
    gran = _pos_int("kv_granularity", kv_granularity)
    if gran & (gran - 1):
        raise ValueError(f"kv_granularity must be a power of two (as aiter checks), got {gran}")
    ps = _pos_int("page_size", page_size)
    qo = qo_indptr.to("cpu", torch.int64).tolist()
    kvp = kv_indptr.to("cpu", torch.int64).tolist()
    B = len(qo) - 1
    if kvp[-1] > INT32_MAX or qo[-1] > INT32_MAX:
        raise ValueError(f"kv_indptr ends at {kvp[-1]:,} and qo_indptr at {qo[-1]:,}: past the int32 limit "
                         f"{INT32_MAX:,} of aiter's metadata tensors")  # fmt: skip
    for b in range(B):
        if qo[b + 1] - qo[b] < 1:
            raise ValueError(f"qo_indptr: request {b} has no query rows (decode needs >= 1)")
    if q_len is not None:
        _pos_int("q_len", q_len)
        bad = [b for b in range(B) if qo[b + 1] - qo[b] != q_len]
        if bad:
            raise ValueError(f"q_len={q_len} but request {bad[0]} has {qo[bad[0] + 1] - qo[bad[0]]} q rows")
    pages = [kvp[b + 1] - kvp[b] for b in range(B)]
    if kv_last_page_len is None:
        if ps > 1:  # guessing "full last pages" would record wrong token counts and loads
            raise ValueError("kv_last_page_len is required when page_size > 1 (tokens used in each last page)")
        lens = [p * ps for p in pages]
    else:
        check_tensor("kv_last_page_len", kv_last_page_len, shape=(B,), dtypes=(torch.int32, torch.int64))
        last = kv_last_page_len.to("cpu", torch.int64).tolist()
        lens = []
        for b, (p, n) in enumerate(zip(pages, last)):
            if (p > 0 and not 1 <= n <= ps) or (p == 0 and n != 0):
                raise ValueError(f"kv_last_page_len[{b}] = {n} is invalid for {p} pages of size {ps}")
            lens.append((p - 1) * ps + n if p else 0)
    return _Batch(qo, kvp, lens, tgt, gran, ps)


def _splits_knob(max_split_per_batch: int | None, num_kv_splits: int | None) -> int | None:
    if max_split_per_batch is not None and num_kv_splits is not None and max_split_per_batch != num_kv_splits:
        raise ValueError(
            f"num_kv_splits ({num_kv_splits}) and max_split_per_batch ({max_split_per_batch}) are aliases; give one"
        )
    v = max_split_per_batch if max_split_per_batch is not None else num_kv_splits
    if v is None or v == -1:
        return None
    return _pos_int("max_split_per_batch (num_kv_splits)", v)


def _finish(x: _Batch, frags: list[Fragment], name: str, params: dict, **kw: str) -> WorkPlan:
    return build_plan(
        frags,
        num_cus=x.N,
        qo=x.qo,
        kvp=x.kvp,
        kv_lens=x.lens,
        page_size=x.page_size,
        planner=name,
        params={"target": x.target.name, "kv_granularity": x.gran, **params},
        **kw,
    )


# ---------------------------------------------------------------------------------------------- v1.0
def intra_batch_splits(
    kv_len: int, batch: int, num_cus: int, max_split_per_batch: int, arch: str, *, clamp: bool = True
) -> int:
    """aiter v1.0 ``get_local_splits``: gfx942 always 16; other archs ``min(L // 196, ceil(CUs / B), max)``.

    aiter does not clamp the latter, so requests under 196 tokens divide by zero on gfx950; we clamp to >= 1
    (``clamp=False`` returns aiter's raw count, 0 included, for showing the hazard).
    """
    if arch == "gfx942":
        return 16
    raw = min(kv_len // 196, _ceil(num_cus, batch), max_split_per_batch)
    return max(1, raw) if clamp else raw


def plan_intra_batch(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    target: str | int | GpuTarget = "mi355x",
    *,
    max_split_per_batch: int | None = None,
    num_kv_splits: int | None = None,
    kv_granularity: int = 16,
    q_len: int | None = None,
    page_size: int = 1,
    kv_last_page_len: torch.Tensor | None = None,
    rule: str | None = None,
) -> WorkPlan:
    """aiter v1.0 intra-batch ("fake non-persistent") planner, ``csrc/kernels/mla/metadata/v1_0_device.cuh``.

    Per request: ``splits = intra_batch_splits(...)`` (16 on gfx942 whatever `max_split_per_batch` says);
    ``payload = ceil(blocks / splits)`` blocks of `kv_granularity`; ``ceil(blocks / payload)`` chunks, and a last
    chunk of 1-4 tokens is merged into the previous one. Works are numbered request-major; a work's partial
    row is its index × q rows; CUs get ``n_work // CUs`` consecutive works (the first ``n_work % CUs`` one more).
    `rule` picks "gfx942" or "gfx950" explicitly; default: gfx942 for MI300X, the gfx950 rule elsewhere.
    `max_split_per_batch` defaults to 32 (the seeds' ``num_kv_splits``); aiter's -1 is refused there.
    """
    x = _prepare(
        qo_indptr,
        kv_indptr,
        target,
        kv_granularity=kv_granularity,
        q_len=q_len,
        page_size=page_size,
        kv_last_page_len=kv_last_page_len,
    )
    if -1 in (max_split_per_batch, num_kv_splits):
        raise ValueError("intra-batch mode needs max_split_per_batch >= 1 (aiter would divide by -1)")
    msp = _splits_knob(max_split_per_batch, num_kv_splits) or 32
    arch = rule if rule is not None else ("gfx942" if x.target.arch == "gfx942" else "gfx950")
    if arch not in ("gfx942", "gfx950"):
        raise ValueError(f"rule must be 'gfx942' or 'gfx950', got {rule!r}")
    chunks: list[tuple[int, int, int]] = []
    for b in range(x.B):
        n = x.positions(b)
        k0 = x.kvp[b]
        if n == 0:
            chunks.append((b, k0, k0))
            continue
        # aiter v1.0 reads kv_indptr directly: its "length" is in kv_indices positions (pages when page_size > 1).
        splits = intra_batch_splits(n, x.B, x.N, msp, arch)
        blocks = _ceil(n, x.gran)
        payload = _ceil(blocks, splits)
        k = _ceil(blocks, payload)
        step = payload * x.gran
        last_tokens = x.lens[b] - (k - 1) * step * x.page_size
        if k > 1 and 1 <= last_tokens <= 4:  # PR #2106: fp8 kernels gave NaN on tails < 4 tokens
            k -= 1
        for i in range(k):
            chunks.append((b, k0 + i * step, k0 + n if i == k - 1 else min(k0 + (i + 1) * step, k0 + n)))
    W = len(chunks)
    per, res = divmod(W, x.N)
    frags, w = [], 0
    for c in range(x.N):
        for _ in range(per + (1 if c < res else 0)):
            b, s, e = chunks[w]
            frags.append(Fragment(c, b, s, e))
            w += 1
    params = {"rule": arch, "max_split_per_batch": msp}
    return _finish(x, frags, "aiter-intra-batch", params, partial_rows="work_index", reduce_tiles="all")


# ---------------------------------------------------------------------------------------------- v1.2
def plan_fast(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    target: str | int | GpuTarget = "mi355x",
    *,
    max_split_per_batch: int | None = None,
    num_kv_splits: int | None = None,
    kv_granularity: int = 16,
    q_len: int | None = None,
    page_size: int = 1,
    kv_last_page_len: torch.Tensor | None = None,
) -> WorkPlan:
    """aiter v1.2 fast-mode planner, ``csrc/kernels/mla/metadata/v1_2_device.cuh`` (the default; vLLM's).

    KV in blocks of `kv_granularity`; each work costs its blocks + ``OVH = max(1, ceil(16 / page_size))`` blocks.
    ``num_splits = CUs`` (or ``min(CUs, max_split_per_batch · B)``: a *global* budget, not a per-request cap);
    ``payload = ceil(sum_b (blocks_b + OVH) / num_splits) + OVH`` per CU. CUs are filled in order, requests in
    index order: a request that fits (``remain >= rb + OVH``) ends on this CU; else, if ``remain > OVH``, a
    fragment of ``remain - OVH`` blocks is cut and the request continues on the next CU; else the next CU.
    Tail rule: a cut that would leave 1..q_len-1 tokens takes the whole rest instead.
    """
    x = _prepare(
        qo_indptr,
        kv_indptr,
        target,
        kv_granularity=kv_granularity,
        q_len=q_len,
        page_size=page_size,
        kv_last_page_len=kv_last_page_len,
    )
    msp = _splits_knob(max_split_per_batch, num_kv_splits)
    num_splits = x.N if msp is None else min(x.N, msp * x.B)
    ovh = max(1, _ceil(16, x.page_size))
    blocks = [_ceil(x.positions(b), x.gran) for b in range(x.B)]
    total = sum(bl + ovh for bl in blocks)
    payload = _ceil(total, num_splits) + ovh
    frags: list[Fragment] = []
    b, c = 0, 0
    pos = x.kvp[0] if x.B else 0
    while b < x.B:
        if c >= x.N:  # cannot happen: every CU absorbs >= payload - OVH blocks of original cost
            raise AssertionError("fast planner ran out of CUs")
        remain = payload
        while b < x.B:
            end = x.kvp[b + 1]
            rb = _ceil(end - pos, x.gran)
            if remain >= rb + ovh:
                frags.append(Fragment(c, b, pos, end))
                remain -= rb + ovh
                b += 1
                pos = x.kvp[b] if b < x.B else pos
            elif remain > ovh:
                cut = min(pos + (remain - ovh) * x.gran, end)
                left_tokens = x.lens[b] - (cut - x.kvp[b]) * x.page_size
                if 0 < left_tokens < x.q_rows(b):  # tail rule (PR #2106): never leave < q_len tokens
                    cut = end
                frags.append(Fragment(c, b, pos, cut))
                pos = cut
                if cut == end:
                    b += 1
                    pos = x.kvp[b] if b < x.B else pos
                break
            else:
                break
        c += 1
    params = {"max_split_per_batch": -1 if msp is None else msp, "num_splits": num_splits, "payload_blocks": payload}
    return _finish(x, frags, "aiter-fast", params)


# ---------------------------------------------------------------------------------------------- v1.1
def plan_cost_heap(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    target: str | int | GpuTarget = "mi355x",
    *,
    kv_granularity: int = 16,
    q_len: int | None = None,
    page_size: int = 1,
    kv_last_page_len: torch.Tensor | None = None,
    num_heads: int = 16,
) -> WorkPlan:
    """aiter v1.1 cost-heap planner, ``csrc/kernels/mla/metadata/v1_1_device.cuh`` + ``v1_comm.cuh`` ("follows
    FlashInfer"). aiter ignores ``max_split_per_batch`` here, so this planner has no such knob.

    ``cost = 2·packed_q + kv`` (packed_q = q rows × heads, capped at 128). Per-CU limit: ``avg = ceil((Σ cost −
    2p·B) / CUs)`` (p = q_len if uniform else 128), ``limit`` = 32/64/128/192 for avg <= 8/16/32/64 else avg,
    ``workload_limit = roundup(2p + limit + 2p·(0.01·B + 0.01·avg + 10), gran)``. Requests by decreasing cost
    (ties: lower index first; aiter's bitonic sort is not stable); each fragment goes to the least-loaded CU
    (ties: lowest id) and takes ``max(workload_limit − load − 2·packed_q, roundup(ceil(kv / CUs), gran))`` tokens
    (the first term rounded down to gran); a rest of <= 16 tokens is absorbed.
    """
    x = _prepare(
        qo_indptr,
        kv_indptr,
        target,
        kv_granularity=kv_granularity,
        q_len=q_len,
        page_size=page_size,
        kv_last_page_len=kv_last_page_len,
    )
    _pos_int("num_heads", num_heads)
    packed = [min(x.q_rows(b) * num_heads, 128) for b in range(x.B)]
    cost = [2 * packed[b] + x.positions(b) for b in range(x.B)]
    uniform = len({x.q_rows(b) for b in range(x.B)}) == 1
    p = x.q_rows(0) if uniform else 128
    avg = max(0, _ceil(sum(cost) - 2 * p * x.B, x.N))
    limit = 32 if avg <= 8 else 64 if avg <= 16 else 128 if avg <= 32 else 192 if avg <= 64 else avg
    wl = 2 * p + limit + 2 * p * (0.01 * x.B + 0.01 * avg + 10.0)
    workload_limit = _ceil(math.ceil(wl), x.gran) * x.gran
    heap = [(0, c) for c in range(x.N)]  # (load, cu): least-loaded first, ties -> lowest id
    order = sorted(range(x.B), key=lambda b: -cost[b])
    frags: list[Fragment] = []
    for b in order:
        n, pos = x.positions(b), x.kvp[b]
        min_piece = max(x.gran, _ceil(_ceil(max(n, 1), x.N), x.gran) * x.gran)
        while True:
            load, c = heapq.heappop(heap)
            room = (workload_limit - load - 2 * packed[b]) // x.gran * x.gran
            take = max(room, min_piece)
            left = x.kvp[b + 1] - pos
            if left - take <= 16:  # kSplitTolerance: a short rest joins this piece
                take = left
            frags.append(Fragment(c, b, pos, pos + take))
            heapq.heappush(heap, (load + 2 * packed[b] + take, c))
            pos += take
            if pos >= x.kvp[b + 1]:
                break
    params = {"workload_limit": workload_limit, "avg": avg}
    return _finish(x, frags, "aiter-cost-heap", params)


# ---------------------------------------------------------------------------------------------- ours
def _fill(x: _Batch, capacity: int, ovh: int, n_cus: int, emit: bool) -> list[Fragment] | None:
    """In-order fill with a hard per-CU capacity (positions + ovh per work); None if it needs > n_cus CUs. Below
    ``ovh + gran`` no cut is possible (``take`` rounds down to 0): such a capacity fits only whole requests."""
    frags: list[Fragment] = []
    c, remain = 0, capacity
    for b in range(x.B):
        pos, end = x.kvp[b], x.kvp[b + 1]
        while True:
            if c >= n_cus:
                return None
            if remain >= end - pos + ovh:  # the rest of the request fits: it ends on this CU
                if emit:
                    frags.append(Fragment(c, b, pos, end))
                remain -= end - pos + ovh
                break
            take = (remain - ovh) // x.gran * x.gran  # < end - pos here
            if take > 0:
                if emit:
                    frags.append(Fragment(c, b, pos, pos + take))
                pos += take
            c, remain = c + 1, capacity
    return frags


def plan_balanced(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    target: str | int | GpuTarget = "mi355x",
    *,
    overhead: int = 64,
    max_split_per_batch: int | None = None,
    num_kv_splits: int | None = None,
    kv_granularity: int = 16,
    q_len: int | None = None,
    page_size: int = 1,
    kv_last_page_len: torch.Tensor | None = None,
) -> WorkPlan:
    """Our planner: minimise the most-loaded CU, where a CU's load = its KV positions + `overhead` per work.

    For a capacity C, fill CUs in request order, cutting a request at a CU boundary (cuts on multiples of
    `kv_granularity`); bisection finds the smallest C whose fill uses at most ``CUs`` (or ``min(CUs,
    max_split_per_batch · B)``) CUs. Why it differs from aiter-fast: v1.2 fixes ``payload = ceil(total /
    splits) + 16 blocks`` with a 256-token overhead, so short batches are chopped into tiny works on
    few CUs and long ones can leave the last CUs idle; here the overhead is a knob (default 64 tokens ≈ loading
    16 heads of q plus writing a float32 partial) and the capacity is the tightest that fits.
    """
    x = _prepare(
        qo_indptr,
        kv_indptr,
        target,
        kv_granularity=kv_granularity,
        q_len=q_len,
        page_size=page_size,
        kv_last_page_len=kv_last_page_len,
    )
    ovh_tokens = _pos_int("overhead", overhead, minimum=0)
    ovh = _ceil(ovh_tokens, x.page_size)
    msp = _splits_knob(max_split_per_batch, num_kv_splits)
    n_cus = x.N if msp is None else min(x.N, msp * x.B)
    total = x.kvp[-1] - x.kvp[0]
    lo = max(ovh + min(x.gran, max(map(x.positions, range(x.B)))), _ceil(total + x.B * ovh, n_cus))  # see _fill()
    hi = total + (x.B + 1) * (ovh + x.gran)  # everything on one CU always fits
    while lo < hi:
        mid = (lo + hi) // 2
        if _fill(x, mid, ovh, n_cus, emit=False) is not None:
            hi = mid
        else:
            lo = mid + 1
    frags = _fill(x, lo, ovh, n_cus, emit=True)
    assert frags is not None
    params = {"overhead_tokens": ovh_tokens, "capacity": lo, "cus_allowed": n_cus}
    return _finish(x, frags, "balanced", params)


def plan_simple(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    target: str | int | GpuTarget = "h200",
    *,
    block: int = 64,
    max_split_per_batch: int | None = None,
    num_kv_splits: int | None = None,
    kv_granularity: int = 1,
    q_len: int | None = None,
    page_size: int = 1,
    kv_last_page_len: torch.Tensor | None = None,
) -> WorkPlan:
    """Ours, the Triton default on the H200: an even contiguous split in one wave (``N`` = CUs, all in positions).

    ``chunk = max(block, roundup(ceil(total / N), block))``, then grown by `block` until the works fit one wave
    (``sum_b max(1, ceil(n_b / chunk)) <= N``) or the chunk reaches the longest request. Why: 64 x 8192 tokens
    on 132 SMs would otherwise cut each request in 3 (192 works) and 60 SMs would run two works, a 1.35x longer
    critical path (measured on the H200). Request ``b`` is cut into ``nsplit = ceil(n_b / chunk)`` pieces of
    ``roundup(ceil(n_b / nsplit), block)`` positions (the last one shorter); works are numbered request-major
    and dealt in contiguous runs: CU ``c`` gets works ``[c·W // N, (c+1)·W // N)``. `max_split_per_batch` (alias
    `num_kv_splits`; default: no limit) caps the CUs used, as in aiter-fast and balanced: ``N = min(CUs,
    max_split_per_batch · B)``.

    `block` is in positions of ``kv_indices`` (tokens at page size 1, pages otherwise); every cut lies on a
    multiple of `block` from the request's start. `kv_granularity` (default 1) only asserts an alignment:
    `block` must be a multiple of it, so the cuts land on multiples of `kv_granularity` as in the other planners.
    """
    x = _prepare(
        qo_indptr,
        kv_indptr,
        target,
        kv_granularity=kv_granularity,
        q_len=q_len,
        page_size=page_size,
        kv_last_page_len=kv_last_page_len,
    )
    blk = _pos_int("block", block)
    if blk % x.gran:
        raise ValueError(
            f"block ({blk}) must be a multiple of kv_granularity ({x.gran}): cuts lie on multiples of block"
        )
    msp = _splits_knob(max_split_per_batch, num_kv_splits)
    N = x.N if msp is None else min(x.N, msp * x.B)
    lens = [x.positions(b) for b in range(x.B)]
    total = sum(lens)
    chunk = max(blk, _ceil(_ceil(total, N), blk) * blk)
    longest = max(lens, default=0)
    lens_t = torch.tensor(lens, dtype=torch.int64)

    def fits(c: int) -> bool:  # the growth stops here: the works fit one wave, or the chunk holds the longest
        return c >= longest or int(((lens_t + c - 1) // c).clamp_min(1).sum()) <= N

    if not fits(chunk):  # grow by `block` to the first chunk that fits; fits() is monotone, so bisect the steps
        lo, hi = 1, _ceil(longest - chunk, blk)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(chunk + mid * blk) else (mid + 1, hi)
        chunk += lo * blk
    pieces: list[tuple[int, int, int]] = []  # (batch, kv_start, kv_end), request-major
    for b, n in enumerate(lens):
        k0 = x.kvp[b]
        nsplit = max(1, _ceil(n, chunk))
        per = _ceil(_ceil(n, nsplit), blk) * blk if nsplit > 1 else n
        for i in range(nsplit):
            ks, ke = k0 + min(n, i * per), k0 + min(n, (i + 1) * per)
            if ks < ke or n == 0:  # a 0-token request keeps its one empty work
                pieces.append((b, ks, ke))
    W = len(pieces)
    frags = [Fragment(c, *pieces[w]) for c in range(N) for w in range(c * W // N, (c + 1) * W // N)]
    return _finish(x, frags, "simple", {"block": blk, "chunk": chunk, "cus_allowed": N})


PLANNERS: dict[str, Callable[..., WorkPlan]] = {
    "aiter-intra-batch": plan_intra_batch,
    "aiter-fast": plan_fast,
    "aiter-cost-heap": plan_cost_heap,
    "balanced": plan_balanced,
    "simple": plan_simple,
}


def make_plan(
    planner: str, qo_indptr: torch.Tensor | DecodeInputs, kv_indptr: torch.Tensor | str | int | GpuTarget,
    target: str | int | GpuTarget | None = None, **knobs: object,
) -> WorkPlan:  # fmt: skip
    """Run the named planner; unknown names or knobs fail with the valid choices.

    ``make_plan(planner, qo_indptr, kv_indptr, target, **knobs)``, or with the inputs themselves,
    ``make_plan(planner, inputs, target, **knobs)``: the indptrs, ``page_size`` and ``kv_last_page_len`` are then
    the inputs' own (`mlalab.inputs.DecodeInputs`)."""
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}; valid: {', '.join(PLANNERS)}")
    if isinstance(qo_indptr, DecodeInputs):
        given = sorted({"page_size", "kv_last_page_len"} & set(knobs))
        if target is not None or given:
            raise TypeError("make_plan(planner, inputs, target, **knobs): with inputs, the third argument is the target"
                            + (f"; it takes {', '.join(given)} from the inputs" if given else ""))  # fmt: skip
        x, target = qo_indptr, kv_indptr
        qo_indptr, kv_indptr = x.qo_indptr.cpu(), x.kv_indptr.cpu()
        knobs = {**knobs, "page_size": x.page_size, "kv_last_page_len": x.kv_last_page_len.cpu()}
    elif target is None:
        raise TypeError("make_plan needs a target: make_plan(planner, qo_indptr, kv_indptr, target) or "
                        "make_plan(planner, inputs, target)")  # fmt: skip
    fn = PLANNERS[planner]
    valid = [n for n, p in inspect.signature(fn).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    bad = [k for k in knobs if k not in valid]
    if bad:
        raise TypeError(f"planner {planner!r} has no knob {', '.join(bad)}; valid knobs: {', '.join(valid)}")
    return fn(qo_indptr, kv_indptr, target, **knobs)


INT32_MAX = 2**31 - 1  # aiter's metadata tensors (and ours) are int32


def indptrs_for(
    kv_lens: Sequence[int], q_len: int = 1, *, page_size: int = 1
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(qo_indptr, kv_indptr)`` int32 for contiguous pages (a convenience for planning without inputs); with
    ``page_size > 1`` also ``kv_last_page_len``. Vectorised (no per-token tensor); totals past int32 are refused."""
    if isinstance(kv_lens, torch.Tensor):
        kv_lens = kv_lens.tolist()
    lens = [int(n) for n in kv_lens]
    if not lens or any(n < 0 for n in lens):
        raise ValueError(f"kv_lens must be a non-empty list of non-negative ints, got {str(kv_lens)[:80]}")
    _pos_int("q_len", q_len)
    ps = _pos_int("page_size", page_size)
    t = torch.tensor(lens, dtype=torch.int64)
    pages = (t + ps - 1) // ps
    total = int(pages.sum())
    if total > INT32_MAX:
        unit = "tokens" if ps == 1 else f"pages of {ps}"
        raise ValueError(f"the batch holds {total:,} KV {unit}, past the int32 limit {INT32_MAX:,} of aiter's metadata "
                         "tensors (kv_indptr is int32): split the batch")  # fmt: skip
    if len(lens) * q_len > INT32_MAX:
        raise ValueError(f"{len(lens) * q_len:,} q rows exceed the int32 limit {INT32_MAX:,} of qo_indptr")
    qo = torch.arange(len(lens) + 1, dtype=torch.int64).mul_(q_len).to(torch.int32)
    kv = torch.zeros(len(lens) + 1, dtype=torch.int64)
    kv[1:] = torch.cumsum(pages, 0)
    if ps == 1:
        return qo, kv.to(torch.int32)
    last = torch.where(t > 0, t - (pages - 1) * ps, torch.zeros_like(t)).to(torch.int32)
    return qo, kv.to(torch.int32), last

"""WorkPlan layout, the research note's worked examples (pinned), validate() catching broken plans, bad input."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from mlalab.plan import PLANNERS, PlanError, WorkPlan, indptrs_for, intra_batch_splits, make_plan


def plan_for(planner: str, lens: list[int], target: object, **kw: object) -> WorkPlan:
    qo, kv = indptrs_for(lens)
    return make_plan(planner, qo, kv, target, **kw).validate(qo, kv)


def frag_tokens(plan: WorkPlan, b: int) -> list[int]:
    df = plan.to_frame()
    return df[df.batch_idx == b].sort_values("kv_start").kv_tokens.tolist()


# ---------------------------------------------------------------- worked examples (research note §2.7)
def test_gfx942_intra_batch_16_works_of_64_and_ignores_splits() -> None:
    for splits in (4, 32, 64):
        p = plan_for("aiter-intra-batch", [1024] * 4, "mi300x", num_kv_splits=splits)
        assert p.n_work == 64 and p.summary()["busy_cus"] == 64
        assert all(frag_tokens(p, b) == [64] * 16 for b in range(4))
        # work/CU 16b+i, partial row = work index
        wi = p.work_info
        assert wi[:, 1].tolist() == list(range(64))
        assert p.work_cus().tolist() == list(range(64))


def test_gfx950_intra_batch_5_works() -> None:
    p = plan_for("aiter-intra-batch", [1024] * 4, "mi355x", max_split_per_batch=32)
    assert p.n_work == 20
    assert p.reduce_indptr.tolist() == [0, 5, 10, 15, 20]
    assert all(frag_tokens(p, b) == [208] * 4 + [192] for b in range(4))
    assert p.reduce_final_map.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]


def test_fast_mode_304_cus_32_by_32() -> None:
    p = plan_for("aiter-fast", [1024] * 4, "mi300x")
    s = p.summary()
    assert (s["works"], s["busy_cus"], s["idle_cus"]) == (128, 128, 176)
    assert all(frag_tokens(p, b) == [32] * 32 for b in range(4))
    assert p.reduce_indptr.tolist() == [0, 32, 64, 96, 128]
    df = p.to_frame()
    r1 = df[df.batch_idx == 1].sort_values("kv_start")
    assert r1.cu.tolist() == list(range(32, 64))
    assert r1.kv_start.tolist() == [1024 + 32 * i for i in range(32)]
    assert r1.partial_qo_loc.tolist() == list(range(32, 64))
    assert r1.kv_offset.tolist() == [992 - 32 * i for i in range(32)]


def test_fast_mode_max_split_32() -> None:
    for tgt in ("mi300x", "mi355x"):
        p = plan_for("aiter-fast", [1024] * 4, tgt, max_split_per_batch=32)
        assert p.n_work == 88 and p.reduce_indptr.tolist() == [0, 22, 44, 66, 88]
        assert all(frag_tokens(p, b) == [48] * 21 + [16] for b in range(4))


def test_fast_mode_b1_fragment_counts_match_pr4899() -> None:
    counts = {512: 32, 1024: 64, 2048: 128, 4096: 128, 8192: 171, 16384: 205, 32768: 228, 65536: 241}
    for L, n in counts.items():
        assert plan_for("aiter-fast", [L], 256).n_work == n
    assert set(frag_tokens(plan_for("aiter-fast", [512], 256), 0)) == {16}


def test_fast_mode_global_budget_and_boundary_split() -> None:
    p = plan_for("aiter-fast", [100000, 100], 304, max_split_per_batch=32)
    assert p.summary()["works_per_request"] == [64, 1]
    assert set(frag_tokens(p, 0)[:-1]) == {1584}
    p = plan_for("aiter-fast", [100000, 100, 100, 100], 256)
    assert frag_tokens(p, 2) == [32, 68]


def test_fast_mode_larger_batches() -> None:
    s = plan_for("aiter-fast", [8192] * 32, 304).summary()
    assert (s["works"], s["busy_cus"], s["params"]["payload_blocks"]) == (320, 299, 72)
    assert set(s["works_per_request"]) == {10}
    s = plan_for("aiter-fast", [1024] * 256, 304).summary()
    assert (s["works"], s["busy_cus"], s["split_requests"]) == (256, 256, 0)


def test_cost_heap_example() -> None:
    p = plan_for("aiter-cost-heap", [1024] * 4, "mi300x")
    assert p.params["workload_limit"] == 96
    assert p.n_work == 64 and p.summary()["busy_cus"] == 64
    assert all(frag_tokens(p, b) == [64] * 16 for b in range(4))


@pytest.mark.parametrize(
    "B,L,arch,want",
    [(1, 8192, "gfx950", (32, 256)), (32, 4096, "gfx950", (8, 512)), (64, 1024, "gfx950", (4, 256)),
     (256, 1024, "gfx950", (1, 1024)), (32, 8192, "gfx942", (16, 512))],
)  # fmt: skip
def test_intra_batch_table_b(B: int, L: int, arch: str, want: tuple[int, int]) -> None:
    p = plan_for("aiter-intra-batch", [L] * B, "mi300x" if arch == "gfx942" else "mi355x")
    toks = frag_tokens(p, 0)
    assert (len(toks), toks[0]) == want


def test_intra_batch_clamps_short_requests_and_merges_tiny_tail() -> None:
    assert intra_batch_splits(100, 4, 256, 32, "gfx950") == 1  # aiter: 100 // 196 = 0 -> division by zero
    p = plan_for("aiter-intra-batch", [100, 50], "mi355x")
    assert p.summary()["works_per_request"] == [1, 1] and p.work_info[:, 1].tolist() == [-1, -1]
    # gfx942, 16 splits of 4 blocks: a 964-token request would end with a 4-token chunk -> merged
    p = plan_for("aiter-intra-batch", [964], "mi300x")
    assert frag_tokens(p, 0) == [64] * 14 + [68]
    assert frag_tokens(plan_for("aiter-intra-batch", [965], "mi300x"), 0) == [64] * 15 + [5]


def test_intra_batch_rules_at_their_edges() -> None:
    """Hand-computed: gfx950 splits = 980 // 196 = 5 (979: 4); the default cap of 32 splits binds at 7840 tokens
    (7840 // 196 = 40): payload ceil(490 blocks / 32) = 16 blocks, so 30 works of 256 and one of 160; gfx942, 17
    tokens = 2 blocks of 16 whose last chunk holds 1 token -> merged into one work of 17."""
    assert intra_batch_splits(980, 1, 256, 32, "gfx950") == 5
    assert intra_batch_splits(979, 1, 256, 32, "gfx950") == 4
    p = plan_for("aiter-intra-batch", [7840], "mi355x")
    assert p.params["max_split_per_batch"] == 32 and frag_tokens(p, 0) == [256] * 30 + [160]
    assert frag_tokens(plan_for("aiter-intra-batch", [17], "mi300x"), 0) == [17]
    assert frag_tokens(plan_for("aiter-intra-batch", [18, 20, 21], "mi300x"), 2) == [16, 5]


def test_intra_batch_tail_rule_counts_tokens_of_pages() -> None:
    """Pages of 16, granularity 1 page, gfx942 (16 splits): 31 pages whose last holds 3 tokens (483 tokens) are 15
    chunks of 2 pages and a last of 1 page = 3 tokens: merged, so 14 works of 2 pages and one of 3."""
    qo = torch.tensor([0, 1], dtype=torch.int32)
    kv = torch.tensor([0, 31], dtype=torch.int32)
    last = torch.tensor([3], dtype=torch.int32)
    p = make_plan("aiter-intra-batch", qo, kv, "mi300x", page_size=16, kv_last_page_len=last, kv_granularity=1)
    p.validate(qo, kv)
    wi = p.work_info
    assert (wi[:, 5] - wi[:, 4]).tolist() == [2] * 14 + [3]
    assert wi[:, 6].tolist() == [483 - 32 * (i + 1) for i in range(14)] + [0]  # kv_offset: tokens after each work


def test_intra_batch_deals_works_request_major() -> None:
    """20 works on 256 CUs: work i (request-major, in KV order) on CU i, with partial row i."""
    p = plan_for("aiter-intra-batch", [1024] * 4, "mi355x")
    df = p.to_frame().sort_values(["batch_idx", "kv_start"])
    assert df.cu.tolist() == list(range(20)) and df.partial_qo_loc.tolist() == list(range(20))


def test_fast_mode_exact_fit_stays_on_the_cu_and_params() -> None:
    """[256, 0, 0] on 2 CUs (granularity 16, OVH 16 blocks): payload = ceil((16 + 16 + 0 + 16 + 0 + 16) / 2) + 16 = 48
    blocks; request 0 costs 32, request 1 (empty) exactly the 16 left (``remain >= rb + OVH``): both on CU 0,
    request 2 on CU 1."""
    p = plan_for("aiter-fast", [256, 0, 0], 2)
    assert p.work_indptr.tolist() == [0, 2, 3]
    assert p.params["payload_blocks"] == 48 and p.params["num_splits"] == 2
    assert p.params["max_split_per_batch"] == -1  # aiter's "no cap"
    assert plan_for("aiter-fast", [256, 0, 0], 2, max_split_per_batch=3).params["max_split_per_batch"] == 3


def test_fast_mode_tail_rule_edges() -> None:
    """Granularity 1 (OVH 16 tokens), 5 CUs, payload = ceil((35 + 16 + 100 + 16) / 5) + 16 = 50: the first cut
    falls at 34. [35, 100] at q_len 2 would leave 1 token (< 2): request 0 stays whole, and request 1 (the next
    one) is still planned: 34 + 34 + 32. [37, 100] at q_len 4 would leave 3 (< 4): the same, 37 in one work."""
    for lens, q_len in (([35, 100], 2), ([37, 100], 4)):
        qo, kv = indptrs_for(lens, q_len=q_len)
        p = make_plan("aiter-fast", qo, kv, 5, kv_granularity=1, q_len=q_len).validate(qo, kv)
        assert (frag_tokens(p, 0), frag_tokens(p, 1)) == ([lens[0]], [34, 34, 32]), (lens, p.to_frame())


def test_fast_mode_tail_rule_counts_tokens_of_pages() -> None:
    """Pages of 16, granularity 1 page (OVH 1 page), 2 CUs, q_len 4: requests of 10 pages (147 tokens, 3 in the
    last page) and 6 full pages; payload = ceil((10 + 1 + 6 + 1) / 2) + 1 = 10 pages, so CU 0 would cut request 0
    after 9 pages, leaving 3 tokens (< 4): it takes all 10 instead."""
    qo = torch.tensor([0, 4, 8], dtype=torch.int32)
    kv = torch.tensor([0, 10, 16], dtype=torch.int32)
    last = torch.tensor([3, 16], dtype=torch.int32)
    p = make_plan("aiter-fast", qo, kv, 2, page_size=16, kv_last_page_len=last, kv_granularity=1, q_len=4)
    p.validate(qo, kv)
    assert p.work_info[:, [0, 4, 5]].tolist() == [[0, 0, 10], [1, 10, 16]]
    assert p.params["payload_blocks"] == 10


# (q rows per request, kv lens, CUs, num_heads, kv_granularity) -> (avg, workload_limit), by hand from the docstring:
# avg = ceil((sum(2 packed + kv) - 2 p B) / CUs), limit by avg's band, wl = 2p + limit + 2p (0.01 B + 0.01 avg + 10),
# rounded up to an int and then to the granularity. E.g. [2] on 4 CUs: cost 32 + 2, avg = ceil(32 / 4) = 8 -> limit 32,
# wl = 2 + 32 + 2 (0.01 + 0.08 + 10) = 54.18 -> 55; [6]: avg 9 -> limit 64, wl = 86.2 -> 87; [230]: avg 65 = limit,
# wl = 88.32 -> 89; 13 x 100 at q_len 4 (packed 64) on 8: avg = ceil((13 * 228 - 104) / 8) = 358, wl = 8 + 358 +
# 8 (0.13 + 3.58 + 10) = 475.68 -> 476; q_len 2 x 128 heads: packed capped at 128, avg = ceil(256 / 4) = 64, wl =
# 196 + 4 (10.65) = 238.6 -> 239; q rows [1, 2] (not uniform: p = 128), cost 42 + 74 - 512 < 0 -> avg 0, wl = 288 +
# 256 (10.02) = 2853.12 -> 2864 (granularity 16).
COST_HEAP_LIMITS = [
    ([1], [2], 4, 16, 1, (8, 55)), ([1], [6], 4, 16, 1, (9, 87)), ([1], [34], 4, 16, 1, (16, 87)),
    ([1], [38], 4, 16, 1, (17, 151)), ([1], [98], 4, 16, 1, (32, 151)), ([1], [102], 4, 16, 1, (33, 215)),
    ([1], [226], 4, 16, 1, (64, 216)), ([1], [230], 4, 16, 1, (65, 89)), ([4] * 13, [100] * 13, 8, 16, 1, (358, 476)),
    ([2], [4], 4, 128, 1, (64, 239)), ([1, 2], [10, 10], 4, 16, 16, (0, 2864)),
]  # fmt: skip


def test_cost_heap_workload_limit_hand_computed() -> None:
    for q_rows, lens, cus, heads, gran, want in COST_HEAP_LIMITS:
        qo = torch.tensor([0, *torch.tensor(q_rows).cumsum(0).tolist()], dtype=torch.int32)
        kv = indptrs_for(lens)[1]
        p = make_plan("aiter-cost-heap", qo, kv, cus, num_heads=heads, kv_granularity=gran).validate(qo, kv)
        assert (p.params["avg"], p.params["workload_limit"]) == want, (q_rows, lens, cus)


def test_cost_heap_minimum_piece() -> None:
    """[1589] on 16 CUs: avg 102, workload_limit 128, so a fresh CU has room (128 - 32) = 96 tokens, but a piece is at
    least roundup(ceil(1589 / 16), 16) = 112: 14 pieces of 112, then the 21 tokens left in one."""
    p = plan_for("aiter-cost-heap", [1589], 16)
    assert p.params["workload_limit"] == 128 and frag_tokens(p, 0) == [112] * 14 + [21]


def test_cost_heap_split_tolerance_edge() -> None:
    """1696 / 1697 tokens on 16 CUs: avg 108 = limit, workload_limit = roundup(ceil(2 + 108 + 2 (10.01 + 1.08)), 16)
    = 144, pieces of 112. Before the 15th piece 128 (1696) or 129 (1697) tokens are left: a rest of 16 after it is
    absorbed (<= kSplitTolerance), a rest of 17 is a work of its own."""
    assert frag_tokens(plan_for("aiter-cost-heap", [1696], 16), 0) == [112] * 14 + [128]
    assert frag_tokens(plan_for("aiter-cost-heap", [1697], 16), 0) == [112] * 15 + [17]


def test_cost_heap_places_costlier_requests_first() -> None:
    """[64, 1000] on 4 CUs: avg = ceil((96 + 1032 - 4) / 4) = 281 = limit, workload_limit = roundup(ceil(2 + 281 + 2
    (0.02 + 2.81 + 10)), 16) = 320, so a fresh CU has room 288. Request 1 (cost 1032) goes first: 288 on CUs 0, 1, 2
    and the last 136 on CU 3 (load 168); then request 0 (cost 96) on the least-loaded CU, 3."""
    p = plan_for("aiter-cost-heap", [64, 1000], 4)
    df = p.to_frame().sort_values(["batch_idx", "kv_start"])
    assert p.params["workload_limit"] == 320
    assert list(zip(df.batch_idx, df.cu, df.kv_tokens)) == [(0, 3, 64), (1, 0, 288), (1, 1, 288), (1, 2, 288),
                                                            (1, 3, 136)]  # fmt: skip


def test_cost_heap_load_accounting_on_a_revisited_cu() -> None:
    """[100, 300, 300] on 4 CUs: avg = ceil((132 + 332 + 332 - 6) / 4) = 198 = limit, workload_limit =
    roundup(ceil(200 + 2 (0.03 + 1.98 + 10)), 16) = 240, room of a fresh CU 208. Requests 1 and 2 (cost 332) take
    208 + 92 each on CUs 0, 1 and 2, 3 (loads 240, 124 = 32 + 92). Request 0 (min piece 32) then goes to CU 1 (load
    124): room (240 - 124 - 32) // 16 * 16 = 80, so 80 tokens, and the last 20 on CU 3."""
    p = plan_for("aiter-cost-heap", [100, 300, 300], 4)
    assert (p.params["workload_limit"], p.params["avg"]) == (240, 198)
    df = p.to_frame().sort_values(["batch_idx", "kv_start"])
    assert list(zip(df.batch_idx, df.cu, df.kv_tokens)) == [(0, 1, 80), (0, 3, 20), (1, 0, 208), (1, 1, 92),
                                                            (2, 2, 208), (2, 3, 92)]  # fmt: skip


def test_balanced_rules_by_hand() -> None:
    """Default overhead 64 tokens; a 1-token cut is a work (2 tokens on 2 CUs at granularity 1, no overhead: capacity
    1, one token per CU); `max_split_per_batch` caps the CUs used at splits x batch (2 x 2 = 4 of 16)."""
    assert plan_for("balanced", [100], 4).params["overhead_tokens"] == 64
    p = plan_for("balanced", [2], 2, kv_granularity=1, overhead=0)
    assert p.params["capacity"] == 1 and p.work_info[:, [0, 4, 5]].tolist() == [[0, 0, 1], [0, 1, 2]]
    p = plan_for("balanced", [1000, 1000], 16, max_split_per_batch=2)
    assert p.params["cus_allowed"] == 4 and p.summary()["busy_cus"] == 4


def test_balanced_capacity_is_the_smallest_that_fits() -> None:
    """[1000] on 2 CUs, overhead 64, granularity 16: CU 0 cuts t = (C - 64) // 16 * 16 tokens and CU 1 needs
    1000 - t + 64 <= C, i.e. C = 64 + 16 k + r with 32 k + r >= 1000: k = 31, r = 8, C = 568 (496 + 504 tokens). On
    one CU everything shares it: [100, 100] needs 200 + 2 x 64 = 328 (overhead 64) or 200 (overhead 0)."""
    p = plan_for("balanced", [1000], 2)
    assert p.params["capacity"] == 568 and frag_tokens(p, 0) == [496, 504]
    for overhead, cap in ((64, 328), (0, 200)):
        p = plan_for("balanced", [100, 100], 1, overhead=overhead)
        assert p.params["capacity"] == cap and p.n_work == 2
    # [20, 20, 20] on 2 CUs, overhead 1 (< granularity 16): a second request fits CU 0 only as a cut of 16, which
    # needs 21 + 1 + 16 = 38; below that the third request finds no CU
    # requests shorter than the granularity: [5, 5] on 4 CUs without overhead fit a capacity of 5, one per CU (the
    # search once started at overhead + granularity = 16 and put both on CU 0); two empty requests: capacity 64
    p = plan_for("balanced", [5, 5], 4, overhead=0)
    assert p.params["capacity"] == 5 and p.work_indptr.tolist() == [0, 1, 2, 2, 2]
    assert plan_for("balanced", [0, 0], 4).params["capacity"] == 64
    p = plan_for("balanced", [20, 20, 20], 2, overhead=1)
    assert p.params["capacity"] == 38 and p.work_info[:, [0, 4, 5]].tolist() == [
        [0, 0, 20],
        [1, 20, 36],
        [1, 36, 40],
        [2, 40, 60],
    ]


def test_balanced_never_worse_than_fast_on_its_own_objective() -> None:
    for lens in ([1024] * 4, [100000, 100, 100, 100], [8192] * 32, [5, 7000, 300, 0, 12000]):
        bal = plan_for("balanced", lens, 256, overhead=64)
        fast = plan_for("aiter-fast", lens, 256)

        def worst(p: WorkPlan) -> int:
            counts = (p.work_indptr[1:] - p.work_indptr[:-1]).long()
            return int((p.cu_loads() + 64 * counts).max())

        assert worst(bal) <= worst(fast)


# ---------------------------------------------------------------- simple (ours, the Triton default on the H200)
def test_simple_64x8192_on_132_grows_the_chunk_to_one_wave() -> None:
    # total/132 = 3972 -> chunk 4032 (63 blocks of 64) would cut each request in 3: 192 works, 60 CUs running two.
    # The rule grows the chunk by 64 until the works fit: 4096 -> 2 works per request, 128 works, one per CU.
    p = plan_for("simple", [8192] * 64, 132)
    assert p.params["chunk"] == 4096
    s = p.summary()
    assert (s["works"], s["busy_cus"], s["max_works_per_cu"], s["split_requests"]) == (128, 128, 1, 64)
    assert all(frag_tokens(p, b) == [4096, 4096] for b in range(64))
    # contiguous runs: CU c gets works [c*128//132, (c+1)*128//132), so the 4 idle CUs are spread out
    counts = (p.work_indptr[1:] - p.work_indptr[:-1]).tolist()
    assert counts == [(c + 1) * 128 // 132 - c * 128 // 132 for c in range(132)]
    assert p.n_partial_rows == 128 and p.reduce_indptr.tolist() == list(range(0, 129, 2))


def test_simple_chunk_growth_by_hand() -> None:
    """[128, 1, 1] on 2 SMs, block 64: chunk = roundup(ceil(130 / 2), 64) = 128 = the longest request, so it does
    not grow although 3 works exceed the 2 SMs (the docstring's "or the chunk reaches the longest request")."""
    p = plan_for("simple", [128, 1, 1], 2)
    assert p.params["chunk"] == 128 and p.n_work == 3
    # an empty request is one (empty) work: [0, 128, 128] on 5 SMs fits one wave at chunk 64 (1 + 2 + 2 works)
    p = plan_for("simple", [0, 128, 128], 5)
    assert p.params["chunk"] == 64 and p.n_work == 5
    # [129, 1, 1, 1] on 4 SMs: chunk 64 (6 works), then 128 (129 = 128 + 1 is still 2 works: 5 > 4), then 192
    p = plan_for("simple", [129, 1, 1, 1], 4)
    assert p.params["chunk"] == 192 and p.n_work == 4


def test_simple_b4x1024_on_132_is_16_works_of_64() -> None:
    p = plan_for("simple", [1024] * 4, 132)
    assert p.params["chunk"] == 64  # ceil(4096 / 132) = 32, raised to one block
    s = p.summary()
    assert (s["works"], s["busy_cus"], s["max_works_per_cu"]) == (64, 64, 1)
    assert all(frag_tokens(p, b) == [64] * 16 for b in range(4))
    df = p.to_frame()
    assert df.sort_values("work").cu.tolist() == [c for c in range(132) if (c + 1) * 64 // 132 > c * 64 // 132]


def test_simple_respects_block_granularity_and_pages() -> None:
    p = plan_for("simple", [700, 0, 33, 5000], 7, block=32)
    assert p.summary()["works_per_request"][1] == 1
    assert all(t % 32 == 0 for b in (0, 3) for t in frag_tokens(p, b)[:-1])
    with pytest.raises(ValueError, match="block .24. must be a multiple of kv_granularity .16."):
        plan_for("simple", [100], 4, block=24, kv_granularity=16)
    capped = plan_for("simple", [8192] * 8, 132, max_split_per_batch=2)  # at most 2 * 8 = 16 CUs
    assert capped.params["cus_allowed"] == 16 and capped.summary()["busy_cus"] == 16
    # paged: positions are pages; the last page is partial (40 and 20 tokens in pages of 16)
    kv = torch.tensor([0, 3, 5], dtype=torch.int32)
    qo = torch.tensor([0, 1, 2], dtype=torch.int32)
    last = torch.tensor([8, 4], dtype=torch.int32)
    p = make_plan("simple", qo, kv, 4, page_size=16, kv_last_page_len=last, block=1).validate(qo, kv)
    # 5 pages on 4 CUs: chunk ceil(5/4) = 2 pages -> 2 + 1 works; CU c gets works [c*3//4, (c+1)*3//4)
    assert p.params["chunk"] == 2 and p.work_info[:, 4:6].tolist() == [[0, 2], [2, 3], [3, 5]]
    assert p.kv_lens == (40, 20) and p.cu_loads().tolist() == [0, 32, 8, 20]


def test_zero_token_request_gets_one_empty_unsplit_work() -> None:
    for name in PLANNERS:
        p = plan_for(name, [0, 300, 0], 8)
        df = p.to_frame()
        empty = df[df.batch_idx == 0]
        assert len(empty) == 1 and int(empty.kv_tokens.iloc[0]) == 0 and int(empty.partial_qo_loc.iloc[0]) == -1


# ---------------------------------------------------------------- layout and views
def test_tensor_layout_dtypes_and_views() -> None:
    p = plan_for("aiter-fast", [700, 33, 2000], "h200", max_split_per_batch=4)
    for name, t in p.tensors().items():
        assert t.dtype == torch.int32 and t.is_contiguous() and t.device.type == "cpu", name
    assert p.work_indptr.shape == (133,) and p.work_info.shape[1] == 8
    assert p.reduce_final_map.shape == (3, 2) and p.reduce_indptr.shape == (4,)
    assert int(p.cu_loads().sum()) == 2733
    df = p.to_frame()
    assert list(df.columns[:4]) == ["work", "cu", "slot", "batch_idx"] and len(df) == p.n_work
    q = p.to("cpu")
    assert torch.equal(q.work_info, p.work_info)
    sub = p.for_request(2)
    qo, kv = indptrs_for([2000])
    sub.validate(qo, kv)
    assert sub.n_work == p.summary()["works_per_request"][2]


def test_page_size_positions_and_offsets() -> None:
    kv = torch.tensor([0, 3, 5], dtype=torch.int32)  # pages of 16: 40 and 20 tokens
    qo = torch.tensor([0, 1, 2], dtype=torch.int32)
    last = torch.tensor([8, 4], dtype=torch.int32)
    p = make_plan("balanced", qo, kv, 4, page_size=16, kv_last_page_len=last, kv_granularity=1, overhead=0)
    p.validate(qo, kv)
    assert p.kv_lens == (40, 20) and int(p.cu_loads().sum()) == 60


# ---------------------------------------------------------------- validate() must catch broken plans
def _broken(p: WorkPlan, **tensors: torch.Tensor) -> WorkPlan:
    return dataclasses.replace(p, **tensors)


def test_validate_catches_corruption() -> None:
    qo, kv = indptrs_for([1024, 300])
    p = make_plan("aiter-fast", qo, kv, 16).validate(qo, kv)
    cases = {}
    wi = p.work_info.clone()
    wi[1, 5] -= 16  # gap
    cases["gap"] = _broken(p, work_info=wi)
    wi = p.work_info.clone()
    wi[1, 4] -= 1  # overlap
    cases["overlap"] = _broken(p, work_info=wi)
    wi = p.work_info.clone()
    wi[0, 1] = -1  # split request writing output directly
    cases["direct"] = _broken(p, work_info=wi)
    wi = p.work_info.clone()
    wi[0, 0] = 7
    cases["batch"] = _broken(p, work_info=wi)
    wi = p.work_info.clone()
    wi[0, 6] += 1
    cases["offset"] = _broken(p, work_info=wi)
    pm = p.reduce_partial_map.clone()
    pm[0] = pm[1]
    cases["partial"] = _broken(p, reduce_partial_map=pm)
    ri = p.reduce_indptr.clone()
    ri[1] = 0
    cases["reduce"] = _broken(p, reduce_indptr=ri)
    for name, bad in cases.items():
        with pytest.raises(PlanError):
            bad.validate(qo, kv)
            pytest.fail(f"validate() accepted a plan with a {name} error")
    with pytest.raises(PlanError, match="batch"):
        p.validate(*indptrs_for([1024]))


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kw,exc,match",
    [
        ({"target": 0}, ValueError, "CU count"),
        ({"target": -5}, ValueError, "CU count"),
        ({"target": "-5"}, ValueError, "CU count"),
        ({"target": "mi999"}, ValueError, "unknown GPU target"),
        ({"max_split_per_batch": 0}, ValueError, "max_split_per_batch"),
        ({"num_kv_splits": -3}, ValueError, "max_split_per_batch"),
        ({"kv_granularity": 24}, ValueError, "power of two"),
        ({"kv_granularity": 0}, ValueError, "kv_granularity"),
        ({"q_len": 2}, ValueError, "q_len"),
        ({"bogus": 1}, TypeError, "valid knobs"),
    ],
)
def test_bad_knobs(kw: dict, exc: type, match: str) -> None:
    qo, kv = indptrs_for([100, 200])
    target = kw.pop("target", 64)
    with pytest.raises(exc, match=match):
        make_plan("aiter-fast", qo, kv, target, **kw)


def test_bad_indptrs_and_names() -> None:
    qo, kv = indptrs_for([100, 200])
    with pytest.raises(ValueError, match="valid: aiter-intra-batch"):
        make_plan("nope", qo, kv, 64)
    with pytest.raises(ValueError, match="kv_indptr"):
        make_plan("balanced", qo, torch.tensor([0, 5], dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="non-decreasing"):
        make_plan("balanced", qo, torch.tensor([0, 5, 3], dtype=torch.int32), 64)
    with pytest.raises(ValueError, match="start at 0"):
        make_plan("balanced", qo, torch.tensor([1, 5, 9], dtype=torch.int32), 64)
    with pytest.raises(TypeError, match="dtype"):
        make_plan("balanced", qo, kv.float(), 64)
    with pytest.raises(ValueError, match="no query rows"):
        make_plan("balanced", torch.tensor([0, 0, 1], dtype=torch.int32), kv, 64)
    with pytest.raises(ValueError, match="max_split_per_batch >= 1"):
        make_plan("aiter-intra-batch", qo, kv, 64, max_split_per_batch=-1)
    with pytest.raises(ValueError, match="rule"):
        make_plan("aiter-intra-batch", qo, kv, 64, rule="gfx1250")


# ---------------------------------------------------------------- CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlalab", *args], capture_output=True, text=True, timeout=120)


def test_cli_plan_json() -> None:
    args = ["--target", "mi355x", "--planner", "aiter-intra-batch", "--batch", "4", "--kv-len", "1024", "--json"]
    r = _cli("plan", *args)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["reduce_indptr"] == [0, 5, 10, 15, 20] and len(d["work_info"]) == 20 and len(d["work_indptr"]) == 257
    assert d["summary"]["busy_cus"] == 20 and d["summary"]["max_cu_load_tokens"] == 208
    r = _cli("plan", "--target", "0", "--planner", "aiter-fast")
    assert r.returncode == 2 and "CU count" in r.stderr


def test_cli_decode_check() -> None:
    r = _cli("decode", "--backend", "emulated", "--planner", "aiter-fast", "--target", "32", "--kv-lens", "300,0,40",
             "--q-len", "2", "--check", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["rel_l2"] < 1e-12 and d["out_shape"] == [6, 16, 512]


def test_make_plan_takes_the_inputs_themselves() -> None:
    """make_plan(planner, inputs, target): the inputs' indptrs, page size and last-page lengths, so a paged batch
    needs no repeated arguments (and its plan emulates)."""
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.plan import emulate_plan

    x = make_inputs(DecodeCase(kv_lens=(100, 300, 7, 0), page_size=16, permute_pages=True))
    for planner in PLANNERS:
        a = make_plan(planner, x, "mi300x")
        b = make_plan(planner, x.qo_indptr, x.kv_indptr, "mi300x", page_size=16, kv_last_page_len=x.kv_last_page_len)
        assert a.page_size == 16 and all(
            torch.equal(getattr(a, n), getattr(b, n))
            for n in ("work_indptr", "work_info", "reduce_indptr", "reduce_final_map", "reduce_partial_map")
        )
    emulate_plan(x, make_plan("balanced", x, "h200"))  # (fails with "plan was made for page size 1" otherwise)
    with pytest.raises(TypeError, match="it takes page_size from the inputs"):
        make_plan("simple", x, "h200", page_size=16)
    with pytest.raises(TypeError, match="with inputs, the third argument is the target"):
        make_plan("simple", x, "h200", "mi300x")
    with pytest.raises(TypeError, match="make_plan needs a target"):
        make_plan("simple", x.qo_indptr, x.kv_indptr)

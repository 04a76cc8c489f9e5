"""`WorkPlan.validate` catches each broken invariant with its own message, and each planner rule is pinned by a test
that fails when the rule is removed (each was checked by deleting the rule once: see the test docstrings)."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
import torch

from mlalab.plan import PlanError, WorkPlan, indptrs_for, make_plan
from mlalab.plan.invariants import check_metadata

LENS, Q_LEN = [256, 100, 64], 2


def _base() -> tuple[WorkPlan, torch.Tensor, torch.Tensor]:
    """balanced, 4 CUs, no overhead: request 0 in 3 works (partial rows 0, 2, 4), request 1 in 2 (6, 8), request 2
    unsplit. work_info rows: [b, slot, qs, qe, ks, ke, kv_offset, pad]."""
    qo, kv = indptrs_for(LENS, q_len=Q_LEN)
    p = make_plan("balanced", qo, kv, 4, overhead=0).validate(qo, kv)
    assert p.work_info[:, [0, 1, 4, 5, 6]].tolist() == [
        [0, 0, 0, 112, 144], [0, 2, 112, 224, 32], [0, 4, 224, 256, 0],
        [1, 6, 256, 336, 20], [1, 8, 336, 356, 0], [2, -1, 356, 420, 0],
    ]  # fmt: skip
    assert p.reduce_partial_map.tolist() == [0, 2, 4, 6, 8]
    return p, qo, kv


def _corrupt(p: WorkPlan, edits: dict[tuple[int, int], int], pmap: dict[int, int] | None = None) -> WorkPlan:
    wi = p.work_info.clone()
    for (r, c), v in edits.items():
        wi[r, c] = v
    pm = p.reduce_partial_map.clone()
    for i, v in (pmap or {}).items():
        pm[i] = v
    return dataclasses.replace(p, work_info=wi, reduce_partial_map=pm)


# one corruption per invariant; each leaves every other invariant intact (the kinds are checked to be exactly one)
CORRUPTIONS = {
    # work 1 ends 16 earlier (its kv_offset moved with it): [208, 224) of request 0 belongs to no work
    "gap": ({(1, 5): 208, (1, 6): 48}, None, "uncovered", r"KV positions \[208, 224\) are not covered by any work"),
    # work 2 starts 16 earlier: [208, 224) is read by works 1 and 2
    "kv_overlap": ({(2, 4): 208}, None, "covered_twice", r"KV positions \[208, 224\) are covered twice"),
    # work 1 writes rows [1, 3) (and the reduce reads row 1): row 1 is also work 0's
    "partial_overlap": ({(1, 1): 1}, {1: 1}, "partial_overlap", r"works 0 and 1 write overlapping partial rows"),
    # request 1's reduce tile reads request 0's row 0 instead of its own row 6
    "reduce": ({}, {3: 0}, "reduce", r"reduce tile 1 merges partial rows \[0, 8\], its works wrote \[6, 8\]"),
    # work 0 claims 143 tokens follow it (144 do)
    "kv_offset": ({(0, 6): 143}, None, "kv_offset", r"work 0: kv_offset 143 but 144 tokens of request 0 follow"),
}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_validate_names_each_broken_invariant(name: str) -> None:
    p, qo, kv = _base()
    edits, pmap, kind, message = CORRUPTIONS[name]
    bad = _corrupt(p, edits, pmap)
    kinds = {f.kind for f in check_metadata(*bad.tensors().values(), qo, kv, n_partial_rows=p.n_partial_rows,
                                            kv_lens=p.kv_lens)}  # fmt: skip
    assert kinds == {kind}, kinds
    with pytest.raises(PlanError, match=message):
        bad.validate(qo, kv)


def test_validate_partial_rows_beyond_the_buffer_and_split_consistency() -> None:
    p, qo, kv = _base()
    with pytest.raises(PlanError, match=r"partial rows \[8, 10\) exceed the 9-row partial buffer"):
        dataclasses.replace(p, n_partial_rows=9).validate(qo, kv)
    with pytest.raises(PlanError, match="is not split but its work writes partial row 10"):
        dataclasses.replace(_corrupt(p, {(5, 1): 10}), n_partial_rows=12).validate(qo, kv)  # rows 10-11 are free
    with pytest.raises(PlanError, match="q row.s. missing"):
        _corrupt(p, {(5, 3): 5}).validate(qo, kv)


# ------------------------------------------------------------------------------------------ planner rules pinned
def _cuts(p: WorkPlan, kv: torch.Tensor) -> list[int]:
    """Every internal cut, as an offset from its request's first position."""
    starts = kv.tolist()
    return [ks - starts[b] for b, ks in zip(p.work_info[:, 0].tolist(), p.work_info[:, 4].tolist()) if ks > starts[b]]


@pytest.mark.parametrize("gran", [16, 64])
def test_balanced_cuts_on_kv_granularity(gran: int) -> None:
    """Removing the alignment (``take = remain - ovh``) puts cuts at e.g. 1000 - 733 = ... offsets: this fails."""
    for lens, cus in (([1000, 333], 7), ([777, 5000, 31], 13), ([4097] * 3, 10)):
        qo, kv = indptrs_for(lens)
        p = make_plan("balanced", qo, kv, cus, kv_granularity=gran, overhead=50).validate(qo, kv)
        cuts = _cuts(p, kv)
        assert cuts, "the case must split a request"
        assert all(c % gran == 0 for c in cuts), (lens, cuts)


def test_fast_tail_rule_never_leaves_fewer_tokens_than_q_rows() -> None:
    """[100, 37] at q_len 4 on 5 CUs (granularity 1): the fill would cut request 1 after 34 tokens, leaving 3
    (< 4 q rows, the fp8 NaN of aiter PR #2106); the tail rule keeps the 37 tokens in one work. Without the rule
    request 1 is split 34 + 3."""
    qo, kv = indptrs_for([100, 37], q_len=4)
    p = make_plan("aiter-fast", qo, kv, 5, kv_granularity=1, q_len=4).validate(qo, kv)
    df = p.to_frame()
    assert df.kv_tokens.min() >= 4, df.kv_tokens.tolist()
    assert df[df.batch_idx == 1].kv_tokens.tolist() == [37]


def test_cost_heap_split_tolerance_absorbs_short_rests() -> None:
    """[1063, 300] on 8 CUs: after six 176-token pieces, 7 tokens of request 0 would be left; kSplitTolerance (16)
    folds them into the sixth piece. With the tolerance at 0 a 7-token work appears."""
    qo, kv = indptrs_for([1063, 300])
    p = make_plan("aiter-cost-heap", qo, kv, 8).validate(qo, kv)
    df = p.to_frame()
    assert df.kv_tokens.min() > 16, df.kv_tokens.tolist()
    assert sorted(df[df.batch_idx == 0].kv_tokens.tolist()) == [176] * 5 + [183]


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _start_chunk(lens: list[int], n: int, blk: int) -> int:
    return max(blk, _ceil(_ceil(sum(lens), n), blk) * blk)


def _simple_chunk_by_growth(lens: list[int], n: int, blk: int) -> int:
    """The simple planner's growth rule written out linearly (its definition)."""
    chunk = _start_chunk(lens, n, blk)
    while chunk < max(lens) and sum(max(1, _ceil(x, chunk)) for x in lens) > n:
        chunk += blk
    return chunk


def test_simple_growth_rule_matches_its_definition() -> None:
    """The chunk grows by `block` until the works fit one wave; without the growth, 64 x 8192 on 132 keeps chunk
    4032 (3 works per request) and this fails (as does test_simple_64x8192_on_132_grows_the_chunk_to_one_wave)."""
    rng = random.Random(5)
    grew = 0
    for _ in range(60):
        lens = [rng.choice([rng.randint(0, 300), rng.randint(1000, 20000)]) for _ in range(rng.randint(1, 90))]
        if not any(lens):
            continue
        n, blk = rng.choice([7, 64, 132]), rng.choice([16, 64])
        qo, kv = indptrs_for(lens)
        p = make_plan("simple", qo, kv, n, block=blk).validate(qo, kv)
        want = _simple_chunk_by_growth(lens, n, blk)
        assert p.params["chunk"] == want, (lens, n, blk)
        grew += want > _start_chunk(lens, n, blk)
    assert grew >= 5, "the random cases must exercise the growth"


# ------------------------------------------------------------------------------------------ malformed metadata
def _t(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


# what to replace in `_base()`'s tensors / arguments -> the one structure finding it must give (a dump from another
# tool can be any shape: the doctor must name it, not crash on it)
MALFORMED = {
    "work_info 7 wide": ({"work_info": "drop last column"}, r"work_info must be \(n, 8\), got \(6, 7\)"),
    "work_indptr past work_info": ({"work_indptr": [0, 1, 2, 4, 7]}, r"work_indptr\[-1\] = 7 but work_info has only 6"),
    "reduce_indptr past the partial map": ({"reduce_indptr": [0, 3, 5, 6]},
                                           r"reduce_indptr\[-1\] = 6 > reduce_partial_map size 5"),
    "reduce_final_map odd": ({"reduce_final_map": [0, 2, 2, 4, 4]}, r"reduce_final_map must hold \(start, end\) for "
                                                                    r"each of the 3 reduce tiles"),
    "reduce_final_map short": ({"reduce_final_map": [[0, 2], [2, 4]]}, r"reduce_final_map must hold .* 3 reduce"),
    "kv_lens short": ({"kv_lens": [256, 100]}, r"kv_lens has 2 entries for 3 requests"),
}  # fmt: skip


@pytest.mark.parametrize("name", MALFORMED)
def test_check_metadata_names_malformed_structure(name: str) -> None:
    p, qo, kv = _base()
    t = p.tensors()
    kw: dict = {"n_partial_rows": p.n_partial_rows, "kv_lens": list(p.kv_lens)}
    assert check_metadata(*t.values(), qo, kv, **kw) == []
    assert check_metadata(*t.values(), qo, kv) == []  # kv_lens and the buffer size are optional
    change, message = MALFORMED[name]
    for key, v in change.items():
        if key == "kv_lens":
            kw[key] = v
        elif v == "drop last column":
            t[key] = t[key][:, :7]
        else:
            t[key] = _t(v)
    found = check_metadata(*t.values(), qo, kv, **kw)
    assert [f.kind for f in found] == ["structure"], found
    assert re.search(message, found[0].message), found[0].message


def test_validate_names_a_work_reaching_into_the_next_request() -> None:
    """Work 2 (request 0, [224, 256)) made to end at 260, inside request 1's KV: only its kv_range finding says so
    (coverage is clipped to the request, and no kv_offset is checked outside it)."""
    p, qo, kv = _base()
    bad = _corrupt(p, {(2, 5): 260})
    found = check_metadata(*bad.tensors().values(), qo, kv, n_partial_rows=p.n_partial_rows, kv_lens=p.kv_lens)
    hits = [f for f in found if f.kind == "kv_range"]
    assert len(hits) == 1 and (hits[0].work, hits[0].first, hits[0].count) == (2, 224, 36), found
    assert "kv [224, 260) reaches beyond request 0's KV [0, 256)" in hits[0].message
    # and a start before the request's first position
    bad = _corrupt(p, {(3, 4): 250})
    hits = [f for f in check_metadata(*bad.tensors().values(), qo, kv) if f.kind == "kv_range"]
    assert len(hits) == 1 and (hits[0].work, hits[0].first, hits[0].count) == (3, 250, 86), hits


def test_partial_overlap_names_the_first_writer_of_the_row() -> None:
    """Works 0 and 1 both write rows [0, 2), work 2 rows [1, 3): two overlaps, each naming the first work (in row
    order, then work index) that wrote the row: "works 0 and 1" (row 0) and "works 0 and 2" (row 1)."""
    p, qo, kv = _base()
    bad = _corrupt(p, {(1, 1): 0, (2, 1): 1})
    found = [f for f in check_metadata(*bad.tensors().values(), qo, kv) if f.kind == "partial_overlap"]
    assert [(f.message.split(" write")[0], f.first, f.count) for f in found] == [
        ("works 0 and 1", 0, 2), ("works 0 and 2", 1, 1)]  # fmt: skip


def test_short_q_rows_summary_counts_only_the_works_missing_rows() -> None:
    """Request 1's two works compute row 2 of its rows [2, 4) (metadata for q_len 1), and work 5 computes rows [0, 2),
    outside request 2's [4, 6): the summary names q_len 1 vs 2 and counts the 2 short works, not the misplaced one."""
    p, qo, kv = _base()
    bad = _corrupt(p, {(3, 3): 3, (4, 3): 3, (5, 2): 0, (5, 3): 2})
    found = [f for f in check_metadata(*bad.tensors().values(), qo, kv) if f.kind == "q_rows"]
    assert found[0].message == (
        "metadata for q_len 1 used with q_len 2: 2 works compute 1 of their request's 2 q rows, the others are never "
        "computed"
    )
    assert [(f.work, "missing" in f.message) for f in found[1:]] == [(3, True), (4, True), (5, False)]
    assert found[1].message == (
        "work 3: computes q rows [2, 3) but request 1 has rows [2, 4): 1 q row(s) missing (metadata for q_len 1 used "
        "with q_len 2?)"
    )


def test_reduce_reading_an_unwritten_partial_row_is_named() -> None:
    """A 12-row buffer, request 1's reduce tile reading row 10 (inside the buffer, written by no work) instead of 6."""
    p, qo, kv = _base()
    bad = _corrupt(p, {}, {3: 10})
    found = check_metadata(*bad.tensors().values(), qo, kv, n_partial_rows=12)
    stale = [f.message for f in found if f.kind == "partial_range"]
    assert stale == ["reduce tile 1: reads partial rows [10] that no work writes (a stale or freed partial-offset "
                     "table?)"], found  # fmt: skip
    # row 0 unwritten (work 0 moved to row 10) but still read by request 0's tile
    found = check_metadata(*_corrupt(p, {(0, 1): 10}).tensors().values(), qo, kv, n_partial_rows=12)
    assert [f.message for f in found if f.kind == "partial_range"] == [
        "reduce tile 0: reads partial rows [0] that no work writes (a stale or freed partial-offset table?)"
    ]
    # out of range: exactly the buffer's size, and below -1
    for row in (12, -2):
        found = check_metadata(*_corrupt(p, {}, {3: row}).tensors().values(), qo, kv, n_partial_rows=12)
        assert [f.message for f in found if f.kind == "partial_range"] == [
            f"reduce tile 1: partial rows [{row}] out of range (the buffer has 12 rows): a stale or freed "
            "partial-offset table?"], found  # fmt: skip


def test_plan_for_an_empty_request_reused_with_kv_is_named() -> None:
    """A plan made for [0, 100, 64] (request 0: one empty work) used with [40, 100, 64]: request 0 is the first that
    differs (its work covers 0 of its 40 positions)."""
    qo, kv_old = indptrs_for([0, 100, 64])
    p = make_plan("balanced", qo, kv_old, 4, overhead=0).validate(qo, kv_old)
    _, kv = indptrs_for([40, 100, 64])
    top = check_metadata(*p.tensors().values(), qo, kv)[0]
    assert top.kind == "other_lengths" and (top.request, top.count) == (0, 3), top
    assert "request 0 has 40 KV positions but its works cover 0 (3 of 3 requests differ)" in top.message
    # the first request that differs is not the first one: [64, 50, 100] used with [64, 200, 100]
    qo, kv_old = indptrs_for([64, 50, 100])
    p = make_plan("balanced", qo, kv_old, 4, overhead=0).validate(qo, kv_old)
    top = check_metadata(*p.tensors().values(), qo, indptrs_for([64, 200, 100])[1])[0]
    assert top.kind == "other_lengths" and (top.request, top.count) == (1, 2), top
    assert "request 1 has 200 KV positions but its works cover 50 (2 of 3 requests differ)" in top.message


def test_coverage_findings_give_first_position_and_count() -> None:
    p, qo, kv = _base()
    cases = {
        "gap": ({(1, 5): 208, (1, 6): 48}, "uncovered", 208, 16),
        "kv_overlap": ({(2, 4): 208}, "covered_twice", 208, 16),
        "works stop early": ({(2, 5): 240}, "uncovered", 240, 16),
        "request without a work": ({(5, 0): 1, (5, 2): 2, (5, 3): 4}, "uncovered", 356, 64),
    }
    for name, (edits, kind, first, count) in cases.items():
        found = [f for f in check_metadata(*_corrupt(p, edits).tensors().values(), qo, kv) if f.kind == kind]
        assert [(f.first, f.count) for f in found] == [(first, count)], (name, found)
    # an empty work inside a request with KV is a kv_range finding, never a 0-position double cover
    found = check_metadata(*_corrupt(p, {(1, 4): 100, (1, 5): 100}).tensors().values(), qo, kv)
    assert "covered_twice" not in {f.kind for f in found} and "kv_range" in {f.kind for f in found}, found


def test_partial_qo_loc_below_minus_one_is_a_field_finding() -> None:
    p, qo, kv = _base()
    found = check_metadata(*_corrupt(p, {(5, 1): -2}).tensors().values(), qo, kv)
    assert [(f.kind, f.message) for f in found] == [
        ("field", "work 5: partial_qo_loc -2 < -1"),
        ("split", "request 2 is not split but its work writes partial row -2 instead of the output"),
    ], found


def test_validate_says_how_many_more_findings_there_are() -> None:
    """validate() raises the first finding; with more, its message counts the rest (doctor lists them)."""
    p, qo, kv = _base()
    for edits, pmap in (CORRUPTIONS["gap"][:2], ({(1, 5): 208, (1, 6): 48, (0, 6): 143}, None)):
        bad = _corrupt(p, edits, pmap)
        n = len(check_metadata(*bad.tensors().values(), qo, kv, n_partial_rows=p.n_partial_rows, kv_lens=p.kv_lens))
        with pytest.raises(PlanError) as e:
            bad.validate(qo, kv)
        more = f"(and {n - 1} more findings: mlalab.plan.doctor lists them)"
        assert (more in str(e.value)) == (n > 1) and ("more findings" in str(e.value)) == (n > 1), (n, str(e.value))
    assert n >= 2


def test_work_tokens_without_kv_lens_count_positions_times_page_size() -> None:
    """A plan that does not know its requests' lengths (e.g. read from aiter's tensors) counts a work's tokens as its
    kv_indices positions x page size; one that knows them counts exactly, a plan of one work too."""
    qo, kv = indptrs_for([5, 3, 0])
    plan = make_plan("balanced", qo, kv, 3, page_size=16, kv_last_page_len=torch.tensor([16, 7, 0]))
    bare = dataclasses.replace(plan, kv_lens=())
    wi = plan.work_info.long()
    assert bare.work_tokens().tolist() == ((wi[:, 5] - wi[:, 4]) * 16).tolist()
    assert plan.work_tokens().sum() == 5 * 16 + 2 * 16 + 7  # exact with the lengths: the last page holds 7
    assert bare.work_tokens().sum() == 8 * 16
    one = make_plan("simple", *indptrs_for([5]), 1, page_size=16, kv_last_page_len=torch.tensor([7]))
    assert one.n_work == 1 and one.work_tokens().tolist() == [4 * 16 + 7]  # a single work counts exactly too

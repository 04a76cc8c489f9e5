"""compare_plans / plan_from_aiter_buffers on the CPU, with our own planners' plans (no fake aiter).

Expected split counts are the seeds' case in docs/aiter.md ("Planners"): B = 4 requests of 1024 tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mlalab.backends.aiter import plan_knobs
from mlalab.backends.aiter_args import AiterSettings
from mlalab.backends.aiter_plan import compare_plans, defined_entries, plan_from_aiter_buffers
from mlalab.plan import indptrs_for, make_plan


def _example_a(planner: str, target: str, **knobs):
    qo, kv = indptrs_for([1024] * 4)
    return make_plan(planner, qo, kv, target, **knobs)


def test_identical_plans_have_no_differences():
    a = _example_a("aiter-intra-batch", "mi300x")
    b = _example_a("aiter-intra-batch", "mi300x")
    d = compare_plans(a, b)
    assert d.identical and d.count == 0 and d.differences == ()
    assert str(d).endswith("identical")
    assert d.summary["works"] == (64, 64)


def test_perturbed_copy_names_each_difference():
    a = _example_a("aiter-fast", "mi355x")
    info = a.work_info.clone()
    info[3, 5] += 1  # kv_end of work 3
    pm = a.reduce_partial_map.clone()
    pm[7] = 999
    b = dataclasses.replace(a, work_info=info, reduce_partial_map=pm)
    d = compare_plans(a, b)
    assert d.count == 2
    kv_end = int(a.work_info[3, 5])
    assert f"work 3 (CU 3) kv_end: {kv_end} vs {kv_end + 1} (request 0 vs 0)" in d.differences
    assert f"reduce_partial_map[7]: {int(a.reduce_partial_map[7])} vs 999" in d.differences
    c = dataclasses.replace(a, planner="other")
    assert compare_plans(a, c).identical  # the name is not part of the plan


def test_different_planners_differ_where_the_note_says():
    intra = _example_a("aiter-intra-batch", "mi300x")  # gfx942: 16 x 64 tokens per request
    fast = _example_a("aiter-fast", "mi300x")  # auto: 32 x 32 tokens per request
    d = compare_plans(intra, fast, limit=3)
    assert not d.identical and len(d.differences) == 3 and d.count > 3
    assert d.summary["works"] == (64, 128) and d.summary["busy_cus"] == (64, 128)
    assert "number of works: 64 vs 128" in str(compare_plans(intra, fast, limit=10_000))
    other_target = _example_a("aiter-intra-batch", "mi355x")
    assert any(x.startswith("num_cus: 304 vs 256") for x in compare_plans(intra, other_target).differences)
    with pytest.raises(ValueError, match="limit"):
        compare_plans(intra, fast, limit=0)
    with pytest.raises(TypeError, match="WorkPlan"):
        compare_plans(intra, object())


def _as_aiter_buffers(plan, extra_works=7, extra_partials=5, garbage=-123456):
    """Our plan laid out as aiter's over-sized, uninitialized buffers (garbage where aiter writes nothing)."""
    n_work, n_p = plan.work_info.shape[0], plan.reduce_partial_map.numel()
    info = torch.full((n_work + extra_works, 8), garbage, dtype=torch.int32)
    info[:n_work] = plan.work_info
    info[:n_work, 7] = garbage  # padding dword
    pm = torch.full((n_p + extra_partials,), garbage, dtype=torch.int32)
    pm[:n_p] = plan.reduce_partial_map
    fm = plan.reduce_final_map.clone()
    counts = plan.reduce_indptr[1:] - plan.reduce_indptr[:-1]
    fm[counts < 1] = garbage  # fast mode leaves rows of unsplit tiles unwritten
    return {
        "work_metadata": torch.zeros(2, dtype=torch.int64),
        "work_indptr": plan.work_indptr.clone(),
        "work_info_set": info,
        "reduce_indptr": plan.reduce_indptr.clone(),
        "reduce_final_map": fm,
        "reduce_partial_map": pm,
    }


@pytest.mark.parametrize(
    "planner, lens, target",
    [
        ("aiter-fast", [100000, 100, 100, 100], "mi355x"),  # example C: some requests unsplit
        ("aiter-intra-batch", [1024] * 4, "mi355x"),
        ("aiter-fast", [1024] * 256, "mi300x"),  # example D: no request split
    ],
)
def test_reading_aiter_buffers_ignores_undefined_entries(planner, lens, target):
    qo, kv = indptrs_for(lens)
    ours = make_plan(planner, qo, kv, target)
    theirs = plan_from_aiter_buffers(
        _as_aiter_buffers(ours), num_cus=ours.num_cus, batch=ours.batch, planner="read back", kv_lens=tuple(lens)
    )
    d = compare_plans(ours, theirs)
    assert d.identical, str(d)
    assert theirs.n_partial_rows == ours.n_partial_rows
    assert theirs.validate(qo, kv) is not None  # the read-back plan is a valid WorkPlan for the same inputs
    assert defined_entries(theirs)["work_info"].shape == (ours.work_info.shape[0], 7)


def test_plan_knobs_mirror_the_metadata_call():
    """Example A through the backend's knob mapping: gfx950 intra-batch 5 splits, gfx942 16, fast msp=32 22."""
    gfx950 = _example_a("aiter-intra-batch", "mi355x", **plan_knobs(AiterSettings(), "gfx950", 1))
    assert gfx950.reduce_indptr.tolist() == [0, 5, 10, 15, 20]
    gfx942 = _example_a("aiter-intra-batch", "mi300x", **plan_knobs(AiterSettings(), "gfx942:sramecc+:xnack-", 1))
    assert gfx942.reduce_indptr.tolist() == [0, 16, 32, 48, 64]
    capped = AiterSettings(mode="fast", max_split_per_batch=32)
    fast = _example_a("aiter-fast", "mi300x", **plan_knobs(capped, "gfx942", 1))
    assert fast.reduce_indptr.tolist() == [0, 22, 44, 66, 88]
    auto = _example_a("aiter-fast", "mi300x", **plan_knobs(AiterSettings(mode="fast"), "gfx942", 1))
    assert auto.reduce_indptr.tolist() == [0, 32, 64, 96, 128]

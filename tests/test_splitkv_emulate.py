"""Emulator vs the fp64 reference (every planner, ragged, paged, q_len > 1), traces, backend, property tests."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlalab.backends import decode
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.plan import PLANNERS, emulate_plan, indptrs_for, make_plan
from mlalab.reference import decode_inputs_reference


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_emulator_matches_reference_fp64(planner: str) -> None:
    x = make_inputs(DecodeCase(kv_lens=(700, 3, 1500, 64, 0), q_len=2, page_size=16, permute_pages=True, seed=3))
    ref, ref_lse = decode_inputs_reference(x, empty_policy="zeros")
    n_split = 0
    for target in ("mi300x", 32, 5):
        plan = make_plan(planner, x.qo_indptr, x.kv_indptr, target, page_size=16, kv_last_page_len=x.kv_last_page_len)
        out, lse, _ = emulate_plan(x, plan)
        n_split += plan.summary()["split_requests"]
        assert rel(out, ref) <= 1e-12, (planner, target)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        fin = torch.isfinite(ref_lse)
        assert float((lse[fin] - ref_lse[fin]).abs().max()) <= 1e-12
    assert n_split >= 2  # the test exercises the reduce, not only direct writes


def test_float32_emulation_is_close() -> None:
    x = make_inputs(DecodeCase.uniform(2, 2048, dist="unit"))
    ref, _ = decode_inputs_reference(x)
    plan = make_plan("aiter-fast", x.qo_indptr, x.kv_indptr, 64)
    out = emulate_plan(x, plan, compute_dtype=torch.float32).out
    assert out.dtype == torch.float32 and 1e-9 < rel(out.double(), ref) < 1e-5


def test_trace_contents_and_merge() -> None:
    x = make_inputs(DecodeCase.uniform(2, 512))
    plan = make_plan("aiter-intra-batch", x.qo_indptr, x.kv_indptr, "mi300x")
    res = emulate_plan(x, plan, trace=True)
    works, red = res.trace["works"], res.trace["reduce"]
    assert len(works) == plan.n_work == 32 and len(red) == 2
    assert [w.cu for w in works] == plan.work_cus().tolist()
    r0 = red[0]
    assert r0.weights.shape == (16, 1, 16) and torch.allclose(r0.weights.sum(0), torch.ones(1, 16, dtype=torch.float64))
    lse_parts = torch.stack([w.lse for w in works if w.batch == 0])
    assert torch.allclose(torch.logsumexp(lse_parts, 0), res.lse[0:1])
    assert all(bool((w.m <= w.lse).all()) for w in works)  # lse = m + ln(l) with l >= 1


def test_unwritten_rows_are_nan_not_silently_zero() -> None:
    """A plan whose reduce forgets a request leaves NaN (the emulator does not hide broken plans)."""
    import dataclasses

    x = make_inputs(DecodeCase.uniform(2, 256))
    plan = make_plan("aiter-fast", x.qo_indptr, x.kv_indptr, 8)
    bad = dataclasses.replace(plan, reduce_indptr=torch.zeros_like(plan.reduce_indptr))
    with pytest.raises(ValueError, match="no reduce tile"):
        emulate_plan(x, bad)


def test_emulate_rejects_mismatched_plan() -> None:
    x = make_inputs(DecodeCase.uniform(2, 256))
    qo, kv = indptrs_for([256, 300])
    with pytest.raises(ValueError):
        emulate_plan(x, make_plan("balanced", qo, kv, 8))
    with pytest.raises(TypeError, match="plan"):
        emulate_plan(x, "aiter-fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compute_dtype"):
        emulate_plan(x, make_plan("balanced", x.qo_indptr, x.kv_indptr, 8), compute_dtype=torch.float16)


def test_backend_emulated() -> None:
    x = make_inputs(DecodeCase(kv_lens=(300, 17), q_len=4))
    ref, _ = decode_inputs_reference(x)
    for planner in PLANNERS:
        out, lse = decode(x, backend="emulated", planner=planner, target="h200", kv_granularity=32)
        assert rel(out, ref) <= 1e-12
    with pytest.raises(TypeError, match="no option 'max_split_per_batch'; its options: .*planner 'aiter-cost-heap'"):
        decode(x, backend="emulated", planner="aiter-cost-heap", max_split_per_batch=4)


def test_quant_schemes_against_dequantized_reference() -> None:
    quant = pytest.importorskip("mlalab.quant")
    if not hasattr(quant, "get_kv_scheme"):
        pytest.skip("mlalab.quant has no get_kv_scheme yet")
    from mlalab.plan import dequantized_inputs

    x = make_inputs(DecodeCase.uniform(2, 300))
    plan = make_plan("aiter-fast", x.qo_indptr, x.kv_indptr, 16)
    name = "fp8-tensor"
    res = emulate_plan(x, plan, q_scheme=name, kv_scheme=name)
    ref_q, _ = decode_inputs_reference(dequantized_inputs(x, q_scheme=name, kv_scheme=name))
    ref, _ = decode_inputs_reference(x)
    assert rel(res.out, ref_q) <= 1e-12
    assert rel(res.out, ref) > 1e-6  # the scheme really changed the inputs


# ---------------------------------------------------------------- properties
lens_st = st.lists(st.sampled_from([0, 1, 2, 5, 17]) | st.integers(0, 5000), min_size=1, max_size=24)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=lens_st,
    n_cus=st.sampled_from([1, 2, 3, 7, 12, 132, 256, 304]),
    q_len=st.sampled_from([1, 1, 2, 4]),
    gran=st.sampled_from([1, 4, 16, 64]),
    splits=st.sampled_from([None, 1, 2, 3, 8, 32]),
)
def test_every_planner_validates_on_random_ragged_batches(
    lens: list[int], n_cus: int, q_len: int, gran: int, splits: int | None
) -> None:
    qo, kv = indptrs_for(lens, q_len)
    for name in PLANNERS:
        kw: dict[str, object] = {"kv_granularity": gran, "q_len": q_len}
        if splits is not None and name != "aiter-cost-heap":
            kw["max_split_per_batch"] = splits
        plan = make_plan(name, qo, kv, n_cus, **kw).validate(qo, kv)
        assert int(plan.cu_loads().sum()) == sum(lens)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(0, 48), min_size=1, max_size=5),
    n_cus=st.integers(1, 9),
    q_len=st.sampled_from([1, 2]),
    page_size=st.sampled_from([1, 1, 4]),
    seed=st.integers(0, 1000),
)
def test_emulator_equals_reference_property(lens: list[int], n_cus: int, q_len: int, page_size: int, seed: int) -> None:
    x = make_inputs(DecodeCase(kv_lens=tuple(lens), q_len=q_len, page_size=page_size, permute_pages=True, seed=seed))
    ref, _ = decode_inputs_reference(x, empty_policy="zeros")
    for name in PLANNERS:
        plan = make_plan(
            name, x.qo_indptr, x.kv_indptr, n_cus, page_size=page_size, kv_last_page_len=x.kv_last_page_len,
            kv_granularity=4,
        )  # fmt: skip
        out = emulate_plan(x, plan).out
        assert float((out - ref).abs().max()) <= 1e-12 * max(float(ref.abs().max()), 1e-30) or rel(out, ref) <= 1e-12


def test_trace_values_are_the_works_own_numbers() -> None:
    """Each work's trace holds its max scaled score, its LSE and the norm of its output rows over the value dims,
    computed here from q and the work's KV tokens (peaked inputs: unit std, q x 3, paged, ragged); each reduce trace
    names the request that owns its q rows."""
    import dataclasses

    x = make_inputs(DecodeCase(kv_lens=(1, 65, 900, 3, 700), q_len=2, page_size=16, permute_pages=True, seed=5,
                               dist="unit"))  # fmt: skip
    x = dataclasses.replace(x, q=(x.q.float() * 3).to(x.q.dtype))
    plan = make_plan("aiter-fast", x.qo_indptr, x.kv_indptr, 8, page_size=16, kv_last_page_len=x.kv_last_page_len)
    res = emulate_plan(x, plan, trace=True)
    kv, tok = x.token_kv()
    kv, tok, cfg = kv.double().reshape(-1, 576), tok.tolist(), x.case.config
    q = x.q.double()
    for w in res.trace["works"]:
        t0, t1 = w.tokens
        k = kv[tok[w.batch] + t0 : tok[w.batch] + t1]
        s = torch.einsum("qhd,nd->qhn", q[w.q_rows[0] : w.q_rows[1]], k) * cfg.sm_scale
        o = torch.einsum("qhn,nd->qhd", torch.softmax(s, -1), k[:, :512])
        assert torch.allclose(w.m, s.amax(-1), rtol=0, atol=1e-12)
        assert torch.allclose(w.lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)
        assert w.out_norm.shape == (w.q_rows[1] - w.q_rows[0], 16)
        assert torch.allclose(w.out_norm, o.norm(dim=-1), rtol=1e-10, atol=0)
    qo = x.qo_indptr.tolist()
    assert res.trace["reduce"]
    for r in res.trace["reduce"]:  # a reduce tile merges all q rows of its request
        assert (qo[r.batch], qo[r.batch + 1]) == r.rows, (r.batch, r.rows)


def test_token_operands_quantise_the_side_named() -> None:
    from mlalab.plan.emulate import token_operands

    x = make_inputs(DecodeCase(kv_lens=(70, 5), seed=2, dist="unit"))
    q0, kv0, _ = token_operands(x)
    qq, kvq, _ = token_operands(x, q_scheme="fp8-tensor")
    assert not torch.equal(qq.float(), q0.float()) and torch.equal(kvq, kv0)
    qk, kvk, _ = token_operands(x, kv_scheme="fp8-tensor")
    assert torch.equal(qk, q0) and not torch.equal(kvk.float(), kv0.float())


def test_emulate_plan_refuses_nonfinite_inputs_unless_allowed() -> None:
    x = make_inputs(DecodeCase(kv_lens=(40, 3), seed=1))
    kv = x.kv_buffer.clone()
    kv.view(-1, 576)[1, 7] = float("inf")  # (token 1 of request 0)
    bad = type(x)(x.q, kv, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len, x.case)
    plan = make_plan("balanced", x.qo_indptr, x.kv_indptr, 4)
    with pytest.raises(ValueError, match="kv_buffer contains 1 non-finite"):
        emulate_plan(bad, plan)
    assert not torch.isfinite(emulate_plan(bad, plan, allow_nonfinite=True).out[0]).all()


def test_reduce_trace_names_the_request_it_merges_next_to_requests_with_no_q_rows() -> None:
    """A request with 0 q rows (accepted by the reference and the emulator; planners refuse it, a hand-built plan can
    hold it) starts at the same q row as the next request. Each reduce trace must name the request whose partial rows
    it merges, not the first work whose q rows start at the tile's. Peaked inputs (unit std, q x 3), fp64 reference.
    Case 1: request 1 (0 rows, unsplit, first on CU 0) shares q row 1 with split request 2. Case 2: requests 0 and 1
    both have 0 rows, request 1 is split (hand-numbered partial rows 0 and 1: its tile merges 0 rows)."""
    import dataclasses

    from mlalab.plan.workplan import Fragment, build_plan

    x = make_inputs(DecodeCase(kv_lens=(300, 20, 200), q_len=1, seed=7, dist="unit"))
    q = (x.q.float() * 3).to(x.q.dtype)
    kvp, lens = x.kv_indptr.tolist(), [300, 20, 200]
    for keep, qo, frags, slots, want in (
        ([0, 2], [0, 1, 1, 2], [(0, 1, 300, 320), (1, 0, 0, 150), (2, 0, 150, 300), (3, 2, 320, 420),
                                (0, 2, 420, 520)], None, [(0, (0, 1)), (2, (1, 2))]),
        ([2], [0, 0, 0, 1], [(0, 0, 0, 300), (1, 1, 300, 310), (2, 1, 310, 320), (3, 2, 320, 520)], [0, 1],
         [(1, (0, 0))]),
    ):  # fmt: skip
        qi = torch.tensor(qo, dtype=x.qo_indptr.dtype)
        xi = dataclasses.replace(x, q=q[keep], qo_indptr=qi)
        plan = build_plan([Fragment(*f) for f in frags], num_cus=4, qo=qo, kvp=kvp, kv_lens=lens, page_size=1,
                          planner="hand")  # fmt: skip
        if slots is not None:  # compact numbering gives a 0-row request's works one row: renumber them apart
            wi = plan.work_info.clone()
            wi[1:3, 1] = torch.tensor(slots)
            pmap = torch.tensor(slots, dtype=torch.int32)
            plan = dataclasses.replace(plan, work_info=wi, reduce_partial_map=pmap, n_partial_rows=2)
        assert plan.work_info[0, 2] == plan.work_info[1, 2]  # a work of another request starts at the tile's row
        res = emulate_plan(xi, plan, trace=True)
        ref, ref_lse = decode_inputs_reference(xi)
        assert rel(res.out, ref) <= 1e-12 and float((res.lse - ref_lse).abs().max()) <= 1e-12
        assert [(r.batch, r.rows) for r in res.trace["reduce"]] == want

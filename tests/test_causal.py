"""Speculative verification's causal mask (`DecodeCase.causal`): q row i of a request's q rows sees all but its
q - 1 - i newest KV tokens. The reference against a formulation written here (each row decoded over its own
truncated KV), the naive loop, the split-KV emulator under every planner (splits that lie wholly past a row's prefix
included), the kernels' host tables, the aiter keywords, the study row keys and bad input. Every check is shown to
fail on the non-causal answer, on peaked inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mlalab.accuracy.grid import _case_json
from mlalab.backends.aiter_abi import AiterAbi
from mlalab.backends.aiter_args import mla_decode_fwd_kwargs, stage1_kwargs
from mlalab.config import DecodeCase
from mlalab.inputs import gather_request_kv, make_inputs
from mlalab.kernels.decoder import causal_work_info, token_work_info
from mlalab.kernels.sm90.host import row_passes
from mlalab.plan import PLANNERS, emulate_plan, make_plan
from mlalab.reference import causal_visible, decode_inputs_reference, decode_naive_loop, decode_reference


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _truncated_rows(x) -> torch.Tensor:  # noqa: ANN001
    """Written without the library's mask: every q row decoded alone over the first n - (q - 1 - i) tokens."""
    out = torch.zeros(x.q.shape[0], 16, 512, dtype=torch.float64)
    qo = x.qo_indptr.tolist()
    for b in range(x.batch):
        kv = gather_request_kv(x, b)[:, 0].double()
        q = qo[b + 1] - qo[b]
        for i in range(q):
            k = kv[: kv.shape[0] - (q - 1 - i)]
            s = (x.q[qo[b] + i].double() @ k.T) / math.sqrt(576)
            out[qo[b] + i] = torch.softmax(s, -1) @ k[:, :512]
    return out


def _peaked(case: DecodeCase):  # noqa: ANN202
    """Unit-std inputs with q x 3: attention concentrated on few tokens, so hiding the newest ones shows."""
    x = make_inputs(case)
    return dataclasses.replace(x, q=(x.q.float() * 3).to(torch.bfloat16))


CASES = [
    DecodeCase(kv_lens=(130, 4, 70), q_len=4, seed=1, dist="unit", causal=True),
    DecodeCase(kv_lens=(129, 2, 64), q_len=2, seed=2, dist="unit", causal=True, page_size=16, permute_pages=True),
    DecodeCase(kv_lens=(300, 9), q_len=4, seed=3, dist="unit", causal=True, permute_pages=True, pool_factor=3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.short_str())
def test_reference_is_each_row_over_its_prefix_and_not_the_whole_kv(case: DecodeCase) -> None:
    x = _peaked(case)
    ref, lse = decode_inputs_reference(x)
    want = _truncated_rows(x)
    assert _rel(ref, want) <= 1e-13
    assert float((decode_naive_loop(x) - ref).abs().max()) <= 1e-12
    wide, _ = decode_inputs_reference(x, causal=False)
    assert _rel(wide, want) > 1e-2, "the non-causal answer passes: the check cannot fail"
    # the last q row of every request sees all of its KV: there the two agree
    last = (x.qo_indptr[1:] - 1).long()
    assert _rel(wide[last], ref[last]) <= 1e-13
    assert torch.isfinite(lse).all()


def test_causal_visible_and_q_len_1() -> None:
    assert causal_visible(10, 4).tolist() == [7, 8, 9, 10]
    assert causal_visible(4, 4).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="3 KV tokens cannot serve 4 q rows"):
        causal_visible(3, 4)
    x = make_inputs(DecodeCase(kv_lens=(50, 7), seed=4, dist="unit", causal=True))
    assert torch.equal(decode_inputs_reference(x)[0], decode_inputs_reference(x, causal=False)[0])


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_emulator_every_planner_with_splits_past_a_rows_prefix(planner: str) -> None:
    """At 40 slots the simple and balanced planners cut a 130-token request so that its last split holds 2 tokens,
    which q rows 0 and 1 (of 4) do not see: their partials there are empty (LSE -inf) and the merge must skip them."""
    x = _peaked(DecodeCase(kv_lens=(130, 4, 0, 70), q_len=4, seed=5, dist="unit", causal=True))
    ref, ref_lse = decode_inputs_reference(x, empty_policy="zeros")
    wide, _ = decode_inputs_reference(x, empty_policy="zeros", causal=False)
    empty_partials = 0
    for target in (5, 40):
        plan = make_plan(planner, x.qo_indptr, x.kv_indptr, target)
        out, lse, tr = emulate_plan(x, plan, trace=True)
        assert _rel(out, ref) <= 1e-12, (planner, target)
        assert _rel(wide, ref) > 1e-2
        live = torch.isfinite(ref_lse)
        assert float((lse - ref_lse)[live].abs().max()) <= 1e-12 and torch.isneginf(lse[~live]).all()
        empty_partials += sum(int(torch.isneginf(w.lse).all(-1).sum()) for w in tr["works"] if w.partial_row >= 0)
    if planner in ("simple", "balanced"):  # (aiter's planners never cut a tail shorter than a granule)
        assert empty_partials > 0, f"{planner}: no split lay past a row's prefix; the case tests nothing"


def test_kernel_tables_cut_each_rows_kv_end_to_its_prefix() -> None:
    """`causal_work_info` on the one-row tables the kernels run: the row's end moves back by q - 1 - i, never before
    the work's start; q_len 1 and the rows that see everything keep the plan's end."""
    x = make_inputs(DecodeCase(kv_lens=(130, 4, 70), q_len=4, seed=6, causal=True))
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 12, block=64)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    _, rows = row_passes(plan.work_indptr, wi)
    cut = causal_work_info(rows, x.qo_indptr, x.kv_indptr, x.kv_last_page_len, 1).long()
    r, c = rows.long(), cut
    ends = x.kv_indptr.long()[1:]
    qo = x.qo_indptr.long()
    for w in range(r.shape[0]):
        b, qi = int(r[w, 0]), int(r[w, 2])
        prefix = int(ends[b]) - (int(qo[b + 1]) - 1 - qi)
        assert int(c[w, 5]) == max(int(r[w, 4]), min(int(r[w, 5]), prefix)) and int(c[w, 7]) == prefix
        assert torch.equal(c[w, :5], r[w, :5]) and torch.equal(c[w, 6], r[w, 6])
    assert bool((c[:, 5] == c[:, 4]).any()), "no work past a row's prefix: the empty case is not exercised"
    assert bool((c[:, 5] < r[:, 5]).any()) and bool((c[:, 5] == r[:, 5]).any())
    # works of 2 or 4 rows (the sm_90 kernel's side-by-side rows): cut to the work's last row's prefix
    for per in (2, 4):
        _, groups = row_passes(plan.work_indptr, wi, per)
        g = causal_work_info(groups, x.qo_indptr, x.kv_indptr, x.kv_last_page_len, 1).long()
        last = ends[groups[:, 0].long()] - (qo[groups[:, 0].long() + 1] - groups[:, 3].long())
        assert torch.equal(g[:, 7], last)
        assert torch.equal(g[:, 5], torch.maximum(torch.minimum(groups[:, 5].long(), last), groups[:, 4].long()))
        # the kernel's mask of row r of a work: min(kv_end, column 7 - (R - 1 - r)) = the row's own prefix
        for w in range(g.shape[0]):
            bb, qs = int(g[w, 0]), int(g[w, 2])
            for r in range(per):
                own = int(ends[bb]) - (int(qo[bb + 1]) - 1 - (qs + r))
                assert min(int(groups[w, 5]), int(g[w, 7]) - (per - 1 - r)) == min(int(groups[w, 5]), own)
    from mlalab.kernels import prepare
    from mlalab.kernels.sm90.host import rows_per_cta_of

    p = prepare(x, "a8w8")
    assert rows_per_cta_of(p, x.qo_indptr.diff(), side_by_side="on") == 4  # side by side under the mask too (CAUSAL)


def test_the_gpu_tests_tiled_oracle_applies_the_mask() -> None:
    """`tests.oracles.tiled_decode` (what the sm_90 GPU tests compare with) under the causal mask, with P unrounded:
    the reference, whatever the plan cuts."""
    from oracles import tiled_decode

    from mlalab.kernels import prepare

    x = _peaked(DecodeCase(kv_lens=(130, 0, 4, 70), q_len=4, seed=9, dist="unit", causal=True, page_size=16,
                           permute_pages=True))  # fmt: skip
    p = prepare(x, "bf16")
    ref, ref_lse = decode_reference(*p.dequantized(), p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_last_page_len,
                                    empty_policy="zeros", causal=True)  # fmt: skip
    for planner, target in (("simple", 40), ("balanced", 7)):
        plan = make_plan(planner, x.qo_indptr, x.kv_indptr, target, page_size=16, kv_last_page_len=x.kv_last_page_len)
        out, lse = tiled_decode(p, plan, p_dtype=None)
        assert _rel(out, ref) <= 1e-12
        wide, _ = tiled_decode(dataclasses.replace(p, causal=False), plan, p_dtype=None)
        assert _rel(wide, ref) > 1e-2


def test_bad_input_is_refused_before_any_work() -> None:
    with pytest.raises(ValueError, match=r"kv_lens\[1\] = 3 is shorter than q_len 4"):
        DecodeCase(kv_lens=(10, 3), q_len=4, causal=True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        DecodeCase(kv_lens=(10,), causal=1)  # type: ignore[arg-type]
    DecodeCase(kv_lens=(10, 0), q_len=4, causal=True)  # an empty request follows the empty policy
    x = make_inputs(DecodeCase(kv_lens=(10, 3), q_len=4))
    with pytest.raises(ValueError, match="request 1 has 3 KV tokens but 4 q rows"):
        decode_reference(x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, causal=True)
    with pytest.raises(TypeError, match="causal must be True or False"):
        decode_reference(x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, causal="yes")  # type: ignore[arg-type]


def test_study_row_keys_name_causal_only_when_set() -> None:
    """Row keys hash `_case_json`: a non-causal case hashes as before the field existed (a study resumes across the
    change), a causal one differently."""
    plain = DecodeCase(kv_lens=(5, 6), q_len=2)
    assert "causal" not in _case_json(plain)
    assert _case_json(dataclasses.replace(plain, causal=True))["causal"] is True
    assert plain.short_str() != dataclasses.replace(plain, causal=True).short_str()


def test_aiter_keywords_carry_the_flag_and_refuse_a_release_without_it() -> None:
    t = torch.zeros(1)
    bufs = dict.fromkeys(("work_metadata", "work_info_set", "work_indptr", "reduce_indptr", "reduce_final_map",
                          "reduce_partial_map"), t)  # fmt: skip
    common = dict(q=t, kv_buffer=t, qo_indptr=t, kv_indptr=t, kv_indices=t, kv_last_page_lens=t, buffers=bufs,
                  q_len=2, sm_scale=0.1, logits=t, attn_lse=t, out=t, final_lse=None, q_scale=None, kv_scale=None,
                  fp8=False)  # fmt: skip
    new = AiterAbi("0.1.20", True, True, True, stage1_has_causal=True)
    old = AiterAbi("0.1.16", True, True, True, stage1_has_causal=False)
    assert stage1_kwargs(new, **common, causal=True)["causal"] is True
    assert stage1_kwargs(new, **common)["causal"] is False
    assert "causal" not in stage1_kwargs(old, **common)
    with pytest.raises(ValueError, match="causal decode needs aiter >= v0.1.20"):
        stage1_kwargs(old, **common, causal=True)
    from mlalab.backends.aiter_args import AiterSettings

    fwd = dict(q=t, kv_buffer=t, out=t, qo_indptr=t, kv_indptr=t, kv_indices=t, kv_last_page_lens=t, buffers=bufs,
               q_len=2, sm_scale=0.1, num_kv_splits=8, settings=AiterSettings(),
               q_scale=None, kv_scale=None)  # fmt: skip
    assert mla_decode_fwd_kwargs(**fwd, accepts=("causal",), causal=True)["causal"] is True
    with pytest.raises(ValueError, match="takes `causal`"):
        mla_decode_fwd_kwargs(**fwd, accepts=(), causal=True)


def test_accuracy_evaluation_and_sweeps_use_the_mask(tmp_path) -> None:  # noqa: ANN001
    """`evaluate` of a causal case measures against the causal reference (its bf16 error is tiny; against the
    non-causal answer it would be large), and `sweep --causal` masks the cases of q_len > 1 only (a q_len 1 case is
    the same either way: one row key)."""
    import pandas as pd

    from mlalab.__main__ import main
    from mlalab.accuracy.metrics import evaluate
    from mlalab.accuracy.metrics import prepare as prepare_case

    case = DecodeCase(kv_lens=(130, 9), q_len=4, seed=3, dist="unit", causal=True)
    p = prepare_case(case)
    assert torch.equal(p.ref_out, decode_inputs_reference(make_inputs(case))[0])
    rec = evaluate(case, "bf16", "bf16")
    wide = decode_inputs_reference(make_inputs(case), causal=False)[0]
    assert rec["rel_l2"] < 1e-2 < _rel(wide, p.ref_out)
    out = tmp_path / "s.csv"
    assert main(["sweep", "--batch", "2", "--kv-len", "64", "--q-len", "1,4", "--causal", "--q-schemes", "bf16",
                 "--kv-schemes", "bf16", "--out", str(out)]) == 0  # fmt: skip
    cases = sorted(pd.read_csv(out)["case"])
    assert cases == ["B2-L64-q1-competition-s0", "B2-L64-q4c-competition-s0"]

"""Bad input found by review: each public entry point fails with a clear message naming the argument."""

from __future__ import annotations

import pytest
import torch

from mlalab import DecodeCase, make_inputs
from mlalab.backends import decode
from mlalab.inputs import kv_lens_from_layout, paged_layout, ragged_kv_lens, sample, uniform_kv_lens
from mlalab.reference import decode_inputs_reference


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda: uniform_kv_lens(2, 3.5), TypeError, "kv_len must be an int"),
        (lambda: paged_layout([-5, 3], 16, permute=False), ValueError, r"kv_lens\[0\] must be >= 0"),
        (lambda: paged_layout([5, 3], 2.5, permute=False), TypeError, "page_size must be an int"),
        (lambda: ragged_kv_lens(4, 100, min_len=50, max_len=60), ValueError, "min_len <= mean_len <= max_len"),
        (lambda: DecodeCase(kv_lens=(3,), page_size=True), ValueError, "page_size must be a positive int"),
        (lambda: DecodeCase(kv_lens=(3,), permute_pages="no"), TypeError, "permute_pages must be a bool"),
        (lambda: DecodeCase(kv_lens=(3,), outlier_channels=2.5), TypeError, "outlier_channels must be an int"),
        (lambda: DecodeCase(kv_lens=(3,), config="x"), TypeError, "config must be an MLAConfig"),
        (
            lambda: kv_lens_from_layout(torch.tensor([0, 5, 3]), torch.tensor([1, 1]), 1),
            ValueError,
            "kv_indptr must be non-decreasing",
        ),
        (lambda: sample((2,), "unit", torch.Generator(), scale=float("nan")), ValueError, "scale must be a positive"),
        (lambda: decode_inputs_reference("x"), TypeError, "inputs must be a DecodeInputs"),
    ],
)
def test_input_helpers_refuse_bad_values(call, exc, msg) -> None:
    with pytest.raises(exc, match=msg):
        call()


@pytest.fixture
def x():
    return make_inputs(DecodeCase(kv_lens=(5, 9), seed=0))


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0])
def test_sm_scale_must_be_positive_and_finite(x, bad: float) -> None:
    with pytest.raises(ValueError, match="sm_scale must be a positive finite float"):
        decode_inputs_reference(x, sm_scale=bad)


def test_emulator_refuses_nonfinite_inputs_unless_asked(x) -> None:
    q = x.q.clone()
    q[0, 0, 0] = float("nan")
    bad = type(x)(q, x.kv_buffer, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len, x.case)
    with pytest.raises(ValueError, match="q contains 1 non-finite"):
        decode(bad, backend="emulated", planner="balanced", target="h200")
    from mlalab.plan import emulate_plan, make_plan

    plan = make_plan("balanced", bad.qo_indptr, bad.kv_indptr, "h200")
    out = emulate_plan(bad, plan, allow_nonfinite=True).out
    assert torch.isnan(out[0]).any() and torch.isfinite(out[1]).all()


def test_backend_options_are_checked_per_backend(x) -> None:
    with pytest.raises(
        TypeError, match=r"decode\(backend='reference'\) has no option 'planner'; its options: compute_dtype"
    ):
        decode(x, backend="reference", planner="balanced")
    with pytest.raises(ValueError, match="unknown backend 'nope'; valid: reference"):
        decode(x, backend="nope")


def test_paged_plans_need_the_last_page_lengths() -> None:
    from mlalab.plan import make_plan

    qo, kv = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 4, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_last_page_len is required when page_size > 1"):
        make_plan("balanced", qo, kv, "h200", page_size=16)
    plan = make_plan("balanced", qo, kv, "h200", page_size=16, kv_last_page_len=torch.tensor([2, 7]))
    assert list(plan.kv_lens) == [3 * 16 + 2, 7]

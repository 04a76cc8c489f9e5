"""Bad input gets a clear error naming the argument."""

from __future__ import annotations

import pytest
import torch

from mlalab import DecodeCase, make_inputs
from mlalab.checks import TooLargeError, ensure_fits
from mlalab.reference import decode_inputs_reference, decode_reference


@pytest.fixture
def x():
    return make_inputs(DecodeCase(kv_lens=(5, 7), q_len=1, seed=0))


def _call(x, **over):
    args = dict(
        q=x.q,
        kv_buffer=x.kv_buffer,
        qo_indptr=x.qo_indptr,
        kv_indptr=x.kv_indptr,
        kv_indices=x.kv_indices,
        kv_last_page_len=x.kv_last_page_len,
    )
    args.update(over)
    return decode_reference(**args)


def test_wrong_q_shape(x) -> None:
    with pytest.raises(ValueError, match=r"q must have shape \(\*, 16, 576\)"):
        _call(x, q=x.q[:, :, :512])


def test_wrong_q_type(x) -> None:
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        _call(x, q=[1, 2])


def test_wrong_dtype(x) -> None:
    with pytest.raises(TypeError, match="q must have dtype"):
        _call(x, q=x.q.to(torch.int32))


def test_kv_rank(x) -> None:
    with pytest.raises(ValueError, match="kv_buffer must have rank 3 or 4"):
        _call(x, kv_buffer=x.kv_buffer.reshape(-1, 576))


def test_indptr_not_starting_at_zero(x) -> None:
    with pytest.raises(ValueError, match="kv_indptr must start at 0"):
        _call(x, kv_indptr=torch.tensor([1, 5, 12], dtype=torch.int32))


def test_indptr_decreasing(x) -> None:
    with pytest.raises(ValueError, match="qo_indptr must be non-decreasing"):
        _call(x, qo_indptr=torch.tensor([0, 2, 1], dtype=torch.int32), q=x.q[:1])


def test_indptr_length_mismatch(x) -> None:
    with pytest.raises(ValueError, match="kv_indptr must have 3 entries"):
        _call(x, kv_indptr=torch.tensor([0, 12], dtype=torch.int32))


def test_indptr_total_mismatch(x) -> None:
    with pytest.raises(ValueError, match=r"qo_indptr\[-1\] = 2 does not match"):
        _call(x, q=torch.cat([x.q, x.q]))


def test_indptr_float(x) -> None:
    with pytest.raises(TypeError, match="kv_indptr must have dtype int32, int64"):
        _call(x, kv_indptr=x.kv_indptr.float())


def test_kv_indices_out_of_range(x) -> None:
    with pytest.raises(ValueError, match="kv_indices must lie in"):
        _call(x, kv_indices=x.kv_indices + 100)


def test_empty_request_is_an_error_by_default() -> None:
    x = make_inputs(DecodeCase(kv_lens=(0, 4)))
    with pytest.raises(ValueError, match="request 0 has no KV tokens"):
        decode_inputs_reference(x)


def test_empty_request_zeros_policy() -> None:
    x = make_inputs(DecodeCase(kv_lens=(0, 4)))
    out, lse = decode_inputs_reference(x, empty_policy="zeros")
    assert torch.all(out[0] == 0) and torch.all(torch.isneginf(lse[0]))
    assert torch.all(torch.isfinite(lse[1]))


def test_nan_and_inf_are_reported(x) -> None:
    q = x.q.clone()
    q[1, 3, 7] = float("nan")
    q[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"q contains 2 non-finite values \(1 NaN, 1 inf\)"):
        _call(x, q=q)
    out, _ = _call(x, q=q, allow_nonfinite=True)
    assert torch.isnan(out).any()


def test_last_page_len_invalid() -> None:
    x = make_inputs(DecodeCase(kv_lens=(20,), page_size=16))
    with pytest.raises(ValueError, match=r"kv_last_page_len\[0\] = 17 is invalid"):
        decode_reference(
            x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, x.kv_indices, torch.tensor([17], dtype=torch.int32)
        )


def test_too_large_is_refused_with_estimate() -> None:
    with pytest.raises(TooLargeError, match=r"needs about 2\.0 GiB, more than the 1\.0 GiB"):
        ensure_fits(2 << 30, "thing", limit=1 << 30)
    with pytest.raises(TooLargeError, match="make_inputs"):
        make_inputs(DecodeCase.uniform(100_000, 1_000_000))


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(kv_lens=()), "at least one request"),
        (dict(kv_lens=(-1,)), r"kv_lens\[0\] must be a non-negative int"),
        (dict(kv_lens=(4,), q_len=0), "q_len must be an int"),
        (dict(kv_lens=(4,), dist="gauss"), "unknown input distribution 'gauss'; valid: competition"),
        (dict(kv_lens=(4,), page_size=0), "page_size must be a positive int"),
        (dict(kv_lens=(4,), scale=-1.0), "scale must be a positive"),
    ],
)
def test_decode_case_validation(kw: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        DecodeCase(**kw)

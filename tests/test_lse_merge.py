"""The CPU LSE merge (`mlalab.plan.merge.lse_merge`), the one definition the kernels' reduces follow: its edge cases
written out by hand, so each line of the formula has a test that fails without it."""

from __future__ import annotations

import math

import pytest
import torch

from mlalab.plan.merge import lse_merge


def test_hand_computed_merge() -> None:
    outs = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)  # two partials of one 2-dim row
    lses = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)  # weights 1 : 3
    out, lse, w = lse_merge(outs, lses)
    assert torch.allclose(out, torch.tensor([0.25, 1.5], dtype=torch.float64), rtol=0, atol=1e-15)
    assert math.isclose(float(lse), math.log(4.0), rel_tol=1e-15)
    assert torch.allclose(w, torch.tensor([0.25, 0.75], dtype=torch.float64), rtol=0, atol=1e-15)


def test_a_huge_lse_spread_does_not_overflow() -> None:
    """The max is subtracted before exp: with LSEs 0 and 800 (exp(800) overflows float64) the merge is the second
    partial exactly; subtracting the min instead gives inf / NaN."""
    outs = torch.tensor([[7.0], [2.0]], dtype=torch.float64)
    out, lse, w = lse_merge(outs, torch.tensor([0.0, 800.0], dtype=torch.float64))
    assert torch.isfinite(out).all() and float(out) == 2.0 and float(lse) == 800.0
    assert float(w[1]) == 1.0


def test_empty_partials_and_all_empty_rows() -> None:
    """An empty partial (L = -inf) weighs 0; a row whose partials are all empty gets O = 0 and L = -inf, weights 0;
    one live partial among empty ones is returned as it is, its LSE kept (Σ w = 1 exactly there)."""
    outs = torch.tensor(
        [[[3.0, 4.0], [9.0, 9.0]], [[5.0, 6.0], [1.0, 1.0]]], dtype=torch.float64
    )  # (2 partials, 2 rows, 2)
    lses = torch.tensor([[5.0, float("-inf")], [float("-inf"), float("-inf")]], dtype=torch.float64)
    out, lse, w = lse_merge(outs, lses)
    assert out[0].tolist() == [3.0, 4.0] and float(lse[0]) == 5.0  # row 0: only partial 0 is live
    assert out[1].tolist() == [0.0, 0.0] and math.isinf(float(lse[1])) and float(lse[1]) < 0  # row 1: all empty
    assert w[:, 1].tolist() == [0.0, 0.0] and w[:, 0].tolist() == [1.0, 0.0]
    assert not torch.isnan(out).any() and not torch.isnan(w).any()


@pytest.mark.parametrize(
    "outs, lses",
    [
        (torch.zeros(3), torch.zeros(3)),  # outs needs a value dim
        (torch.zeros(2, 4, 8), torch.zeros(3, 4)),  # partial counts differ
        (torch.zeros(2, 4, 8), torch.zeros(2, 5)),  # row counts differ
        (torch.zeros(0, 4, 8), torch.zeros(0, 4)),  # no partial at all
    ],
)
def test_mismatched_shapes_are_refused(outs: torch.Tensor, lses: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="must agree on their leading dims"):
        lse_merge(outs, lses)


def test_the_smallest_valid_shapes_are_accepted() -> None:
    out, lse, _ = lse_merge(torch.ones(1, 1), torch.zeros(1))  # one partial of one 1-dim row
    assert out.tolist() == [1.0] and float(lse) == 0.0
    with pytest.raises(TypeError, match="torch.Tensors"):
        lse_merge([[1.0]], torch.zeros(1))  # type: ignore[arg-type]

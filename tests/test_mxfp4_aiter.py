"""``mxfp4-aiter`` is aiter's quantiser bit for bit: every E2M1 code and E8M0 scale equals what aiter's own
``dynamic_mxfp4_quant`` (the registry wheel's source, run in Triton's interpreter: `aiter_fp4`) produces, on random
bf16 at both input scales, exact E2M1 ties times 2**k, tiny and huge magnitudes, zeros, and elements far below their
block's scale. The ties-to-even recipe must differ from it on the ties (the comparison can fail).

Needs the ``amd-aiter`` wheel: fetched once with pip into pytest's cache; skipped, with pip's reason, when offline.
"""

from __future__ import annotations

import pytest
import torch
from aiter_fp4 import AITER_VERSION, WheelUnavailable, aiter_dynamic_mxfp4_quant, fetch_wheel
from torch import Tensor

from mlalab.quant import MXFP4_RECIPES, get_kv_scheme, mxfp4_dequantize, mxfp4_quantize, unpack_e2m1

MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # the E2M1 ties
VALUES = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@pytest.fixture(scope="module")
def aiter(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Tensor, Tensor]]:
    """aiter's (packed, scales) of every input set, computed once."""
    pytest.importorskip("triton", reason="aiter's kernel runs in Triton's interpreter")
    try:
        cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: fetch into a temp dir
        wheel = fetch_wheel(cache.mkdir("amd-aiter-wheel") if cache else tmp_path_factory.mktemp("amd-aiter-wheel"))
    except WheelUnavailable as e:
        pytest.skip(str(e))
    inputs = {name: make() for name, make in INPUTS.items()}
    return aiter_dynamic_mxfp4_quant(wheel, inputs, tmp_path_factory.mktemp("aiter"))


def _rows(blocks: list[torch.Tensor]) -> torch.Tensor:
    """32-value blocks -> (M, 576) rows, padded with all-zero blocks."""
    pad = -len(blocks) % 18
    return torch.cat(blocks + [torch.zeros(32)] * pad).reshape(-1, 576)


def _random(std: float, seed: int) -> torch.Tensor:
    return (torch.randn(512, 576, generator=torch.Generator().manual_seed(seed)) * std).bfloat16()


def _ties() -> torch.Tensor:
    """Blocks of scale exactly 2**k (block max 6 * 2**k) holding every signed tie and E2M1 value times 2**k, for
    k = -127..125 (e8m0 0..252), shuffled; then blocks whose max sits at and around the scale rule's 1.75 step, with
    ties under both candidate scales."""
    g = torch.Generator().manual_seed(5)
    blocks = []
    for k in range(-127, 126):
        vals = [6.0, -6.0, 0.0] + [s * m for m in MIDS for s in (1, -1)] + [s * v for v in VALUES[:-1] for s in (1, -1)]
        vals += [-0.0, 1.25, -1.75]  # 32 values
        b = torch.tensor(vals, dtype=torch.float64) * 2.0**k
        blocks.append(b[torch.randperm(32, generator=g)].float())
    for k in range(-126, 126, 5):
        for top in (1.5, 1.7421875, 1.75, 1.7578125, 1.9921875):
            mids = torch.tensor(MIDS, dtype=torch.float64)
            pool = torch.cat([mids * 2.0 ** (k - 2), mids * 2.0 ** (k - 1), -mids * 2.0 ** (k - 2)])
            pick = pool[torch.randint(len(pool), (31,), generator=g)]
            blocks.append(torch.cat([torch.tensor([top * 2.0**k], dtype=torch.float64), pick]).float())
    x = _rows(blocks).bfloat16()
    assert torch.equal(x.float(), _rows(blocks)), "every tie must be exact in bf16"
    return x


def _tiny_huge() -> torch.Tensor:
    """Random blocks times 2**k near both ends of bf16: subnormal block maxima (scale clamped at 2**-127, or an amax
    that rounds to 0) and maxima up to bf16's largest finite (an amax that rounds past fp32's range)."""
    g = torch.Generator().manual_seed(6)
    ks = list(range(-140, -110)) + list(range(110, 128))
    x = torch.randn(len(ks) * 4, 576, generator=g).clamp(-1.99, 1.99)
    scale = torch.tensor([2.0**k for k in ks for _ in range(4)]).unsqueeze(1)
    x = (x * scale).bfloat16()
    x[-1, :32] = torch.finfo(torch.bfloat16).max  # amax 1.99 * 2**127: rounds to inf, scale 2**127
    x[-1, 32:64] = -1.75 * 2.0**127
    return x


def _zeros() -> torch.Tensor:
    x = torch.zeros(8, 576)
    x[1] = -0.0
    x[2, ::2] = -0.0
    x[3, 5] = 1e-3  # one nonzero in a block
    x[4, 40] = -7.0
    x[5, 64:96] = torch.tensor([0.0, -0.0] * 16)
    return x.bfloat16()


def _wide_range() -> torch.Tensor:
    """Blocks whose elements sit 2**-1 to 2**-60 below the block max (the kernel's subnormal path shifts by 0 to
    more than 31 bits; see `aiter_fp4` for the shifts of 32 and more)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 576, generator=g)
    x = x * torch.pow(2.0, -torch.randint(1, 61, (64, 576), generator=g).float())
    x[:, ::32] = 3.0
    return x.bfloat16()


def _fp32() -> torch.Tensor:
    return torch.randn(64, 576, generator=torch.Generator().manual_seed(8)) * 2.0


INPUTS = {
    "randn*0.02": lambda: _random(0.02, 0),
    "randn": lambda: _random(1.0, 1),
    "ties*2^k": _ties,
    "tiny+huge": _tiny_huge,
    "zeros": _zeros,
    "wide-range": _wide_range,
    "fp32": _fp32,
}


def _differences(got: tuple[Tensor, Tensor], want: tuple[Tensor, Tensor]) -> tuple[int, int, int, int]:
    codes, want_codes = unpack_e2m1(got[0]), unpack_e2m1(want[0])
    return int((codes != want_codes).sum()), codes.numel(), int((got[1] != want[1]).sum()), got[1].numel()


@pytest.mark.parametrize("name", list(INPUTS))
def test_mxfp4_aiter_codes_and_scales_are_aiters(aiter: dict[str, tuple[Tensor, Tensor]], name: str) -> None:
    x = INPUTS[name]()
    got = mxfp4_quantize(x, *MXFP4_RECIPES["mxfp4-aiter"])
    bad_codes, n_codes, bad_scales, n_scales = _differences(got, aiter[name])
    assert bad_codes == 0 and bad_scales == 0, (
        f"{name}: {bad_codes} of {n_codes} E2M1 codes and {bad_scales} of {n_scales} E8M0 scales differ from "
        f"aiter {AITER_VERSION}'s dynamic_mxfp4_quant"
    )


def test_the_scheme_dequantizes_aiters_bytes(aiter: dict[str, tuple[Tensor, Tensor]]) -> None:
    x = INPUTS["randn*0.02"]()
    want = mxfp4_dequantize(*aiter["randn*0.02"])
    assert torch.equal(get_kv_scheme("mxfp4-aiter").fake_quant(x.unsqueeze(1)).squeeze(1), want)


def test_ties_to_even_is_not_aiters(aiter: dict[str, tuple[Tensor, Tensor]]) -> None:
    """The same scales with E2M1 ties to even (torchao's recipe) change codes on the input sets with ties."""
    for name in ("ties*2^k", "randn*0.02"):
        got = mxfp4_quantize(INPUTS[name](), *MXFP4_RECIPES["mxfp4-torchao-even"])
        bad_codes, n_codes, bad_scales, _ = _differences(got, aiter[name])
        assert bad_scales == 0 and bad_codes > 0.003 * n_codes, (name, bad_codes, n_codes)

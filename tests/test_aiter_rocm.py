"""aiter on a real AMD Instinct GPU: decode vs the exact decode of the quantized inputs, our plan vs aiter's.

Every test here is ``@pytest.mark.rocm``: tests/conftest.py skips it with aiter's probe reason wherever aiter
cannot run (e.g. "aiter unavailable: aiter is not installed ..."). None of them has been run by mlalab's
authors (no ROCm GPU was available); the tolerances are aiter's own test criteria (docs/aiter.md, "aiter's own tests")
tightened to what the kernels' documented numerics allow, and may need adjusting after a first real run.
"""

from __future__ import annotations

import pytest
import torch

from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs, ragged_kv_lens

pytestmark = pytest.mark.rocm

# rel-L2 of the output vs the fp64 decode of the same quantized inputs. bf16 output rounding alone is ~3e-3;
# fp8 kernels also round the softmax numerators P to fp8 before PV (docs/aiter.md, "Kernels"), a few % per element.
_TOL = {"bf16": 1e-2, "a16w8": 1e-2, "a8w8": 5e-2}


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def _cos_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """aiter's `cal_diff`: 1 - 2 sum(xy) / sum(x^2 + y^2); its fp8 tests assert < 3e-2."""
    x, y = a.double().cpu(), b.double().cpu()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def _cases():
    return [
        DecodeCase.uniform(4, 1024),  # the seeds' shape
        DecodeCase.uniform(32, 8192, seed=1),
        DecodeCase(kv_lens=ragged_kv_lens(8, 1500, seed=2, min_len=256), seed=2),
        DecodeCase.uniform(4, 1024, q_len=2, seed=3),
        DecodeCase(kv_lens=(700, 300, 1200), page_size=16, permute_pages=True, seed=4),
    ]


@pytest.mark.parametrize("precision", ["a8w8", "a16w8", "bf16"])
@pytest.mark.parametrize("mode", ["intra-batch", "fast"])
def test_decode_matches_quantized_reference(precision, mode):
    from mlalab.backends.aiter import get_decoder, quantized_reference
    from mlalab.backends.aiter_args import settings_for_precision

    dec = get_decoder(settings_for_precision(precision, mode=mode))
    for case in _cases():
        x = make_inputs(case)
        out, lse = dec(x)
        assert out.dtype == torch.bfloat16 and out.shape == (case.total_q, 16, 512)
        assert bool(torch.isfinite(out).all()), f"non-finite output for {case.short_str()}"
        ref, ref_lse = quantized_reference(x, dec.settings, dec.rt.fp8_flavour)
        err = _rel_l2(out, ref)
        assert err < _TOL[precision], f"{case.short_str()} {precision} {mode}: rel-L2 {err:.3e}"
        if precision == "a8w8":
            assert _cos_diff(out, ref) < 3e-2
        if lse is not None:  # None where this release/kernel does not write the LSE of unsplit works
            assert float((lse.double().cpu() - ref_lse).abs().max()) < 5e-2


def test_buffers_are_reused_at_fixed_addresses():
    from mlalab.backends.aiter import get_decoder
    from mlalab.backends.aiter_args import AiterSettings

    dec = get_decoder(AiterSettings())
    x = make_inputs(DecodeCase.uniform(4, 1024))
    p1 = dec.prepare(x)
    ptrs = {k: v.data_ptr() for k, v in p1.buffers.items()} | {"logits": p1.logits.data_ptr()}
    out1, _ = dec(x)
    x2 = make_inputs(DecodeCase.uniform(4, 1024, seed=9))  # same shape, other values: same buffers
    out2, _ = dec(x2)
    p2 = dec.prepare(x2)
    assert p2 is p1
    assert ptrs == {k: v.data_ptr() for k, v in p2.buffers.items()} | {"logits": p2.logits.data_ptr()}
    assert not torch.equal(out1, out2)


def test_direct_path_equals_mla_decode_fwd():
    from mlalab.backends.aiter import get_decoder
    from mlalab.backends.aiter_args import AiterSettings

    x = make_inputs(DecodeCase.uniform(8, 2048, seed=5))
    direct, _ = get_decoder(AiterSettings())(x, return_lse=False)
    wrapped, _ = get_decoder(AiterSettings(path="mla_decode_fwd"))(x, return_lse=False)
    # same metadata, same kernels: identical up to the reduce's (deterministic) summation order
    assert _rel_l2(direct, wrapped) < 1e-3


@pytest.mark.parametrize("mode", ["intra-batch", "fast"])
def test_our_planner_reproduces_aiters_work_map(mode):
    from mlalab.backends.aiter import get_decoder
    from mlalab.backends.aiter_args import AiterSettings

    dec = get_decoder(AiterSettings(mode=mode))
    for lens in ([1024] * 4, [8192] * 32, list(ragged_kv_lens(16, 3000, seed=7, min_len=256)), [100000, 300, 300]):
        x = make_inputs(DecodeCase(kv_lens=tuple(lens)))
        d = dec.compare_with_ours(x)
        assert d.identical, str(d)


def test_documented_buffer_formulas_match_aiter():
    from mlalab.backends.aiter import get_decoder
    from mlalab.backends.aiter_args import AiterSettings

    for mode in ("intra-batch", "fast"):
        dec = get_decoder(AiterSettings(mode=mode))
        p = dec.prepare(make_inputs(DecodeCase.uniform(16, 1024)))
        assert p.notes == [], p.notes  # aiter's get_mla_metadata_info_v1 sizes == our formulas


def test_guards_refuse_documented_hazards_on_this_gpu():
    from mlalab.backends.aiter import get_decoder, load
    from mlalab.backends.aiter_args import AiterSettings

    rt = load()
    short = make_inputs(DecodeCase(kv_lens=(1024, 3)))
    with pytest.raises(ValueError, match="fp8"):
        get_decoder(AiterSettings(mode="fast"))(short)
    if rt.arch == "gfx950":
        with pytest.raises(ValueError, match="196"):
            get_decoder(AiterSettings())(make_inputs(DecodeCase(kv_lens=(1024, 150))))
    if rt.arch == "gfx942":
        with pytest.raises(ValueError, match="16"):
            get_decoder(AiterSettings(num_kv_splits=8))(make_inputs(DecodeCase.uniform(2, 1024)))

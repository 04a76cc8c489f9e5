"""Every CPU executor (the exact reference, the plan emulator and the CPU backends) on discriminating inputs: the
competition's (attention almost uniform) and two peaked sets (unit std with q x 3; unit std with outlier channels),
where an output that ignores q (the mean of V) or is all zeros is far from the answer. Each check asserts, in the
same test, that those baselines fail it. And the softmax scale: a valid ``sm_scale=`` must reach the numbers (a
reference or backend that ignored it would give the default-scale answer, which each test shows is far off)."""

from __future__ import annotations

import math

import pytest
import torch
from oracles import INPUT_SETS, assert_baselines_fail, make_input_set, rel, request_mean_v

from mlalab.backends import decode
from mlalab.config import DecodeCase
from mlalab.inputs import DecodeInputs, make_inputs
from mlalab.kernels import naive_decode, prepare
from mlalab.plan import PLANNERS, dequantized_inputs, emulate_plan, make_plan
from mlalab.reference import decode_inputs_reference, decode_naive_loop, decode_reference

PEAKED = [n for n in INPUT_SETS if n != "competition"]


def template(x: DecodeInputs, sm_scale: float = 576**-0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode written independently of the library: per request, float64, max-subtracted softmax, natural LSE."""
    outs, lses = [], []
    for b in range(x.batch):
        p0, p1 = int(x.kv_indptr[b]), int(x.kv_indptr[b + 1])
        n = int(x.kv_lens[b])
        kv = x.kv_buffer[x.kv_indices[p0:p1].long()].reshape(-1, 576)[:n].double()
        qb = x.q[int(x.qo_indptr[b]) : int(x.qo_indptr[b + 1])].double()
        s = (qb @ kv.T) * sm_scale
        m = s.max(-1, keepdim=True).values
        e = torch.exp(s - m)
        z = e.sum(-1, keepdim=True)
        outs.append((e / z) @ kv[:, :512])
        lses.append((m + torch.log(z)).squeeze(-1))
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("inputs", list(INPUT_SETS))
def test_reference_on_every_input_set(inputs: str) -> None:
    x = make_input_set(inputs, (37, 300, 1, 64), q_len=2, page_size=16, permute_pages=True, seed=5)
    out, lse = decode_inputs_reference(x)
    ref, ref_lse = template(x)
    assert rel(out, ref) <= 1e-12 and float((lse - ref_lse).abs().max()) <= 1e-12 * float(ref_lse.abs().max())
    assert_baselines_fail(ref, 1e-12, request_mean_v(x), inputs)
    if inputs != "competition":  # peaked: the baselines are O(1) away, not merely outside a tight tolerance
        assert_baselines_fail(ref, 0.3, request_mean_v(x), inputs)
    else:  # the competition's inputs: a 1e-3 check could not tell the mean of V from the answer
        assert rel(request_mean_v(x), ref) < 1e-3


@pytest.mark.parametrize("inputs", PEAKED)
def test_reference_honours_sm_scale(inputs: str) -> None:
    """sm_scale = 0.1 (2.4 x the default): the reference, its backend, the naive loop and `naive_decode` (the kernel
    tests' oracle) all match the independent decode at that scale, which is far from the default-scale answer."""
    x = make_input_set(inputs, (37, 130, 5), q_len=2, seed=3)
    want, want_lse = template(x, 0.1)
    default, _ = template(x)
    assert rel(default, want) > 0.1  # ignoring sm_scale= would fail every check below
    out, lse = decode_inputs_reference(x, sm_scale=0.1)
    assert rel(out, want) <= 1e-12 and float((lse - want_lse).abs().max()) <= 1e-12 * float(want_lse.abs().max())
    assert rel(decode(x, backend="reference", sm_scale=0.1)[0], want) <= 1e-12
    assert rel(decode_naive_loop(x, sm_scale=0.1), want) <= 1e-12
    flat = decode_reference(x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, sm_scale=0.1)[0]
    assert rel(flat, want) <= 1e-12
    p = prepare(x, "bf16")
    assert rel(naive_decode(p, sm_scale=0.1)[0], want) <= 1e-12
    # an explicit default equals the implicit one, exactly
    assert torch.equal(decode_inputs_reference(x, sm_scale=576**-0.5)[0], decode_inputs_reference(x)[0])
    assert_baselines_fail(want, 1e-12, request_mean_v(x), inputs)


def test_sm_scale_golden_values() -> None:
    """Two tokens, one head pattern worked by hand: scores s = sm_scale * <q, k_j> = sm_scale * (0, 1) with
    q = e_0 and k_0 = 0, k_1 = e_0: the weight of token 1 is 1 / (1 + exp(-sm_scale)). Its value row is e_1, so
    out[.., 1] is that weight and LSE = log(1 + exp(sm_scale))."""
    q = torch.zeros(1, 16, 576)
    q[0, :, 0] = 1.0
    kv = torch.zeros(2, 1, 576)
    kv[1, 0, 0] = 1.0
    kv[1, 0, 1] = 1.0
    qo, kvp = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)
    for s in (576**-0.5, 0.1, 3.0):
        out, lse = decode_reference(q, kv, qo, kvp, sm_scale=None if s == 576**-0.5 else s)
        w = 1.0 / (1.0 + math.exp(-s))
        assert out[0, :, 1].tolist() == pytest.approx([w] * 16, rel=1e-15)
        assert out[0, :, 0].tolist() == pytest.approx([w] * 16, rel=1e-15)
        assert lse[0].tolist() == pytest.approx([math.log1p(math.exp(s))] * 16, rel=1e-15)


@pytest.mark.parametrize("inputs", list(INPUT_SETS))
def test_emulator_every_planner_on_every_input_set(inputs: str) -> None:
    """The emulator computes with the specification's scale (1/sqrt(576); it has no sm_scale= argument) and merges
    splits exactly, under every planner; on peaked inputs a scale off by 2.4x, the mean of V or zeros miss the check."""
    x = make_input_set(inputs, (700, 3, 1500, 64, 0), q_len=2, page_size=16, permute_pages=True, seed=3)
    ref, ref_lse = decode_inputs_reference(x, empty_policy="zeros")
    live = ref.norm(dim=-1) > 0
    n_split = 0
    for planner in PLANNERS:
        plan = make_plan(planner, x.qo_indptr, x.kv_indptr, 7, page_size=16, kv_last_page_len=x.kv_last_page_len)
        out, lse, _ = emulate_plan(x, plan)
        n_split += plan.summary()["split_requests"]
        assert rel(out[live], ref[live]) <= 1e-12, planner
        fin = torch.isfinite(ref_lse)
        assert float((lse[fin] - ref_lse[fin]).abs().max()) <= 1e-12 * float(ref_lse[fin].abs().max()), planner
    assert n_split >= 2  # the reduce runs, not only direct writes
    assert_baselines_fail(ref[live], 1e-12, request_mean_v(x)[live], inputs)
    if inputs != "competition":
        other, _ = decode_inputs_reference(x, empty_policy="zeros", sm_scale=0.1)
        assert rel(other[live], ref[live]) > 0.1  # a scale bug in the emulator would be caught at 1e-12 by far


@pytest.mark.parametrize("inputs", PEAKED)
def test_emulated_backend_and_quant_schemes_on_peaked_inputs(inputs: str) -> None:
    """The emulated backend (every planner) and the emulator with quantisation schemes, against the reference on the
    same dequantised inputs; the schemes must change the answer, and the baselines fail the check."""
    x = make_input_set(inputs, (300, 17), q_len=4, seed=4)
    ref, _ = decode_inputs_reference(x)
    for planner in PLANNERS:
        out, _ = decode(x, backend="emulated", planner=planner, target="h200", kv_granularity=32)
        assert rel(out, ref) <= 1e-12, planner
    assert_baselines_fail(ref, 0.3, request_mean_v(x), inputs)
    plan = make_plan("aiter-fast", x.qo_indptr, x.kv_indptr, 16)
    for qs, ks in (("fp8-token", "fp8-block128"), ("fp8-tensor", "nvfp4"), ("bf16", "fp8-flashmla-v32")):
        res = emulate_plan(x, plan, q_scheme=qs, kv_scheme=ks)
        deq = dequantized_inputs(x, q_scheme=qs, kv_scheme=ks)
        ref_q, _ = decode_inputs_reference(deq)
        assert rel(res.out, ref_q) <= 1e-12, (qs, ks)
        assert rel(res.out, ref) > 1e-4, (qs, ks)  # the schemes really changed the inputs
        assert_baselines_fail(ref_q, 1e-12, request_mean_v(deq), f"{inputs} {qs}/{ks}")


@pytest.mark.parametrize("inputs", list(INPUT_SETS))
def test_reference_torch_backend_on_every_input_set(inputs: str) -> None:
    """The reference-torch timing baseline (bf16 matmuls, fp32 softmax, P in bf16) runs on the CPU too: within
    bf16 rounding of the exact decode. On the competition's inputs its 2e-2 check cannot tell the mean of V from the
    answer (said here); on peaked inputs the baselines fail it."""
    x = make_input_set(inputs, (256,) * 3, seed=6)
    out, _ = decode(x, backend="reference-torch")
    ref, _ = decode_inputs_reference(x)
    err = rel(out, ref)
    assert out.dtype == torch.bfloat16 and err <= 2e-2, err
    if inputs == "competition":
        assert rel(request_mean_v(x), ref) < 2e-2  # the weak check the issue describes, pinned
    else:
        assert_baselines_fail(ref, 2e-2, request_mean_v(x), inputs)


def test_reference_torch_uses_the_specification_scale() -> None:
    """reference-torch has no sm_scale= knob: its scale must be 1/sqrt(576). On peaked inputs its answer is within
    bf16 rounding of the reference at that scale and far from the reference at 0.1 (2.4 x)."""
    x = make_input_set("unit-q3", (256,) * 2, seed=7)
    out, _ = decode(x, backend="reference-torch")
    assert rel(out, decode_inputs_reference(x)[0]) <= 2e-2
    assert rel(out, decode_inputs_reference(x, sm_scale=0.1)[0]) > 0.1


def test_input_sets_are_what_they_claim() -> None:
    """The peaked sets are peaked (the top token of a head carries a large share of the softmax mass); the
    competition set is not."""
    for name in INPUT_SETS:
        x = make_input_set(name, (512,), seed=1)
        kv = x.kv_buffer.reshape(-1, 576).double()
        p = torch.softmax((x.q[0].double() @ kv.T) * 576**-0.5, -1)  # (16, 512)
        top = float(p.max(-1).values.mean())
        assert (top < 0.01) if name == "competition" else (top > 0.2), (name, top)
    assert isinstance(make_inputs(DecodeCase(kv_lens=(4,))), DecodeInputs)

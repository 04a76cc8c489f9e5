"""aiter backend: everything decided before the GPU, checked on the CPU with real values (no fake aiter).

Expected numbers come from docs/aiter.md: the release table ("Releases and signatures"), the buffer formulas and the
seeds' worked sizes ("Buffer sizes"), the hazards ("Hazards and guards"). The contract with aiter's real sources is
tests/test_aiter_contract.py."""

from __future__ import annotations

import inspect
import time

import pytest
import torch

from mlalab.backends import aiter as be
from mlalab.backends.aiter_args import (
    AiterSettings,
    Mode,
    abi_for_version,
    abi_from_signatures,
    arch_from_gcn_name,
    check_signature,
    fp8_flavour_for_arch,
    fp8_torch_dtype,
    info_kwargs,
    metadata_buffer_shapes,
    metadata_kwargs,
    mla_decode_fwd_kwargs,
    parse_version,
    partial_buffer_shapes,
    reduce_kwargs,
    settings_for_precision,
    stage1_kwargs,
    token_kv_indices,
)
from mlalab.backends.aiter_guards import check_fragments, check_metadata_pointers, check_request
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.reference import decode_reference

# ---------------------------------------------------------------------------------------------------- versions


def test_parse_version_orders_pre_and_post_releases():
    order = ["0.1.7.post1", "0.1.7.post2.dev18", "0.1.7.post2", "0.1.10.post1", "0.1.10.post2", "0.1.11",
             "0.1.11.post1", "0.1.12.dev3+g1a2b", "0.1.12", "0.1.16.post2"]  # fmt: skip
    parsed = [parse_version(v) for v in order]
    assert all(a < b for a, b in zip(parsed, parsed[1:]))
    assert parse_version("0.1.12.dev3+g1a2b").pre and not parse_version("0.1.12").pre
    assert str(parse_version("0.1.11.post1")) == "0.1.11.post1"
    for bad in ("", "latest", "1.2", "0.1.x"):
        with pytest.raises(ValueError, match="cannot parse"):
            parse_version(bad)
    with pytest.raises(TypeError):
        parse_version(11)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "version, lse, nks",
    [
        ("0.1.10.post2", False, False),
        ("0.1.11", False, False),
        ("0.1.11.post1", False, False),
        ("0.1.12", True, False),
        ("0.1.15.post3", True, False),
        ("0.1.16", True, True),
        ("0.1.16.post2", True, True),
        ("0.1.20", True, True),
    ],
)
def test_release_table(version, lse, nks):
    abi = abi_for_version(version)
    assert (abi.stage1_has_lse, abi.reduce_has_num_kv_splits) == (lse, nks)
    # stage 1 gained `causal` (default True) in 0.1.20: we must pass False there, and only there.
    assert abi.stage1_has_causal is (version == "0.1.20")
    assert ("causal" in abi.stage1_params()) is (version == "0.1.20")


def test_causal_false_is_passed_where_stage1_has_it():
    import inspect

    def stage1_020(
        Q,
        KV,
        qo_indptr,
        kv_indptr,
        kv_page_indices,
        kv_last_page_lens,
        num_kv_splits_indptr,
        work_meta_data,
        work_indptr,
        work_info_set,
        max_seqlen_q,
        page_size,
        nhead_kv,
        softmax_scale,
        splitData,
        splitLse,
        output,
        lse=None,
        q_scale=None,
        kv_scale=None,
        causal=True,
    ):
        """The 0.1.20 shape of the signature: `causal` defaults to True."""

    def reduce_016(
        partial_output,
        partial_lse,
        reduce_indptr,
        reduce_final_map,
        reduce_partial_map,
        max_seqlen_q,
        num_kv_splits,
        final_output,
        final_lse=None,
    ):
        """The 0.1.16+ reduce."""

    abi = abi_from_signatures("0.1.20.dev", inspect.signature(stage1_020), inspect.signature(reduce_016))
    assert abi.stage1_has_causal and abi.stage1_has_lse and abi.reduce_has_num_kv_splits
    assert abi_for_version("0.1.19").stage1_has_causal is False


@pytest.mark.parametrize(
    "version, why", [("0.1.6", "not supported"), ("0.1.9", "not supported"), ("0.1.10.post1", "not supported"),
                     ("0.1.7.post3", "not supported"), ("0.1.21", "newer")]
)  # fmt: skip
def test_undocumented_releases_are_refused(version, why):
    with pytest.raises(ValueError, match=why):
        abi_for_version(version)


def test_parameter_counts_match_the_seeds_positional_calls():
    """The seeds' stage 1 passes 19 positional args and their reduce 8: exactly the v0.1.11 ABI."""
    v011, v012, v016 = (abi_for_version(v) for v in ("0.1.11", "0.1.12", "0.1.16"))
    assert len(v011.stage1_params()) == 19 and len(v011.reduce_params()) == 8
    assert len(v012.stage1_params()) == 20 and v012.stage1_params().index("lse") == 17  # right after output
    assert v016.reduce_params().index("num_kv_splits") == 6  # slot 7, after max_seqlen_q


def _documented_signature(names, n_required):
    P = inspect.Parameter
    return inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in names[:n_required]]
        + [P(n, P.POSITIONAL_OR_KEYWORD, default=None) for n in names[n_required:]]
    )


def test_positional_call_binds_q_scale_into_lse_on_v012():
    """Why we only call with keywords: the seeds' 19 positional args on the v0.1.12 signature."""
    v012 = abi_for_version("0.1.12")
    sig = _documented_signature(v012.stage1_params(), 17)
    q_scale, kv_scale = object(), object()
    bound = sig.bind(*range(17), q_scale, kv_scale)
    assert bound.arguments["lse"] is q_scale and bound.arguments["q_scale"] is kv_scale
    sig_reduce = _documented_signature(abi_for_version("0.1.16").reduce_params(), 8)
    o = object()
    assert sig_reduce.bind(*range(6), o, None).arguments["num_kv_splits"] is o


def _buffers(n=4):
    return {
        "work_metadata": torch.zeros(2, dtype=torch.int64),
        "work_indptr": torch.zeros(305, dtype=torch.int32),
        "work_info_set": torch.zeros(32 * n, 8, dtype=torch.int32),
        "reduce_indptr": torch.zeros(n + 1, dtype=torch.int32),
        "reduce_final_map": torch.zeros(n, 2, dtype=torch.int32),
        "reduce_partial_map": torch.zeros(32 * n, dtype=torch.int32),
    }


_ONE = torch.ones(1)


def _stage1(abi, fp8=True, q_scale=_ONE, kv_scale=_ONE):
    t = torch.zeros(1)
    return stage1_kwargs(
        abi,
        q=t,
        kv_buffer=t,
        qo_indptr=t,
        kv_indptr=t,
        kv_indices=t,
        kv_last_page_lens=t,
        buffers=_buffers(),
        q_len=1,
        sm_scale=576**-0.5,
        logits=t,
        attn_lse=t,
        out=t,
        final_lse=t,
        q_scale=q_scale,
        kv_scale=kv_scale,
        fp8=fp8,
    )


@pytest.mark.parametrize("version", ["0.1.11", "0.1.12", "0.1.16", "0.1.20"])
def test_keyword_sets_match_each_release(version):
    abi = abi_for_version(version)
    kw = _stage1(abi)
    assert set(kw) == set(abi.stage1_params())
    assert kw["num_kv_splits_indptr"] is None  # None is what selects the persistent path in C++
    t = torch.zeros(1)
    rk = reduce_kwargs(abi, logits=t, attn_lse=t, buffers=_buffers(), q_len=1, num_kv_splits=304, out=t, final_lse=None)
    assert set(rk) == set(abi.reduce_params())
    # Each release's documented signature accepts exactly these keywords (and nothing required is missing).
    assert check_signature("stage1", _documented_signature(abi.stage1_params(), 17), kw) == []
    assert check_signature("reduce", _documented_signature(abi.reduce_params(), 7), rk) == []
    ik = info_kwargs(abi, settings=AiterSettings(), batch=4, q_len=1, q_torch_dtype=t.dtype, kv_torch_dtype=t.dtype)
    assert set(ik) == set(abi.info_params())


def test_check_signature_names_the_mismatch():
    old_kw = reduce_kwargs(
        abi_for_version("0.1.11"),
        logits=1,
        attn_lse=1,
        buffers=_buffers(),
        q_len=1,
        num_kv_splits=304,
        out=1,
        final_lse=None,
    )
    new_sig = _documented_signature(abi_for_version("0.1.16").reduce_params(), 8)
    problems = check_signature("mla_reduce_v1", new_sig, old_kw)
    assert problems == ["mla_reduce_v1: required parameter 'num_kv_splits' is unknown to mlalab"]
    stage1_v016 = _documented_signature(abi_for_version("0.1.16").stage1_params(), 17)
    renamed = list(abi_for_version("0.1.16").reduce_params())
    renamed[renamed.index("final_output")] = "out"  # a future rename must be caught, not mis-bound
    with pytest.raises(ValueError, match="no parameter 'final_output'.*required parameter 'out'"):
        abi_from_signatures("x", stage1_v016, _documented_signature(tuple(renamed), 8))
    star = inspect.Signature(
        [
            inspect.Parameter("a", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("k", inspect.Parameter.VAR_KEYWORD),
        ]
    )
    assert check_signature("f", star, ["x"]) == ["f: signature not inspectable"]


def test_abi_from_signatures_reads_the_flags():
    for version in ("0.1.11", "0.1.12", "0.1.16"):
        abi = abi_for_version(version)
        got = abi_from_signatures(
            version,
            _documented_signature(abi.stage1_params(), 17),
            _documented_signature(abi.reduce_params(), 7),
        )
        assert (got.stage1_has_lse, got.reduce_has_num_kv_splits) == (abi.stage1_has_lse, abi.reduce_has_num_kv_splits)
        assert got.source == "signature"


def test_fp8_scales_are_required():
    abi = abi_for_version("0.1.11")
    with pytest.raises(ValueError, match="q_scale and kv_scale"):
        _stage1(abi, q_scale=None)
    with pytest.raises(ValueError, match="q_scale and kv_scale"):
        _stage1(abi, kv_scale=None)
    assert _stage1(abi, fp8=False, q_scale=None, kv_scale=None)["q_scale"] is None


def test_metadata_kwargs_always_pass_dtypes_and_a_positive_split_cap():
    t = torch.zeros(1, dtype=torch.int32)
    for mode, split in ((Mode.INTRA_BATCH, 32), (Mode.FAST, -1)):
        kw = metadata_kwargs(
            abi_for_version("0.1.11"),
            settings=AiterSettings(mode=mode),
            qo_indptr=t,
            kv_indptr=t,
            kv_last_page_lens=t,
            buffers=_buffers(),
            q_len=2,
            q_torch_dtype=torch.float8_e4m3fnuz,
            kv_torch_dtype=torch.float8_e4m3fnuz,
        )
        assert set(kw) == set(abi_for_version("0.1.11").metadata_params())
        assert kw["dtype_q"] is torch.float8_e4m3fnuz and kw["dtype_kv"] is torch.float8_e4m3fnuz
        assert kw["max_split_per_batch"] == split and kw["uni_seqlen_qo"] == 2 and kw["page_size"] == 1
        assert kw["fast_mode"] is (mode is Mode.FAST) and kw["intra_batch_mode"] is (mode is Mode.INTRA_BATCH)
        # get_mla_metadata_v1 takes info_set BEFORE indptr (info_v1 returns them the other way round)
        assert kw["work_info_set"] is not kw["work_indptr"]
    fwd = mla_decode_fwd_kwargs(
        q=t,
        kv_buffer=t,
        out=t,
        qo_indptr=t,
        kv_indptr=t,
        kv_indices=t,
        kv_last_page_lens=t,
        buffers=_buffers(),
        q_len=1,
        sm_scale=0.04,
        num_kv_splits=304,
        settings=AiterSettings(),
        q_scale=t,
        kv_scale=t,
        accepts=("return_lse", "causal"),
        return_lse=True,
    )
    assert fwd["num_kv_splits"] == 304 and fwd["return_lse"] is True and fwd["work_meta_data"] is not None
    assert fwd["causal"] is False  # HEAD's mla_decode_fwd defaults causal=True: it would mask speculative decode


# -------------------------------------------------------------------------------------------- arch and flavour


def test_fp8_flavour_from_architecture():
    assert arch_from_gcn_name("gfx942:sramecc+:xnack-") == "gfx942"
    assert fp8_flavour_for_arch("gfx942:sramecc+:xnack-") == "e4m3fnuz"
    assert fp8_flavour_for_arch("gfx950") == "e4m3fn"
    assert fp8_torch_dtype("e4m3fnuz") is torch.float8_e4m3fnuz
    assert torch.finfo(fp8_torch_dtype(fp8_flavour_for_arch("gfx942"))).max == 240.0
    assert torch.finfo(fp8_torch_dtype(fp8_flavour_for_arch("gfx950"))).max == 448.0
    for bad in ("gfx90a", "gfx1100"):
        with pytest.raises(ValueError, match="gfx942 and gfx950 only"):
            fp8_flavour_for_arch(bad)
    with pytest.raises(ValueError, match="not an AMD GPU"):
        arch_from_gcn_name("sm90")


# ----------------------------------------------------------------------------------------------- buffer shapes


@pytest.mark.parametrize("arch, cus", [("gfx942", 304), ("gfx950", 256)])
def test_seed_case_buffer_sizes(arch, cus):
    """Worked sizes (docs/aiter.md, "Buffer sizes") of the seeds' call (intra-batch, 32 splits, H=16, Lq=1), B=4."""
    s = metadata_buffer_shapes(batch=4, q_len=1, num_cus=cus, settings=AiterSettings(), arch=arch)
    assert s["work_metadata"] == ((2,), torch.uint64)
    assert s["work_indptr"][0] == (cus + 1,)
    assert s["work_info_set"][0] == (32 * 4, 8)
    assert s["reduce_indptr"][0] == (5,) and s["reduce_final_map"][0] == (4, 2)
    assert s["reduce_partial_map"][0] == (32 * 4,)
    logits = partial_buffer_shapes(s["reduce_partial_map"][0][0], 1)["logits"]
    assert logits == (128, 1, 16, 512)
    assert torch.Size(logits).numel() * 4 == 4 * 2**20  # 1 MiB of fp32 partials per request


def test_fast_mode_bounds():
    fast = AiterSettings(mode="fast")
    s = metadata_buffer_shapes(batch=4, q_len=1, num_cus=304, settings=fast, arch="gfx942")
    assert s["work_info_set"][0] == (4 + 303, 8) and s["reduce_partial_map"][0] == (307,)
    big = metadata_buffer_shapes(batch=1000, q_len=1, num_cus=304, settings=fast, arch="gfx942")
    assert big["reduce_partial_map"][0] == (2 * 303,)  # min(B + N - 1, 2(N - 1))
    capped = AiterSettings(mode="fast", max_split_per_batch=32)
    head = metadata_buffer_shapes(
        batch=4, q_len=1, num_cus=304, settings=capped, arch="gfx942", info_has_max_split_per_batch=True
    )
    assert head["reduce_partial_map"][0] == (307,)  # max(307, 4 + min(304, 128)) = 307
    head1 = metadata_buffer_shapes(
        batch=1, q_len=1, num_cus=4, settings=capped, arch="gfx942", info_has_max_split_per_batch=True
    )
    assert head1["reduce_partial_map"][0] == (5,)  # max(min(4, 6), 1 + min(4, 32)) = 5


def test_q_tiles():
    for arch in ("gfx942", "gfx950"):
        for lq in (1, 2, 4, 8):
            s = metadata_buffer_shapes(batch=3, q_len=lq, num_cus=8, settings=AiterSettings(), arch=arch)
            assert s["reduce_indptr"][0] == (4,)  # one q tile per request for Lq <= 8
    bf16 = AiterSettings(q_dtype="bf16", kv_dtype="bf16")
    assert metadata_buffer_shapes(batch=3, q_len=16, num_cus=8, settings=bf16, arch="gfx950")["reduce_indptr"][0] == (
        7,
    )
    with pytest.raises(ValueError, match="batch"):
        metadata_buffer_shapes(batch=0, q_len=1, num_cus=8, settings=bf16, arch="gfx950")


# ------------------------------------------------------------------------------------------------------ guards


def test_settings_validation():
    with pytest.raises(ValueError, match="-1 in intra-batch"):
        AiterSettings(max_split_per_batch=-1)
    assert AiterSettings(mode="fast", max_split_per_batch=-1).split_arg == -1
    assert AiterSettings().split_arg == 32 and AiterSettings(max_split_per_batch=8).split_arg == 8
    with pytest.raises(ValueError, match="overflow"):
        AiterSettings(num_kv_splits=16, max_split_per_batch=32)
    with pytest.raises(ValueError, match="power of two"):
        AiterSettings(kv_granularity=12)
    with pytest.raises(ValueError, match="fp8 q with bf16 kv"):
        AiterSettings(q_dtype="fp8", kv_dtype="bf16")
    with pytest.raises(ValueError, match="mode must be"):
        AiterSettings(mode="persistent")
    with pytest.raises(TypeError, match="num_kv_splits"):
        AiterSettings(num_kv_splits=16.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path"):
        AiterSettings(path="fwd")


def test_gfx950_intra_batch_needs_196_tokens():
    s = AiterSettings()
    with pytest.raises(ValueError, match="195 KV tokens < 196"):
        check_request(kv_lens=[1024, 195], q_lens=[1, 1], arch="gfx950", settings=s)
    check_request(kv_lens=[1024, 196], q_lens=[1, 1], arch="gfx950", settings=s)
    check_request(kv_lens=[1024, 195], q_lens=[1, 1], arch="gfx950", settings=AiterSettings(mode="fast"))
    check_request(kv_lens=[1024, 195], q_lens=[1, 1], arch="gfx942", settings=s)  # gfx942: fixed 16 splits


def test_gfx942_intra_batch_needs_16_splits():
    with pytest.raises(ValueError, match="< 16 on gfx942"):
        check_request(kv_lens=[1024], q_lens=[1], arch="gfx942", settings=AiterSettings(num_kv_splits=8))
    check_request(kv_lens=[1024], q_lens=[1], arch="gfx942", settings=AiterSettings(num_kv_splits=16))
    check_request(kv_lens=[1024], q_lens=[1], arch="gfx950", settings=AiterSettings(num_kv_splits=8))


def test_fp8_short_requests_and_other_refusals():
    fast = AiterSettings(mode="fast")
    with pytest.raises(ValueError, match="3 KV tokens"):
        check_request(kv_lens=[300, 3], q_lens=[1, 1], arch="gfx942", settings=fast)
    check_request(
        kv_lens=[300, 3], q_lens=[1, 1], arch="gfx942", settings=AiterSettings("fast", 32, -1, 16, "bf16", "bf16")
    )
    with pytest.raises(ValueError, match="no KV tokens"):
        check_request(kv_lens=[300, 0], q_lens=[1, 1], arch="gfx942", settings=fast)
    with pytest.raises(ValueError, match="one q length"):
        check_request(kv_lens=[300, 300], q_lens=[1, 2], arch="gfx942", settings=fast)
    with pytest.raises(ValueError, match="q_len 5"):
        check_request(kv_lens=[300], q_lens=[5], arch="gfx942", settings=fast)
    with pytest.raises(ValueError, match="gfx942 and gfx950 only"):
        check_request(kv_lens=[300], q_lens=[1], arch="gfx90a", settings=fast)


def _works(ranges):
    """work_info rows (batch, partial, qs, qe, ks, ke, off, pad) for kv ranges of one request each."""
    return torch.tensor([[b, -1, b, b + 1, ks, ke, 0, 0] for b, (ks, ke) in enumerate(ranges)], dtype=torch.int32)


def test_check_fragments():
    # the seeds' case on gfx950 (docs/aiter.md, "Planners"): 5 works of 4 x 208 + 192 tokens: all fine
    ok = torch.tensor([[0, i, 0, 1, 208 * i, min(208 * (i + 1), 1024), 0, 0] for i in range(5)], dtype=torch.int32)
    check_fragments(ok, 5)
    bad = _works([(0, 100), (100, 103), (103, 200)])
    with pytest.raises(ValueError, match=r"1 work\(s\) cover fewer than 4 KV tokens \(first: work 1, request 1"):
        check_fragments(bad, 3)
    check_fragments(bad, 1)  # rows past n_work are unused buffer space, never read
    with pytest.raises(ValueError, match="n_work"):
        check_fragments(bad, 4)


def test_check_metadata_pointers_detects_moved_buffers():
    indptr, info = torch.zeros(305, dtype=torch.int32), torch.zeros(128, 8, dtype=torch.int32)
    meta = torch.tensor([indptr.data_ptr(), info.data_ptr()], dtype=torch.int64)
    check_metadata_pointers(meta.tolist(), indptr.data_ptr(), info.data_ptr())
    moved = info.clone()
    with pytest.raises(RuntimeError, match="moved"):
        check_metadata_pointers(meta.tolist(), indptr.data_ptr(), moved.data_ptr())
    # a uint64 address above 2**63 arrives as a negative int64 on the host: same address
    check_metadata_pointers([-1, 5], 2**64 - 1, 5)


# --------------------------------------------------------------------------------------- page table, quantization


@pytest.mark.parametrize("page_size", [1, 16])
def test_token_kv_indices_follow_the_page_table(page_size):
    x = make_inputs(DecodeCase(kv_lens=(33, 1, 70), page_size=page_size, permute_pages=True, seed=3))
    indptr, idx = token_kv_indices(x.kv_indptr, x.kv_indices, x.kv_last_page_len, page_size)
    kv_tokens, ref_indptr = x.token_kv()
    assert torch.equal(indptr, ref_indptr)
    rows = x.kv_buffer.reshape(-1, 1, 1, 576)[idx.long()][:, 0]  # what aiter reads at page size 1
    assert torch.equal(rows, kv_tokens)


def test_quantized_inputs_and_reference():
    x = make_inputs(DecodeCase(kv_lens=(300, 257), q_len=2, seed=1))
    exact, _ = decode_reference(x.q, x.kv_buffer, x.qo_indptr, x.kv_indptr, x.kv_indices, x.kv_last_page_len)
    for flavour, fmax in (("e4m3fnuz", 240.0), ("e4m3fn", 448.0)):
        qi = be.quantize_inputs(x, AiterSettings(), flavour)
        assert qi.q.dtype == fp8_torch_dtype(flavour) and qi.kv_buffer.dtype == fp8_torch_dtype(flavour)
        assert qi.q_scale.dtype == torch.float32 and qi.q_scale.shape == (1,)
        assert qi.q.float().abs().max().item() == fmax  # per-tensor amax scaling uses the full range
        ref, lse = be.quantized_reference(x, AiterSettings(), flavour)
        err = ((ref - exact).norm() / exact.norm()).item()
        assert 1e-3 < err < 0.1  # fp8 inputs change the result, but not grossly
    a16w8 = be.quantize_inputs(x, AiterSettings(q_dtype="bf16"), "e4m3fn")
    assert a16w8.q.dtype == torch.bfloat16 and a16w8.q_scale.item() == 1.0 and a16w8.kv_scale is not None
    bf16 = be.quantize_inputs(x, AiterSettings(q_dtype="bf16", kv_dtype="bf16"), "e4m3fn")
    assert bf16.q_scale is None and bf16.kv_scale is None
    ref, _ = be.quantized_reference(x, AiterSettings(q_dtype="bf16", kv_dtype="bf16"), "e4m3fn")
    assert torch.equal(ref, exact)


# --------------------------------------------------------------------------------------------- probe, registry


def test_probe_reports_a_reason_and_is_cached():
    from mlalab.backends import available

    reason = be.probe()
    t0 = time.perf_counter()
    assert be.probe() == reason
    assert time.perf_counter() - t0 < 0.05
    status = available()["aiter"]
    detail = be.describe()
    tail = f" [{detail}]" if detail else ""
    if reason is None:
        assert status == "available" + tail
    else:
        assert isinstance(reason, str) and reason
        assert status == f"unavailable: {reason}{tail}"


def test_describe_names_version_window_and_what_works(monkeypatch):
    from mlalab.backends import aiter_runtime

    monkeypatch.setattr(aiter_runtime, "installed_version", lambda: "0.1.7.post2.dev18")
    assert aiter_runtime.describe() == (
        "aiter 0.1.7.post2.dev18 installed, window 0.1.7 to 0.1.7.post2 (the PyPI wheel): fast mode only; a8w8, "
        "a16w8, bf16; q_len 1-4; LSE of split rows only (stage 1 has no lse)"
    )
    monkeypatch.setattr(aiter_runtime, "installed_version", lambda: "0.1.16.post2")
    assert aiter_runtime.describe().startswith("aiter 0.1.16.post2 installed, window 0.1.10.post2 to 0.1.20.x: intra")
    monkeypatch.setattr(aiter_runtime, "installed_version", lambda: "0.1.9")
    assert "outside the supported windows" in aiter_runtime.describe()
    monkeypatch.setattr(aiter_runtime, "installed_version", lambda: None)
    assert aiter_runtime.describe() is None


def test_decode_validates_options_before_loading():
    x = make_inputs(DecodeCase.uniform(2, 300))
    with pytest.raises(TypeError, match="unknown aiter option.*valid: mode"):
        be.decode(x, splits=32)
    with pytest.raises(TypeError, match="DecodeInputs"):
        be.decode(x.q)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="-1 in intra-batch"):
        be.decode(x, max_split_per_batch=-1)
    if be.probe() is not None:
        with pytest.raises(RuntimeError, match="aiter unavailable: "):
            be.decode(x)


# ------------------------------------------------------------------------------------- the v0.1.7 window (PyPI wheel)


def test_the_pypi_wheel_window():
    from mlalab.backends.aiter_abi import WINDOWS, window_of

    for v in ("0.1.7", "0.1.7.post1", "0.1.7.post2.dev18", "0.1.7.post2"):
        assert window_of(v) == list(WINDOWS)[1] and abi_for_version(v).legacy
    assert window_of("0.1.11") == list(WINDOWS)[0] and window_of("0.1.8") is None
    legacy = abi_for_version("0.1.7.post2.dev18")
    assert "page_size" not in legacy.stage1_params() and "work_metadata" in legacy.stage1_params()
    assert "max_seqlen_q" not in legacy.reduce_params() and len(legacy.info_params()) == 7
    assert "work_info" in legacy.metadata_params() and "dtype_q" not in legacy.metadata_params()
    assert "fast mode only" in legacy.works() and "intra-batch" in abi_for_version("0.1.11").works()
    t, bufs = torch.zeros(1), _buffers()
    kw = metadata_kwargs(legacy, settings=AiterSettings(mode="fast"), qo_indptr=t, kv_indptr=t, kv_last_page_lens=t,
                         buffers=bufs, q_len=1, q_torch_dtype=t.dtype, kv_torch_dtype=t.dtype)  # fmt: skip
    # the stub's `work_indptr` slot is the binding's work_info_set (docs/aiter.md, "How a call reaches the kernel")
    assert kw["work_indptr"] is bufs["work_info_set"] and kw["work_info"] is bufs["work_indptr"]
    assert set(kw) == set(legacy.metadata_params())
    with pytest.raises(ValueError, match="cannot run mode='intra-batch'.*no intra_batch_mode"):
        metadata_kwargs(legacy, settings=AiterSettings(), qo_indptr=t, kv_indptr=t, kv_last_page_lens=t,
                        buffers=_buffers(), q_len=1, q_torch_dtype=t.dtype, kv_torch_dtype=t.dtype)  # fmt: skip


def test_precisions_come_from_the_precision_table():
    from mlalab.quant.precision import PRECISIONS, get_precision

    for p in PRECISIONS:
        spec = get_precision(p.value)
        if spec.kv_fp4:  # aiter's persistent MLA decode reads fp8 / bf16 KV only
            with pytest.raises(ValueError, match="has no .* kernel; it runs a8w8, a16w8, bf16"):
                settings_for_precision(p.value)
            continue
        s = settings_for_precision(p.value)
        assert (s.q_dtype, s.kv_dtype) == (spec.q_format, spec.kv_format)
    assert tuple(p.value for p in PRECISIONS if not get_precision(p.value).kv_fp4) == be.PRECISIONS
    with pytest.raises(ValueError, match="unknown precision"):
        settings_for_precision("fp4")


def test_backends_command_says_which_aiter_and_what_works(monkeypatch, capsys):
    import argparse

    from mlalab.backends import aiter_runtime
    from mlalab.commands import backends

    monkeypatch.setattr(aiter_runtime, "installed_version", lambda: "0.1.7.post2.dev18")
    assert backends.run(argparse.Namespace(json=False)) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("aiter"))
    assert "[aiter 0.1.7.post2.dev18 installed, window 0.1.7 to 0.1.7.post2 (the PyPI wheel): fast mode only" in line

"""The sm_90 kernels (`mlalab.kernels.sm90`): what they accept, how they are built, and on the GPU, that they compute
the decode of the same quantised inputs with the numerics they claim.

CPU (CI): the refusals, the per-plan tables (tile stream, CTA headers, first burst), the relabellings of the fp8
path, and the kernels compiled for sm_90 in a subprocess (ptxas from Triton's wheel, no GPU) with this environment's
Triton and the H200 machine's (3.6): the wgmma counts, no local memory, shared memory within 227 KB, V loads free of
bank conflicts.

GPU (``-m gpu``, on the H200): every path (a8w8: V in registers; bf16: V from the K tile; a16w8: converted tiles),
every planner, ragged / long / empty / many-works batches and permuted 64-token pages with NaN in the unused slots,
against `oracles.tiled_decode` (fp64 with the path's one rounding, P to fp8 or bf16) on competition inputs and on
peaked ones (unit std, q x 3), where the mean of V and zeros are far off and each check asserts so.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from oracles import mean_v, rel, tiled_decode

from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs, ragged_kv_lens
from mlalab.kernels import Decoder, KernelConfig, naive_decode, prepare, token_work_info
from mlalab.kernels.sm90 import host
from mlalab.plan import PLANNERS, make_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
NO_GLUON = host.import_error()

#: each precision's path, and the dtype its P is rounded to before the value product
PATHS = {"a8w8": ("v-regs", torch.float8_e4m3fn), "bf16": ("v-tile", torch.bfloat16),
         "a16w8": ("v-conv", torch.bfloat16)}  # fmt: skip


def test_refusals_name_the_reason() -> None:
    x = make_inputs(DecodeCase(kv_lens=(100, 70)))
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 4)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    for prec in ("a8w8", "a16w8", "bf16"):
        assert "needs an NVIDIA GPU" in host.unsupported(prepare(x, prec), wi)  # this CPU tensor
    assert "exact mode" in host.unsupported(prepare(x, "a8w8"), wi, pv_exact=True)
    assert "exact mode" in host.unsupported(prepare(x, "bf16"), wi, out_dtype=torch.float32)
    assert "e4m3fn" in host.unsupported(prepare(x, "a16w8", fp8_format="e4m3fnuz"), wi)
    assert "p_fp8=False" in host.unsupported(prepare(x, "a8w8"), wi, p_fp8=False)
    assert "needs an NVIDIA GPU" in host.unsupported(prepare(x, "bf16"), wi, p_fp8=False)  # (P is bf16 there)
    for ps, why in ((8, "multiple of 64"), (48, "multiple of 64"), (16, "needs an NVIDIA GPU"), (32, "NVIDIA GPU")):
        paged = make_inputs(DecodeCase(kv_lens=(100, 70), page_size=ps, permute_pages=True))
        pplan = make_plan("simple", paged.qo_indptr, paged.kv_indptr, 4, page_size=ps,
                          kv_last_page_len=paged.kv_last_page_len)  # fmt: skip
        pwi = token_work_info(pplan, paged.kv_indptr, paged.kv_last_page_len)
        assert why in host.unsupported(prepare(paged, "a8w8"), pwi), ps
    assert "fp4 KV needs contiguous tiles" in host.unsupported(prepare(paged, "a16w4-mxfp4"), pwi)
    tok = make_inputs(DecodeCase(kv_lens=(100, 70), page_size=1, permute_pages=True))  # a token table
    assert host.tokens(prepare(tok, "a8w8")) and not host.tokens(prepare(x, "a8w8"))
    twi = token_work_info(make_plan("simple", tok.qo_indptr, tok.kv_indptr, 4), tok.kv_indptr, tok.kv_last_page_len)
    assert "needs an NVIDIA GPU" in host.unsupported(prepare(tok, "bf16"), twi)
    assert "fp4 KV needs contiguous tiles" in host.unsupported(prepare(tok, "a8w4-mxfp4"), twi)
    spec = make_inputs(DecodeCase(kv_lens=(100, 70), q_len=2))  # speculative decode runs (as row passes)
    swi = token_work_info(make_plan("simple", spec.qo_indptr, spec.kv_indptr, 4), spec.kv_indptr, spec.kv_last_page_len)
    assert "needs an NVIDIA GPU" in host.unsupported(prepare(spec, "a8w8"), swi)
    # asked for explicitly, a refusal is an error naming the reason; "auto" falls back to the portable kernel
    with pytest.raises(ValueError, match="kernel='sm90' cannot run here: needs an NVIDIA GPU"):
        Decoder(prepare(x, "a16w8"), plan, config=KernelConfig(kernel="sm90"))
    with pytest.raises(RuntimeError, match="needs a GPU"):  # (past every check: this CPU cannot launch it)
        Decoder(prepare(x, "bf16"), plan)


@pytest.mark.parametrize(("q_len", "per"), [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (4, 4), (6, 2)])
@pytest.mark.parametrize("planner", ["simple", "balanced", "aiter-fast"])
def test_row_passes_run_every_q_row_of_every_work_once(q_len: int, per: int, planner: str) -> None:
    """`per` q rows a kernel work (1, or 2 or 4 side by side in the wgmmas' N): every (work, group of rows) exactly
    once, CTA c·G + g running group g of slot c's works in the plan's order."""
    x = make_inputs(DecodeCase(kv_lens=(0, 700, 65, 3000, 1), q_len=q_len))
    plan = make_plan(planner, x.qo_indptr, x.kv_indptr, 6)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    cta_indptr, rows = host.row_passes(plan.work_indptr, wi, per)
    G = q_len // per
    assert cta_indptr.numel() == plan.num_cus * G + 1 and int(cta_indptr[-1]) == rows.shape[0]
    assert ((rows[:, 3] - rows[:, 2]) == per).all()  # `per` q rows per kernel work
    # every (work, group) exactly once: same request and KV range, q rows from qs + g·per, partial rows likewise
    want = set()
    for w in range(wi.shape[0]):
        b, loc, qs, qe, ks, ke = (int(v) for v in wi[w, :6])
        want |= {(b, loc + g * per if loc >= 0 else -1, qs + g * per, ks, ke) for g in range((qe - qs) // per)}
    got = [(int(r[0]), int(r[1]), int(r[2]), int(r[4]), int(r[5])) for r in rows]
    assert len(got) == len(set(got)) and set(got) == want
    for c in range(plan.num_cus):
        works = wi[int(plan.work_indptr[c]) : int(plan.work_indptr[c + 1])]
        for g in range(G):
            mine = rows[int(cta_indptr[c * G + g]) : int(cta_indptr[c * G + g + 1])]
            assert mine[:, 2].tolist() == (works[:, 2] + g * per).tolist()
            assert mine[:, 4].tolist() == works[:, 4].tolist()
    if G == 1:  # the plan's own tables
        assert torch.equal(cta_indptr, plan.work_indptr) and torch.equal(rows, wi)


def test_rows_per_cta_on_the_fp8_path_four_or_two_as_the_rows_divide() -> None:
    """Four q rows a work (side by side in the wgmmas' N) where every work covers a multiple of 4 rows on the fp8 path,
    else two where every count is even, token tables included; not on the 16-bit and fp4 paths; `row_passes` refuses
    a split it cannot make."""
    for q_len, prec, want in ((2, "a8w8", 2), (4, "a8w8", 4), (6, "a8w8", 2), (1, "a8w8", 1), (2, "bf16", 1),
                              (2, "a16w8", 1), (4, "a8w4-mxfp4", 1), (3, "a8w8", 1)):  # fmt: skip
        x = make_inputs(DecodeCase(kv_lens=(0, 700, 65), q_len=q_len))
        plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 6)
        wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
        assert host.rows_per_cta_of(prepare(x, prec), wi[:, 3] - wi[:, 2], side_by_side="on") == want, (q_len, prec)
        assert host.rows_per_cta_of(prepare(x, prec), x.qo_indptr.diff(), side_by_side="on") == want, (
            q_len,
            prec,
        )  # (per request)
    tok = make_inputs(DecodeCase(kv_lens=(70, 5), q_len=2, page_size=1, permute_pages=True))
    assert host.tokens(prepare(tok, "a8w8"))
    twi = token_work_info(make_plan("simple", tok.qo_indptr, tok.kv_indptr, 4), tok.kv_indptr, tok.kv_last_page_len)
    assert host.rows_per_cta_of(prepare(tok, "a8w8"), twi[:, 3] - twi[:, 2], side_by_side="on") == 2
    assert host.rows_per_cta_of(prepare(tok, "bf16"), twi[:, 3] - twi[:, 2], side_by_side="on") == 1
    p8 = prepare(make_inputs(DecodeCase(kv_lens=(70, 5), q_len=2)), "a8w8")
    assert host.rows_per_cta_of(p8, torch.tensor([1, 2]), side_by_side="on") == 1  # (one odd count: one row a CTA)
    assert (
        host.rows_per_cta_of(p8, torch.tensor([0, 0]), side_by_side="on") == 1
        and host.rows_per_cta_of(p8, torch.tensor([0, 2]), side_by_side="on") == 2
    )
    assert host.rows_per_cta_of(p8, torch.tensor([4, 0, 8]), side_by_side="on") == 4
    assert host.rows_per_cta_of(p8, torch.tensor([4, 2]), side_by_side="on") == 2
    x = make_inputs(DecodeCase(kv_lens=(70, 5), q_len=3))
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 4)
    with pytest.raises(ValueError, match="multiple of rows_per_cta=2"):
        host.row_passes(plan.work_indptr, token_work_info(plan, x.kv_indptr, x.kv_last_page_len), 2)
    with pytest.raises(ValueError, match="multiple of rows_per_cta=4"):
        host.row_passes(plan.work_indptr, token_work_info(plan, x.kv_indptr, x.kv_last_page_len), 4)
    with pytest.raises(ValueError, match="rows_per_cta must be 1, 2 or 4"):
        host.row_passes(plan.work_indptr, token_work_info(plan, x.kv_indptr, x.kv_last_page_len), 3)


def _sized(lens: tuple[int, ...], page: int):  # noqa: ANN202
    """A prepared a8w8 batch whose tables say `lens` KV tokens in pages of `page` (the KV buffer itself is a small
    stand-in: only the tables are read)."""
    base = prepare(make_inputs(DecodeCase(kv_lens=(70,) * len(lens), q_len=4, page_size=page)), "a8w8")
    pages = torch.tensor([-(-n // page) for n in lens])
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    last = torch.tensor([n - (k - 1) * page if k else 0 for n, k in zip(lens, pages.tolist())], dtype=torch.int32)
    return dataclasses.replace(base, kv_indptr=indptr, kv_last_page_len=last)


def test_side_by_side_auto_from_a_batch_size_off_and_bad_values() -> None:
    """`KernelConfig.side_by_side`: "auto" puts q rows side by side from `SIDE_BY_SIDE_FROM_TOKENS` KV tokens on (paged
    batches counted in tokens, not pages), one row a CTA below; "off" never; "on" at any size; other values refused
    by the config and by `rows_per_cta_of`."""
    from mlalab.kernels import KernelConfig

    half = host.SIDE_BY_SIDE_FROM_TOKENS // 2
    q = torch.tensor([4, 4])
    for lens, page, want in (((half, half), 1, 4), ((half, half - 1), 1, 1), ((half, half), 64, 4),
                             ((half - 63, half + 62), 64, 1), ((0, 2 * half), 64, 4)):  # fmt: skip
        p = _sized(lens, page)
        assert host.batch_kv_tokens(p) == sum(lens)
        assert host.rows_per_cta_of(p, q) == want, (lens, page)
        assert host.rows_per_cta_of(p, q, side_by_side="off") == 1
        assert host.rows_per_cta_of(p, q, side_by_side="on") == 4
    with pytest.raises(ValueError, match="side_by_side must be"):
        host.rows_per_cta_of(p, q, side_by_side="yes")
    with pytest.raises(ValueError, match="KernelConfig.side_by_side must be one of"):
        KernelConfig(side_by_side=True)


def test_row_passes_drop_works_without_q_rows() -> None:
    """A work of 0 q rows (a request without queries) runs nowhere: the kernel would compute a row at its qo_start and
    write it over the next request's output. The other works keep their rows and slots."""
    wp = torch.tensor([0, 2, 3], dtype=torch.int32)
    wi = torch.tensor([[0, -1, 0, 1, 0, 100, 0, 0], [1, -1, 1, 1, 100, 200, 0, 0], [2, -1, 1, 2, 200, 300, 0, 0]],
                      dtype=torch.int32)  # fmt: skip
    cta_indptr, rows = host.row_passes(wp, wi)
    assert cta_indptr.tolist() == [0, 1, 2]
    assert rows.tolist() == [wi[0].tolist(), wi[2].tolist()]
    wi2 = wi.clone()
    wi2[:, 3] = wi2[:, 2] + torch.tensor([2, 0, 2], dtype=torch.int32)  # two rows a work, side by side
    wi2[2, 2:4] = torch.tensor([2, 4], dtype=torch.int32)
    cta_indptr, rows = host.row_passes(wp, wi2, 2)
    assert cta_indptr.tolist() == [0, 1, 2]
    assert rows.tolist() == [wi2[0].tolist(), wi2[2].tolist()]


def test_tile_stream_follows_the_plan_and_the_page_table() -> None:
    # contiguous: tiles of 64 tokens from each work's start, rows = positions
    x = make_inputs(DecodeCase(kv_lens=(130, 0, 64, 65)))
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 3)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    t_indptr, rows = host.tile_stream(p, plan.work_indptr, wi)
    want = []
    for c in range(3):
        got = rows[int(t_indptr[c]) : int(t_indptr[c + 1])].tolist()
        mine = [s for w in range(int(plan.work_indptr[c]), int(plan.work_indptr[c + 1]))
                for s in range(int(wi[w, 4]), int(wi[w, 5]), 64)]  # fmt: skip
        assert got == mine
        want += mine
    assert int(t_indptr[-1]) == len(want) == 3 + 1 + 2  # 130 -> 3 tiles, 64 -> 1, 65 -> 2
    # paged (64-token pages, permuted): a tile's row is its page's row
    y = make_inputs(DecodeCase(kv_lens=(200, 64, 1), page_size=64, permute_pages=True, seed=3))
    q = prepare(y, "a8w8")
    assert not q.contiguous
    pp = make_plan("balanced", y.qo_indptr, y.kv_indptr, 5, page_size=64, kv_last_page_len=y.kv_last_page_len,
                   kv_granularity=1, overhead=0)  # fmt: skip
    pwi = token_work_info(pp, y.kv_indptr, y.kv_last_page_len)
    _, prow = host.tile_stream(q, pp.work_indptr, pwi)
    pos = [s for w in range(pwi.shape[0]) for s in range(int(pwi[w, 4]), int(pwi[w, 5]), 64)]
    assert prow.tolist() == [int(y.kv_indices[s // 64]) * 64 + s % 64 for s in pos]
    # pages of 16 / 32 tokens: a tile is 64 / page pages, each its own row; past the work's end, its last page again;
    # page size 1 with a permuted token table (`host.tokens`): the same with 64 rows a tile, one per token
    for ps in (1, 16, 32):
        z = make_inputs(DecodeCase(kv_lens=(200, 16, 1, 0, 130), page_size=ps, permute_pages=True, seed=4))
        zq = prepare(z, "a8w8")
        for planner in ("simple", "balanced", "aiter-fast"):
            zp = make_plan(planner, z.qo_indptr, z.kv_indptr, 5, page_size=ps, kv_last_page_len=z.kv_last_page_len)
            zwi = token_work_info(zp, z.kv_indptr, z.kv_last_page_len)
            zt, zrow = host.tile_stream(zq, zp.work_indptr, zwi)
            want = []
            for w in range(zwi.shape[0]):
                ks, ke = int(zwi[w, 4]), int(zwi[w, 5])
                for t in range(ks, ke, 64):
                    for i in range(64 // ps):
                        page = min(t + i * ps, ke - 1) // ps  # (a page past the end: the work's last page)
                        want.append(int(z.kv_indices[page]) * ps)
            assert zrow.tolist() == want, (ps, planner)
            assert int(zt[-1]) * (64 // ps) == len(want)
            assert host.kv_box(zq) == ps and host.tokens(zq) == (ps == 1)


def test_cta_headers_and_the_first_burst_rule() -> None:
    x = make_inputs(DecodeCase(kv_lens=(0, 130, 5, 4096)))
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 8, block=128)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    ti, rows = host.tile_stream(p, plan.work_indptr, wi)
    info = host.cta_info(plan.work_indptr, ti, rows, wi)
    assert info.shape == (8, host.INFO_COLS) and info.dtype == torch.int32
    for c in range(8):
        w0, w1, t0, t1 = (int(v) for v in info[c, :4])
        assert (w0, w1) == (int(plan.work_indptr[c]), int(plan.work_indptr[c + 1]))
        assert (t0, t1) == (int(ti[c]), int(ti[c + 1]))
        assert int(info[c, 4]) == (int(wi[w0, 2]) if w0 < w1 else 0)  # q row of its first work
        for i in range(max(host.RING.values())):  # the rows of its first tiles, 0 where it has fewer
            assert int(info[c, 5 + i]) == (int(rows[t0 + i]) if t0 + i < t1 else 0)
    # 2 of a 3-tile ring at the start when some CTA streams more than 2 tiles; else (or a 2-tile ring) the whole ring
    assert host.first_burst(3, 3) == 2 and host.first_burst(2, 3) == 3 and host.first_burst(100, 2) == 2
    assert host.first_burst(0, 3) == 3
    for bad in ((-1, 3), (3, 0), (2.0, 3), (3, True)):
        with pytest.raises(ValueError):
            host.first_burst(*bad)  # type: ignore[arg-type]


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
def test_the_kernel_reads_the_header_the_host_writes() -> None:
    from mlalab.kernels.sm90 import stage1

    assert stage1.INFO_COLS.value == host.INFO_COLS and stage1.BLOCK_N == host.BLOCK_N


def _by_bits(bits: tuple[int, ...], n: int) -> list[int]:
    """Index i -> the index whose bit ``bits[j]`` is bit j of i."""
    return [sum(((i >> j) & 1) << b for j, b in enumerate(bits)) for i in range(n)]


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
@pytest.mark.parametrize("warpgroups", [1, 2])
def test_partial_row_bits_match_the_epilogue_relabelling(warpgroups: int) -> None:
    """The head-minor partial store puts accumulator row m at value dim d by a bit map (`VREGS_ROW_BITS`, with two
    warpgroups `VREGS_ROW_BITS_8W`); the bf16 epilogue undoes the same row order π by a register relabelling (reshape +
    permute). Both must agree, or a split request's partials land in the wrong dims."""
    from mlalab.kernels.sm90 import epilogue as E

    nat, bits = (E.O_TO_NATURAL_64, E.VREGS_ROW_BITS) if warpgroups == 1 else (E.O_TO_NATURAL_8W, E.VREGS_ROW_BITS_8W)
    shape, perm = nat.value
    m_of_d = torch.arange(512)[:, None].expand(512, 16).reshape(shape).permute(perm).reshape(512, 16)[:, 0]
    d_of_m = torch.empty(512, dtype=torch.long)
    d_of_m[m_of_d] = torch.arange(512)
    assert sorted(bits.value) == list(range(9))
    assert _by_bits(bits.value, 512) == d_of_m.tolist()
    assert _by_bits(E.NATURAL_ROW_BITS.value, 512) == list(range(512))


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
@pytest.mark.parametrize("warpgroups", [1, 2])
def test_v_operand_and_p_relabellings_agree(warpgroups: int) -> None:
    """The PV's A operand is V (tokens t, dims d) relabelled by reshape + permute (`_pv_operand`) so that row m holds
    dim π(m) (the epilogue's `VREGS_ROW_BITS`, or `VREGS_ROW_BITS_8W` on two warpgroups) and column k token σ(k); Pᵀ's
    column k (`_p_operand`) must hold the same token σ(k), or each value would be weighted by another token's
    probability."""
    from mlalab.kernels.sm90 import epilogue as E
    from mlalab.kernels.sm90 import vpaths as V

    v = torch.arange(64 * 512).reshape(64, 512)  # element (t, d) = t·512 + d
    rel, bits = (V.V_TO_OPERAND_64, E.VREGS_ROW_BITS) if warpgroups == 1 else (V.V_TO_OPERAND_8W, E.VREGS_ROW_BITS_8W)
    shape, perm = rel.value
    a = v.reshape(shape).permute(perm).reshape(512, 64)
    pi = _by_bits(bits.value, 512)
    sigma = (a[0] // 512).tolist()  # token of column k
    assert sorted(sigma) == list(range(64))
    assert a.tolist() == [[t * 512 + pi[m] for t in sigma] for m in range(512)]
    inner, perm = V.P_TO_OPERAND.value
    pt = torch.arange(64)[:, None].expand(64, 16).reshape(4, *inner, 16).permute(perm)
    assert pt.reshape(64, 16).permute(1, 0)[0].tolist() == sigma


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
def test_gluon_reduce_launch_shape() -> None:
    """All of a tile's partials in one block load up to 64 (further blocks beyond), 8 partial values per thread (in
    registers up to 8 partials, then across 2 lanes and the warps), every program a whole number of dims."""
    from mlalab.kernels.sm90.reduce import launch_shape

    assert launch_shape(1) == launch_shape(2) == {"BLOCK_P": 2, "DPT": 4, "LP": 1, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(3) == launch_shape(4) == {"BLOCK_P": 4, "DPT": 2, "LP": 1, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(8) == {"BLOCK_P": 8, "DPT": 1, "LP": 1, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(9) == launch_shape(16) == {"BLOCK_P": 16, "DPT": 1, "LP": 2, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(33) == launch_shape(500) == {"BLOCK_P": 64, "DPT": 1, "LP": 2, "num_warps": 4, "maxnreg": 255}
    for mp in (1, 3, 8, 9, 33, 64, 200):
        s = launch_shape(mp)
        assert s["BLOCK_P"] // (s["LP"] * s["num_warps"]) * s["DPT"] <= 8 and 512 % (s["DPT"] * 8 // s["LP"]) == 0
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="max_partials must be an int >= 1"):
            launch_shape(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- compiled for sm_90
def _compile_env(triton_copy: str) -> dict[str, str]:
    """The environment of a compile subprocess: this one's Triton, or the H200 machine's copy (skips if absent)."""
    env = dict(os.environ)
    if triton_copy == "h200":
        path = os.environ.get("MLALAB_TRITON_H200", "")
        if not (path and os.path.isdir(os.path.join(path, "triton"))):
            pytest.skip("no copy of Triton 3.6 (scripts/test.sh fetches it into $MLALAB_TRITON_H200; offline here?)")
        env["PYTHONPATH"] = os.pathsep.join([path, ROOT, env.get("PYTHONPATH", "")])
    return env


def _compile_rows(body: str, triton_copy: str, shards: int = 1) -> tuple[str, list[list[str]]]:
    """Run a compile script in `shards` concurrent subprocesses (shard i of n sees ``SHARD, NSHARD = i, n``: a script
    that compiles a list of builds takes ``builds[SHARD::NSHARD]``); their stdout and the fields of its lines that
    start with ``R``."""
    head = f"import sys; sys.path.insert(0, {ROOT!r})\nimport triton; print('V', triton.__version__)\n"
    procs = [subprocess.Popen([sys.executable, "-c", f"{head}SHARD, NSHARD = {i}, {shards}\n{body}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_compile_env(triton_copy))
             for i in range(shards)]  # fmt: skip
    outs = [p.communicate(timeout=1200) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    stdout = "".join(o for o, _ in outs)
    if triton_copy == "h200":
        assert "V 3.6." in stdout, stdout[:200]
    return stdout, [ln.split() for ln in stdout.splitlines() if ln.startswith("R ")]


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
@pytest.mark.parametrize("triton_copy", ["environment", "h200"])
def test_stage1_compiles_for_sm90_as_launched(triton_copy: str) -> None:
    """Every path as the decoder launches it (contiguous and paged, whole ring and deferred fill, the measurement
    hooks, the four fp4 precisions of v-fp4, the e4m3 route, the cp.async ring of token tables, two and four q rows a
    work on the fp8 path, on two warpgroups, with and without the causal mask, on TMA tiles and token tables): the
    path's wgmmas (fp8: 18 score + 16 value QGMMA per tile; 16-bit: 68 HGMMA), not serialised by ptxas, no local
    memory in the tile loop (at most 16 bytes outside it; none on the contiguous fp8 path), within sm_90's 227 KB,
    the fp8 V load and the fp4 rope chunk's conversion free of bank conflicts, one 8-byte store per row of an fp16
    partial, the LSE's log2 on the SFU."""
    body = (
        "import re\n"
        "from mlalab.kernels.sm90.build import compile_stage1\n"
        "def spills_in_tile_loop(listing):  # LDL / STL inside the shortest loop around every wgmma: the tile loop\n"
        "    ins = [(int(a, 16), t) for a, t in re.findall(r'/\\*([0-9a-f]{4,})\\*/\\s+([^;]*);', listing)]\n"
        "    mma = [a for a, t in ins if 'GMMA' in t]\n"
        "    if not mma:\n"
        "        return 0\n"
        "    loops = [(int(m.group(1), 16), a) for a, t in ins for m in [re.search(r'BRA (?:`\\()?0x([0-9a-f]+)', t)]\n"
        "             if m and int(m.group(1), 16) <= mma[0] and a >= mma[-1]]\n"
        "    lo, hi = min(loops, key=lambda r: r[1] - r[0])  # (barrier-wait retries jump back from the end)\n"
        "    return sum(1 for a, t in ins if lo <= a <= hi and re.search(r'\\b(LDL|STL)', t))\n"
        "runs = [('v-regs', m, fb, tl, ab) for m in (False, True) for fb in (None, 2) for tl, ab in ((0, 0),)]\n"
        "runs += [('v-regs', False, None, 1, 0), ('v-regs', False, 2, 0, 1), ('v-regs', False, 2, 0, 2)]\n"
        "runs += [(p, m, None, 0, 0) for p in ('v-tile', 'v-conv') for m in (False, True)]\n"
        "runs = [(*r, None) for r in runs]\n"
        "runs += [('v-fp4', m, None, 0, 0, pr) for pr in ('a16w4-mxfp4', 'a8w4-mxfp4', 'a16w4-nvfp4', 'a8w4-nvfp4')\n"
        "         for m in (False, True)]\n"
        "runs += [('v-fp4-e4m3', m, None, 0, ab, None) for m, ab in ((False, 0), (True, 0), (False, 3), (False, 4))]\n"
        "runs = [(*r, None) for r in runs]\n"
        "runs += [(p, True, None, 0, 0, None, pg) for p, pg in (('v-regs', 16), ('v-regs', 32), ('v-tile', 16),\n"
        "                                                         ('v-conv', 16))]  # page by page\n"
        "runs += [(p, True, None, 0, 0, None, 1) for p in ('v-regs', 'v-tile', 'v-conv')]  # token tables\n"
        "runs += [('v-regs', True, 2, 0, 0, None, 1)]  # (token tables with a deferred ring fill, as launched)\n"
        "runs = [(*r, 1) for r in runs]\n"
        "runs += [('v-regs', m, fb, 0, 0, None, pg, rw) for m, pg in ((False, None), (True, None), (True, 16))\n"
        "         for fb in (None, 2) for rw in (2, 4)]  # q rows side by side on two warpgroups\n"
        "runs = [(*r, False) for r in runs]\n"
        "runs += [('v-regs', m, 2, 0, 0, None, None, rw, True) for m in (False, True) for rw in (2, 4)]  # causal\n"
        "runs += [('v-regs', True, fb, 0, 0, None, 1, rw, c) for fb in (None, 2) for rw in (2, 4)\n"
        "         for c in (False, True)]  # q rows side by side on a token table\n"
        "for path, mask, fb, tl, ab, prec, pg, rw, causal in runs[SHARD::NSHARD]:\n"
        "    r = compile_stage1(path, mask_tail=mask, first_burst=fb, timeline=bool(tl), ablate=ab, precision=prec,\n"
        "                       page=pg, rows=rw, causal=causal)\n"
        "    gmma = sum(n for k, n in r.sass.items() if 'GMMA' in k)\n"
        "    local = sum(n for k, n in r.sass.items() if k.startswith(('LDL', 'STL')))\n"
        "    print('R', path, int(mask), fb or 0, tl, ab, r.registers, r.stack_bytes, local, r.shared_bytes,\n"
        "          ','.join(map(str, r.bank_conflicts)) or '-', gmma, r.sass.get('STG.E.64', 0),\n"
        "          r.sass.get('MUFU.LG2', 0), rw, pg or 0, spills_in_tile_loop(r.listing),\n"
        "          r.listing.count('WARPGROUP.DEPBAR'))\n"
    )
    out, rows = _compile_rows(body, triton_copy, shards=max(1, min(4, os.cpu_count() or 1)))  # (55 builds)
    assert len(rows) == 55, out
    for row in rows:
        _, path, _m, _fb, _tl, ab, regs, stack, local, shared, conflicts, gmma, stg64, lg2, rw, pg, inloop, waits = row
        assert int(regs) <= 255 and int(shared) <= 227 * 1024, out
        # the wgmmas stay asynchronous: where ptxas cannot prove a wgmma's registers untouched while it is in flight
        # (its C7514 / C7515 reports) it silently puts a wait after every wgmma (here: two or three in all)
        assert int(waits) <= 6, out
        # no local memory in the tile loop (a masked V operand once made the paged fp8 loop spill); outside it a few
        # registers may go (stored before the work loop, loaded once a work: the paged e4m3 route on Triton 3.6,
        # four q rows on a token table on 3.9, one q row on a token table), never more than 16 bytes
        assert inloop == "0" and int(stack) <= 16, out
        if path == "v-regs" and pg == "0" and rw == "1":
            assert int(stack) == 0 and local == "0", out  # the contiguous fp8 path, the fast path, spills nothing
        if path == "v-regs":
            assert conflicts == "0", out  # the V load of the register operand
            if rw == "1":
                assert int(gmma) == {"0": 34, "1": 16, "2": 0}[ab], out  # ablations drop the products they name
            else:  # per warpgroup: 18 score QGMMA of its NQ / 2 columns, 8 value QGMMA of its 256 rows
                assert int(gmma) == 26, out
            if ab == "0":
                assert int(stg64) >= 16, out  # the fp16 partial: one 8-byte vector of 4 heads per row
        elif path == "v-fp4":  # the rope chunk's code load and word store (the value chunks: see fp4tiles)
            assert int(gmma) == 68 and conflicts == "0,0", out
        elif path == "v-fp4-e4m3":  # fp8 products (18 + 16 QGMMA), the rope chunk's conversion and the V load
            # (the conversion ablations: no conversion, so only the V load's count)
            assert int(gmma) == 34 and conflicts == ("0" if ab in ("3", "4") else "0,0,0"), out
        else:
            assert int(gmma) == 68 and conflicts == "-", out
        assert int(lg2) >= 4, out  # the LSE's log2 on the SFU (one per head column a thread holds)


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
@pytest.mark.parametrize("triton_copy", ["environment", "h200"])
def test_reduces_compile_for_sm90_without_local_memory(triton_copy: str) -> None:
    """The Gluon reduce at every launch shape on fp16 partials: no local memory and at most 40 shuffles per copy of
    the block merge (4 copies: the peeled first block of row 0, further blocks, and the same for later rows); the
    Triton reduce on fp32 head-minor partials (bf16 KV) without local memory."""
    body = (
        "from mlalab.kernels.sm90.build import compile_reduce, compile_triton_reduce\n"
        "for mp in (1, 2, 3, 4, 8, 9, 16, 33, 64, 200):\n"
        "    r = compile_reduce(mp)\n"
        "    local = sum(n for k, n in r.sass.items() if k.startswith(('LDL', 'STL')))\n"
        "    print('R', 'gluon', mp, r.registers, r.stack_bytes, local, r.sass.get('SHFL', 0))\n"
        "for mp in (2, 16, 40):\n"
        "    r = compile_triton_reduce(mp)\n"
        "    local = sum(n for k, n in r.sass.items() if k.startswith(('LDL', 'STL')))\n"
        "    print('R', 'triton', mp, r.registers, r.stack_bytes, local, 0)\n"
    )
    out, rows = _compile_rows(body, triton_copy)
    assert len(rows) == 13, out
    for _, kind, _mp, regs, stack, local, shfl in rows:
        assert int(regs) <= 255 and stack == "0" and local == "0", out
        assert kind == "triton" or int(shfl) <= 4 * 40, out


@pytest.mark.skipif(NO_GLUON is not None, reason=str(NO_GLUON))
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (dict(path="vt-smem"), ValueError, "path must be one of 'v-regs', 'v-tile', 'v-conv', 'v-fp4'"),
        (dict(path="v-fp4", precision="a8w8"), ValueError, "precision must be one of a16w4-mxfp4, .* on v-fp4"),
        (dict(path="v-conv", precision="a16w4-mxfp4"), ValueError, "v-conv has one build"),
        (dict(path="v-regs", first_burst=4), ValueError, "first_burst must be None .* or 1 to 3 on v-regs"),
        (dict(path="v-tile", ablate=1), ValueError, "ablate must be 0 .* got 1 on v-tile"),
        (dict(path="v-regs", ablate=3), ValueError, "or 3 .no fp4 conversion.* got 3 on v-regs"),
        (dict(path="v-fp4-e4m3", ablate=1), ValueError, "got 1 on v-fp4-e4m3"),
        (dict(path="v-regs", ablate=4), ValueError, "or 4 .nor scale loads. on v-fp4-e4m3, got 4 on v-regs"),
        (dict(path="v-regs", ablate=5), ValueError, "ablate must be 0"),
        (dict(path="v-regs", mask_tail=1), TypeError, "mask_tail must be True or False"),
        (dict(path="v-regs", page=8), ValueError, "page must be None, 1 .a token table. or one of"),
        (dict(path="v-fp4", page=16), ValueError, "page must be None, 1 .a token table. or one of"),
        (dict(path="v-fp4-e4m3", page=1), ValueError, "not on the fp4 paths"),
        (dict(path="v-tile", rows=2), ValueError, "rows must be 1, or 2 or 4 on v-regs"),
    ],
)
def test_sm90_build_refuses_bad_options_before_compiling(options: dict, error: type, message: str) -> None:
    from mlalab.kernels.sm90.build import compile_stage1

    with pytest.raises(error, match=message):
        compile_stage1(**options)


# --------------------------------------------------------------------------------------------- GPU
def _poisoned_run(dec: Decoder) -> tuple[torch.Tensor, torch.Tensor]:
    dec.out.fill_(float("nan"))
    dec.lse.fill_(float("nan"))
    dec.part_o.fill_(float("nan"))
    out, lse = dec()
    torch.cuda.synchronize()
    return out.clone(), lse.clone()


def _peaked(x):  # noqa: ANN001, ANN202
    """q x 3 on unit-std inputs: attention far from uniform."""
    return dataclasses.replace(x, q=(x.q.float() * 3).to(x.q.dtype))


_NAN_CODE = {True: (torch.uint8, 0x7F), False: (torch.int16, 0x7FC0)}  # fp8 KV: e4m3 NaN; 16-bit: bf16 NaN


def _nan_in_unused_page_slots(x, p):  # noqa: ANN001, ANN202
    """(`p` with NaN codes in the unused slots of every request's last page, a clean copy of `p`): a kernel that lets
    a slot past a request's end reach the output shows."""
    clean = dataclasses.replace(p, kv=p.kv.clone())
    page = x.page_size
    kv = p.kv.view(-1, page, p.kv.shape[-1])
    code_type, nan_code = _NAN_CODE[p.spec.kv_fp8]
    pages = x.kv_indices.long()
    for b in range(x.batch):
        s, e = int(x.kv_indptr[b]), int(x.kv_indptr[b + 1])
        if e > s:
            kv[pages[e - 1], int(x.kv_last_page_len[b]) :].view(code_type).fill_(nan_code)
    return p, clean


def _in_a_token_pool(x, factor: int = 4, seed: int = 5):  # noqa: ANN001, ANN202
    """`x` (page size 1) with each token moved to a random slot of a pool `factor` times the batch's KV, and the
    pool's slots the batch does not use (a bool mask over the pool, to fill with NaN once quantised)."""
    n = x.kv_buffer.shape[0]
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(factor * n, generator=g)[:n]  # token t of the batch lives in pool slot slots[t]
    pool = (torch.randn((factor * n, *x.kv_buffer.shape[1:]), generator=g) * 3).to(x.kv_buffer.dtype)
    pool[slots] = x.kv_buffer
    unused = torch.ones(factor * n, dtype=torch.bool)
    unused[slots] = False
    return dataclasses.replace(x, kv_buffer=pool, kv_indices=slots[x.kv_indices.long()].to(torch.int32)), unused


def _nan_in_unused_pool_slots(p, unused):  # noqa: ANN001, ANN202
    """(`p` with NaN codes in the pool slots `unused`, a clean copy of `p`)."""
    clean = dataclasses.replace(p, kv=p.kv.clone())
    code_type, nan_code = _NAN_CODE[p.spec.kv_fp8]
    p.kv.view(code_type)[unused.to(p.kv.device)] = nan_code
    return p, clean


def _check(p, plan, clean=None, config=None, *, peaked: bool = False, lse_rtol: float = 0.0,  # noqa: ANN001
           rows: int | None = None) -> float:  # fmt: skip
    """Run the sm_90 decoder on `p` (outputs poisoned first) and compare with the tiled oracle of its path on the
    same codes (`clean`: the same inputs without the NaN planted in unused page slots). Returns the rel-L2.

    Tolerances: rel-L2 5e-3 and |dLSE| 2e-3, except where fp8 wgmma's accumulation (narrower than fp32) meets peaked
    attention (a8w8 on unit-std inputs with q x 3: scores up to ~15, whose rounding the softmax amplifies; measured
    rel-L2 0.5-0.75 % and |dLSE| up to 0.008 at q_len 1 (H200) and 0.0145 at q_len 2 (H100), where a16w8 on the same
    inputs is within 4e-6): 1e-2 and 2e-2; `lse_rtol` adds a relative part for huge LSEs. (A lost split or a wrong
    merge moves the LSE by ln 2 or more.) `rows`: the q rows a CTA must run per work (`host.rows_per_cta_of`)."""
    dec = Decoder(p, plan, config=config)
    path, p_dtype = PATHS[p.precision.value]
    assert dec.ran == f"sm90:{path}", dec.sm90_reason
    assert rows is None or dec.sm90.rows == rows, (dec.sm90.rows, rows)
    out, lse = _poisoned_run(dec)
    ref, ref_lse = tiled_decode(p if clean is None else clean, plan, p_dtype=p_dtype)
    live = ref.norm(dim=-1) > 0
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()  # every element written
    err = rel(out.cpu()[live], ref[live])
    loose = peaked and p.precision.value == "a8w8"
    tol, lse_tol = (1e-2, 2e-2) if loose else (5e-3, 2e-3)
    rows = live.all(-1)
    dl = float(((lse.cpu().double() - ref_lse)[rows].abs() - lse_rtol * ref_lse[rows].abs()).max()) if rows.any() else 0
    assert err <= tol and dl <= lse_tol, (plan.planner, err, dl)
    if peaked:  # the check can fail: the mean of V (and zeros) are far from the answer
        assert rel(mean_v(p if clean is None else clean)[live], ref[live]) > 10 * tol
    dead = ~live.all(-1)
    assert torch.isinf(lse.cpu()[dead]).all() and (out.cpu()[dead] == 0).all()  # 0-token requests
    return err


_BATCHES = [  # (kv_lens, dist): ragged, uniform, long + tiny, empty, more works than slots
    (tuple(ragged_kv_lens(9, 700, seed=3)), "unit"),
    ((1024,) * 4, "competition"),
    ((1, 64, 8192), "unit"),
    ((0, 130, 5, 4096), "competition"),
    ((1000,) * 40, "unit"),
    ((100,) * 150, "competition"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_every_path_every_planner_ragged_long_empty(planner: str, precision: str) -> None:
    from mlalab.backends.triton import build_plan

    for lens, dist in _BATCHES:
        x = make_inputs(DecodeCase(kv_lens=lens, seed=4, dist=dist)).to("cuda")
        x = _peaked(x) if dist == "unit" else x
        _check(prepare(x, precision), build_plan(x, planner, 132), peaked=dist == "unit")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_many_works_per_cta(precision: str) -> None:
    """Plans on a few slots: CTAs with 4-15 works, a first work without tiles followed by works with tiles, q buffers
    reused more than once, the deferred ring fill across works."""
    from mlalab.backends.triton import build_plan

    for lens, planner, slots in [((0, 65, 128, 1, 190, 64, 0, 300, 129, 2), "balanced", 3),
                                 ((0, 65, 128, 1, 190, 64, 0, 300, 129, 2), "simple", 3),
                                 ((100,) * 40 + (1,) * 20, "balanced", 8)]:  # fmt: skip
        x = _peaked(make_inputs(DecodeCase(kv_lens=lens, seed=7, dist="unit")).to("cuda"))
        plan = build_plan(x, planner, slots)
        assert int(plan.work_indptr.diff().max()) >= 4, (planner, slots)  # the point of the case
        _check(prepare(x, precision), plan, peaked=True)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("q_len", [1, 2, 4])
@pytest.mark.parametrize("page", [64, 32, 16, 1])
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_every_planner_layout_q_len_and_precision(precision: str, page: int, q_len: int) -> None:
    """The layouts issue's matrix: every planner x layout x q_len 1 / 2 / 4 x precision. Layouts: permuted pages of
    64 tokens (one TMA box a tile) and of 32 / 16 (a box per page), NaN in every unused slot of a request's last page;
    page size 1 with a token table into a pool four times the batch's KV (sglang's and aiter's layout: each token a
    random slot, every slot the batch does not use holding NaN codes, so a row read from the wrong slot, or a tile row
    past a work's end read from anywhere but the work's last token, shows; the ring filled by cp.async,
    `host.tokens`). Ragged, empty, long (split) requests and one of q_len tokens, outputs poisoned; a8w8 at q_len
    2 / 4 with the q rows side by side (two warpgroups sharing each tile) and one row a CTA."""
    from mlalab.backends.triton import build_plan

    lens = (*ragged_kv_lens(6, 900, seed=8), 0, 3000, q_len)
    x = _peaked(make_inputs(DecodeCase(kv_lens=lens, q_len=q_len, page_size=page, permute_pages=page > 1, seed=9,
                                       dist="unit")))  # fmt: skip
    if page == 1:
        x, unused = _in_a_token_pool(x)
        x = x.to("cuda")
        p, clean = _nan_in_unused_pool_slots(prepare(x, precision), unused)
    else:
        x = x.to("cuda")
        p, clean = _nan_in_unused_page_slots(x, prepare(x, precision))
    assert not p.contiguous and host.tokens(p) == (page == 1) and torch.isnan(p.kv.float()).any()
    for planner in PLANNERS:
        knobs = {"block": 1} if planner == "simple" else {}
        plan = build_plan(x, planner, 132 // q_len, **knobs)
        for side in ("on", "off") if q_len > 1 and precision == "a8w8" else ("auto",):  # (kernel "auto": sm_90)
            rows = q_len if side == "on" else 1
            _check(p, plan, clean, peaked=True, config=KernelConfig(side_by_side=side), rows=rows)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("q_len", [2, 4])
@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_speculative_decode_every_planner(q_len: int, planner: str, precision: str) -> None:
    """q_len 2 and 4 on the sm_90 kernel (row passes; a8w8: all q_len rows a CTA, side by side in the wgmmas' N on two
    warpgroups): ragged, empty and long requests, every query row seeing its request's whole KV; plans with
    SMs // q_len slots and with 132."""
    from mlalab.backends.triton import build_plan

    for lens, dist in [(tuple(ragged_kv_lens(9, 700, seed=3)), "unit"), ((0, 130, 5, 4096), "competition"),
                       ((1000,) * 40, "unit")]:  # fmt: skip
        x = make_inputs(DecodeCase(kv_lens=lens, q_len=q_len, seed=5, dist=dist)).to("cuda")
        x = _peaked(x) if dist == "unit" else x
        for slots, side in ((132 // q_len, "on"), (132, "on"), (132 // q_len, "off")):
            _check(prepare(x, precision), build_plan(x, planner, slots), config=KernelConfig(side_by_side=side),
                   peaked=dist == "unit", rows=q_len if precision == "a8w8" and side == "on" else 1)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("q_len", "page"), [(2, 16), (2, 64), (4, 16), (4, 64)])
def test_gpu_q_rows_side_by_side_paged_with_nan_and_many_works(q_len: int, page: int) -> None:
    """a8w8 with q_len rows a CTA (two warpgroups) on the paths a contiguous batch does not take: permuted pages of 16
    (a box per page) and 64 tokens with NaN in every unused slot (tails zeroed in shared memory), split works, and
    plans on a few slots (CTAs with many works: the 32- and 64-row q buffers reused, works without tiles)."""
    from mlalab.backends.triton import build_plan

    lens = (*ragged_kv_lens(6, 900, seed=8), 0, 3000, 1)
    x = _peaked(make_inputs(DecodeCase(kv_lens=lens, q_len=q_len, page_size=page, permute_pages=True, seed=9,
                                       dist="unit"))).to("cuda")  # fmt: skip
    p = prepare(x, "a8w8")
    clean = dataclasses.replace(p, kv=p.kv.clone())
    kv = p.kv.view(-1, page, p.kv.shape[-1])
    pages = x.kv_indices.long()
    for b in range(len(lens)):
        s, e = int(x.kv_indptr[b]), int(x.kv_indptr[b + 1])
        if e > s:
            kv[pages[e - 1], int(x.kv_last_page_len[b]) :].view(torch.uint8).fill_(0x7F)  # NaN codes
    for planner, slots, knobs in (("simple", 132, {"block": 1}), ("balanced", 132, {}), ("balanced", 3, {})):
        plan = build_plan(x, planner, slots, **knobs)
        _check(p, plan, clean, KernelConfig(side_by_side="on"), peaked=True, rows=q_len)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("counts", "rows"), [((2, 6, 4, 2, 6, 2), 2), ((4, 8, 4, 8, 8, 4), 4)])
def test_gpu_q_rows_side_by_side_with_q_counts_that_differ(counts: tuple[int, ...], rows: int) -> None:
    """Requests with different numbers of q rows (a batch mixing q_len 2, 4 and 6, or 4 and 8): works of more rows than
    a CTA runs become several CTAs of a slot (`host.row_passes`), each its group of `rows` q rows side by side on two
    warpgroups, on contiguous and paged caches and plans of few and many slots."""
    from mlalab.backends.triton import build_plan

    qmax = max(counts)
    lens = (700, 65, 3000, 1, 130, 900)
    for page in (1, 64):
        x = _peaked(make_inputs(DecodeCase(kv_lens=lens, q_len=qmax, page_size=page, permute_pages=page > 1, seed=4,
                                           dist="unit")))  # fmt: skip
        keep = torch.cat([torch.arange(b * qmax, b * qmax + c) for b, c in enumerate(counts)])
        qo = torch.zeros(len(counts) + 1, dtype=torch.int32)
        qo[1:] = torch.cumsum(torch.tensor(counts), 0)
        x = dataclasses.replace(x, q=x.q[keep].contiguous(), qo_indptr=qo).to("cuda")
        p = prepare(x, "a8w8")
        for planner, slots, knobs in (("simple", 132, {"block": 1}), ("balanced", 5, {})):
            _check(p, build_plan(x, planner, slots, **knobs), config=KernelConfig(side_by_side="on"), peaked=True,
                   rows=rows)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("q_len", [2, 4])
@pytest.mark.parametrize("planner", ["simple", "balanced", "aiter-fast"])
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_causal_speculative_decode(q_len: int, planner: str, precision: str) -> None:
    """The causal mask of speculative verification on the sm_90 kernel (each one-row work's KV end cut to its row's
    prefix, `decoder.causal_work_info`): ragged, empty, page-64 and token-table batches, plans whose last split of a
    request lies past its first rows' prefixes (empty partials), against the tiled oracle of the path under the
    same mask; the non-causal answer misses the tolerance in every batch (each holds a request of at most 9 tokens,
    whose first q row sees at most 9 - (q_len - 1): without one, 1 of 1000+ tokens masked moved a8w8's answer by only
    0.5-2 %, inside the loose tolerance)."""
    from mlalab.backends.triton import build_plan

    layouts = [((130, 0, 4, 4097), {}), ((1000,) * 39 + (q_len,), {}),
               ((1024, q_len, 4096), {"page_size": 64, "permute_pages": True}),
               ((517, 9, 2000), {"permute_pages": True, "pool_factor": 3})]  # fmt: skip
    for lens, layout in layouts:
        x = _peaked(make_inputs(DecodeCase(kv_lens=lens, q_len=q_len, seed=8, dist="unit", causal=True,
                                           **layout)).to("cuda"))  # fmt: skip
        p = prepare(x, precision)
        for slots in (132 // q_len, 132):
            plan = build_plan(x, planner, slots)
            for side in ("on", "off"):  # (a8w8: the q rows side by side with the kernel's CAUSAL, or one a CTA)
                _check(p, plan, config=KernelConfig(side_by_side=side), peaked=True)
        wide, _ = tiled_decode(dataclasses.replace(p, causal=False), plan, p_dtype=PATHS[precision][1])
        ref, _ = tiled_decode(p, plan, p_dtype=PATHS[precision][1])
        live = ref.norm(dim=-1) > 0
        assert rel(wide[live], ref[live]) > 0.05, "the non-causal answer passes the check"


def _max_jumps(x, every: int = 1000):  # noqa: ANN001, ANN202
    """`x` (page size 1, identity table) with every `every`-th token of each request turned towards all its q rows
    (the sum of its heads' q, normalised) and scaled so that its median head's score is 12 + 8 j nats for the j-th
    such token: most columns' max moves there by 8 nats or more, mid-work, so every work spanning one must rescale its
    output by a factor far from 1 (and some columns' max moves less, or not at all)."""
    kv = x.kv_buffer.float().clone()
    qo, kvp = x.qo_indptr.long(), x.kv_indptr.long()
    for b in range(x.batch):
        q = x.q[qo[b] : qo[b + 1]].float().reshape(-1, 576)
        u = q.sum(0) / q.sum(0).norm()
        unit_score = float((q @ u).median()) * 576**-0.5  # the median head's score of u (nats)
        for j, t in enumerate(range(every // 2, int(kvp[b + 1] - kvp[b]), every)):
            kv[x.kv_indices[kvp[b] + t].long(), 0, 0] = (12 + 8 * j) / unit_score * u
    return dataclasses.replace(x, kv_buffer=kv.to(x.kv_buffer.dtype))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("precision", "q_len"), [(p, 1) for p in PATHS] + [("a8w8", 2), ("a8w8", 4)])
def test_gpu_output_rescaled_where_the_max_jumps_mid_work(precision: str, q_len: int) -> None:
    """Scores that jump by 8+ nats every 1000 tokens (`_max_jumps`), on plans whose works span many tiles (a few
    slots) and the default one: the online softmax must rescale Oᵀ and the running sum by 2^-11 or less there; the
    answer is the jump tokens' values, far from the mean of V."""
    from mlalab.backends.triton import build_plan

    x = _peaked(make_inputs(DecodeCase(kv_lens=(4096, 3000, 1, 8192, 700), q_len=q_len, seed=3, dist="unit")))
    x = _max_jumps(x).to("cuda")
    p = prepare(x, precision)
    for planner, slots in (("simple", 3), ("balanced", 8), ("simple", 132)):
        _check(p, build_plan(x, planner, slots), peaked=True, lse_rtol=2e-3, config=KernelConfig(side_by_side="on"),
               rows=q_len if precision == "a8w8" else 1)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("q_len", [1, 2, 4])
def test_gpu_backend_default_plans_for_mtp_and_pages(q_len: int) -> None:
    """The triton backend's default plan where the sm_90 kernel runs, a8w8: from `SIDE_BY_SIDE_FROM_TOKENS` KV tokens
    on one slot an SM at every q_len (a CTA runs all q_len rows of its works), below SMs // q_len slots of one q row a
    CTA; works of one 64-token tile counted in pages at page size 64 (16 requests of 16 or 64 pages make more works
    than requests)."""
    from mlalab.backends.triton import make_callable

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, rows, cus in ((host.SIDE_BY_SIDE_FROM_TOKENS // 16, q_len, sms), (1024, 1, sms // q_len)):
        x = _peaked(make_inputs(DecodeCase(kv_lens=(n,) * 16, q_len=q_len, page_size=64, permute_pages=True, seed=2,
                                           dist="unit")).to("cuda"))  # fmt: skip
        call, info = make_callable(x, precision="a8w8")
        plan = info["plan"]
        assert plan.num_cus == cus and plan.n_work > 16 and info["decoder"].ran == "sm90:v-regs", (n, plan.num_cus)
        assert info["decoder"].sm90.rows == rows, (n, info["decoder"].sm90.rows)
        out = call(0)
        ref, _ = tiled_decode(info["prepared"], plan, p_dtype=torch.float8_e4m3fn)
        assert rel(out, ref) <= 1e-2 and rel(mean_v(info["prepared"]), ref) > 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_production_error_within_5pct_of_quantisation_error_and_close_to_portable(precision: str) -> None:
    x = make_inputs(DecodeCase(kv_lens=ragged_kv_lens(16, 2048, seed=5), seed=6)).to("cuda")
    p = prepare(x, precision)
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    out, _ = Decoder(p, plan, config=KernelConfig(kernel="sm90"))()
    portable, _ = Decoder(p, plan, config=KernelConfig(kernel="portable"))()
    emul, _ = naive_decode(p)
    exact, _ = naive_decode(prepare(x, "bf16"))
    quant_err = rel(emul.to(torch.bfloat16), exact)
    assert rel(out, exact) <= 1.05 * quant_err + 1e-3 * (precision == "bf16")
    assert rel(out, portable) <= 5e-3  # same numerics, different accumulation order


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", list(PATHS))
def test_gpu_rotated_kv_copies_pdl_and_sm_scale(precision: str) -> None:
    """Timing calls the decoder on KV copies: each copy gets its own TMA descriptors (a stale descriptor would read
    the first copy). The reduce with or without the dependent launch gives the same output. A softmax scale other
    than 1/sqrt(576) reaches the kernel."""
    x = _peaked(make_inputs(DecodeCase(kv_lens=(3000, 17, 800), seed=12, dist="unit")).to("cuda"))
    p = prepare(x, precision)
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    dec = Decoder(p, plan)
    base = dec()[0].clone()
    other = dataclasses.replace(x, kv_buffer=x.kv_buffer.flip(0).contiguous())
    p2 = prepare(other, precision)
    want = Decoder(p2, plan)()[0].clone()
    if p2.spec.kv_fp8:  # the same scale, so the copy's codes are the other inputs' codes
        assert torch.equal(p2.kv_scale, p.kv_scale)
    got = dec(kv=p2.kv.clone())[0]
    assert torch.equal(got, want) and not torch.equal(got, base)
    assert torch.equal(dec(kv=p.kv.clone())[0], base)
    assert torch.equal(Decoder(p, plan, config=KernelConfig(pdl=False))()[0], base)
    scaled = Decoder(p, plan, sm_scale=0.02)
    assert scaled.ran.startswith("sm90")
    ref, _ = tiled_decode(p, plan, p_dtype=PATHS[precision][1], sm_scale=0.02)
    assert rel(scaled()[0], ref) <= 5e-3 and rel(base, ref) > 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", ["a8w8", "a16w8"])
@pytest.mark.parametrize("amax", [1.0, 1e6])
def test_gpu_fp16_partials_whatever_the_kv_scale(precision: str, amax: float) -> None:
    """fp16 partials hold V in fp8 code units, so KV values up to 1e6 (partials far past fp16's 65504 if they carried
    the scale) still decode, on a batch whose requests split into 2 to 33 partials, with peaked attention (unit-std
    inputs, q x 3). q is divided by KV's factor, so the scores are those at amax 1 (LSEs up to ~16) and only the scale
    of V grows: with q unscaled the scores reach ~2e4 and a8w8 missed the oracle by 3.5 % rel-L2 (H100, 2026-12-07),
    the fp8 wgmma accumulation on one-hot attention (scores perturbed by 2^-14 of the products summed give 4.8 % on the
    CPU), not what this test is about."""
    from mlalab.backends.triton import build_plan

    x0 = make_inputs(DecodeCase(kv_lens=(*ragged_kv_lens(12, 3000, seed=11), 8192, 64), seed=12, dist="unit"))
    s = amax / float(x0.kv_buffer.abs().max())
    x = dataclasses.replace(x0, kv_buffer=x0.kv_buffer * s, q=(x0.q.float() * (3 / s)).to(x0.q.dtype)).to("cuda")
    p = prepare(x, precision)
    plan = build_plan(x, "simple", 132)
    assert int((plan.reduce_indptr.diff() >= 2).sum()) >= 2  # split requests go through the reduce
    dec = Decoder(p, plan)
    assert dec.part_o.dtype == torch.float16
    out, _ = _poisoned_run(dec)
    assert torch.isfinite(out).all() and float(out.abs().max()) > 0.1 * amax
    _check(p, plan, peaked=True)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", ["a16w8", "a8w8"])
def test_gpu_subnormal_fp8_codes_decode_exactly(precision: str) -> None:
    """KV values 2^-9 to 2^-6 times amax / 448 (one rope outlier sets amax) quantise to e4m3's subnormal codes: the
    output, a mean of such V codes, must still match the oracle on the same codes (flushing them to zero, or decoding
    them as normals, would miss it by ~100 %)."""
    x = make_inputs(DecodeCase(kv_lens=(300, 700, 64), seed=21)).to("cuda")
    kv = x.kv_buffer.view(-1, 576)
    g = torch.Generator(device="cuda").manual_seed(5)
    u = torch.rand(kv.shape, device="cuda", generator=g) * (2**-6 - 2**-9) + 2**-9  # |code| in [2^-9, 2^-6]
    kv.copy_((torch.where(torch.rand(kv.shape, device="cuda", generator=g) < 0.5, -u, u) / 448).to(kv.dtype))
    kv[0, 520] = 1.0  # sets the per-tensor scale: amax / 448
    p = prepare(x, precision)
    codes = p.kv.view(torch.uint8)[:, :512] & 0x7F
    assert ((codes > 0) & (codes < 8)).float().mean() > 0.5  # mostly subnormal V codes
    _check(p, make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
def test_gpu_ablations_skip_the_compute_they_name() -> None:
    """`Decoder.ablation` is a timing experiment: "qk" zeroes the scores (uniform softmax: each output is the mean of
    its request's V), "qk+pv" also skips the PV (outputs 0), "convert" (the e4m3 route only) the fp4 conversion; the
    decoder's own call is untouched."""
    x = _peaked(make_inputs(DecodeCase(kv_lens=(700, 64, 1500), seed=13, dist="unit")).to("cuda"))
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    dec = Decoder(p, plan)
    real = dec()[0].double().cpu()
    no_qk = dec.ablation("qk")()[0].double().cpu()
    assert rel(no_qk, mean_v(p)) <= 1e-2 and rel(real, mean_v(p)) > 0.1
    assert torch.count_nonzero(dec.ablation("qk+pv")()[0]) == 0
    assert torch.equal(dec()[0].double().cpu(), real)
    with pytest.raises(ValueError, match="skip must be one of 'qk', 'qk\\+pv'"):
        dec.ablation("pv")
    with pytest.raises(ValueError, match="written for the v-regs path"):
        Decoder(prepare(x, "bf16"), plan).ablation("qk")
    with pytest.raises(ValueError, match="written for the v-fp4-e4m3 path"):
        dec.ablation("convert")
    fp4 = Decoder(prepare(x, "a8w4-mxfp4"), plan)  # the e4m3 route: "convert" leaves its tile unwritten
    assert fp4.sm90 is not None and fp4.sm90.path == "v-fp4-e4m3"
    real4 = fp4()[0].double().cpu()
    fp4.ablation("convert")()
    fp4.ablation("convert+scales")()
    torch.cuda.synchronize()
    assert torch.equal(fp4()[0].double().cpu(), real4)
    with pytest.raises(ValueError, match="written for the v-regs path"):
        fp4.ablation("qk")

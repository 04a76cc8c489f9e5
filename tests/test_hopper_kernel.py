"""The sm_90 Gluon kernels (`mlalab.splitkv.gluon_hopper`, `gluon_hopper_vreg`): what they accept, how they are
built, and on the GPU, that they compute the decode of the same quantised inputs.

CPU (CI): the kernel is compiled for sm_90 in a subprocess (ptxas from Triton's wheel, no GPU): fp8 wgmma in the
SASS, no local memory, shared memory within the 227 KB a CTA may have, and a V transpose free of bank
conflicts. The tile stream and the refusals are checked on the CPU too.

GPU (``-m gpu``, run on the H200): under every planner, on ragged / long / paged (page 64, permuted, NaN in the
unused slots) batches with a 0-token request, the bf16 output matches the fp64 reference on the dequantised
codes up to the a8w8 rounding of P (rel-L2 <= 5e-3), the LSE to 2e-3, every output element is written (the
buffer is poisoned first), and the total error stays within 5 % of the emulated quantisation error.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs, ragged_kv_lens
from mlalab.splitkv import PLANNERS, make_plan
from mlalab.splitkv.triton_mla import (
    HOPPER_FIRST_BURST,
    HOPPER_MAX_STAGES,
    HOPPER_MAX_STAGES_128,
    KernelConfig,
    TritonDecoder,
    first_burst,
    hopper_import_error,
    hopper_ring,
    hopper_tiles,
    hopper_unsupported,
    naive_decode,
    prepare,
    token_work_info,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def test_refusals_name_the_reason() -> None:
    x = make_inputs(DecodeCase(kv_lens=(100, 70)))
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 4)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    # bf16: the v-tile path ("auto" means it), a16w8 the v-conv path, not the a8w8 paths
    assert "a16w8 runs the sm_90 kernel on its v-conv path only" in hopper_unsupported(prepare(x, "a16w8"), wi,
                                                                                     variant="v-regs")  # fmt: skip
    assert "needs an NVIDIA GPU" in hopper_unsupported(prepare(x, "a16w8"), wi)
    assert "e4m3fn" in hopper_unsupported(prepare(x, "a16w8", fp8_format="e4m3fnuz"), wi)
    assert "v-tile path only" in hopper_unsupported(prepare(x, "bf16"), wi, variant="v-regs")
    assert "needs an NVIDIA GPU" in hopper_unsupported(prepare(x, "bf16"), wi, variant="v-tile")
    assert "needs an NVIDIA GPU" in hopper_unsupported(prepare(x, "bf16"), wi)
    assert "exact mode" in hopper_unsupported(prepare(x, "a8w8"), wi, pv_exact=True)
    assert "needs an NVIDIA GPU" in hopper_unsupported(prepare(x, "a8w8"), wi)  # this CPU tensor
    assert "e4m3fn" in hopper_unsupported(prepare(x, "a8w8", fp8_format="e4m3fnuz"), wi)
    paged = make_inputs(DecodeCase(kv_lens=(100, 70), page_size=16, permute_pages=True))
    pplan = make_plan("simple", paged.qo_indptr, paged.kv_indptr, 4, page_size=16,
                      kv_last_page_len=paged.kv_last_page_len)  # fmt: skip
    pwi = token_work_info(pplan, paged.kv_indptr, paged.kv_last_page_len)
    assert "multiple of 64" in hopper_unsupported(prepare(paged, "a8w8"), pwi)
    spec = make_inputs(DecodeCase(kv_lens=(100, 70), q_len=2))
    splan = make_plan("simple", spec.qo_indptr, spec.kv_indptr, 4)
    swi = token_work_info(splan, spec.kv_indptr, spec.kv_last_page_len)
    assert "q_len 1" in hopper_unsupported(prepare(spec, "a8w8"), swi)
    assert "q_len 1" in hopper_unsupported(prepare(spec, "a8w8"), None)  # before a plan exists: from qo_indptr
    # asked for explicitly, a refusal is an error naming the reason; "auto" falls back to the portable kernel
    with pytest.raises(ValueError, match="kernel='hopper' cannot run here: a16w8 runs the sm_90 kernel on its v-conv"):
        TritonDecoder(prepare(x, "a16w8"), plan, config=KernelConfig(kernel="hopper", hopper_variant="vt-smem"))
    with pytest.raises(ValueError, match="kernel='hopper' cannot run here: needs an NVIDIA GPU"):
        TritonDecoder(prepare(x, "a16w8"), plan, config=KernelConfig(kernel="hopper"))  # (v-conv: this CPU)
    with pytest.raises(ValueError, match="kernel must be 'auto', 'hopper' or 'portable'"):
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(kernel="cuda"))
    with pytest.raises(ValueError, match="hopper_stages must be 1 to 5"):
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(hopper_stages=6))
    with pytest.raises(ValueError, match="hopper_stages must be 1 to 5"):  # (not a message about the first burst)
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(hopper_stages=0))
    with pytest.raises(ValueError, match="hopper_stages must be 1 to 5"):
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(hopper_stages=2.0))
    # the v-tile path is bf16's, on 64-token tiles, one warpgroup, a ring of exactly 2 tiles, none of the fp8 paths'
    # experiments; bf16's "auto" is v-tile (the same rules), bf16 with an fp8 variant runs the portable kernel
    # (kernel='hopper' then names why not)
    with pytest.raises(ValueError, match="'v-tile' .* 16-bit types only: bf16 precision, not a8w8"):
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(hopper_variant="v-tile"))
    bf16 = prepare(x, "bf16")
    for knobs in (dict(hopper_block=128), dict(hopper_warpgroups=2), dict(hopper_merge_splits=2),
                  dict(hopper_warp_exchange=True), dict(hopper_ablate="qk"), dict(hopper_stages=1)):  # fmt: skip
        with pytest.raises(ValueError, match="'v-tile' \\(bf16\\) runs 64-token tiles .* exactly 2 tiles"):
            TritonDecoder(bf16, plan, config=KernelConfig(hopper_variant="v-tile", **knobs))
    with pytest.raises(ValueError, match="'v-tile' \\(bf16\\) runs 64-token tiles .* exactly 2 tiles"):
        TritonDecoder(bf16, plan, config=KernelConfig(hopper_stages=3))  # ("auto": v-tile for bf16)
    with pytest.raises(ValueError, match="kernel='hopper' cannot run here: bf16 runs the sm_90 kernel on its v-tile"):
        TritonDecoder(bf16, plan, config=KernelConfig(kernel="hopper", hopper_variant="v-regs"))
    with pytest.raises(RuntimeError, match="needs a GPU"):  # (past every check: this CPU cannot launch it)
        TritonDecoder(bf16, plan, config=KernelConfig(hopper_variant="v-regs"))  # (bf16 runs the portable kernel)
    # the v-conv path is a16w8's: 64-token tiles, one warpgroup, a ring of at most 2 fp8 tiles refilled once converted
    with pytest.raises(ValueError, match="'v-conv' converts fp8 KV codes for bf16 q: a16w8 precision, not bf16"):
        TritonDecoder(bf16, plan, config=KernelConfig(hopper_variant="v-conv"))
    a16 = prepare(x, "a16w8")
    for knobs in (dict(hopper_block=128), dict(hopper_warpgroups=2), dict(hopper_merge_splits=2),
                  dict(hopper_warp_exchange=True), dict(hopper_ablate="qk"), dict(hopper_stages=3),
                  dict(hopper_refill_after_pv=False)):  # fmt: skip
        with pytest.raises(ValueError, match="'v-conv' \\(a16w8\\) runs 64-token tiles .* at most 2 fp8 tiles"):
            TritonDecoder(a16, plan, config=KernelConfig(**knobs))  # ("auto": v-conv for a16w8)
    # fp16 partials hold V in fp8 code units: fp8 KV only, not with the in-stage-1 merge (it reads fp32)
    with pytest.raises(ValueError, match="hopper_partials='fp16' holds V in units of its fp8 codes: a8w8 and a16w8"):
        TritonDecoder(bf16, plan, config=KernelConfig(hopper_partials="fp16"))
    with pytest.raises(ValueError, match="hopper_partials='fp16' with hopper_merge_splits"):
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(hopper_partials="fp16", hopper_merge_splits=2))
    with pytest.raises(ValueError, match="hopper_partials must be one of 'auto', 'fp32', 'fp16', got 'bf16'"):
        TritonDecoder(prepare(x, "a8w8"), plan, config=KernelConfig(hopper_partials="bf16"))


def test_tile_stream_follows_the_plan_and_the_page_table() -> None:
    # contiguous: tiles of 64 tokens from each work's start, rows = positions
    x = make_inputs(DecodeCase(kv_lens=(130, 0, 64, 65)))
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 3)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    t_indptr, rows = hopper_tiles(p, plan.work_indptr, wi)
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
    _, prow = hopper_tiles(q, pp.work_indptr, pwi)
    pos = [s for w in range(pwi.shape[0]) for s in range(int(pwi[w, 4]), int(pwi[w, 5]), 64)]
    assert prow.tolist() == [int(y.kv_indices[s // 64]) * 64 + s % 64 for s in pos]


def _h200_triton() -> str | None:
    """Where scripts/test.sh put a copy of the H200 machine's Triton (3.6), or None."""
    path = os.environ.get("MLALAB_TRITON_H200", "")
    return path if path and os.path.isdir(os.path.join(path, "triton")) else None


def _compile_env(triton_copy: str) -> dict[str, str]:
    """The environment of a compile subprocess: this one's Triton, or the H200 machine's copy (skips if absent)."""
    env = dict(os.environ)
    if triton_copy == "h200":
        path = _h200_triton()
        if path is None:
            pytest.skip("no copy of Triton 3.6 (scripts/test.sh fetches it into $MLALAB_TRITON_H200; offline here?)")
        env["PYTHONPATH"] = os.pathsep.join([path, ROOT, env.get("PYTHONPATH", "")])
    return env


def _compile_rows(body: str, env: dict[str, str], maxsplit: int = -1) -> tuple[str, list[list[str]]]:
    """Run a compile script (`body`, after the repository on sys.path and `compile_hopper` imported) in a subprocess
    with `env` (`_compile_env`); its stdout and the fields of its lines that start with ``R``."""
    code = f"import sys; sys.path.insert(0, {ROOT!r})\nfrom mlalab.splitkv.sm90_build import compile_hopper\n" + body
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, [ln.split(maxsplit=maxsplit) for ln in r.stdout.splitlines() if ln.startswith("R ")]


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
@pytest.mark.parametrize("triton_copy", ["environment", "h200"])
def test_compiles_for_sm90_with_fp8_wgmma_no_spills_no_bank_conflicts(triton_copy: str) -> None:
    """With this environment's Triton and with the H200 machine's (3.6, fetched by scripts/test.sh into
    $MLALAB_TRITON_H200): register allocation differs between versions (a merge configuration spilled with 3.6 only)."""
    env = _compile_env(triton_copy)
    body = (
        "import triton; print('V', triton.__version__)\n"
        "from mlalab.splitkv.triton_mla import HOPPER_MAX_STAGES, HOPPER_MAX_STAGES_128\n"
        "sts_all = lambda r: sum(n for k, n in r.sass.items() if k[:3] == 'STS')  # shared stores of every width\n"
        "runs = [(v, st, 64) for v in ('vt-smem', 'v-regs') for st in range(1, HOPPER_MAX_STAGES[v] + 1)]\n"
        "runs += [('v-regs', st, 128) for st in range(1, HOPPER_MAX_STAGES_128 + 1)]  # two warpgroups\n"
        "for v, st, blk in runs:\n"
        "  if True:\n"
        # (the default q first, 1 stage q last; 2 stages with the one-barrier exchanges across warps; 3 / 2 with the
        # merge of <= 4 / <= 8 splits in stage 1, which the decoder refuses with 1 stage: it spills with Triton 3.6)
        "    extra = dict(warp_exchange=st == 2, merge_max={3: 4, 2: 8}.get(st, 0)) if blk == 64 else {}\n"
        "    r = compile_hopper(st, variant=v, q_first=st != 1, block=blk, **extra)\n"
        "    print('R', v + ('' if blk == 64 else '-128'), st, r.registers, r.stack_bytes, r.shared_bytes,\n"
        "          ','.join(map(str, r.bank_conflicts)),\n"
        "          sum(n for k, n in r.sass.items() if k.startswith('QGMMA.64x16x32.F32.E4M3.E4M3')),\n"
        "          sum(n for k, n in r.sass.items() if k.startswith(('LDL', 'STL', 'LDS.U8', 'LDS.S8'))),\n"
        "          r.sass.get('LDS.128' if blk == 64 else 'LDS.64', 0),\n"
        "          r.sass.get('STS.128', 0) if v == 'vt-smem' else sts_all(r),\n"
        "          r.sass.get('STG.E.64', 0),\n"
        "          r.sass.get('MUFU.LG2', 0))\n"
    )
    out, rows = _compile_rows(body, env)
    if triton_copy == "h200":
        assert "V 3.6." in out, out[:200]
    assert len(rows) == HOPPER_MAX_STAGES["vt-smem"] + HOPPER_MAX_STAGES["v-regs"] + HOPPER_MAX_STAGES_128, out
    for _, variant, _st, regs, stack, shared, conflicts, qgmma, local, lds, sts, stg64, lg2 in rows:
        assert int(regs) <= 255 and int(stack) == 0, out  # nothing in local memory
        assert local == "0", out  # no local loads/stores, no byte-wise shared loads
        assert int(shared) <= 227 * 1024, out  # what one CTA may take on sm_90
        # 18 score (16 nope + 2 rope k-steps of 32) + 16 value (8 row blocks x 2 k-steps) fp8 wgmmas per tile
        assert int(qgmma) == 34, out
        # V of a tile: 16 x 16-byte loads per thread (128-token tiles: 32 x 8-byte loads, 8 consecutive dims each)
        assert int(lds) >= (16 if variant != "v-regs-128" else 32), out
        if variant == "vt-smem":
            assert conflicts == "0,0" and int(sts) >= 16, out  # the transpose: 16-byte stores, no conflicts
        else:
            # V goes to registers: no shared-memory stores of any width but the Pᵀ tile's and the reductions' (18; a
            # transpose or a layout conversion of V or Oᵀ through shared memory would add 16 or more); the warp
            # exchange (2 stages) and the merge (3 stages) add their own
            plain = variant == "v-regs-128" or _st in ("1", "4", "5")
            assert conflicts == "0" and int(sts) <= (20 if plain else 40), out
        # the fp32 partial leaves the accumulator as 32 8-byte stores per thread (head-minor, no conversion; 16 with
        # two warpgroups, which hold half of it each)
        assert int(stg64) >= (32 if variant != "v-regs-128" else 16), out
        # the LSE's log2 on the SFU (one per head column a thread holds), not Triton's software log2
        assert int(lg2) >= 4, out


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
@pytest.mark.parametrize("triton_copy", ["environment", "h200"])
def test_fp16_partials_and_the_gluon_reduce_compile_for_sm90(triton_copy: str) -> None:
    """fp16 partials (`hopper_partials`): stage 1 stores each row's 4 heads (column order) as one 8-byte vector (16
    per thread; the natural head order gave 4-byte half-sector stores, ~0.5 us slower on the H200), no spills. The
    Gluon reduce at every launch shape, fp32 and fp16 partials: no local memory, at most 40 shuffles per copy of the
    block merge (the Triton reduce's shuffle trees: 144 in fp32 and 344 in fp16 at 16 partials, the reason it exists;
    the kernel holds 4 copies: the first block of q row 0, peeled so that the common tile, one row of at most BLOCK_P
    partials, runs straight, further blocks, and the same for later rows)."""
    env = _compile_env(triton_copy)
    body = (
        "import triton; print('V', triton.__version__)\n"
        "from mlalab.splitkv.sm90_build import compile_reduce\n"
        "for v in ('vt-smem', 'v-regs'):\n"
        "  for part in ('fp32', 'fp16'):\n"
        "    r = compile_hopper(3, variant=v, partials=part)\n"
        "    stg = r.sass.get('STG.E.64', 0), r.sass.get('STG.E', 0)\n"
        "    print('R', 'stage1', v, part, r.registers, r.stack_bytes, *stg)\n"
        "for name, kw in (('v-regs-128', dict(block=128)), ('v-regs-2wg', dict(warpgroups=2))):\n"
        "    r = compile_hopper(2 if 'block' in kw else 4, variant='v-regs', partials='fp16', **kw)\n"
        "    print('R', 'stage1', name, 'fp16', r.registers, r.stack_bytes, r.sass.get('STG.E.64', 0), 0)\n"
        "for mp in (1, 2, 3, 4, 8, 9, 16, 33, 64, 200):\n"
        "  for part in ('fp32', 'fp16'):\n"
        "    r = compile_reduce(mp, part)\n"
        "    local = sum(n for k, n in r.sass.items() if k.startswith(('LDL', 'STL')))\n"
        "    print('R', 'reduce', mp, part, r.registers, r.stack_bytes, local, r.sass.get('SHFL', 0))\n"
    )
    out, rows = _compile_rows(body, env)
    if triton_copy == "h200":
        assert "V 3.6." in out, out[:200]
    stage1 = {(v, part): tuple(map(int, rest)) for _, kind, v, part, *rest in rows if kind == "stage1"}
    assert len(stage1) == 6, out
    for (v, part), (regs, stack, stg64, stg32) in stage1.items():
        # (two warpgroups with fp16 partials spill 48 bytes with Triton 3.9, not with the H200's 3.6: "auto" keeps
        # fp32 partials there)
        assert regs <= 255 and (stack == 0 or (v == "v-regs-2wg" and triton_copy == "environment")), out
        if part == "fp16":  # 16 rows x one 8-byte vector of 4 heads (and no 4-byte partial stores: <= 8 others);
            # 128-token tiles: each warpgroup holds 256 of the 512 rows, 8 per thread
            assert stg64 >= (8 if v == "v-regs-128" else 16) and stg32 <= 8, out
    reduce_rows = [tuple(map(int, (r[2], *r[4:]))) for r in rows if r[1] == "reduce"]
    assert len(reduce_rows) == 20, out
    for _mp, regs, stack, local, shfl in reduce_rows:
        assert regs <= 255 and stack == 0 and local == 0 and shfl <= 4 * 40, out


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
@pytest.mark.parametrize("triton_copy", ["environment", "h200"])
def test_two_warpgroup_kernel_compiles_for_sm90(triton_copy: str) -> None:
    """`gluon_hopper_2wg` (``hopper_warpgroups=2``): both warpgroups' 34 fp8 wgmmas per tile, the V load and the
    32 KB hand-over of Oᵀ free of bank conflicts, every ring within sm_90's 227 KB; with the H200's Triton (3.6) no
    spills for rings of 2-4 tiles (Triton 3.9 allocates registers differently and spills a few dozen bytes)."""
    env = _compile_env(triton_copy)
    body = (
        "import triton; print('V', triton.__version__)\n"
        "from mlalab.splitkv.triton_mla import HOPPER_MAX_STAGES_2WG\n"
        "for ring in range(1, HOPPER_MAX_STAGES_2WG + 1):\n"
        "    r = compile_hopper(ring, variant='v-regs', warpgroups=2)\n"
        "    print('R', ring, r.stack_bytes, r.shared_bytes, ','.join(map(str, r.bank_conflicts)),\n"
        "          r.sass.get('QGMMA.64x16x32.F32.E4M3.E4M3', 0), r.sass.get('BAR.SYNC.DEFER_BLOCKING', 0))\n"
    )
    out, rows = _compile_rows(body, env)
    assert len(rows) == 4, out
    for _, ring, stack, shared, conflicts, qgmma, bars in rows:
        assert int(shared) <= 227 * 1024, out
        assert set(conflicts.split(",")) == {"0"} and len(conflicts.split(",")) >= 2, out  # V load, hand-over
        assert int(qgmma) == 2 * 34, out  # each partition's copy of the tile loop
        assert int(bars) > 0, out
        if triton_copy == "h200" and ring != "1":
            assert int(stack) == 0, out


#: The 16-bit paths' compiles: (stages, mask_tail, refill_after_pv) of each. v-tile (bf16, ``V_FROM_K``): the PV's Vᵀ
#: read transposed from the K tile, with and without the paged tail's zeroing, the previous tile's stage refilled after
#: the softmax or before it; its ring is 2 tiles (with 1, a stage refilled one tile late would be the tile it waits
#: for). v-conv (a16w8, ``KV_CONVERT``): fp8 ring tiles of 1 or 2 converted into one bf16 tile (a thread's 288 codes of
#: a tile, 16 per 16-byte shared load; Triton 3.9 adds 2 such loads elsewhere), the tile's address not a constant, so
#: its wgmma descriptors are not hoisted out of the loop and spilled.
_SIXTEEN_BIT_BUILDS = {
    "v-tile": ((2, False, True), (2, True, True), (2, False, False), (2, True, False)),
    "v-conv": ((2, False, True), (2, True, True), (1, False, True)),
}


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
@pytest.mark.parametrize("triton_copy", ["environment", "h200"])
@pytest.mark.parametrize("variant", list(_SIXTEEN_BIT_BUILDS))
def test_16bit_paths_compile_to_bf16_wgmma_without_spills(variant: str, triton_copy: str) -> None:
    """bf16's v-tile and a16w8's v-conv path: the scores' 36 and the values' 32 bf16 wgmmas (m64n16k16), no fp8
    ones, no spills, in the 227 KB of shared memory, for every build of `_SIXTEEN_BIT_BUILDS`."""
    builds = _SIXTEEN_BIT_BUILDS[variant]
    body = (
        f"for st, mask, late in {builds!r}:\n"
        f"    r = compile_hopper(st, variant={variant!r}, mask_tail=mask, refill_after_pv=late)\n"
        "    gmma = {k: n for k, n in r.sass.items() if 'GMMA' in k}\n"
        "    print('R', st, mask, r.stack_bytes, r.shared_bytes, r.sass.get('LDS.128', 0),\n"
        "          r.sass.get('WARPGROUP', 0), gmma)\n"
    )
    out, rows = _compile_rows(body, _compile_env(triton_copy), maxsplit=7)
    assert len(rows) == len(builds), out
    for _, _st, _mask, stack, shared, lds128, warpgroup, gmma in rows:
        assert stack == "0" and int(shared) <= 227 * 1024, out
        assert gmma == "{'HGMMA.64x16x16.F32.BF16': 68}", out
        # a wgmma fence and wait per product chain, not per wgmma (ptxas serialises them all after a partial wait:
        # 136 such instructions in a session-13 experiment, commit 546f538)
        assert int(warpgroup) <= 8, out
        if variant == "v-conv":
            assert int(lds128) >= 64 * 576 // 128 // 16, out


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
def test_deferred_ring_fill_compiles_with_the_same_copies() -> None:
    """``hopper_first_burst``: the ring's later first tiles move from the start into the loop (after the first tile's
    wait), so the kernel issues as many TMA copies as with the whole ring at once; same wgmmas, no spills, no bank
    conflicts (this environment's Triton; the H200's 3.6 is checked in the test below when present)."""
    body = (
        "runs = [('v-regs', 3, 64, fb) for fb in (0, 1, 2)] + [('vt-smem', 3, 64, fb) for fb in (0, 2)]\n"
        "runs += [('v-regs', 5, 64, fb) for fb in (0, 1, 4)] + [('v-regs', 2, 128, fb) for fb in (0, 1)]\n"
        "for v, st, blk, fb in runs:\n"
        "    r = compile_hopper(st, variant=v, block=blk, first_burst=fb)\n"
        "    tma = sum(n for k, n in r.sass.items() if k.startswith('UTMALDG'))\n"
        "    print('R', f'{v}/{st}/{blk}', fb, r.stack_bytes, ','.join(map(str, r.bank_conflicts)), tma,\n"
        "          r.sass.get('QGMMA.64x16x32.F32.E4M3.E4M3', 0))\n"
    )
    env = _compile_env("h200") if _h200_triton() else _compile_env("environment")
    out, lines = _compile_rows(body, env)
    rows = {(v, fb): rest for _, v, fb, *rest in lines}
    assert len(rows) == 10, out
    for (v, _), (stack, conflicts, tma, qgmma) in rows.items():
        assert stack == "0" and set(conflicts.split(",")) == {"0"} and qgmma == "34", out
        assert tma == rows[(v, "0")][2], out  # the same copies, issued elsewhere


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
def test_partial_row_bits_match_the_epilogue_relabellings() -> None:
    """The head-minor partial store puts accumulator row m at value dim d by bit maps (`VT_ROW_BITS`,
    `VREGS_ROW_BITS`); the bf16 epilogues undo the same row orders π by register relabellings (reshape + permute).
    Both must agree, or a split request's partials land in the wrong dims."""
    from mlalab.splitkv import gluon_hopper_vreg as R

    def natural(relabel) -> torch.Tensor:  # noqa: ANN001 (the kernel's (shape, permutation) of Oᵀ rows x 16 heads)
        shape, perm = relabel.value
        o = torch.arange(512)[:, None].expand(512, 16)  # element (m, n) = m
        return o.reshape(shape).permute(perm).reshape(512, 16)[:, 0]

    # natural dim d of the relabelled tensor holds accumulator row m_of_d[d] (the kernels' reshape + permute; the
    # vt-smem epilogue's is written in `gluon_hopper._store_work_vt`)
    for bits, m_of_d in (
        (R.VT_ROW_BITS.value, torch.arange(512).reshape(4, 8, 2, 8).permute(0, 3, 2, 1).reshape(512)),
        (R.VREGS_ROW_BITS.value, natural(R.O_TO_NATURAL_64)),
        (R.VREGS128_ROW_BITS.value, natural(R.O_TO_NATURAL_128)),
    ):
        d_of_m = torch.empty(512, dtype=torch.long)
        d_of_m[m_of_d] = torch.arange(512)
        assert sorted(bits) == list(range(9))
        assert _by_bits(bits, 512) == d_of_m.tolist()


def _by_bits(bits: tuple[int, ...], n: int) -> list[int]:
    """Index i -> the index whose bit ``bits[j]`` is bit j of i."""
    return [sum(((i >> j) & 1) << b for j, b in enumerate(bits)) for i in range(n)]


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
@pytest.mark.parametrize("block", [64, 128])
def test_v_operand_and_p_relabellings_agree(block: int) -> None:
    """v-regs: the PV's A operand is V (tokens t, dims d) relabelled by reshape + permute (`_pv_operand`) so that row
    m holds dim π(m) (the epilogue's `VREGS*_ROW_BITS`) and column k token σ(k); Pᵀ's column k (`_p_operand`) must hold
    the same token σ(k), or each value would be weighted by another token's probability."""
    from mlalab.splitkv import gluon_hopper_vreg as R

    v = torch.arange(block * 512).reshape(block, 512)  # element (t, d) = t·512 + d
    shape, perm = (R.V_TO_OPERAND_128 if block == 128 else R.V_TO_OPERAND_64).value  # (the kernel's `_pv_operand`)
    a = v.reshape(shape).permute(perm).reshape(512, block)
    pi = _by_bits((R.VREGS128_ROW_BITS if block == 128 else R.VREGS_ROW_BITS).value, 512)
    sigma = (a[0] // 512).tolist()  # token of column k
    assert sorted(sigma) == list(range(block))
    assert a.tolist() == [[t * 512 + pi[m] for t in sigma] for m in range(512)]
    # `_p_operand`: P (tokens, 16 heads) -> Pᵀ (16, tokens); element (t, n) = t
    inner, perm = R.P_TO_OPERAND.value
    pt = torch.arange(block)[:, None].expand(block, 16).reshape(block // 16, *inner, 16).permute(perm)
    assert pt.reshape(block, 16).permute(1, 0)[0].tolist() == sigma


def test_cta_info_rows_and_variant_choice() -> None:
    from mlalab.splitkv.triton_mla import HOPPER_INFO_COLS, HOPPER_LONG_STREAM, HOPPER_MAX_STAGES, hopper_cta_info

    x = make_inputs(DecodeCase(kv_lens=(0, 130, 5, 4096)))
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 8, block=128)
    wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
    ti, rows = hopper_tiles(p, plan.work_indptr, wi)
    info = hopper_cta_info(plan.work_indptr, ti, rows, wi)
    assert info.shape == (8, HOPPER_INFO_COLS) and info.dtype == torch.int32
    for c in range(8):
        w0, w1, t0, t1 = (int(v) for v in info[c, :4])
        assert (w0, w1) == (int(plan.work_indptr[c]), int(plan.work_indptr[c + 1]))
        assert (t0, t1) == (int(ti[c]), int(ti[c + 1]))
        assert int(info[c, 4]) == (int(wi[w0, 2]) if w0 < w1 else 0)  # q row of its first work
        for i in range(max(HOPPER_MAX_STAGES.values())):  # the rows of its first tiles, 0 where it has fewer
            assert int(info[c, 5 + i]) == (int(rows[t0 + i]) if t0 + i < t1 else 0)
    assert HOPPER_LONG_STREAM >= 1
    with pytest.raises(ValueError, match="hopper_variant must be"):
        TritonDecoder(p, plan, config=KernelConfig(hopper_variant="fast"))
    with pytest.raises(ValueError, match="hopper_ablate must be one of 'none', 'qk', 'qk\\+pv'"):
        TritonDecoder(p, plan, config=KernelConfig(hopper_ablate="pv"))
    with pytest.raises(TypeError, match="switches must be True or False, got hopper_refill_after_pv=1"):
        TritonDecoder(p, plan, config=KernelConfig(hopper_refill_after_pv=1))
    with pytest.raises(ValueError, match="experiment of the sm_90 kernel.*kernel='portable'"):
        TritonDecoder(p, plan, config=KernelConfig(kernel="portable", hopper_ablate="qk"))
    for bad, msg in [(dict(hopper_block=96), "hopper_block must be 64 or 128"),
                     (dict(hopper_block=True), "hopper_block must be 64 or 128"),
                     (dict(hopper_block=128.0), "hopper_block must be 64 or 128"),
                     (dict(hopper_block=128, hopper_variant="vt-smem"), "written for the v-regs path"),
                     (dict(hopper_block=128, hopper_merge_splits=4), "written for the v-regs path"),
                     (dict(hopper_block=128, hopper_warp_exchange=True), "written for the v-regs path"),
                     (dict(hopper_block=128, hopper_stages=3), "at most 2 tiles of 128 tokens"),
                     (dict(hopper_warpgroups=3), "hopper_warpgroups must be 1 or 2"),
                     (dict(hopper_warpgroups=2.0), "hopper_warpgroups must be 1 or 2"),
                     (dict(hopper_warpgroups=2, hopper_stages=5), "shares a ring of 1 to 4 tiles"),
                     (dict(hopper_warpgroups=2, hopper_variant="vt-smem"), "written for the v-regs path"),
                     (dict(hopper_warpgroups=2, hopper_merge_splits=2), "written for the v-regs path"),
                     (dict(hopper_warpgroups=2, hopper_ablate="qk"), "written for the v-regs path"),
                     (dict(hopper_warpgroups=2, hopper_block=128, hopper_stages=2),
                      "hopper_warpgroups must be 1"),
                     (dict(hopper_first_burst=3), "hopper_first_burst must be None .* or 1 to hopper_stages - 1 = 2"),
                     (dict(hopper_first_burst=-1), "hopper_first_burst must be None"),
                     (dict(hopper_first_burst=True), "hopper_first_burst must be None"),
                     (dict(hopper_first_burst=2.0), "hopper_first_burst must be None"),
                     (dict(hopper_first_burst=1, hopper_warpgroups=2, hopper_stages=3),
                      "knob of the one-warpgroup kernel")]:  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            TritonDecoder(p, plan, config=KernelConfig(**bad))
    # 128-token tiles need pages of a multiple of 128 (or page size 1 with the identity table)
    paged = prepare(make_inputs(DecodeCase(kv_lens=(300, 70), page_size=64)), "a8w8")
    assert "multiple of 128" in hopper_unsupported(paged, None, block=128)


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
def test_gluon_reduce_launch_shape() -> None:
    """All of a tile's partials in one block load up to 64 (further blocks beyond), 8 partial values per thread
    (in registers up to 8 partials, then across 2 lanes and the warps), every program a whole number of 16-head rows
    of the 512 value dims; bad counts refused."""
    from mlalab.splitkv.gluon_reduce import launch_shape

    assert launch_shape(1) == launch_shape(2) == {"BLOCK_P": 2, "DPT": 4, "LP": 1, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(3) == launch_shape(4) == {"BLOCK_P": 4, "DPT": 2, "LP": 1, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(8) == {"BLOCK_P": 8, "DPT": 1, "LP": 1, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(9) == launch_shape(16) == {"BLOCK_P": 16, "DPT": 1, "LP": 2, "num_warps": 1, "maxnreg": 255}
    assert launch_shape(33) == launch_shape(500) == {"BLOCK_P": 64, "DPT": 1, "LP": 2, "num_warps": 4, "maxnreg": 255}
    for n in range(1, 70):
        s = launch_shape(n)
        per_thread = s["BLOCK_P"] // (s["LP"] * s["num_warps"])
        assert s["BLOCK_P"] >= min(n, 64) and per_thread * s["DPT"] * 4 == 32 and 512 % (s["DPT"] * 8 // s["LP"]) == 0
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="max_partials must be an int >= 1"):
            launch_shape(bad)


def test_first_burst_rule() -> None:
    """``hopper_first_burst``: None issues `HOPPER_FIRST_BURST` tiles at the start only where a CTA streams more tiles
    than that through a deeper ring (one warpgroup); elsewhere, and for 0, the whole ring; an explicit count stays."""
    assert HOPPER_FIRST_BURST == 2
    auto = KernelConfig()
    assert [first_burst(auto, n, 3) for n in (0, 1, 2, 3, 64)] == [3, 3, 3, 2, 2]
    assert first_burst(auto, 64, 2) == 2  # the ring is the burst (bf16's 2 tiles, 128-token tiles)
    assert first_burst(auto, 64, 5) == 2
    assert first_burst(KernelConfig(hopper_first_burst=0), 64, 3) == 3
    assert first_burst(KernelConfig(hopper_first_burst=1, hopper_stages=4), 1, 4) == 1
    assert first_burst(KernelConfig(hopper_warpgroups=2, hopper_stages=4), 64, 4) == 4
    for bad in (-1, 2.0, None):
        with pytest.raises(ValueError, match="most_tiles must be an int >= 0"):
            first_burst(auto, bad, 3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="stages must be an int >= 1"):
            first_burst(auto, 3, bad)  # type: ignore[arg-type]


def test_ring_depth_defaults_per_path() -> None:
    """``hopper_stages=None``: each sm_90 path's default ring (3 fp8 tiles, 2 bf16 tiles on v-tile, 2 of 128 tokens, 3
    shared by two warpgroups); an explicit depth is kept whatever the path (the decoder checks it against the path)."""
    assert hopper_ring(KernelConfig()) == 3 and hopper_ring(KernelConfig(hopper_variant="v-tile")) == 2
    assert hopper_ring(KernelConfig(hopper_variant="vt-smem")) == 3
    assert hopper_ring(KernelConfig(hopper_block=128)) == HOPPER_MAX_STAGES_128 == 2
    assert hopper_ring(KernelConfig(hopper_warpgroups=2)) == 3
    assert hopper_ring(KernelConfig(hopper_stages=5)) == 5 and hopper_ring(KernelConfig(hopper_stages=1)) == 1


def test_merge_info_picks_small_one_row_splits_and_names_their_rows() -> None:
    """`hopper_merge_splits`: the reduce tiles with 2..N partials (one q row, consecutive partial rows) are merged by
    stage 1; every work of such a tile carries (slot, n, first partial row, q row); the others carry slot -1."""
    from mlalab.splitkv.triton_mla import hopper_merge_info, merge_tiles

    for lens, n_max, merged in [((1024,) * 64, 2, 64), ((8192,) * 32, 2, 0), ((8192,) * 32, 4, 32), ((1024,) * 4, 8, 0),
                                ((1000,) * 40, 4, 40), ((0, 130, 5, 4096), 0, 0)]:  # fmt: skip
        x = make_inputs(DecodeCase(kv_lens=lens, seed=1))
        plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 132, block=64)
        wi = token_work_info(plan, x.kv_indptr, x.kv_last_page_len)
        tiles = merge_tiles(plan, n_max)
        info, slot_tiles = hopper_merge_info(plan, wi, n_max)
        slots = len(slot_tiles)
        assert slot_tiles == tiles
        assert len(tiles) == slots == merged, (lens[:2], n_max)
        indptr, pmap = plan.reduce_indptr.long(), plan.reduce_partial_map.long()
        final = plan.reduce_final_map.long().reshape(-1, 2)
        for slot, t in enumerate(tiles):
            s, e = int(indptr[t]), int(indptr[t + 1])
            works = [w for w in range(wi.shape[0]) if int(wi[w, 1]) in pmap[s:e].tolist()]
            assert len(works) == e - s <= n_max  # one work per partial
            for w in works:
                assert info[w].tolist() == [slot, e - s, int(pmap[s]), int(final[t, 0])]
        in_merged = {int(r) for t in tiles for r in pmap[int(indptr[t]) : int(indptr[t + 1])]}
        for w in range(wi.shape[0]):
            if int(wi[w, 1]) not in in_merged:
                assert int(info[w, 0]) == -1
    p = prepare(make_inputs(DecodeCase(kv_lens=(300, 200))), "a8w8")
    plan = make_plan("simple", p.qo_indptr, p.kv_indptr, 8, block=64)
    with pytest.raises(ValueError, match="hopper_merge_splits needs hopper_stages >= 2"):
        TritonDecoder(p, plan, config=KernelConfig(hopper_merge_splits=2, hopper_stages=1))
    for bad in (1, 3, 16, True):
        with pytest.raises(ValueError, match="hopper_merge_splits must be 0 \\(off\\), 2, 4 or 8"):
            TritonDecoder(p, plan, config=KernelConfig(hopper_merge_splits=bad))


# --------------------------------------------------------------------------------------------- GPU
def _poisoned_run(dec: TritonDecoder) -> tuple[torch.Tensor, torch.Tensor]:
    dec.out.fill_(float("nan"))
    dec.lse.fill_(float("nan"))
    dec.part_o.fill_(float("nan"))
    out, lse = dec()
    torch.cuda.synchronize()
    return out.clone(), lse.clone()


_CONFIGS = {
    "vt-smem-3-stages": KernelConfig(hopper_variant="vt-smem"),
    "vt-smem-1-stage": KernelConfig(hopper_variant="vt-smem", hopper_stages=1),
    "v-regs-3-stages": KernelConfig(hopper_variant="v-regs"),
    "v-regs-2-stages": KernelConfig(hopper_variant="v-regs", hopper_stages=2),
    # maxima and softmax sums across the warps with one barrier each (`gluon_hopper._across_warps`)
    "v-regs-warp-exchange": KernelConfig(hopper_variant="v-regs", hopper_warp_exchange=True),
    "vt-smem-warp-exchange": KernelConfig(hopper_variant="vt-smem", hopper_warp_exchange=True),
    # requests split in <= 4 merged inside stage 1 by their last CTA (the others through the reduce)
    "v-regs-merge-4": KernelConfig(hopper_variant="v-regs", hopper_merge_splits=4),
    "vt-smem-merge-4": KernelConfig(hopper_variant="vt-smem", hopper_merge_splits=4),
    # two warpgroups on 128-token tiles (plans cut on 64 leave half-empty tiles: masked)
    "v-regs-block128-2-stages": KernelConfig(hopper_block=128, hopper_stages=2),
    "v-regs-block128-1-stage": KernelConfig(hopper_block=128, hopper_stages=1),
    # two warpgroups on alternate 64-token tiles, sharing a ring of 4 / 3 (odd: buffers change hands) / 1 tiles
    "v-regs-2wg-4": KernelConfig(hopper_warpgroups=2, hopper_stages=4),
    "v-regs-2wg-3": KernelConfig(hopper_warpgroups=2, hopper_stages=3),
    "v-regs-2wg-1": KernelConfig(hopper_warpgroups=2, hopper_stages=1),
    # only the ring's first 1 / 2 tiles issued at the start, the rest once the first tile has arrived
    "v-regs-burst-1": KernelConfig(hopper_variant="v-regs", hopper_first_burst=1),
    "v-regs-whole-ring": KernelConfig(hopper_variant="v-regs", hopper_first_burst=0),  # (the default up to run 11)
    "vt-smem-burst-2": KernelConfig(hopper_variant="vt-smem", hopper_first_burst=2),
    "v-regs-4-stages-burst-2": KernelConfig(hopper_variant="v-regs", hopper_stages=4, hopper_first_burst=2),
    "v-regs-5-stages-burst-1": KernelConfig(hopper_variant="v-regs", hopper_stages=5, hopper_first_burst=1),
    "v-regs-5-stages-burst-4": KernelConfig(hopper_variant="v-regs", hopper_stages=5, hopper_first_burst=4),
    "v-regs-block128-burst-1": KernelConfig(hopper_block=128, hopper_stages=2, hopper_first_burst=1),
    "v-regs-merge-4-burst-1": KernelConfig(hopper_variant="v-regs", hopper_merge_splits=4, hopper_first_burst=1),
    # fp16 partials in KV code units (the reduce applies the KV scale)
    "v-regs-fp16-partials": KernelConfig(hopper_variant="v-regs", hopper_partials="fp16"),
    "vt-smem-fp16-partials": KernelConfig(hopper_variant="vt-smem", hopper_partials="fp16"),
    "v-regs-2wg-fp16-partials": KernelConfig(hopper_warpgroups=2, hopper_stages=4, hopper_partials="fp16"),
    # each reduce with the other partial type (the defaults pair fp16 with the Gluon reduce, fp32 with the Triton one)
    "v-regs-fp16-partials-triton-reduce": KernelConfig(hopper_partials="fp16", hopper_reduce="triton"),
    "v-regs-fp32-partials-gluon-reduce": KernelConfig(hopper_partials="fp32", hopper_reduce="gluon"),
    "v-regs-fp32-partials-triton-reduce": KernelConfig(hopper_partials="fp32", hopper_reduce="triton"),
}


def _check_against_reference(p, plan, clean=None, config=KernelConfig()) -> tuple[float, float]:  # noqa: ANN001, B008
    """`clean`: the same inputs without the NaN planted in unused page slots (the reference refuses NaN)."""
    dec = TritonDecoder(p, plan, config=config)
    assert dec.kernel == "hopper", dec.hopper_reason
    out, lse = _poisoned_run(dec)
    ref, ref_lse = naive_decode(p if clean is None else clean)
    live = ref.norm(dim=-1) > 0
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()  # every element written
    err = _rel(out.cpu()[live], ref[live])
    dl = float((lse.cpu().double() - ref_lse)[live.all(-1)].abs().max())
    assert err <= 5e-3 and dl <= 2e-3, (plan.planner, err, dl)
    dead = ~live.all(-1)
    assert torch.isinf(lse.cpu()[dead]).all() and (out.cpu()[dead] == 0).all()  # 0-token requests
    return err, dl


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize("variant", list(_CONFIGS))
def test_gpu_every_planner_ragged_long_and_empty(planner: str, variant: str) -> None:
    from mlalab.backends.triton import build_plan

    # (100,) * 150: 150 works on 132 slots, so some CTAs run two works (the case a bug of v-regs once hung on)
    for lens in [ragged_kv_lens(9, 700, seed=3), (1024,) * 4, (1, 64, 8192), (0, 130, 5, 4096), (1000,) * 40,
                 (100,) * 150]:  # fmt: skip
        x = make_inputs(DecodeCase(kv_lens=tuple(lens), seed=4)).to("cuda")
        p = prepare(x, "a8w8")
        _check_against_reference(p, build_plan(x, planner, 132), config=_CONFIGS[variant])


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", [v for v in _CONFIGS if "2wg" in v or "burst" in v] + ["v-regs-3-stages"])
def test_gpu_many_works_per_cta(variant: str) -> None:
    """Plans on a few slots: CTAs with 4-15 works, a first work without tiles followed by works with tiles, several
    hand-overs in one CTA going to either warpgroup (2wg), q buffers reused more than once (the cases the 132-slot
    plans above never make; suggested by a review of the deferred ring fill and the two-warpgroup path)."""
    from mlalab.backends.triton import build_plan

    for lens, planner, slots in [((0, 65, 128, 1, 190, 64, 0, 300, 129, 2), "balanced", 3),
                                 ((0, 65, 128, 1, 190, 64, 0, 300, 129, 2), "simple", 3),
                                 ((100,) * 40 + (1,) * 20, "balanced", 8)]:  # fmt: skip
        x = make_inputs(DecodeCase(kv_lens=lens, seed=7)).to("cuda")
        p = prepare(x, "a8w8")
        plan = build_plan(x, planner, slots)
        assert int(plan.work_indptr.diff().max()) >= 4, (planner, slots)  # the point of the case
        _check_against_reference(p, plan, config=_CONFIGS[variant])


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("planner", ["simple", "balanced", "aiter-fast"])
@pytest.mark.parametrize("variant", list(_CONFIGS))
def test_gpu_paged_permuted_with_nan_in_unused_slots(planner: str, variant: str) -> None:
    from mlalab.backends.triton import build_plan

    lens = (*ragged_kv_lens(6, 900, seed=8), 0, 3000, 1)
    ps = _CONFIGS[variant].hopper_block  # (128-token tiles need pages of 128)
    x = make_inputs(DecodeCase(kv_lens=lens, page_size=ps, permute_pages=True, seed=9)).to("cuda")
    p = prepare(x, "a8w8")
    assert not p.contiguous
    clean = dataclasses.replace(p, kv=p.kv.clone())
    # the unused slots of every last page hold NaN codes: the kernel must never let them reach the output
    kv = p.kv.view(-1, ps, p.kv.shape[-1])
    pages = x.kv_indices.long()
    for b in range(len(lens)):
        s, e = int(x.kv_indptr[b]), int(x.kv_indptr[b + 1])
        if e > s:
            used = int(x.kv_last_page_len[b])
            kv[pages[e - 1], used:].view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
    knobs = {"block": 1} if planner == "simple" else {}
    _check_against_reference(p, build_plan(x, planner, 132, **knobs), clean, _CONFIGS[variant])


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
def test_gpu_production_error_within_5pct_of_quantisation_error_and_close_to_portable() -> None:
    from mlalab.splitkv.triton_mla import triton_decode

    x = make_inputs(DecodeCase(kv_lens=ragged_kv_lens(16, 2048, seed=5), seed=6)).to("cuda")
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    out, _ = triton_decode(p, plan, config=KernelConfig(kernel="hopper"))
    portable, _ = triton_decode(p, plan, config=KernelConfig(kernel="portable"))
    emul, _ = naive_decode(p)
    exact, _ = naive_decode(prepare(x, "bf16"))
    quant_err = _rel(emul.to(torch.bfloat16), exact)
    assert _rel(out, exact) <= 1.05 * quant_err
    assert _rel(out, portable) <= 5e-3  # same numerics (fp8 P), different accumulation order


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
def test_gpu_rotated_kv_copies_and_stage_counts() -> None:
    """Timing calls the decoder on KV copies: each copy gets its own TMA descriptors (a stale descriptor would
    read the first copy). Every ring depth (q fetched before or after the ring's tiles), with or without the
    dependent launches, with the ring's refill issued before or after the PV, gives the same output."""
    x = make_inputs(DecodeCase(kv_lens=(3000, 17, 800), seed=12)).to("cuda")
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    with pytest.raises(ValueError, match="vt-smem path holds at most 3 tiles"):
        TritonDecoder(p, plan, config=KernelConfig(hopper_variant="vt-smem", hopper_stages=4))
    # "auto" with a ring deeper than vt-smem holds runs v-regs, even when the plan streams no tile (all empty)
    z = make_inputs(DecodeCase(kv_lens=(0, 0), seed=1)).to("cuda")
    zp = prepare(z, "a8w8")
    zdec = TritonDecoder(zp, make_plan("simple", z.qo_indptr.cpu(), z.kv_indptr.cpu(), 132),
                         config=KernelConfig(hopper_stages=5))  # fmt: skip
    assert zdec.hopper_variant == "v-regs"
    zout, zlse = zdec()
    assert (zout.float() == 0).all() and torch.isinf(zlse).all()
    wide = KernelConfig(hopper_block=128, hopper_stages=2)  # (and 128-token tiles: a 128-row zero KV for the TMA)
    zout, zlse = TritonDecoder(zp, make_plan("simple", z.qo_indptr.cpu(), z.kv_indptr.cpu(), 132), config=wide)()
    assert (zout.float() == 0).all() and torch.isinf(zlse).all()
    for variant in ("vt-smem", "v-regs"):
        depths = range(1, HOPPER_MAX_STAGES[variant] + 1)
        cfgs = [KernelConfig(hopper_variant=variant, hopper_stages=s, hopper_q_first=s % 2 == 0) for s in depths]
        outs = [TritonDecoder(p, plan, config=c)()[0].clone() for c in cfgs]
        outs.append(TritonDecoder(p, plan, config=KernelConfig(hopper_variant=variant, pdl=False))()[0].clone())
        early = KernelConfig(hopper_variant=variant, hopper_refill_after_pv=False)  # the refill's issue point
        outs.append(TritonDecoder(p, plan, config=early)()[0].clone())
        chained = TritonDecoder(p, plan, config=KernelConfig(hopper_variant=variant, pdl_chain=True))
        for _ in range(3):  # back to back: each stage 1 waits for the previous call's reduce before it writes
            chained()
        outs.append(chained()[0].clone())
        assert all(torch.equal(outs[0], o) for o in outs[1:]), variant
    # 128-token tiles (two warpgroups): both ring depths, q first or last, without dependent launches, the refill
    # before the PV, chained launches
    base = dict(hopper_block=128, hopper_stages=2)
    cfgs = [KernelConfig(hopper_block=128, hopper_stages=s, hopper_q_first=s == 2) for s in (1, 2)]
    cfgs += [KernelConfig(**base, pdl=False), KernelConfig(**base, hopper_refill_after_pv=False)]
    outs = [TritonDecoder(p, plan, config=c)()[0].clone() for c in cfgs]
    chained = TritonDecoder(p, plan, config=KernelConfig(**base, pdl_chain=True))
    for _ in range(3):
        chained()
    outs.append(chained()[0].clone())
    assert all(torch.equal(outs[0], o) for o in outs[1:]), "hopper_block=128"
    ref, _ = naive_decode(p)
    assert _rel(outs[0].cpu(), ref) <= 5e-3
    for cfg in (KernelConfig(hopper_variant="v-regs"), KernelConfig(**base)):  # each copy its own descriptors
        _check_rotation(p, plan, cfg)


def _check_rotation(p, plan, cfg: KernelConfig) -> None:  # noqa: ANN001
    dec = TritonDecoder(p, plan, config=cfg)
    other = p.kv.clone()
    other[: p.kv.shape[0] // 2] = p.kv[p.kv.shape[0] // 2 : 2 * (p.kv.shape[0] // 2)]  # different contents
    a = dec()[0].clone()
    b = dec(kv=other)[0].clone()
    c = dec()[0].clone()
    assert torch.equal(a, c) and not torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    ("lens", "n_max"), [((1024,) * 64, 2), ((8192,) * 32, 4), ((1000,) * 40, 4), ((1024,) * 16, 8)]
)
def test_gpu_merge_in_stage1_replaces_the_reduce(lens: tuple[int, ...], n_max: int) -> None:
    """With every request split in <= n_max, stage 1 merges them all (no reduce launch): the output matches the
    default decoder's (same numerics, merge order aside) and the fp64 reference, call after call (the arrival
    counters are back at 0 after each call), and on rotated KV copies."""
    from mlalab.backends.triton import build_plan

    x = make_inputs(DecodeCase(kv_lens=lens, seed=21)).to("cuda")
    p = prepare(x, "a8w8")
    plan = build_plan(x, "simple", 132, block=64)
    dec = TritonDecoder(p, plan, config=KernelConfig(hopper_merge_splits=n_max))
    assert dec.merge_max > 0 and dec.split_tiles.numel() == 0 and dec.ran.endswith(f"+merge{n_max}")
    base, base_lse = _poisoned_run(TritonDecoder(p, plan))
    outs = [_poisoned_run(dec) for _ in range(3)]
    assert int(dec.merge_counters.abs().sum()) == 0
    for out, lse in outs:
        assert _rel(out.cpu(), base.cpu().double()) <= 2e-3 and float((lse - base_lse).abs().max()) <= 1e-4
        assert torch.equal(out, outs[0][0])
    _check_against_reference(p, plan, config=KernelConfig(hopper_merge_splits=n_max))
    other = p.kv.clone()
    other[: other.shape[0] // 2] = p.kv[other.shape[0] // 2 : 2 * (other.shape[0] // 2)]
    ref_b = TritonDecoder(p, plan)(kv=other)[0].clone()
    assert _rel(dec(kv=other)[0].cpu(), ref_b.cpu().double()) <= 2e-3


#: bf16's sm_90 path (v-tile: the PV reads Vᵀ straight from the K tile), asked for: its 2-tile ring, that ring's
#: deferred fill (1 tile at the start), and the previous tile's stage refilled before the softmax (a timing variant)
_BF16_CONFIGS = {
    "v-tile": KernelConfig(hopper_variant="v-tile"),
    "v-tile-burst-1": KernelConfig(hopper_variant="v-tile", hopper_first_burst=1),
    "v-tile-early-refill": KernelConfig(hopper_variant="v-tile", hopper_refill_after_pv=False),
}


#: a16w8's sm_90 path (v-conv: fp8 ring tiles converted to one bf16 tile): its default 2-tile ring, 1 tile, and the
#: 2-tile ring's deferred fill
_A16W8_CONFIGS = {
    "v-conv": KernelConfig(),
    "v-conv-1-stage": KernelConfig(hopper_stages=1),
    "v-conv-burst-1": KernelConfig(hopper_first_burst=1),
    "v-conv-fp16-partials": KernelConfig(hopper_partials="fp16"),
}


#: The paths of one precision each, by test id: (precision, the path "auto" runs, config, the NaN code of the KV)
_ONE_PATH_CASES = {
    **{f"bf16-{k}": ("bf16", "v-tile", c, (torch.int16, 0x7FC0)) for k, c in _BF16_CONFIGS.items()},
    **{f"a16w8-{k}": ("a16w8", "v-conv", c, (torch.uint8, 0x7F)) for k, c in _A16W8_CONFIGS.items()},
}


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize("case", list(_ONE_PATH_CASES))
def test_gpu_16bit_paths_every_planner_ragged_long_empty_and_paged_with_nan(planner: str, case: str) -> None:
    """bf16 on the v-tile path and a16w8 (bf16 q, fp8 KV) on the v-conv path against the fp64 reference on the same
    inputs: ragged, long, empty requests, more works than slots, and a permuted paged cache whose unused slots hold
    NaN (the PV reads V from the 16-bit tile, so a work's last tile has its tail zeroed first)."""
    from mlalab.backends.triton import build_plan

    precision, path, cfg, (code_type, nan_code) = _ONE_PATH_CASES[case]
    for lens in [ragged_kv_lens(9, 700, seed=3), (1, 64, 8192), (0, 130, 5, 4096), (100,) * 150]:
        x = make_inputs(DecodeCase(kv_lens=tuple(lens), seed=4)).to("cuda")
        p = prepare(x, precision)
        dec = TritonDecoder(p, build_plan(x, planner, 132), config=cfg)
        assert dec.kernel == "hopper" and dec.hopper_variant == path and dec.ran.startswith(f"hopper:{path}")
        _check_against_reference(p, build_plan(x, planner, 132), config=cfg)
    lens = (*ragged_kv_lens(6, 900, seed=8), 0, 3000, 1)
    x = make_inputs(DecodeCase(kv_lens=lens, page_size=64, permute_pages=True, seed=9)).to("cuda")
    p = prepare(x, precision)
    clean = dataclasses.replace(p, kv=p.kv.clone())
    kv = p.kv.view(-1, 64, p.kv.shape[-1])
    pages = x.kv_indices.long()
    for b in range(len(lens)):
        s, e = int(x.kv_indptr[b]), int(x.kv_indptr[b + 1])
        if e > s:
            kv[pages[e - 1], int(x.kv_last_page_len[b]) :].view(code_type).fill_(nan_code)
    assert torch.isnan(p.kv.float()).any()
    knobs = {"block": 1} if planner == "simple" else {}
    _check_against_reference(p, build_plan(x, planner, 132, **knobs), clean, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", ["bf16", "a16w8"])
def test_gpu_16bit_error_like_the_portable_kernel_and_launch_options_agree(precision: str) -> None:
    """bf16 (v-tile) and a16w8 (v-conv: the KV's fp8 codes exact in bf16) production numerics (P rounded to bf16, fp32
    accumulation): within 10 % of the portable kernel's error against the exact decode and within 5e-3 of its output;
    the deferred ring fill, without dependent launches, chained launches and rotated KV copies give the same output;
    a few slots (CTAs with several works) too."""
    from mlalab.backends.triton import build_plan
    from mlalab.splitkv.triton_mla import triton_decode

    x = make_inputs(DecodeCase(kv_lens=ragged_kv_lens(16, 2048, seed=5), seed=6)).to("cuda")
    p = prepare(x, precision)
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    vt = dict(hopper_variant="v-tile") if precision == "bf16" else {}  # (asked for, or a16w8's "auto")
    out, _ = triton_decode(p, plan, config=KernelConfig(kernel="hopper", **vt))
    portable, _ = triton_decode(p, plan, config=KernelConfig(kernel="portable"))
    exact, _ = naive_decode(p)
    assert _rel(out, exact) <= 1.1 * _rel(portable, exact), (_rel(out, exact), _rel(portable, exact))
    assert _rel(out, portable) <= 5e-3
    cfgs = [KernelConfig(pdl=False, **vt), KernelConfig(hopper_first_burst=1, **vt)]
    outs = [TritonDecoder(p, plan, config=c)()[0].clone() for c in cfgs]
    chained = TritonDecoder(p, plan, config=KernelConfig(pdl_chain=True, **vt))
    for _ in range(3):
        chained()
    outs.append(chained()[0].clone())
    assert all(torch.equal(out, o) for o in outs), f"{precision} launch options"
    _check_rotation(p, plan, KernelConfig(**vt))
    for planner, slots in (("balanced", 3), ("simple", 8)):  # CTAs with 4+ works of several tiles each
        few = build_plan(x, planner, slots)
        assert int(few.work_indptr.diff().max()) >= 2
        _check_against_reference(p, few, config=KernelConfig(**vt))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", ["a8w8", "a16w8"])
@pytest.mark.parametrize("amax", [1.0, 1e6])
def test_gpu_fp16_partials_match_fp32_ones_whatever_the_kv_scale(precision: str, amax: float) -> None:
    """fp16 partials (`hopper_partials`) hold V in fp8 code units, so KV values up to 1e6 (partials far past fp16's
    65504 if they carried the scale) still decode; the output is within 2e-3 (rel-L2) of the fp32 partials' one (a
    partial's fp16 rounding, <= 2^-12 relative, flips some of the bf16 output's roundings: ~8e-4 expected) and the
    LSE equal (it stays fp32), on a batch whose requests split into 2 to 33 partials."""
    from mlalab.backends.triton import build_plan

    x0 = make_inputs(DecodeCase(kv_lens=(*ragged_kv_lens(12, 3000, seed=11), 8192, 64), seed=12)).to("cuda")
    x = dataclasses.replace(x0, kv_buffer=x0.kv_buffer * (amax / float(x0.kv_buffer.abs().max())))
    p = prepare(x, precision)
    plan = build_plan(x, "simple", 132)
    assert int((plan.reduce_indptr.diff() >= 2).sum()) >= 2  # split requests go through the reduce
    base_dec = TritonDecoder(p, plan, config=KernelConfig(hopper_partials="fp32", hopper_reduce="triton"))
    assert base_dec.part_o.dtype == torch.float32 and base_dec.gluon_reduce is None
    base, base_lse = base_dec()
    dec = TritonDecoder(p, plan, config=KernelConfig(hopper_partials="fp16"))
    assert dec.part_o.dtype == torch.float16 and dec.ran.endswith("+fp16-partials+gluon-reduce")
    # "auto": fp16 for fp8 KV (since 2026-12-04's session 16 also with few split requests: 4 here), fp32 and the
    # Triton reduce with `hopper_merge_splits`
    assert TritonDecoder(p, plan).part_o.dtype == torch.float16
    x4 = make_inputs(DecodeCase(kv_lens=(1024,) * 4, seed=12)).to("cuda")
    p4, plan4 = prepare(x4, precision), build_plan(x4, "simple", 132)
    assert TritonDecoder(p4, plan4).ran.endswith("+fp16-partials+gluon-reduce")
    if precision == "a8w8":  # (a16w8's v-conv path has no in-stage-1 merge)
        merged = TritonDecoder(p4, plan4, config=KernelConfig(hopper_merge_splits=8))
        assert merged.part_o.dtype == torch.float32 and merged.gluon_reduce is None
    out, lse = _poisoned_run(dec)
    assert torch.isfinite(out).all() and float(out.abs().max()) > 0.1 * amax
    assert _rel(out.cpu(), base.cpu().double()) <= 2e-3
    # (the two reduces compute the LSE in different orders: equal to fp32 rounding)
    assert torch.allclose(lse, base_lse, rtol=1e-6, atol=2e-5), float((lse - base_lse).abs().max())
    # against the fp64 reference on the inputs as made (rescaled ones break the check's premise, not the kernel: at
    # amax 1 the a8w8 rounding of P alone is ~1e-2 off the reference, with fp32 partials as with fp16)
    _check_against_reference(prepare(x0, precision), plan, config=KernelConfig(hopper_partials="fp16"))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("precision", ["a16w8", "a8w8"])
def test_gpu_subnormal_fp8_codes_decode_exactly(precision: str) -> None:
    """KV values 2^-9 to 2^-6 times amax / 448 (one rope outlier sets amax) quantise to e4m3's subnormal codes: the
    output, a mean of such V codes, must still match the reference on the same codes (flushing them to zero, or
    decoding them as normals, would miss it by ~100 %)."""
    x = make_inputs(DecodeCase(kv_lens=(300, 700, 64), seed=21)).to("cuda")
    kv = x.kv_buffer.view(-1, 576)
    g = torch.Generator(device="cuda").manual_seed(5)
    u = torch.rand(kv.shape, device="cuda", generator=g) * (2**-6 - 2**-9) + 2**-9  # |code| in [2^-9, 2^-6]
    kv.copy_((torch.where(torch.rand(kv.shape, device="cuda", generator=g) < 0.5, -u, u) / 448).to(kv.dtype))
    kv[0, 520] = 1.0  # sets the per-tensor scale: amax / 448
    p = prepare(x, precision)
    codes = p.kv.view(torch.uint8)[:, :512] & 0x7F
    assert ((codes > 0) & (codes < 8)).float().mean() > 0.5  # mostly subnormal V codes
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    err, _ = _check_against_reference(p, plan)
    assert err <= 5e-3


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["vt-smem", "v-regs"])
def test_gpu_ablations_skip_the_compute_they_name(variant: str) -> None:
    """``hopper_ablate`` is a timing experiment: "qk" zeroes the scores (uniform softmax: each output is the mean of
    its request's V, which the fp64 reference gives for q = 0), "qk+pv" also skips the PV (outputs 0). The
    decoder says so in `ran`."""
    x = make_inputs(DecodeCase(kv_lens=(700, 64, 1500), seed=13, scale=1.0)).to("cuda")  # peaked: far from a mean
    p = prepare(x, "a8w8")
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    real = TritonDecoder(p, plan, config=KernelConfig(hopper_variant=variant))
    no_qk = TritonDecoder(p, plan, config=KernelConfig(hopper_variant=variant, hopper_ablate="qk"))
    none = TritonDecoder(p, plan, config=KernelConfig(hopper_variant=variant, hopper_ablate="qk+pv"))
    # (fp8 KV: fp16 partials and the Gluon reduce for the split requests, `hopper_partials="auto"`)
    path = f"hopper:{variant}+fp16-partials+gluon-reduce"
    assert no_qk.ran == f"{path}+ablate:qk" and real.ran == path
    kv = p.dequantized()[1].reshape(-1, 576)
    starts = x.kv_indptr.cpu().tolist()
    mean_v = torch.stack([kv[a:b, :512].mean(0) for a, b in zip(starts, starts[1:])])  # (3, 512): uniform softmax
    out = _poisoned_run(no_qk)[0].double().cpu()
    assert _rel(out, mean_v[:, None, :].expand_as(out)) <= 1e-2  # P = 1 rounded through fp8 is exact: bf16 out
    assert _rel(_poisoned_run(real)[0].double().cpu(), mean_v[:, None, :].expand_as(out)) > 0.1
    assert torch.count_nonzero(_poisoned_run(none)[0]) == 0


_BAD_BUILDS = [  # (stages, options, error, message)
    (3, dict(ablate=3), ValueError, "ablate must be 0"),
    (3, dict(variant="v-regs", warp_exchange=1), TypeError, "warp_exchange must be True or False"),
    (4, dict(variant="vt-smem"), ValueError, "stages must be 1 to 3 on the vt-smem path"),
    (3, dict(variant="fast"), ValueError, "variant must be"),
    (2, dict(variant="v-regs", block=96), ValueError, "block must be one of"),
    (2, dict(variant="vt-smem", block=128), ValueError, "written for the v-regs path"),
    (3, dict(variant="v-regs", block=128), ValueError, "stages must be 1 to 2 on the v-regs path with 128-token tiles"),
    (2, dict(variant="v-regs", warpgroups=3), ValueError, "warpgroups must be 1 or 2"),
    (2, dict(variant="vt-smem", warpgroups=2), ValueError, "warpgroups=2 is written for the v-regs path"),
    (5, dict(variant="v-regs", warpgroups=2), ValueError, "stages must be 1 to 4"),
    (3, dict(variant="v-regs", first_burst=3), ValueError, "first_burst must be 0 or 1 to stages - 1"),
    (3, dict(variant="v-regs", warpgroups=2, first_burst=1), ValueError, "first_burst must be 0 or 1 to stages - 1"),
]


@pytest.mark.skipif(hopper_import_error() is not None, reason=str(hopper_import_error()))
@pytest.mark.parametrize(("stages", "options", "error", "message"), _BAD_BUILDS)
def test_sm90_build_refuses_bad_options_before_compiling(stages: int, options: dict, error: type, message: str) -> None:
    from mlalab.splitkv.sm90_build import compile_hopper

    with pytest.raises(error, match=message):
        compile_hopper(stages, **options)

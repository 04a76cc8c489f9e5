"""fp4 KV caches for the GPU (`mlalab.kernels.fp4`): the Triton quantiser writes, bit for bit, what the CPU
quantiser of `mlalab.quant.mx` writes, for every recipe, on random rows and on blocks made to sit on each rule's
edges; the cache type refuses tensors that do not match. CPU: Triton's interpreter in a subprocess; GPU: marked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mlalab.kernels.fp4 import FP4_RECIPES, Fp4Cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Rows that sit on the edges: E2M1 ties at every midpoint (both signs, several binades), -0 and negatives that
#: round to 0, amax at the ``even`` rule's rounding edge (mantissa 1.75) and next to it, amax exactly a power of two
#: (``rceil``'s edge: amax / 6 a power of two), all-zero blocks, bf16 subnormals, values near bf16's maximum, and
#: NVFP4 blocks whose scale clamps to E4M3's smallest normal or lands on an E4M3 tie.
_EDGE_ROWS = textwrap.dedent(
    """
    def edge_rows():
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        rows = []
        for k in (-3, 0, 5):  # ties of v / X: a block whose amax makes X = 2^k... then every midpoint times X
            r = torch.zeros(576)
            r[0] = 6.0 * 2.0**k  # amax: 6 * 2^k
            r[1:8] = mids * 2.0**k
            r[8:15] = -mids * 2.0**k
            r[32] = -0.0
            r[33] = -0.01 * 2.0**k
            r[64:96] = 1.75 * 2.0**k  # the even rule's edge: rounds amax up
            r[96:128] = torch.nextafter(torch.tensor(1.75 * 2.0**k), torch.tensor(0.0))  # just below it
            r[128:160] = 6.0 * 2.0**k  # rceil: amax / 6 a power of two
            r[160] = 4.0 * 2.0**k  # floor: amax a power of two
            r[200:210] = torch.tensor(2.0**-130)  # bf16 subnormals (a block of its own: 192..223)
            r[224:256] = 3.0e38  # near bf16's maximum
            rows.append(r)
        r = torch.zeros(576)  # NVFP4: a block far smaller than the cache's amax (scale clamps to 2^-6)
        r[0] = 1e-6
        r[16] = 448.0 * 6.0 * 1.0625 / 448.0 * 2.0**-4  # ... and one whose block scale lands on an E4M3 tie
        rows.append(r)
        rows.append(torch.zeros(576))
        return torch.stack(rows).to(torch.bfloat16)

    def e4m3_tie_rows():
        # NVFP4 with the cache amax 2688 = 448 * 6: global scale 1, so a block's scale is amax / 6; 6.375 / 6 = 1.0625
        # and 7.125 / 6 = 1.1875 are E4M3 ties (to even: 1.0 and 1.25), also a few binades down
        r = torch.zeros(2, 576)
        r[:, 0] = 2688.0
        for i, k in enumerate((0, -3, -5, 4)):
            r[0, 16 * (i + 1)] = 6.375 * 2.0**k
            r[1, 16 * (i + 1)] = -7.125 * 2.0**k
        return r.to(torch.bfloat16)
    """
)


def _interp(body: str, timeout: int = 900) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = f"import sys, torch\nsys.path.insert(0, {ROOT!r})\n" + _EDGE_ROWS + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_interpreter_quantiser_is_bit_exact_for_every_recipe() -> None:
    out = _interp(
        """
        from mlalab.kernels.fp4 import FP4_RECIPES, quantize_kv_fp4
        from mlalab.quant import MXFP4_RECIPES
        from mlalab.quant.mx import mxfp4_quantize, nvfp4_quantize
        g = torch.Generator().manual_seed(3)
        inputs = {
            "edges": edge_rows(),
            "e4m3-ties": e4m3_tie_rows(),
            "unit": torch.randn(24, 576, generator=g).to(torch.bfloat16),
            "competition": (torch.randn(24, 576, generator=g) * 0.02).to(torch.bfloat16),
            "outliers": (torch.randn(24, 576, generator=g) * torch.where(torch.rand(576, generator=g) < 0.02, 40.0,
                                                                            1.0)).to(torch.bfloat16),
        }
        for recipe in FP4_RECIPES:
            for name, x in inputs.items():
                if recipe == "nvfp4" and name == "edges":
                    x = x.clamp(-1e4, 1e4)  # (one cache amax: keep the near-maximum block from swamping the rest)
                c = quantize_kv_fp4(x, recipe)
                if recipe == "nvfp4":
                    codes, s8, gs = nvfp4_quantize(x)
                    same = (torch.equal(c.codes, codes) and torch.equal(c.global_scale, gs)
                            and torch.equal(c.scales.view(torch.uint8), s8.view(torch.uint8)))
                else:
                    codes, e8 = mxfp4_quantize(x, *MXFP4_RECIPES[recipe])
                    same = torch.equal(c.codes, codes) and torch.equal(c.scales, e8)
                n_diff = int((c.codes != codes).sum())
                print("CASE", recipe, name, int(same), n_diff)
        """
    )
    rows = [ln.split()[1:] for ln in out.splitlines() if ln.startswith("CASE")]
    assert len(rows) == 5 * len(FP4_RECIPES), out
    bad = [r for r in rows if r[2] != "1"]
    assert not bad, f"GPU quantiser differs from the CPU one (recipe, input, same, codes differing): {bad}"


def test_interpreter_quantiser_check_can_fail() -> None:
    """The comparison above tells recipes apart on the edge rows: aiter's ties-away and torchao's ties-even differ
    there, and so do the three scale rules (a quantiser with the wrong rule would be caught)."""
    out = _interp(
        """
        from mlalab.kernels.fp4 import quantize_kv_fp4
        x = edge_rows()
        c = {r: quantize_kv_fp4(x, r) for r in ("mxfp4-aiter", "mxfp4-torchao-even", "mxfp4-ocp", "mxfp4-rceil")}
        print("TIES", int(torch.equal(c["mxfp4-aiter"].codes, c["mxfp4-torchao-even"].codes)))
        print("RULES", int(torch.equal(c["mxfp4-ocp"].scales, c["mxfp4-torchao-even"].scales)),
              int(torch.equal(c["mxfp4-rceil"].scales, c["mxfp4-torchao-even"].scales)))
        """
    )
    assert "TIES 0" in out and "RULES 0 0" in out, out


def test_fp4_cache_refuses_mismatched_tensors() -> None:
    codes = torch.zeros((4, 288), dtype=torch.uint8)
    e8 = torch.zeros((4, 18), dtype=torch.uint8)
    one = torch.ones(1)
    Fp4Cache(codes, e8, one, "mxfp4-aiter")  # fine
    with pytest.raises(ValueError, match=r"scales must be \(4, 18\): one mxfp4 scale per 32"):
        Fp4Cache(codes, torch.zeros((4, 36), dtype=torch.uint8), one, "mxfp4-aiter")
    with pytest.raises(ValueError, match="288 bytes per row"):
        Fp4Cache(torch.zeros((4, 287), dtype=torch.uint8), e8, one, "mxfp4-aiter")
    with pytest.raises(TypeError, match="Fp4Cache.scales"):  # NVFP4 scales are E4M3, not bytes
        Fp4Cache(codes, torch.zeros((4, 36), dtype=torch.uint8), one, "nvfp4")
    with pytest.raises(ValueError, match="recipe must be one of"):
        Fp4Cache(codes, e8, one, "mxfp8")
    assert "nvfp4" in FP4_RECIPES and "mxfp4-aiter" in FP4_RECIPES


def test_quantiser_refuses_bad_rows() -> None:
    from mlalab.kernels.fp4 import quantize_kv_fp4

    with pytest.raises(ValueError, match="576 values per row"):
        quantize_kv_fp4(torch.zeros((2, 512), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="non-finite"):
        quantize_kv_fp4(torch.full((2, 576), float("nan"), dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="recipe must be one of"):
        quantize_kv_fp4(torch.zeros((2, 576), dtype=torch.bfloat16), "fp4")


# ------------------------------------------------------------------------------------------- decode with fp4 KV
_FP4_PRECISIONS = ("a16w4-mxfp4", "a8w4-mxfp4", "a16w4-nvfp4", "a8w4-nvfp4")


def test_prepare_writes_the_accuracy_schemes_bits() -> None:
    """The fp4-KV precisions hold exactly what the accuracy study's KV schemes hold (`mlalab.quant`): the decode
    timed and the error reported are of one format."""
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare
    from mlalab.quant import get_kv_scheme

    x = make_inputs(DecodeCase(kv_lens=(40, 7), seed=1, dist="unit"))
    rows = x.kv_buffer.reshape(-1, 576)
    for prec, scheme in [("a16w4-mxfp4", "mxfp4-aiter"), ("a8w4-nvfp4", "nvfp4")]:
        p = prepare(x, prec)
        assert p.kv.shape == (rows.shape[0], 288) and p.kv.dtype == torch.uint8
        assert torch.equal(p.kv_values(), get_kv_scheme(scheme).fake_quant(rows).float())
    p = prepare(x, "a16w4-mxfp4", fp4_recipe="mxfp4-ocp")
    assert p.kv_recipe == "mxfp4-ocp" and torch.equal(p.kv_values(), get_kv_scheme("mxfp4-ocp").fake_quant(rows))
    assert not torch.equal(p.kv_values(), prepare(x, "a16w4-mxfp4").kv_values())  # the recipe matters here
    with pytest.raises(ValueError, match="fp4_recipe for a16w4-nvfp4 must be one of nvfp4"):
        prepare(x, "a16w4-nvfp4", fp4_recipe="mxfp4-aiter")
    with pytest.raises(ValueError, match="fp4_recipe applies to the fp4-KV precisions, not a8w8"):
        prepare(x, "a8w8", fp4_recipe="nvfp4")


def test_sm90_refuses_fp4_and_names_the_portable_kernel() -> None:
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare
    from mlalab.kernels.sm90 import host

    x = make_inputs(DecodeCase(kv_lens=(64,)))
    assert "portable kernel" in host.unsupported(prepare(x, "a8w4-nvfp4"), None)


def test_interpreter_decode_every_fp4_precision_exact_paged_empty_peaked() -> None:
    """Stage 1 + reduce of the portable kernel on fp4 KV (codes decoded in registers) against the fp64 reference on
    the same dequantised values: fp32 accumulation only (exact mode), ragged batch with an empty request, contiguous
    and permuted pages, split requests, on peaked attention where the mean of V and zeros miss the tolerance."""
    code = textwrap.dedent(
        """
        import dataclasses
        from mlalab.config import DecodeCase
        from mlalab.inputs import make_inputs
        from mlalab.kernels import Decoder, naive_decode, prepare
        from mlalab.plan import make_plan

        def rel(x, ref, live):
            return float((x.double() - ref)[live].norm() / ref[live].norm())

        for prec in ("a16w4-mxfp4", "a8w4-mxfp4", "a16w4-nvfp4", "a8w4-nvfp4"):
            for ps in (1, 4):
                x = make_inputs(DecodeCase(kv_lens=(37, 130, 0, 21), seed=2, page_size=ps, permute_pages=ps > 1,
                                           dist="unit"))
                x = dataclasses.replace(x, q=(x.q.float() * 3).to(torch.bfloat16))
                p = prepare(x, prec)
                plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 5, block=16 // ps, page_size=ps,
                                 kv_last_page_len=x.kv_last_page_len)
                dec = Decoder(p, plan, out_dtype=torch.float32, pv_exact=True)
                dec.out.fill_(float("nan"))
                out, lse = dec()
                ref, _ = naive_decode(p)
                live = ref.norm(dim=-1) > 0
                _, kv = p.dequantized()
                mean_v = torch.zeros_like(ref)
                toks = kv.reshape(-1, 576)
                for b in range(p.batch):
                    rows = torch.tensor([int(p.kv_indices[pg]) * ps + i for pg in range(int(p.kv_indptr[b]),
                                         int(p.kv_indptr[b + 1])) for i in range(ps)])[: int(x.kv_lens[b])]
                    if len(rows):
                        mean_v[b] = toks[rows, :512].mean(0)
                fails = rel(mean_v, ref, live) > 1e-5 and rel(torch.zeros_like(ref), ref, live) > 1e-5
                split = int((plan.work_info[:, 1] >= 0).any())
                print("FP4", prec, ps, rel(out, ref, live), int(fails), split, int(torch.isnan(out).any()))
        """
    )
    out = _interp(code)
    rows = [ln.split()[1:] for ln in out.splitlines() if ln.startswith("FP4")]
    assert len(rows) == 8, out
    for prec, ps, e, fails, split, nan in rows:
        assert float(e) <= 1e-5 and nan == "0", (prec, ps, out)
        assert fails == "1" and split == "1", out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_quantiser_is_bit_exact_for_every_recipe() -> None:
    """The Triton quantiser compiled for the GPU (div.rn, fp32 multiplies without flush-to-zero) against the CPU
    quantiser, on the edge rows and on 4,096 random rows per input set."""
    from mlalab.kernels.fp4 import quantize_kv_fp4, to_fp4_cache

    ns: dict = {"torch": torch}
    exec(_EDGE_ROWS, ns)  # noqa: S102 (the edge rows defined above, as the interpreter tests use them)
    g = torch.Generator().manual_seed(11)
    sets = {"edges": ns["edge_rows"](), "e4m3-ties": ns["e4m3_tie_rows"](),
            "unit": torch.randn(4096, 576, generator=g).to(torch.bfloat16),
            "competition": (torch.randn(4096, 576, generator=g) * 0.02).to(torch.bfloat16)}  # fmt: skip
    for recipe in FP4_RECIPES:
        for name, x in sets.items():
            if recipe == "nvfp4" and name == "edges":
                x = x.clamp(-1e4, 1e4)
            gpu = quantize_kv_fp4(x.cuda(), recipe)
            cpu = to_fp4_cache(x, recipe)
            assert torch.equal(gpu.codes.cpu(), cpu.codes), (recipe, name)
            assert torch.equal(gpu.scales.cpu().view(torch.uint8), cpu.scales.view(torch.uint8)), (recipe, name)
            assert torch.equal(gpu.global_scale.cpu(), cpu.global_scale), (recipe, name)

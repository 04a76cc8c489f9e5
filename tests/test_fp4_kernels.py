"""fp4 KV caches for the GPU (`mlalab.kernels.fp4`): the Triton quantiser writes, bit for bit, what the CPU
quantiser of `mlalab.quant.mx` writes, for every recipe, on random rows and on blocks made to sit on each rule's
edges; the cache type refuses tensors that do not match. CPU: Triton's interpreter in a subprocess; GPU: marked.

The decode on fp4 KV: the portable kernel in the interpreter (exact mode); the sm_90 paths (``v-fp4``, and the e4m3
route ``v-fp4-e4m3`` of a8w4-mxfp4): their conversions' PTX executed on the CPU for every code byte, the e4m3 route's
tiles (`mlalab.kernels.fp4.e4m3_residuals`) and numerics modelled on the CPU, and on an sm_90 GPU (``-m gpu``) every
precision x planner on ragged / long / empty / many-works / speculative / page-64 batches with NaN in unused slots
against `oracles.tiled_decode` (fp64, P rounded as the path does), single-token requests whose output must be the
exact tile values, and the error against the emulated scheme."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mlalab.kernels.fp4 import FP4_RECIPES, Fp4Cache
from mlalab.plan import PLANNERS

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


def test_sm90_takes_fp4_and_refuses_a_cache_that_does_not_match() -> None:
    """The sm_90 kernel runs every fp4 precision (``v-fp4``; a8w4-mxfp4 ``v-fp4-e4m3`` unless p_fp8=False; here only
    the missing GPU stops it) and refuses, naming the layout it needs, codes or scales of another shape."""
    import dataclasses

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare
    from mlalab.kernels.sm90 import host

    x = make_inputs(DecodeCase(kv_lens=(64,)))
    for prec in _FP4_PRECISIONS:
        assert host.PATHS[prepare(x, prec).precision] == "v-fp4"
        assert host.path_of(prepare(x, prec)) == ("v-fp4-e4m3" if prec == "a8w4-mxfp4" else "v-fp4")
        assert host.path_of(prepare(x, prec), p_fp8=False) == "v-fp4"  # (a8w4-mxfp4: the bf16 route)
        assert "needs an NVIDIA GPU" in host.unsupported(prepare(x, prec), None)
    for fmt in ("e5m2", "e4m3fnuz"):  # the kernel reads e4m3fn q codes only (a wrong type would be read silently)
        assert "needs e4m3fn q codes" in host.unsupported(prepare(x, "a8w4-mxfp4", fp8_format=fmt), None)
    assert "needs an NVIDIA GPU" in host.unsupported(prepare(x, "a8w4-mxfp4"), None, p_fp8=False)  # (bf16 route)
    p = prepare(x, "a16w4-mxfp4")
    bad = dataclasses.replace(p, kv_scales=torch.zeros((p.kv.shape[0], 36), dtype=torch.uint8))
    assert "(rows, 288) uint8 codes with (rows, 18) block scales" in host.unsupported(bad, None)
    bad = dataclasses.replace(prepare(x, "a8w4-nvfp4"), kv_scales=None)
    assert "(rows, 36) block scales" in host.unsupported(bad, None)


def test_two_ctas_an_sm_only_on_the_e4m3_route_of_large_batches() -> None:
    """`host.ctas_per_sm`: 2 for the e4m3 route from `TWO_CTAS_FROM_TOKENS` KV tokens on (the H100 A/B of
    data/ab/h100_2026-12-06_e4m3_two_ctas_an_sm.csv: 0.76-0.93x at the shapes from 128K tokens, 0.98-1.22x below), 1
    below it, for the bf16 route and every other precision; a negative count is refused."""
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare
    from mlalab.kernels.sm90 import host

    x = make_inputs(DecodeCase(kv_lens=(64,)))
    n = host.TWO_CTAS_FROM_TOKENS
    assert n == 128 * 1024
    e4m3 = prepare(x, "a8w4-mxfp4")
    assert host.ctas_per_sm(e4m3, n) == 2 and host.ctas_per_sm(e4m3, 128 * 8192) == 2
    assert host.ctas_per_sm(e4m3, n - 1) == 1 and host.ctas_per_sm(e4m3, 0) == 1
    assert host.ctas_per_sm(e4m3, n, p_fp8=False) == 1
    for prec in ("a8w8", "a16w8", "bf16", "a16w4-mxfp4", "a8w4-nvfp4"):
        assert host.ctas_per_sm(prepare(x, prec), 10 * n) == 1, prec
    with pytest.raises(ValueError, match="kv_tokens"):
        host.ctas_per_sm(e4m3, -1)


def _run_asm(asm: str, ins: dict[int, int]) -> dict[int, int]:
    """Execute the few PTX instructions the fp4 conversions use (mov, and, or, shl, shr, add, prmt in its default
    mode, lop3, mul.rn.bf16x2) on 32-bit integers: operands ``$k`` from `ins`, returns the ``$k`` written."""
    regs: dict[str, int] = {f"${k}": v for k, v in ins.items()}

    def val(x: str) -> int:
        x = x.strip()
        return regs[x] if x in regs else int(x, 0)

    def byte_sel(a: int, b: int, c: int) -> int:
        pool = (a | (b << 32)).to_bytes(8, "little")
        out = 0
        for i in range(4):
            n = (c >> (4 * i)) & 15
            v = pool[n & 7]
            if n & 8:  # sign replication
                v = 0xFF if v & 0x80 else 0
            out |= v << (8 * i)
        return out

    def bf16_mul(a: int, b: int) -> int:
        out = 0
        for h in range(2):
            x = torch.tensor([(a >> (16 * h)) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
            y = torch.tensor([(b >> (16 * h)) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
            z = (x.double() * y.double()).to(torch.bfloat16)  # (exact products here: one rounding either way)
            out |= (int(z.view(torch.int16)) & 0xFFFF) << (16 * h)
        return out

    for line in asm.strip().strip("{}").splitlines():
        line = line.strip().rstrip(";")
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        d, *src = [t.strip() for t in rest.split(",")]
        v = [val(t) for t in src]
        if op == "mov.b32":
            r = v[0]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "or.b32":
            r = v[0] | v[1]
        elif op == "shl.b32":
            r = v[0] << v[1]
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "prmt.b32":
            r = byte_sel(v[0], v[1], v[2])
        elif op == "lop3.b32":  # bit i of the immLut is the result for (a, b, c) bits = (i >> 2, i >> 1, i) & 1
            r = 0
            for i in range(8):
                if v[3] >> i & 1:
                    r |= (v[0] if i & 4 else ~v[0]) & (v[1] if i & 2 else ~v[1]) & (v[2] if i & 1 else ~v[2])
        elif op == "add.u32":
            r = v[0] + v[1]
        elif op == "mul.rn.bf16x2":
            r = bf16_mul(v[0], v[1])
        else:
            raise AssertionError(f"unexpected instruction {line!r}")
        regs[d] = r & 0xFFFFFFFF
    return {int(k[1:]): v for k, v in regs.items() if k.startswith("$")}


def test_e2m1_conversion_asm_decodes_every_byte_exactly() -> None:
    """The sm_90 conversion's PTX (`fp4tiles._E2M1_TO_BF16X2`), executed instruction by instruction on the CPU: for
    every byte value in every position of a 4-byte word, word k holds (low-nibble value, high-nibble value) of byte k
    times the scale, bit for bit the bf16 of the E2M1 value times the scale (both signs of zero included). And the
    E4M3 scale decode (`_E4M3_TO_BF16X2`) gives every non-NaN E4M3 byte's value in both halves."""
    pytest.importorskip("triton.experimental.gluon")
    from oracles import _E2M1, _e4m3_values

    from mlalab.kernels.sm90 import fp4tiles as F

    e2m1 = torch.tensor(list(_E2M1) + [-v for v in _E2M1], dtype=torch.float64)

    def bits(x: float) -> int:
        return int(torch.tensor([x], dtype=torch.float64).to(torch.bfloat16).view(torch.int16)) & 0xFFFF

    assert list(F.E2M1_BF16_LUT.value) == [bits(v) for v in _E2M1]
    for scale in (1.0, 2.0**-127, 0.375, 2.0**40):
        sw = bits(scale) * 0x10001
        for b in range(256):
            for k in range(4):
                word = (b << (8 * k)) | (((b * 37 + 11) & 0xFF) << (8 * ((k + 1) % 4)))  # other bytes: something else
                out = _run_asm(F._E2M1_TO_BF16X2.value, {4: word, 5: sw})[k]
                want = bits(float(e2m1[b & 15]) * scale) | (bits(float(e2m1[b >> 4]) * scale) << 16)
                assert out == want, (scale, b, k, hex(out), hex(want))
    for b in range(256):
        if b & 0x7F == 0x7F:
            continue
        out = _run_asm(F._E4M3_TO_BF16X2.value, {1: b})[0]
        assert out == bits(float(_e4m3_values(torch.tensor([b]))[0])) * 0x10001, b


def _e4m3_byte(x: float) -> int:
    return int(torch.tensor([x], dtype=torch.float64).to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_route_asm_converts_every_byte_exactly() -> None:
    """The e4m3 route's PTX (`fp4tiles._E2M1_TO_E4M3X4`), executed instruction by instruction on the CPU: for every
    code byte in every position of a 4-byte word and every block table (j = -5 .. 6, built here from torch's e4m3fn
    of E2M1 × 2^j, and a flushed block's zeros), the two output words hold the e4m3 codes of the 8 E2M1 values times
    2^j, both signs of zero included; a flushed block gives ±0 with the codes' signs. The kernel's tables
    (`fp4tiles._block_tables`: the codes at j = -5 plus (j + 5) << 3 in every nonzero entry) are those tables."""
    pytest.importorskip("triton.experimental.gluon")
    from oracles import _E2M1

    from mlalab.kernels.sm90 import fp4tiles as F

    assert list(F.E2M1_E4M3_LUT.value) == [_e4m3_byte(v * 2.0**-5) for v in _E2M1]
    lut = list(F.E2M1_E4M3_LUT.value)
    assert F._LUT_LO.value == sum(b << (8 * i) for i, b in enumerate(lut[:4]))
    assert F._LUT_HI.value == sum(b << (8 * i) for i, b in enumerate(lut[4:]))
    e2m1 = list(_E2M1) + [-v if v else -0.0 for v in _E2M1]
    for j in [*range(-5, 7), None]:
        if j is None:  # flushed
            t_lo = t_hi = 0
        else:
            table = [_e4m3_byte(v * 2.0**j) for v in _E2M1]
            t_lo = sum(b << (8 * i) for i, b in enumerate(table[:4]))
            t_hi = sum(b << (8 * i) for i, b in enumerate(table[4:]))
            add = ((j + 5) << 3) * 0x01010101  # the kernel's formula
            assert (F._LUT_LO.value + (add & 0x7FFFFF00), F._LUT_HI.value + add) == (t_lo, t_hi), j
        for b in range(256):
            for k in range(4):
                codes = (b << (8 * k)) | (((b * 37 + 11) & 0xFF) << (8 * ((k + 1) % 4)))
                out = _run_asm(F._E2M1_TO_E4M3X4.value, {2: codes, 3: t_lo, 7: t_hi})
                got = ((out[0] | (out[1] << 32)) >> (16 * k)) & 0xFFFF  # values 2k, 2k + 1: bytes 2k, 2k + 1
                lo, hi = e2m1[b & 15], e2m1[b >> 4]
                if j is None:  # flushed: ±0
                    want = (0x80 if b & 8 else 0) | ((0x80 if b & 0x80 else 0) << 8)
                else:
                    want = _e4m3_byte(lo * 2.0**j) | (_e4m3_byte(hi * 2.0**j) << 8)
                assert got == want, (j, b, k, hex(got), hex(want))


def test_e4m3_residuals_are_the_mxfp4_values_exactly_within_the_window() -> None:
    """`mlalab.kernels.fp4.e4m3_residuals` (the CPU model of the e4m3 route's tiles) against `oracles.
    e4m3_route_values` (written from the definition): e4m3(residual) · 2^F equals the MXFP4 value exactly in every block
    at most 11 binades below its token's largest scale, ±0 below; on random rows (nothing flushed, F from the largest
    scale) and hand-made ones: a block exactly 11 binades down (kept) and 12 (flushed), tiny tokens (scales under
    2^-94: F floored at -100), the largest E8M0 (254) and a NaN scale (F = 122)."""
    import dataclasses

    from oracles import e4m3_route_values, fp4_values

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare
    from mlalab.kernels.fp4 import e4m3_residuals

    p = prepare(make_inputs(DecodeCase(kv_lens=(200, 77), seed=3, dist="outliers", scale=1.0)), "a8w4-mxfp4")
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (6, 288), dtype=torch.uint8, generator=g)
    sc = torch.full((6, 18), 130, dtype=torch.uint8)
    sc[0, 3], sc[0, 4] = 119, 118  # 11 and 12 binades below 130: kept, flushed
    sc[1] = torch.tensor([10, 3, 0, 20] * 4 + [1, 2], dtype=torch.uint8)  # all below 33: E floored, 20 - 11 = 9 kept
    sc[2, 0] = 254  # the largest finite E8M0
    sc[3, 7] = 255  # NaN
    sc[4] = torch.arange(110, 128, dtype=torch.uint8)  # 18 binades: 116 .. 127 kept
    codes[5] = 0x88  # -0 everywhere
    rows = dataclasses.replace(p, kv=torch.cat([p.kv, codes]), kv_scales=torch.cat([p.kv_scales, sc]))
    res, f = e4m3_residuals(rows.kv, rows.kv_scales)
    want, f_want = e4m3_route_values(rows)
    got = res.view(torch.float8_e4m3fn).double() * torch.exp2(f.double())[:, None]
    fin = ~torch.isnan(want).any(1)
    assert torch.equal(got[fin], want[fin]) and torch.equal(f.double(), f_want)
    n = p.kv.shape[0]
    assert int(f[n + 3]) == 122 and int(f[n + 1]) == -100 and int(f[n + 2]) == 254 - 133
    vals = fp4_values(rows.kv, rows.kv_scales, "mxfp4")
    assert torch.equal(got[:n], vals[:n])  # random rows: nothing flushed
    assert torch.equal(got[n, 96:128], vals[n, 96:128]) and bool((vals[n, 128:160] != 0).any())
    assert bool((got[n, 128:160] == 0).all()) and torch.equal(torch.signbit(got[n, 128:160]),
                                                              torch.signbit(vals[n, 128:160]))  # fmt: skip
    kept = (torch.arange(110, 128) >= 116).repeat_interleave(32)
    assert torch.equal(got[n + 4][kept], vals[n + 4][kept]) and bool((got[n + 4][~kept] == 0).all())
    assert bool(torch.signbit(got[n + 5]).all()) and bool((got[n + 5] == 0).all())
    assert int(res.max()) & 0x7F <= 0x7E  # never e4m3fn's NaN
    with pytest.raises(ValueError, match="scales"):
        e4m3_residuals(rows.kv, rows.kv_scales[:, :9])


def test_e4m3_route_numerics_add_little_to_the_mxfp4_error() -> None:
    """The e4m3 route's numerics (`oracles.tiled_decode` with ``e4m3_route``: the tile's residuals, P̂ rounded to
    e4m3) against the emulated scheme (the same codes, fp64, P exact): on the competition's inputs and peaked ones
    its output is within 5 % of the scheme's own error against the exact decode of the bf16 inputs (what the GPU test
    asks of the kernel), as close to the scheme as a8w8's fp8 P is (< 2e-2 rel-L2), and the zeros and mean-of-V
    baselines fail that check."""
    from oracles import INPUT_SETS, mean_v, rel, tiled_decode

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import naive_decode, prepare
    from mlalab.plan import make_plan

    for name, kw in INPUT_SETS.items():
        mult = kw.get("q_mult", 1.0)
        kw = {k: v for k, v in kw.items() if k != "q_mult"}
        x = make_inputs(DecodeCase(kv_lens=(300, 1024, 0, 77), seed=3, **kw))
        x = x if mult == 1.0 else __import__("dataclasses").replace(x, q=(x.q.float() * mult).to(x.q.dtype))
        p = prepare(x, "a8w4-mxfp4")
        plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 8, block=64)
        route, _ = tiled_decode(p, plan, p_dtype=torch.float8_e4m3fn, e4m3_route=True)
        scheme, _ = tiled_decode(p, plan, p_dtype=None)
        exact, _ = naive_decode(prepare(x, "bf16"))
        live = scheme.norm(dim=-1) > 0
        e_route, e_scheme = rel(route[live], exact[live].double()), rel(scheme[live], exact[live].double())
        assert e_route <= 1.05 * e_scheme, (name, e_route, e_scheme)
        assert rel(route[live], scheme[live]) < 2e-2, name
        assert rel(torch.zeros_like(scheme[live]), scheme[live]) > 10 * 2e-2
        if name != "competition":  # peaked attention: the mean of V is far off
            assert rel(mean_v(p)[live], scheme[live]) > 10 * 2e-2, name


def _spread_exponents(x, big: float = 256.0):  # noqa: ANN001, ANN202
    """`x` with every 64th token (random ones) scaled by `big` — large-norm tokens whose F is ~log2(big) above their
    tile's others, which pushes the others' P̂ down on the e4m3 route — and, in every 5th token, one value block (dims
    64-95) and one rope block (dims 544-575) scaled by 2^-14: 12+ binades below the token's largest, flushed on the
    e4m3 route."""
    import dataclasses

    k = x.kv_buffer.float().clone().reshape(-1, 576)
    g = torch.Generator().manual_seed(1)
    k[torch.randperm(k.shape[0], generator=g)[: max(1, k.shape[0] // 64)]] *= big
    k[::5, 64:96] *= 2.0**-14
    k[::5, 544:576] *= 2.0**-14
    return dataclasses.replace(x, kv_buffer=k.reshape(x.kv_buffer.shape).to(x.kv_buffer.dtype))


def test_e4m3_route_numerics_with_spread_exponents_and_flushed_blocks() -> None:
    """On inputs whose token exponents spread within a tile (tokens x 256) and with blocks flushed in the value and
    rope dims (`_spread_exponents`), the e4m3 route's numerics stay as close to the emulated scheme as P rounded to
    e4m3 without the shift (the portable kernel's a8w4 numerics) — within 1.25x of its rel-L2 — and within 5 % of the
    scheme's own error against the exact decode; blocks are flushed (the case the GPU test
    ``test_gpu_sm90_fp4_spread_exponents_and_flushed_blocks`` runs)."""
    from oracles import fp4_values, rel, tiled_decode

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import naive_decode, prepare
    from mlalab.kernels.fp4 import e4m3_residuals
    from mlalab.plan import make_plan

    for dist in ("competition", "unit"):
        x = _spread_exponents(make_inputs(DecodeCase(kv_lens=(300, 1024, 77), seed=3, dist=dist)))
        p = prepare(x, "a8w4-mxfp4")
        res, _ = e4m3_residuals(p.kv, p.kv_scales)
        flushed = (res.view(torch.float8_e4m3fn).double() == 0) & (fp4_values(p.kv, p.kv_scales, "mxfp4") != 0)
        assert int(flushed[:, :512].sum()) > 0 and int(flushed[:, 512:].sum()) > 0, dist  # value and rope dims
        plan = make_plan("simple", x.qo_indptr, x.kv_indptr, 8, block=64)
        route, _ = tiled_decode(p, plan, p_dtype=torch.float8_e4m3fn, e4m3_route=True)
        p8, _ = tiled_decode(p, plan, p_dtype=torch.float8_e4m3fn)
        scheme, _ = tiled_decode(p, plan, p_dtype=None)
        exact, _ = naive_decode(prepare(x, "bf16"))
        assert rel(route, scheme) <= 1.25 * rel(p8, scheme), (dist, rel(route, scheme), rel(p8, scheme))
        assert rel(route, exact) <= 1.05 * rel(scheme, exact), dist


def test_nvfp4_products_do_not_fit_e4m3() -> None:
    """Why NVFP4 stays on the bf16 route: with the per-cache scale and each token's largest power of two factored out
    (largest value below 2^9, within e4m3's range), E2M1 × E4M3 block-scale products need up to 6 significant bits
    and e4m3 holds 4, so rounding them to e4m3 changes about a fifth of the values, 2-3e-2 rel-L2 of K (the numbers
    docs/kernels.md gives), on the competition's and outlier inputs alike."""
    from oracles import fp4_values, rel

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare

    for kw in ({}, {"dist": "outliers", "scale": 1.0}):
        p = prepare(make_inputs(DecodeCase(kv_lens=(300, 1024, 77, 2000), seed=3, **kw)), "a8w4-nvfp4")
        kv = fp4_values(p.kv, p.kv_scales, "nvfp4")  # (without the per-cache scale)
        f = torch.floor(torch.log2(kv.abs().amax(1).clamp(min=1e-30))) - 8
        r = (kv * torch.exp2(-f)[:, None]).to(torch.float8_e4m3fn).double() * torch.exp2(f)[:, None]
        changed = float((r != kv).double().mean())
        assert 0.15 < changed < 0.3 and 1.5e-2 < rel(r, kv) < 4e-2, (kw, changed, rel(r, kv))
        mx = prepare(make_inputs(DecodeCase(kv_lens=(300, 1024), seed=3, **kw)), "a8w4-mxfp4")  # (MXFP4: exact)
        vm = fp4_values(mx.kv, mx.kv_scales, "mxfp4")
        fm = torch.floor(torch.log2(vm.abs().amax(1))) - 8
        assert torch.equal((vm * torch.exp2(-fm)[:, None]).to(torch.float8_e4m3fn).double() * torch.exp2(fm)[:, None],
                           vm)  # fmt: skip


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


# ------------------------------------------------------------------------------ the sm_90 fp4 path (GPU, the H200)
#: The sm_90 kernel's fp4 path runs on an sm_90 GPU; elsewhere these tests skip.
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _poisoned(dec):  # noqa: ANN001, ANN202
    """Run `dec` with its outputs and partials poisoned (NaN) first: every element must be written."""
    dec.out.fill_(float("nan"))
    dec.lse.fill_(float("nan"))
    dec.part_o.fill_(float("nan"))
    out, lse = dec()
    torch.cuda.synchronize()
    return out.clone(), lse.clone()


def _peaked(x):  # noqa: ANN001, ANN202
    """q x 3 on unit-std inputs: attention far from uniform."""
    import dataclasses

    return dataclasses.replace(x, q=(x.q.float() * 3).to(x.q.dtype))


#: (precision, p_fp8) runs of the sm_90 fp4 tests, all with kernel "auto" (which must pick sm_90): a8w4-mxfp4 takes
#: the e4m3 route (``v-fp4-e4m3``), and with p_fp8=False the bf16 route (``v-fp4``) as every other fp4 precision.
_SM90_FP4_RUNS = [pytest.param(p, True, id=f"{p}-e4m3" if p == "a8w4-mxfp4" else p) for p in _FP4_PRECISIONS]
_SM90_FP4_RUNS.append(pytest.param("a8w4-mxfp4", False, id="a8w4-mxfp4-bf16-route"))


def _check_sm90_fp4(p, plan, clean=None, *, peaked: bool, p_fp8: bool = True) -> float:  # noqa: ANN001
    """Run the decoder (kernel "auto": it must take the sm_90 fp4 path `host.path_of` names for `p_fp8`) on `p`,
    outputs poisoned first, against the tiled fp64 oracle of that path on the same codes and block scales (`clean`:
    the same inputs without the NaN planted in unused page slots): ``v-fp4`` with P rounded to bf16, rel-L2 <= 5e-3
    and |dLSE| <= 2e-3 (the v-conv path's tolerances: the same bf16 products); ``v-fp4-e4m3`` with its residuals and
    P̂ rounded to e4m3 (`oracles.tiled_decode`, ``e4m3_route``), a8w8's tolerances (1e-2 and 2e-2 on peaked inputs:
    the same fp8 wgmma accumulation) and |dLSE| also 2e-3 of |LSE| (scores in the hundreds). Zeros must fail that
    check always; with `peaked` inputs the mean of V too.
    Returns the rel-L2."""
    from oracles import mean_v, rel, tiled_decode

    from mlalab.kernels import Decoder, KernelConfig
    from mlalab.kernels.sm90.host import path_of

    path = path_of(p, p_fp8=p_fp8)
    dec = Decoder(p, plan, config=KernelConfig(p_fp8=p_fp8))
    assert dec.ran == f"sm90:{path}", dec.sm90_reason
    out, lse = _poisoned(dec)
    route = path == "v-fp4-e4m3"
    ref, ref_lse = tiled_decode(p if clean is None else clean, plan, e4m3_route=route,
                                p_dtype=torch.float8_e4m3fn if route else torch.bfloat16)  # fmt: skip
    live = ref.norm(dim=-1) > 0
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()  # every element written, no NaN let through
    err = rel(out.cpu()[live], ref[live])
    rows = live.all(-1)
    tol, lse_tol = (1e-2, 2e-2) if route and peaked else (5e-3, 2e-3)
    # fp8 wgmma accumulates the scores with ~2^-11 of their magnitude, so the route's LSE error grows with the LSE:
    # up to 0.23 on LSEs of 300-530 (tokens x 256 on unit inputs; H100, q x 1), 0.65 on an H200 with q x 3, and
    # and a row 0.021 past a bound that had no relative part below |LSE| 50 (H100, 2026-12-07, spread exponents).
    # The bound grows by 2e-3 of |LSE| on every row (a lost split moves the output, which rel-L2 catches).
    allow = 2e-3 * ref_lse.abs() if route else torch.zeros_like(ref_lse)
    excess = torch.where(rows[:, None], (lse.cpu().double() - ref_lse).abs() - allow, -torch.inf)
    dl = float(excess.max()) if rows.any() else 0.0
    worst_lse = float(ref_lse.flatten()[int(excess.argmax())])  # in the message: a failure says where it lies
    assert err <= tol and dl <= lse_tol, (p.precision.value, path, plan.planner, err, dl, worst_lse)
    assert rel(torch.zeros_like(ref[live]), ref[live]) > 10 * tol
    if peaked:  # the check can fail: the mean of V is far from the answer
        assert rel(mean_v(p if clean is None else clean)[live], ref[live]) > 10 * tol
    dead = ~live.all(-1)
    assert torch.isinf(lse.cpu()[dead]).all() and (out.cpu()[dead] == 0).all()  # 0-token requests
    return err


#: (kv_lens, dist): ragged, uniform, long + tiny, empty, more works than slots
_SM90_BATCHES = [
    ((37, 700, 1, 129, 64, 2000, 5, 333, 900), "unit"),
    ((1024,) * 4, "competition"),
    ((1, 64, 8192), "unit"),
    ((0, 130, 5, 4096), "competition"),
    ((1000,) * 40, "unit"),
    ((100,) * 150, "competition"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize(("precision", "p_fp8"), _SM90_FP4_RUNS)
def test_gpu_sm90_fp4_every_planner_ragged_long_empty(planner: str, precision: str, p_fp8: bool) -> None:
    from mlalab.backends.triton import build_plan
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare

    for lens, dist in _SM90_BATCHES:
        x = make_inputs(DecodeCase(kv_lens=lens, seed=4, dist=dist)).to("cuda")
        x = _peaked(x) if dist == "unit" else x
        _check_sm90_fp4(prepare(x, precision), build_plan(x, planner, 132), peaked=dist == "unit", p_fp8=p_fp8)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("batch", [4, 128])
def test_gpu_backend_default_plan_runs_two_ctas_an_sm_on_large_e4m3_batches(batch: int) -> None:
    """The triton backend's default plan for a8w4-mxfp4 (the e4m3 route): 2 x SMs slots at 128 x 1024 KV tokens, SMs
    at 4 x 1024; both decode right (the tiled oracle, peaked inputs)."""
    from mlalab.backends.triton import make_callable
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = _peaked(make_inputs(DecodeCase(kv_lens=(1024,) * batch, seed=7, dist="unit")).to("cuda"))
    _, info = make_callable(x, precision="a8w4-mxfp4")
    assert info["plan"].num_cus == sms * (2 if batch == 128 else 1) and info["decoder"].ran == "sm90:v-fp4-e4m3"
    _check_sm90_fp4(info["prepared"], info["plan"], peaked=True)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("precision", "p_fp8"), _SM90_FP4_RUNS)
def test_gpu_sm90_fp4_many_works_per_cta_and_speculative_decode(precision: str, p_fp8: bool) -> None:
    """Plans on a few slots (CTAs with 4-15 works, works without tiles between works with tiles: the q conversion of
    a8w4 and the scale staging across works) and q_len 2 (row passes)."""
    from mlalab.backends.triton import build_plan
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare

    for lens, planner, slots, q_len in [((0, 65, 128, 1, 190, 64, 0, 300, 129, 2), "balanced", 3, 1),
                                        ((0, 65, 128, 1, 190, 64, 0, 300, 129, 2), "simple", 3, 1),
                                        ((100,) * 40 + (1,) * 20, "balanced", 8, 1),
                                        ((0, 130, 5, 4096, 700), "simple", 66, 2)]:  # fmt: skip
        x = _peaked(make_inputs(DecodeCase(kv_lens=lens, q_len=q_len, seed=7, dist="unit")).to("cuda"))
        plan = build_plan(x, planner, slots)
        if q_len == 1:
            assert int(plan.work_indptr.diff().max()) >= 4, (planner, slots)  # the point of the case
        _check_sm90_fp4(prepare(x, precision), plan, peaked=True, p_fp8=p_fp8)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("planner", ["simple", "balanced", "aiter-fast"])
@pytest.mark.parametrize(("precision", "p_fp8"), _SM90_FP4_RUNS)
def test_gpu_sm90_fp4_paged_64_with_nan_in_unused_slots(planner: str, precision: str, p_fp8: bool) -> None:
    """Permuted 64-token pages whose unused slots hold random codes and NaN block scales (E8M0 0xFF, E4M3 0x7F): the
    kernel must never let them reach the output (their V rows are zeroed in shared memory, their scores masked)."""
    import dataclasses

    from mlalab.backends.triton import build_plan
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare

    lens = (37, 700, 129, 64, 200, 900, 0, 3000, 1)
    x = _peaked(make_inputs(DecodeCase(kv_lens=lens, page_size=64, permute_pages=True, seed=9, dist="unit")))
    x = x.to("cuda")
    p = prepare(x, precision)
    assert not p.contiguous
    clean = dataclasses.replace(p, kv=p.kv.clone(), kv_scales=p.kv_scales.clone())
    codes = p.kv.view(-1, 64, p.kv.shape[-1])
    scales = p.kv_scales.view(torch.uint8).view(-1, 64, p.kv_scales.shape[-1])
    nan_byte = 0xFF if p.spec.kv_format == "mxfp4" else 0x7F
    g = torch.Generator(device="cuda").manual_seed(3)
    pages, planted = x.kv_indices.long(), 0
    for b in range(len(lens)):
        s, e = int(x.kv_indptr[b]), int(x.kv_indptr[b + 1])
        last = int(x.kv_last_page_len[b])
        if e > s and last < 64:
            tail = codes[pages[e - 1], last:]
            tail.copy_(torch.randint(0, 256, tail.shape, device="cuda", generator=g, dtype=torch.uint8))
            scales[pages[e - 1], last:] = nan_byte
            planted += 64 - last
    assert planted > 0
    knobs = {"block": 1} if planner == "simple" else {}
    _check_sm90_fp4(p, build_plan(x, planner, 132, **knobs), clean, peaked=True, p_fp8=p_fp8)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("precision", "p_fp8"), _SM90_FP4_RUNS)
def test_gpu_sm90_fp4_spread_exponents_and_flushed_blocks(precision: str, p_fp8: bool) -> None:
    """Large-norm tokens among ordinary ones and blocks 12+ binades below their token's largest, in the value and the
    rope dims (`_spread_exponents`), ragged, split by two planners, peaked and competition inputs: against the path's
    oracle (the e4m3 route's models the shifted P̂ and the flushed blocks exactly)."""
    from mlalab.backends.triton import build_plan
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import prepare

    for dist in ("competition", "unit"):
        x = _spread_exponents(make_inputs(DecodeCase(kv_lens=(300, 1024, 0, 77, 2000), seed=3, dist=dist)))
        x = x.to("cuda")
        x = _peaked(x) if dist == "unit" else x
        for planner in ("simple", "balanced"):
            _check_sm90_fp4(prepare(x, precision), build_plan(x, planner, 132), peaked=dist == "unit", p_fp8=p_fp8)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("precision", "p_fp8"), _SM90_FP4_RUNS)
def test_gpu_sm90_fp4_tile_holds_the_exact_values_of_every_code_and_scale(precision: str, p_fp8: bool) -> None:
    """Requests of one token each: the softmax weight is exactly 1, so the output is V itself (times NVFP4's
    per-cache scale, in fp32, then bf16): every code byte in every position of a row, E8M0 scales 2^-127 .. 2^72 and
    every non-NaN E4M3 scale, both signs, subnormal scales. The bf16 tile must hold exactly E2M1 × scale (a wrong
    table entry, nibble order, sign, scale or word layout in shared memory shows here as a bit difference). On the
    e4m3 route the output is the residuals times 2^F (`mlalab.kernels.fp4.e4m3_residuals`: blocks more than 11
    binades below their token's largest are ±0), exactly: P̂ = 1 and the softmax sum 2^-F, a power of two."""
    import dataclasses

    from oracles import fp4_values

    from mlalab.backends.triton import build_plan
    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs
    from mlalab.kernels import Decoder, KernelConfig, prepare
    from mlalab.kernels.fp4 import e4m3_residuals
    from mlalab.kernels.sm90.host import path_of

    n = 256
    x = make_inputs(DecodeCase(kv_lens=(1,) * n, seed=2, dist="unit")).to("cuda")
    p = prepare(x, precision)
    rows = torch.arange(n)[:, None]
    codes = ((rows * 7 + torch.arange(288)[None, :]) % 256).to(torch.uint8)  # every byte in every column
    if p.spec.kv_format == "mxfp4":
        sc = (rows * 5 + torch.arange(18)[None, :]) % 200  # E8M0 0 .. 199: 2^-127 .. 2^72
    else:
        ok = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F])
        sc = ok[(rows * 3 + torch.arange(36)[None, :]) % len(ok)]
    scales = sc.to(torch.uint8).view(p.kv_scales.dtype)
    q = dataclasses.replace(p, kv=codes.cuda(), kv_scales=scales.cuda())
    dec = Decoder(q, build_plan(x, "simple", 132), config=KernelConfig(p_fp8=p_fp8))
    path = path_of(q, p_fp8=p_fp8)
    assert dec.ran == f"sm90:{path}", dec.sm90_reason
    out, _ = _poisoned(dec)
    g = float(p.kv_scale.cpu()[0])
    v = fp4_values(codes, scales, p.spec.kv_format)[:, :512]  # exact E2M1 x block scale (a bf16 value)
    if path == "v-fp4-e4m3":
        res, f = e4m3_residuals(codes, scales.view(torch.uint8))
        flushed = int((v != res.view(torch.float8_e4m3fn).double()[:, :512] * torch.exp2(f.double())[:, None]).sum())
        assert flushed > 1000  # (the point: scales spread over 199 binades in a row)
        v = res.view(torch.float8_e4m3fn).double()[:, :512] * torch.exp2(f.double())[:, None]
    assert torch.equal(v.to(torch.bfloat16).double(), v)  # (the premise: exact in bf16)
    want = (v.float() * g).to(torch.bfloat16)  # the epilogue's fp32 multiply by the per-cache scale, then bf16
    got = out.cpu()
    assert torch.equal(got, want[:, None, :].expand_as(got)), float((got.double() - want[:, None].double()).abs().max())


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(("precision", "p_fp8"), _SM90_FP4_RUNS)
def test_gpu_sm90_fp4_error_within_5pct_of_the_emulated_scheme(precision: str, p_fp8: bool) -> None:
    """Against the exact decode of the bf16 inputs, the sm_90 fp4 decode's error is within 5 % of the emulated scheme's
    (the same codes decoded in fp64): the kernel adds almost nothing to the format's own error. Competition inputs."""
    from oracles import rel

    from mlalab.config import DecodeCase
    from mlalab.inputs import make_inputs, ragged_kv_lens
    from mlalab.kernels import Decoder, KernelConfig, naive_decode, prepare
    from mlalab.plan import make_plan

    x = make_inputs(DecodeCase(kv_lens=ragged_kv_lens(16, 2048, seed=5), seed=6)).to("cuda")
    p = prepare(x, precision)
    plan = make_plan("simple", x.qo_indptr.cpu(), x.kv_indptr.cpu(), 132)
    out, _ = Decoder(p, plan, config=KernelConfig(p_fp8=p_fp8))()
    emul, _ = naive_decode(p)
    exact, _ = naive_decode(prepare(x, "bf16"))
    assert rel(out, exact) <= 1.05 * rel(emul.to(torch.bfloat16), exact)


_WORDS_LAYOUTS = textwrap.dedent(
    """
    import torch
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.runtime.driver import driver
    from mlalab.kernels.sm90.build import _Sm90Driver

    driver.set_active(_Sm90Driver())

    @gluon.jit
    def show(X):
        gl.static_print("LL16", gl.to_linear_layout(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                                          rank=2), [64, 512]))
        gl.static_print("LL32", gl.to_linear_layout(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32,
                                                                          rank=2), [64, 256]))
        gl.static_print("LN8", gl.to_linear_layout(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8,
                                                                         rank=2), [64, 512]))
        gl.static_print("LN16", gl.to_linear_layout(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                                          rank=2), [64, 256]))
        gl.static_print("LR8", gl.to_linear_layout(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8,
                                                                         rank=2), [64, 64]))
        gl.static_print("LR16", gl.to_linear_layout(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                                          rank=2), [64, 32]))

    show.warmup(torch.zeros(4), grid=(1,))
    """
)


def test_sm90_fp4_words_view_is_the_converted_tile_byte_for_byte(tmp_path) -> None:  # noqa: ANN001
    """The fp4 conversion stores words into the converted tile through a reinterpreted view (`fp4tiles._as_words`):
    the 128-byte-swizzled layouts of a (64, 512) bf16 tile and a (64, 256) int32 tile must put bf16 (r, 2c + h) at byte
    4·offset32(r, c) + 2h, i.e. their linear layouts agree on every byte-address bit; so must the e4m3 route's (64,
    512) e4m3 tile and its (64, 256) int16 view (128-byte swizzle), and its (64, 64) rope tile and (64, 32) int16 view
    (64-byte swizzle). (This environment's Triton: 3.6's ``to_linear_layout`` takes distributed layouts only.)"""
    pytest.importorskip("triton.experimental.gluon")
    import re

    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"))  # (a cached kernel prints nothing)
    script = tmp_path / "words_layouts.py"  # (a file: @jit functions need their source)
    script.write_text(f"import sys; sys.path.insert(0, {ROOT!r})\n" + _WORDS_LAYOUTS)
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    def bases(tag: str) -> list[tuple[int, int]]:
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(tag))
        found = re.search(r"offset_bases=\[(.*?)\]\]", line)
        assert found, line
        return [tuple(int(v) for v in b.split(",")) for b in re.findall(r"\[(-?\d+, -?\d+)", found.group(1) + "]")]

    b16, b32 = bases("LL16"), bases("LL32")
    assert len(b16) == 15 and len(b32) == 14, r.stdout
    # byte-address bit k: bf16 offset bit k - 1, int32 offset bit k - 2 (bit 1 selects the bf16 inside a word)
    assert b16[0] == (0, 1)
    assert [(row, col // 2) for row, col in b16[1:]] == b32, (b16, b32)
    for tag8, tag16, n in (("LN8", "LN16", 15), ("LR8", "LR16", 12)):  # e4m3 codes and their int16 pairs
        b8, w16 = bases(tag8), bases(tag16)
        assert len(b8) == n and len(w16) == n - 1 and b8[0] == (0, 1), r.stdout
        assert [(row, col // 2) for row, col in b8[1:]] == w16, (tag8, b8, w16)


@pytest.mark.parametrize(("q_dtype", "kv_dtype", "kv_cols"), [(torch.bfloat16, torch.uint8, 288),
                                                             (torch.float8_e4m3fn, torch.uint8, 288),
                                                             (torch.float8_e4m3fn, torch.float8_e4m3fn, 576),
                                                             (torch.bfloat16, torch.bfloat16, 576)])  # fmt: skip
def test_sm90_descriptors_step_each_tensor_by_its_own_row(q_dtype, kv_dtype, kv_cols) -> None:  # noqa: ANN001
    """The TMA descriptors of q and of the KV rows each step by their own row length: q by 576 values whatever the KV
    holds (fp4 codes are 288 bytes a token; q stepped by that, its head rows were read from the wrong places, which
    only peaked inputs showed on the GPU), the KV by its own row, the rope boxes starting where the value dims end."""
    pytest.importorskip("triton.experimental.gluon")
    from mlalab.kernels.sm90.stage1 import BLOCK_N, make_descriptors

    q = torch.zeros(4 * 16, 576, dtype=q_dtype)
    kv = torch.zeros(200, kv_cols, dtype=kv_dtype)
    qn, qr, kn, kr = make_descriptors(q, kv, 16)
    nope = 256 if kv_dtype == torch.uint8 else 512
    assert list(qn.strides) == list(qr.strides) == [576, 1]
    assert list(kn.strides) == list(kr.strides) == [kv_cols, 1]
    assert list(qn.shape) == [64, 512] and list(qr.shape) == [64, 64] and list(qn.block_shape) == [16, 512]
    assert list(kn.shape) == [200, nope] and list(kr.shape) == [200, kv_cols - nope]
    assert list(kn.block_shape) == [BLOCK_N, nope] and list(kr.block_shape) == [BLOCK_N, kv_cols - nope]
    assert qr.base.data_ptr() == q.data_ptr() + 512 * q.element_size()
    assert kr.base.data_ptr() == kv.data_ptr() + nope * kv.element_size()

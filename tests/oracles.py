"""Value oracles for the kernel tests, written independently of the library's kernels: what a decode must output
given the numerics it claims, and the baselines a check must be able to tell from the answer."""

from __future__ import annotations

import dataclasses

import torch

from mlalab.config import DecodeCase
from mlalab.inputs import DecodeInputs, make_inputs
from mlalab.kernels import PreparedInputs, token_work_info
from mlalab.plan import WorkPlan


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """rel-L2 of `x` against `ref` (both moved to the CPU in float64)."""
    x, ref = x.double().cpu(), ref.double().cpu()
    return float((x - ref).norm() / ref.norm())


def token_rows(p: PreparedInputs) -> list[torch.Tensor]:
    """Per request, the KV rows (of ``p.kv``) of its tokens in order, through the page table."""
    ind, kvp, ps = p.kv_indices.cpu().long(), p.kv_indptr.cpu().long(), p.page_size
    last = p.kv_last_page_len.cpu().long()
    out = []
    for b in range(p.batch):
        pages = ind[kvp[b] : kvp[b + 1]]
        rows = (pages[:, None] * ps + torch.arange(ps)).flatten()
        n = (len(pages) - 1) * ps + int(last[b]) if len(pages) else 0
        out.append(rows[:n])
    return out


#: E2M1 magnitudes by the code's low 3 bits (OCP MX spec, table "FP4 E2M1").
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e4m3_values(b: torch.Tensor) -> torch.Tensor:
    """E4M3 (fn) bytes -> float64, from the bit fields: 2^(E-7)·(1 + M/8), subnormal 2^-6·M/8, 0x7F / 0xFF NaN."""
    b = b.long()
    e, m = (b >> 3) & 15, (b & 7).double()
    v = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
    v = torch.where((b & 0x7F) == 0x7F, float("nan"), v)
    return torch.where(b >= 128, -v, v)


def fp4_values(codes: torch.Tensor, scales: torch.Tensor, fmt: str, global_scale: float = 1.0) -> torch.Tensor:
    """Packed E2M1 rows (rows, 288) bytes, the even index in the low nibble, with their block scales (MXFP4: E8M0
    bytes per 32 values, 2^(e-127), 255 NaN; NVFP4: E4M3 bytes per 16 values, times `global_scale`) -> float64
    (rows, 576), decoded here from the bits (independently of `mlalab.quant`)."""
    c = codes.cpu().long()
    nib = torch.stack([c & 15, c >> 4], -1).reshape(c.shape[0], -1)  # (rows, 576): even index = low nibble
    mag = torch.tensor(_E2M1, dtype=torch.float64)[nib & 7]
    val = torch.where(nib >= 8, -mag, mag)
    sb = scales.cpu().view(torch.uint8).long()
    if fmt == "mxfp4":
        sc = torch.where(sb == 255, float("nan"), torch.pow(2.0, (sb - 127).double()))
    else:
        sc = _e4m3_values(sb) * global_scale
    g = val.shape[1] // sc.shape[1]
    return (val.reshape(val.shape[0], -1, g) * sc[:, :, None]).reshape(val.shape)


def kv_values(p: PreparedInputs) -> torch.Tensor:
    """The KV rows of `p` as the decode sees them, float64 (rows, 576): codes times the per-tensor scale, or the fp4
    codes decoded with their block scales (and NVFP4's per-cache scale)."""
    if p.spec.kv_fp4:
        return fp4_values(p.kv, p.kv_scales, p.spec.kv_format, float(p.kv_scale.cpu()[0]))
    return p.kv.cpu().double() * float(p.kv_scale.cpu()[0])


def mean_v(p: PreparedInputs) -> torch.Tensor:
    """The output of a decode that ignores q: each request's mean V (dequantised), for every q row and head."""
    kv = kv_values(p)
    q_ind = p.qo_indptr.cpu().tolist()
    out = torch.zeros(int(q_ind[-1]), 16, 512, dtype=torch.float64)
    for b, rows in enumerate(token_rows(p)):
        if len(rows):
            out[q_ind[b] : q_ind[b + 1]] = kv[rows, :512].mean(0)
    return out


def e4m3_route_values(p: PreparedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 KV rows as the sm_90 e4m3 route holds them, written here from the format's definition: ``(values, F)``,
    float64 (rows, 576) and (rows,). F = max(E, 33) - 133 for E the token's largest E8M0 byte (255: NaN values); a
    block of scale byte s keeps its E2M1 values (times 2^(s - 127)) when s >= max(E, 33) - 11, else gives 0."""
    vals = fp4_values(p.kv, p.kv_scales, "mxfp4")
    s = p.kv_scales.cpu().view(torch.uint8).long()
    e = s.amax(1).clamp(min=33)
    keep = (s >= e[:, None] - 11).repeat_interleave(32, dim=1)
    vals = torch.where(keep, vals, 0.0)
    vals[e == 255] = float("nan")
    return vals, (e - 133).double()


def tiled_decode(p: PreparedInputs, plan: WorkPlan, *, p_dtype: torch.dtype | None, block: int = 64,
                 sm_scale: float = 576**-0.5,
                 e4m3_route: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The decode of `plan` as a tiled kernel computes it, in float64 but for one rounding: each work streams its
    tokens in `block`-token tiles from its start with a running max (base 2); P = 2^(s - m) rounded to `p_dtype`
    (None: not rounded) feeds the value product, the unrounded P the softmax sum; split works merge by their LSEs.
    This is the specification of the production numerics (fp8 P for a8w8, bf16 P for the 16-bit paths).

    Under `p.causal` q row i of a request's q rows streams only the tokens of its prefix (all but the q - 1 - i
    newest), so a work past that prefix gives the row an empty partial.

    `e4m3_route` (MXFP4 KV): the sm_90 e4m3 route's numerics: token t's values are 2^F_t times its residual
    (`e4m3_route_values`), its base-2 logit gets + F_t, the running max is over those, P̂ = 2^(s + F - m) rounded to
    `p_dtype` weights the residual rows, and the softmax sum adds P̂ · 2^-F (unrounded)."""
    q = p.q.cpu().double() * float(p.q_scale.cpu()[0])
    kv = kv_values(p)
    f_tok = torch.zeros(kv.shape[0], dtype=torch.float64)
    if e4m3_route:
        kv, f_tok = e4m3_route_values(p)
        kv = kv * float(p.kv_scale.cpu()[0])
    lens = torch.tensor([len(r) for r in token_rows(p)])
    rows_of = token_rows(p)
    wi = token_work_info(plan.to("cpu"), p.kv_indptr.cpu(), p.kv_last_page_len.cpu())
    tok0 = p.kv_indptr.cpu().long()[:-1] * p.page_size  # token position of each request's first token
    total_q = q.shape[0]
    out = torch.zeros(total_q, 16, 512, dtype=torch.float64)
    lse = torch.full((total_q, 16), float("-inf"), dtype=torch.float64)
    parts: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    log2e = 1.4426950408889634
    qo = p.qo_indptr.cpu().long()
    for w in range(wi.shape[0]):
        b, loc, qs, qe, ks, ke = (int(v) for v in wi[w, :6])
        kr_work = rows_of[b][ks - int(tok0[b]) : ke - int(tok0[b])]
        assert len(kr_work) <= int(lens[b])
        for i in range(qs, qe):
            kr = kr_work
            if p.causal:  # this row sees the request's first lens - (q - 1 - row) tokens
                seen = int(lens[b]) - (int(qo[b + 1]) - 1 - i) - (ks - int(tok0[b]))
                kr = kr_work[: max(0, seen)]
            m = torch.full((16,), float("-inf"), dtype=torch.float64)
            l = torch.zeros(16, dtype=torch.float64)
            o = torch.zeros(16, 512, dtype=torch.float64)
            for t0 in range(0, len(kr), block):
                k = kv[kr[t0 : t0 + block]]
                f = f_tok[kr[t0 : t0 + block]]  # (0 but on the e4m3 route)
                s = (q[i] @ k.T) * sm_scale * log2e + f[None, :]  # (16, tokens), base 2
                m_new = torch.maximum(m, s.max(1).values)
                alpha = torch.exp2(m - m_new)
                pr = torch.exp2(s - m_new[:, None])
                pv = pr if p_dtype is None else pr.to(p_dtype).double()
                o = o * alpha[:, None] + pv @ (k[:, :512] * torch.exp2(-f)[:, None])
                l = l * alpha + (pr * torch.exp2(-f)[None, :]).sum(1)
                m = m_new
            has = l > 0
            o_i = torch.where(has[:, None], o / torch.where(has, l, 1.0)[:, None], 0.0)
            lse_i = torch.where(has, (m + torch.log2(torch.where(has, l, 1.0))) / log2e, float("-inf"))
            if loc < 0:
                out[i], lse[i] = o_i, lse_i
            else:
                parts.setdefault(i, []).append((o_i, lse_i))
    for i, ps in parts.items():
        L = torch.stack([x[1] for x in ps])
        tot = torch.logsumexp(L, 0)
        w_ = torch.exp(L - tot)
        out[i] = (w_[:, :, None] * torch.stack([x[0] for x in ps])).sum(0)
        lse[i] = tot
    return out, lse


# ---------------------------------------------------------------- discriminating inputs (on DecodeInputs)
#: The input sets every CPU correctness check runs on: the competition's (randn x 0.02: attention almost uniform, the
#: mean of V within ~1e-3 of the answer) and two peaked ones where ignoring q, or a wrong softmax scale, is far off.
INPUT_SETS = {
    "competition": {},
    "unit-q3": {"dist": "unit", "q_mult": 3.0},  # unit std, q x 3
    "outliers": {"dist": "outliers", "scale": 1.0},  # unit std with 8 channels x 20 (in q and KV alike)
}


def make_input_set(name: str, kv_lens: tuple[int, ...], *, q_len: int = 1, page_size: int = 1, seed: int = 0,
                   permute_pages: bool = False) -> DecodeInputs:  # fmt: skip
    """`make_inputs` of one of `INPUT_SETS` (q multiplied after drawing, for ``q_mult``)."""
    kw = dict(INPUT_SETS[name])
    q_mult = kw.pop("q_mult", None)
    case = DecodeCase(kv_lens=tuple(kv_lens), q_len=q_len, page_size=page_size, permute_pages=permute_pages,
                      seed=seed, **kw)  # fmt: skip
    x = make_inputs(case)
    if q_mult is not None:
        x = dataclasses.replace(x, q=(x.q.float() * q_mult).to(x.q.dtype))
    return x


def request_mean_v(x: DecodeInputs) -> torch.Tensor:
    """The output of a decode that ignores q, on raw inputs: each request's mean V (float64), for every q row and head
    (a request without KV: 0)."""
    kv, tok = x.to("cpu").token_kv()
    q_ind = x.qo_indptr.cpu().tolist()
    out = torch.zeros(int(q_ind[-1]), x.q.shape[1], 512, dtype=torch.float64)
    for b in range(x.batch):
        if tok[b + 1] > tok[b]:
            out[q_ind[b] : q_ind[b + 1]] = kv[tok[b] : tok[b + 1], 0, :512].double().mean(0)
    return out


def assert_baselines_fail(ref: torch.Tensor, tol: float, mean_v_out: torch.Tensor, what: str = "") -> None:
    """The mean-of-V output and all zeros must both be farther than `tol` (rel-L2) from `ref`: else the check that
    uses `tol` cannot tell them from the answer (a test bug)."""
    e_mean, e_zero = rel(mean_v_out, ref), rel(torch.zeros_like(ref), ref)
    assert e_mean > tol and e_zero > tol, (
        f"{what}: the baselines pass a {tol:g} check (mean V {e_mean:.3g}, zeros {e_zero:.3g})"
    )

"""The ragged-batch split explorer: length mixes x split policies, scored under one cost model.

Question: on ragged batches (one long request among short ones, a geometric tail, ...), how far is each split
policy from the best schedule of its batch, and what does it pay for it (idle CUs, partial bytes, reduce work)?

Policies (`POLICIES`): the five planners of `mlalab.plan` at their defaults; ``fixed-16`` (every request cut into 16
even pieces, dealt to CUs by count: the fixed split count of e.g. ROCm ATOM); ``flashmla`` (FlashMLA's split rule,
`plan_flashmla`); and ``oracle`` (`plan_oracle`: the smallest modelled cost among the tightest split fills and
every other policy's plan; with ``reduce_row = 0`` its makespan is certified within ``2 · overhead + granularity``
tokens of the true minimum).

Cost model (`CostModel`): a CU runs its works one after the other; a work costs its KV tokens plus a fixed
`overhead` (loading q, writing a partial, the loop's ramp). The modelled makespan is the most expensive CU; the
modelled ``cost`` adds the reduce: ``reduce_row`` tokens per partial row it reads. Metrics (`score`): ``makespan``
(tokens), ``cost`` (tokens), ``idle_share`` (share of CU-time the model leaves idle: 1 − Σ cost / (CUs ×
makespan)), ``idle_cus`` (CUs without work), ``partial_bytes`` (float32 partial rows written, each 16 heads × 512 +
16 LSEs), ``reduce_reads`` (partial rows the reduce reads), ``lower_bound`` ((Σ tokens + overhead × requests) / CUs:
no schedule does better) and ``regret`` (cost / oracle's cost − 1).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from ..config import COMPETITION_SHAPES, MLA, GpuTarget, get_target
from .planners import PLANNERS, indptrs_for, plan_balanced
from .workplan import Fragment, WorkPlan, build_plan

__all__ = ["CostModel", "MIXES", "POLICIES", "mix_lengths", "plan_policy", "plan_flashmla", "plan_fixed_splits",
           "plan_oracle", "score", "explore"]  # fmt: skip

_ceil = lambda a, b: -(-a // b)


@dataclass(frozen=True)
class CostModel:
    """A work costs ``tokens + overhead`` (tokens); the reduce ``reduce_row`` tokens per partial row it reads;
    `granularity`: the oracle's cut alignment (1 = any cut).

    ``reduce_row = 57``: a partial row (16 heads x 512 fp16 + 16 fp32 LSEs) is written by stage 1 and read again by
    the reduce, 32,896 bytes: 57 tokens of an a8w8 KV cache (576 bytes each). Measured on an H100 (data/explore/
    h100_2026-12-05_explore.csv, 6 batches x 8 policies on the sm_90 kernel), the cost with this term ranks plans
    with a mean Spearman rho of 0.87 within a batch, the makespan alone 0.39 (57 is the bytes ratio, not a fit)."""

    overhead: int = 64
    granularity: int = 1
    reduce_row: int = 57

    def cost(self, makespan: int, reduce_reads: int) -> int:
        """The modelled cost of a plan (tokens) from its makespan and the partial rows its reduce reads."""
        return int(makespan) + self.reduce_row * int(reduce_reads)

    def __post_init__(self) -> None:
        for name in ("overhead", "granularity", "reduce_row"):
            v = getattr(self, name)
            low = 1 if name == "granularity" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"CostModel.{name} must be an int >= {low}, got {v!r}")


# ------------------------------------------------------------------------------------------------------ length mixes
def _uniform(r: random.Random) -> list[int]:
    return [r.randint(512, 8192) for _ in range(32)]


def _geometric(r: random.Random) -> list[int]:
    return [min(262_144, int(128 * r.paretovariate(1.1))) for _ in range(64)]


def _bimodal(r: random.Random) -> list[int]:
    return [r.randint(64, 512) if r.random() < 0.75 else r.randint(16_384, 32_768) for _ in range(32)]


def _straggler(r: random.Random) -> list[int]:
    lens = [r.randint(512, 2048) for _ in range(15)]
    lens.insert(r.randrange(16), 131_072)
    return lens


def _tiny(r: random.Random) -> list[int]:
    return [r.randint(1, 128) for _ in range(256)]


def _competition(r: random.Random) -> list[int]:
    b, n = COMPETITION_SHAPES[r.randrange(len(COMPETITION_SHAPES))]
    return [n] * b


#: mix name -> (one-line description, generator of one batch's KV lengths from a seeded `random.Random`)
MIXES: dict[str, tuple[str, Callable[[random.Random], list[int]]]] = {
    "uniform": ("32 requests, lengths uniform in 512..8192", _uniform),
    "geometric": ("64 requests, Pareto(1.1) tail from 128 tokens (up to 256K)", _geometric),
    "bimodal": ("32 requests: 3/4 short (64..512), 1/4 long (16K..32K)", _bimodal),
    "straggler": ("one 128K request among 15 of 512..2048", _straggler),
    "tiny": ("256 requests of 1..128 tokens", _tiny),
    "competition": ("one competition shape (B x L uniform), drawn by the seed", _competition),
}


def mix_lengths(mix: str, seed: int = 0) -> list[int]:
    """The KV lengths of one batch of `mix` (`MIXES`), reproducible from `seed`."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; valid: {', '.join(MIXES)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return MIXES[mix][1](random.Random(f"{mix}:{seed}"))


# ------------------------------------------------------------------------------------------------------- policies
def _lens(kv_indptr: torch.Tensor) -> list[int]:
    return (kv_indptr[1:] - kv_indptr[:-1]).tolist()


def _finish(frags: list[Fragment], qo: torch.Tensor, kv: torch.Tensor, n: int, name: str, params: dict) -> WorkPlan:
    return build_plan(frags, num_cus=n, qo=qo.tolist(), kvp=kv.tolist(), kv_lens=_lens(kv), page_size=1,
                      planner=name, params=params)  # fmt: skip


def plan_flashmla(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, target: str | int | GpuTarget = "h200") -> WorkPlan:
    """FlashMLA's split rule (dense decode, sm90), re-derived from its public ``get_mla_metadata`` scheduler.

    In our words: the SMs are grouped into ``parts = max(1, SMs // ceil(q_len · 16 / 64))`` partitions (one latent
    head; 132 on the H200 at q_len 1). KV is counted in 64-token blocks, a request of 0 tokens as 1 block, and every
    request also costs 5 overhead blocks; each partition gets a budget of ``ceil(Σ (blocks + 5) / parts) + 5``
    blocks. Partitions are filled in order, requests in index order: if the rest of the request plus 5 fits the
    remaining budget it ends there; otherwise, if more than 5 blocks remain, the partition takes ``remaining − 5``
    blocks of it and the request continues in the next partition; otherwise the next partition starts. (aiter's
    fast mode follows the same scheme with 16-token blocks and a 16-block overhead.) Page size 1 only.
    """
    tgt = get_target(target)
    lens = _lens(kv_indptr)
    q_rows = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
    q_len = max(q_rows) if q_rows else 1
    parts = max(1, tgt.num_cus // _ceil(q_len * MLA.num_heads, 64))
    blk, ovh = 64, 5
    blocks = [max(1, _ceil(n, blk)) for n in lens]
    payload = _ceil(sum(b + ovh for b in blocks), parts) + ovh
    kvp = kv_indptr.tolist()
    frags: list[Fragment] = []
    b, done = 0, 0  # request, blocks of it already placed
    for part in range(parts):
        remain = payload
        while b < len(lens):
            rest = blocks[b] - done
            if remain >= rest + ovh:
                frags.append(Fragment(part, b, min(kvp[b] + done * blk, kvp[b + 1]), kvp[b + 1]))
                remain -= rest + ovh
                b, done = b + 1, 0
            else:
                if remain - ovh > 0:
                    take = remain - ovh
                    frags.append(Fragment(part, b, kvp[b] + done * blk, min(kvp[b] + (done + take) * blk, kvp[b + 1])))
                    done += take
                break
    if b < len(lens):  # cannot happen: the budget covers every block (FlashMLA asserts the same)
        raise AssertionError("flashmla rule left requests unplaced")
    return _finish(frags, qo_indptr, kv_indptr, tgt.num_cus, "flashmla", {"parts": parts, "payload_blocks": payload})


def plan_fixed_splits(
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, target: str | int | GpuTarget = "h200", *, splits: int = 16
) -> WorkPlan:
    """Every request cut into `splits` even pieces (fewer if it has fewer tokens), works dealt to CUs by count
    (CU ``c`` gets works ``[c·W // N, (c+1)·W // N)``)."""
    tgt = get_target(target)
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits must be an int >= 1, got {splits!r}")
    kvp, pieces = kv_indptr.tolist(), []
    for b, n in enumerate(_lens(kv_indptr)):
        k = max(1, min(splits, n))
        pieces += [(b, kvp[b] + i * n // k, kvp[b] + (i + 1) * n // k) for i in range(k)]
    W, N = len(pieces), tgt.num_cus
    frags = [Fragment(c, *pieces[w]) for c in range(N) for w in range(c * W // N, (c + 1) * W // N)]
    return _finish(frags, qo_indptr, kv_indptr, N, f"fixed-{splits}", {"splits": splits})


def plan_oracle(
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, target: str | int | GpuTarget = "h200", *,
    model: CostModel = CostModel(), candidates: tuple[WorkPlan, ...] = (),
) -> WorkPlan:  # fmt: skip
    """The smallest modelled cost under `model` among: the tightest in-order split fill (the bisection of
    ``balanced`` with the model's overhead and granularity) over the requests in index order and in decreasing
    length, and the `candidates` (the other policies' plans of the same batch, so no policy beats the oracle).

    The fill's makespan is within ``2 · overhead + granularity`` tokens of the true minimum makespan: it succeeds at
    any capacity ``>= lower_bound + 2 · overhead + granularity`` (every CU but the last is filled to within
    ``overhead + granularity`` of it, and each CU boundary adds at most one overhead); `score` reports the lower
    bound beside it. With ``reduce_row > 0`` the oracle is the best of these plans, not a certified minimum.
    """
    tgt = get_target(target)
    lens = _lens(kv_indptr)
    kvp = kv_indptr.tolist()
    best: WorkPlan | None = None
    for order in (list(range(len(lens))), sorted(range(len(lens)), key=lambda b: -lens[b])):
        qo_p, kv_p = indptrs_for([lens[b] for b in order])
        p = plan_balanced(qo_p, kv_p, tgt, overhead=model.overhead, kv_granularity=model.granularity)
        wi, cus = p.work_info.tolist(), p.work_cus().tolist()
        frags = [Fragment(c, order[w[0]], w[4] - kv_p[w[0]].item() + kvp[order[w[0]]],
                          w[5] - kv_p[w[0]].item() + kvp[order[w[0]]]) for c, w in zip(cus, wi)]  # fmt: skip
        frags.sort(key=lambda f: f.cu)
        plan = _finish(frags, qo_indptr, kv_indptr, tgt.num_cus, "oracle", {"overhead_tokens": model.overhead})
        if best is None or _cost(plan, model) < _cost(best, model):
            best = plan
    assert best is not None
    for c in candidates:
        if not isinstance(c, WorkPlan) or c.num_cus != tgt.num_cus or c.kv_lens != tuple(lens):
            raise ValueError("candidates must be plans of the same batch for the same CU count")
        if _cost(c, model) < _cost(best, model):
            best = dataclasses.replace(c, planner="oracle", params={**c.params, "from": c.planner})
    return best


def _default(name: str) -> Callable[..., WorkPlan]:
    return lambda qo, kv, target: PLANNERS[name](qo, kv, target)


#: policy name -> (qo_indptr, kv_indptr, target) -> WorkPlan (page size 1)
POLICIES: dict[str, Callable[..., WorkPlan]] = {
    **{name: _default(name) for name in PLANNERS},
    "fixed-16": plan_fixed_splits,
    "flashmla": plan_flashmla,
    "oracle": plan_oracle,
}


def plan_policy(policy: str, kv_lens: list[int], target: str | int | GpuTarget = "h200", *,
                model: CostModel = CostModel()) -> WorkPlan:  # fmt: skip
    """The plan of `policy` (`POLICIES`) for a q_len-1 batch of `kv_lens`, validated."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    qo, kv = indptrs_for(kv_lens)
    if policy != "oracle":
        return POLICIES[policy](qo, kv, target).validate(qo, kv)
    others = tuple(POLICIES[p](qo, kv, target) for p in POLICIES if p != "oracle")
    return plan_oracle(qo, kv, target, model=model, candidates=others).validate(qo, kv)


# ------------------------------------------------------------------------------------------------------- metrics
def _cu_costs(plan: WorkPlan, model: CostModel) -> torch.Tensor:
    counts = (plan.work_indptr[1:] - plan.work_indptr[:-1]).to(torch.int64)
    return plan.cu_loads() + model.overhead * counts


def _makespan(plan: WorkPlan, model: CostModel) -> int:
    return int(_cu_costs(plan, model).max()) if plan.num_cus else 0


def _reduce_reads(plan: WorkPlan) -> int:
    tiles = (plan.reduce_indptr[1:] - plan.reduce_indptr[:-1]).to(torch.int64)
    rows = (plan.reduce_final_map[:, 1] - plan.reduce_final_map[:, 0]).to(torch.int64)
    return int((tiles * rows)[tiles >= 2].sum())


def _cost(plan: WorkPlan, model: CostModel) -> int:
    return model.cost(_makespan(plan, model), _reduce_reads(plan))


def score(plan: WorkPlan, model: CostModel = CostModel(), *, oracle: WorkPlan | None = None) -> dict[str, float]:
    """The explorer's metrics of one plan (module docstring); `regret` needs the `oracle` plan of the same batch."""
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    cost = _cu_costs(plan, model)
    span = int(cost.max()) if plan.num_cus else 0
    reads = _reduce_reads(plan)
    lens = plan.kv_lens or tuple(plan.work_tokens().tolist())
    lb = _ceil(sum(lens) + model.overhead * plan.batch, plan.num_cus)
    out = {
        "works": plan.n_work,
        "busy_cus": int((cost > 0).sum()),
        "idle_cus": int(((plan.work_indptr[1:] - plan.work_indptr[:-1]) == 0).sum()),
        "makespan": span,
        "cost": model.cost(span, reads),
        "idle_share": 1.0 - float(cost.sum()) / (plan.num_cus * span) if span else 0.0,
        "partial_bytes": plan.n_partial_rows * MLA.num_heads * (MLA.v_dim + 1) * 4,
        "reduce_reads": reads,
        "lower_bound": lb,
    }
    if oracle is not None:
        out["regret"] = out["cost"] / _cost(oracle, model) - 1.0
    return out


def explore(
    mixes: list[str] | None = None,
    policies: list[str] | None = None,
    *,
    seeds: int = 3,
    target: str | int | GpuTarget = "h200",
    model: CostModel = CostModel(),
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per (mix, seed, policy): the batch's shape and `score`'s metrics, regret against the oracle."""
    mixes = list(MIXES) if mixes is None else list(mixes)
    policies = list(POLICIES) if policies is None else list(policies)
    bad = [m for m in mixes if m not in MIXES] + [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"unknown mix/policy {bad}; mixes: {', '.join(MIXES)}; policies: {', '.join(POLICIES)}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an int >= 1, got {seeds!r}")
    tgt = get_target(target)
    rows = []
    for mix in mixes:
        for seed in range(seeds):
            lens = mix_lengths(mix, seed)
            plans = {p: plan_policy(p, lens, tgt, model=model) for p in POLICIES if p != "oracle"}
            qo, kv = indptrs_for(lens)
            plans["oracle"] = plan_oracle(qo, kv, tgt, model=model, candidates=tuple(plans.values()))
            oracle = plans["oracle"]
            for pol in policies:
                p = plans[pol]
                rows.append({"mix": mix, "seed": seed, "policy": pol, "target": tgt.name, "batch": len(lens),
                             "tokens": sum(lens), "longest": max(lens), **score(p, model, oracle=oracle)})  # fmt: skip
            if progress is not None:
                progress(f"{mix} seed {seed}: {len(lens)} requests, {sum(lens)} tokens")
    return pd.DataFrame(rows)

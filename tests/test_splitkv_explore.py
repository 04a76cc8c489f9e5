"""The split explorer: FlashMLA's rule and the fixed split count pinned on hand-worked batches, the oracle's
certificate (never beaten, within 2 x overhead + granularity of the lower bound), the metrics, the CLI."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from mlalab.plan import indptrs_for
from mlalab.plan.explore import MIXES, POLICIES, CostModel, explore, mix_lengths, plan_flashmla, plan_policy, score


def test_flashmla_rule_4x1024_on_h200() -> None:
    # 4 x 16 blocks of 64: total (16 + 5) x 4 = 84, payload ceil(84 / 132) + 5 = 6 blocks: each partition takes
    # 6 - 5 = 1 block of a request that does not fit, the last block of each request (1 + 5 <= 6) fits whole
    qo, kv = indptrs_for([1024] * 4)
    p = plan_flashmla(qo, kv, "h200").validate(qo, kv)
    assert p.params == {"parts": 132, "payload_blocks": 6}
    assert p.n_work == 64 and p.to_frame().kv_tokens.tolist() == [64] * 64 and p.summary()["busy_cus"] == 64


def test_flashmla_rule_partitions_and_overhead() -> None:
    qo, kv = indptrs_for([1024] * 4, q_len=8)  # 8 x 16 = 128 q rows per latent head: 2 x 64-row tiles
    assert plan_flashmla(qo, kv, "h200").params["parts"] == 66
    # one 100-token request and one of 6400 on 4 SMs: blocks 2 + 100, total 2+5 + 100+5 = 112, payload 28 + 5 = 33:
    # part 0 takes request 0 (2 + 5 = 7, 26 left) then 21 blocks of request 1; parts 1, 2 take 28; part 3 the rest 23
    qo, kv = indptrs_for([100, 6400])
    p = plan_flashmla(qo, kv, 4).validate(qo, kv)
    df = p.to_frame()
    assert df.kv_tokens.tolist() == [100, 21 * 64, 28 * 64, 28 * 64, 23 * 64]
    assert df.cu.tolist() == [0, 0, 1, 2, 3]


def test_fixed_splits_cut_every_request_in_16() -> None:
    p = plan_policy("fixed-16", [1000, 7, 4096], 8)
    assert p.summary()["works_per_request"] == [16, 7, 16]
    assert score(p)["partial_bytes"] == (16 + 7 + 16) * 16 * 513 * 4


def test_oracle_is_never_beaten_and_is_certified() -> None:
    rng = random.Random(3)
    for i in range(12):
        mix = list(MIXES)[i % len(MIXES)]
        lens = mix_lengths(mix, rng.randint(0, 99))
        for target, ovh, red in (("h200", 64, 0), (37, 200, 0), ("h200", 64, 57)):
            model = CostModel(overhead=ovh, reduce_row=red)
            oracle = plan_policy("oracle", lens, target, model=model)
            so = score(oracle, model)
            assert so["cost"] == so["makespan"] + red * so["reduce_reads"]
            if red == 0:  # makespan only: certified within 2 overheads + 1 of the lower bound
                assert so["lower_bound"] <= so["makespan"] <= so["lower_bound"] + 2 * ovh + 1, (mix, lens)
            for pol in POLICIES:
                s = score(plan_policy(pol, lens, target, model=model), model, oracle=oracle)
                assert s["regret"] >= 0 and s["makespan"] >= so["lower_bound"], (pol, mix)


def test_cost_model_refuses_bad_fields() -> None:
    for bad in ({"reduce_row": -1}, {"overhead": -1}, {"granularity": 0}, {"reduce_row": 1.5}, {"overhead": True}):
        with pytest.raises(ValueError, match="CostModel"):
            CostModel(**bad)


def test_explore_rows_and_metrics() -> None:
    df = explore(["straggler", "tiny"], ["aiter-fast", "simple", "oracle"], seeds=2, target="mi355x")
    assert len(df) == 2 * 2 * 3 and set(df.policy) == {"aiter-fast", "simple", "oracle"}
    assert ((df.idle_share >= 0) & (df.idle_share < 1)).all()
    assert (df[df.policy == "oracle"].regret == 0).all() and (df.regret >= 0).all()
    # the straggler mix: one 128K request among 15 short ones; the tiny mix: 256 requests
    assert set(df[df.mix == "straggler"].longest) == {131_072} and set(df[df.mix == "tiny"].batch) == {256}
    with pytest.raises(ValueError, match="unknown mix/policy"):
        explore(["nope"])
    with pytest.raises(ValueError, match="seeds"):
        explore(seeds=0)


def test_cli_explore() -> None:
    res = subprocess.run([sys.executable, "-m", "mlalab", "explore", "--mixes", "straggler", "--seeds", "1"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "oracle" in res.stdout and "regret" in res.stdout and "flashmla" in res.stdout


def test_default_cost_model_ranks_the_recorded_gpu_plans() -> None:
    """On the recorded GPU measurement of every policy's plan (data/explore/), the default model's cost orders the
    plans of a batch like the measured time (mean Spearman rho >= 0.8), where the makespan alone did not (< 0.5)."""
    from mlalab.widgets.splitkv import latest_explore_recording

    rec = latest_explore_recording()
    assert rec is not None and rec["us_median"].notna().sum() >= 30
    rho = {}
    for name, model in (("cost", CostModel()), ("makespan", CostModel(reduce_row=0))):
        cost = [model.cost(m, r) for m, r in zip(rec["makespan"], rec["reduce_reads"])]
        d = rec.assign(cost=cost).dropna(subset=["us_median"])
        rho[name] = d.groupby(["mix", "seed"]).apply(lambda g: g["cost"].rank().corr(g["us_median"].rank())).mean()
    assert rho["cost"] >= 0.8 and rho["makespan"] < 0.5, rho

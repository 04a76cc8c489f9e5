"""Competition presets (inputs, shapes, seeds, check), the named checks in every accuracy record, and the half-KV
cheat baseline: which check can tell a decode over every other KV page from the real one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mlalab.accuracy import (
    CHECKS,
    PRESETS,
    NamedCheck,
    check_columns,
    check_key,
    evaluate_prepared,
    get_check,
    get_preset,
    half_kv_output,
    prepare,
)
from mlalab.config import DecodeCase, InputDist
from mlalab.reference import decode_reference
from mlalab.timing import SUITES


@pytest.fixture(scope="module")
def records() -> dict[str, dict]:
    """bf16 decode records of batch 4 x kv_len 1024 under each preset's inputs (its seed for that shape)."""
    out = {}
    for name in ("competition", "mixed-mla-2026"):
        p = prepare(get_preset(name).case(4, 1024))
        out[name] = evaluate_prepared(p, "bf16", "bf16")
    return out


def test_presets_reuse_the_timing_suites_shapes_and_state_their_check() -> None:
    new, old = get_preset("mixed-mla-2026"), get_preset("competition")
    for preset, suite in ((new, "mixed-mla-2026"), (old, "competition")):
        assert list(preset.shapes) == [(b, n) for b, n, _, _ in SUITES[suite]]
        assert len(preset.seeds) == len(preset.shapes)
    assert sorted({b for b, _ in new.shapes}) == [4, 32, 64, 256] and sorted({n for _, n in new.shapes}) == [1024, 8192]
    assert (new.dist, new.scale, new.tolerance, new.max_mismatch) == (InputDist.UNIT, 1.0, (0.1, 0.1), 0.05)
    assert (old.dist, old.scale, old.tolerance, old.max_mismatch) == (InputDist.COMPETITION, 0.02, (2e-2, 8e-3), 0.0)
    assert "mxfp4-aiter" in new.kv_schemes and "fp8-tensor" in new.kv_schemes
    assert new.seed_for(256, 8192) == 9826 and new.seed_for(7, 7) == 0
    c = new.case(64, 1024)
    assert (c.batch, c.kv_lens[0], c.seed, c.dist, c.std) == (64, 1024, 1357, InputDist.UNIT, 1.0)
    assert [x.seed for x in new.cases()] == list(new.seeds)
    assert get_preset(new) is new


def test_bad_preset_and_check_names_fail_clearly() -> None:
    with pytest.raises(ValueError, match="unknown preset 'nope'; known: competition, mixed-mla-2026"):
        get_preset("nope")
    with pytest.raises(ValueError, match="unknown check"):
        get_check("loose")
    with pytest.raises(ValueError, match="max_mismatch"):
        NamedCheck("x", 0.1, 0.1, 1.5)
    with pytest.raises(ValueError, match="rtol"):
        NamedCheck("x", -1.0, 0.1)
    with pytest.raises(ValueError, match="batch"):
        PRESETS["competition"].case(0, 1024)


def test_named_check_allows_its_share_of_mismatches() -> None:
    ref = torch.ones(100, dtype=torch.float64)
    out = ref.clone()
    out[:5] = 2.0  # 5 % of the elements far outside rtol = atol = 0.1
    cols = check_columns(out, ref)
    assert cols[check_key("mixed-mla-2026", "mismatch")] == 0.05
    assert cols["passes@mixed-mla-2026"] is True  # <= 5 % passes
    out[5] = 2.0
    assert check_columns(out, ref)["passes@mixed-mla-2026"] is False  # 6 % fails
    assert check_columns(out, ref, ["competition"]) == {"mismatch@competition": 0.06, "passes@competition": False}
    out[:] = float("nan")
    assert check_columns(out, ref)["passes@mixed-mla-2026"] is False


def test_half_kv_is_the_reference_over_every_other_page() -> None:
    case = DecodeCase(kv_lens=(40, 7, 33), page_size=16, permute_pages=True, seed=3)
    p = prepare(case)
    half = half_kv_output(p)
    kp = p.kv_indptr.tolist()
    rows, lens = [], []
    for b, n in enumerate(case.kv_lens):
        keep = [t for t in range(n) if (t // 16) % 2 == 0]  # pages 0 and 2 of each request
        rows += [kp[b] + t for t in keep]
        lens.append(len(keep))
    assert lens == [24, 7, 17]
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    want, _ = decode_reference(p.inputs.q, p.kv[rows], p.inputs.qo_indptr, indptr, compute_dtype=torch.float64)
    assert torch.equal(half, want.to(torch.bfloat16).double())
    assert half_kv_output(p) is half  # cached


def test_the_old_tolerance_cannot_tell_the_half_kv_cheat_from_the_real_decode(records: dict[str, dict]) -> None:
    """At randn x 0.02 the half-KV output is ~99 % off in rel-L2, yet every element passes rtol 2e-2 / atol 8e-3:
    the outputs (~1e-3) sit inside atol, so that check cannot see the cheat (nor zeros, nor mean(V))."""
    r = records["competition"]
    assert r["halfkv_rel_l2"] > 0.9
    assert r["halfkv_mismatch@0.02,0.008"] == 0.0 and r["halfkv_passes@competition"] is True
    assert r["zeros_passes@competition"] is True and r["meanv_passes@competition"] is True
    assert r["passes@competition"] is True  # the real (bf16) decode passes too: the check cannot separate them


def test_at_unit_inputs_a_check_can_fail_the_cheat_and_the_2026_check_lets_it_pass(records: dict[str, dict]) -> None:
    """At unit-std inputs (the 2026 problem's) the old tolerance fails the cheat on most elements, so a check CAN
    fail it; the 2026 check (1e-1, 5 % allowed) still passes it at 4 x 1024 (3.6 % mismatch) while it fails
    zeros and mean(V) there."""
    r = records["mixed-mla-2026"]
    assert r["seed"] == 4217 and r["dist"] == "unit"
    assert r["passes@competition"] is True and r["passes@mixed-mla-2026"] is True  # the real decode
    assert r["halfkv_mismatch@competition"] > 0.5 and r["halfkv_passes@competition"] is False
    assert 0.0 < r["halfkv_mismatch@mixed-mla-2026"] <= 0.05 and r["halfkv_passes@mixed-mla-2026"] is True
    assert r["zeros_passes@mixed-mla-2026"] is False and r["meanv_passes@mixed-mla-2026"] is False
    assert 0.5 < r["halfkv_rel_l2"] < 0.9


def test_records_carry_every_named_check(records: dict[str, dict]) -> None:
    r = records["mixed-mla-2026"]
    for name in CHECKS:
        for prefix in ("", "zeros_", "meanv_", "halfkv_"):
            assert isinstance(r[check_key(name, "passes", prefix)], bool)
            assert 0.0 <= r[check_key(name, "mismatch", prefix)] <= 1.0
    for rt, at in ((2e-2, 8e-3), (1e-1, 5e-2)):
        assert f"halfkv_mismatch@{rt:g},{at:g}" in r


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlalab", *args], capture_output=True, text=True, timeout=300)


def test_cli_accuracy_preset_draws_the_competition_case_and_gives_the_verdict() -> None:
    r = _cli("accuracy", "--preset", "mixed-mla-2026", "--kv-scheme", "mxfp4-aiter", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert (rec["preset"], rec["dist"], rec["std"], rec["seed"]) == ("mixed-mla-2026", "unit", 1.0, 4217)
    assert rec["halfkv_passes@mixed-mla-2026"] is True and rec["zeros_passes@mixed-mla-2026"] is False
    text = _cli("accuracy", "--preset", "mixed-mla-2026").stdout
    assert "half-KV cheat 3.62 % passes" in text and "zeros 8.92 % FAILS" in text
    bad = _cli("accuracy", "--preset", "competition", "--seed", "3")
    assert bad.returncode != 0 and "drop ['--seed']" in bad.stderr


def test_cli_sweep_preset_takes_its_shapes_and_seeds(tmp_path) -> None:
    r = _cli("sweep", "--preset", "mixed-mla-2026", "--estimate")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("8 rows (8 cases")
    bad = _cli("sweep", "--preset", "mixed-mla-2026", "--batch", "4")
    assert bad.returncode != 0 and "drop ['--batch']" in bad.stderr
    bad = _cli("sweep", "--preset", "nope")
    assert bad.returncode != 0 and "invalid choice: 'nope'" in bad.stderr

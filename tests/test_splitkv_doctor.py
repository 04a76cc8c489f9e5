"""The metadata doctor: each finding class produced by corrupting real plans of every planner and named in words;
clean plans of every planner x target x 200 random ragged batches pass; the file format and the CLI's exit codes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlalab.backends.aiter_dump import dump_aiter_metadata
from mlalab.plan import PLANNERS, indptrs_for, make_plan
from mlalab.plan.doctor import DoctorInputError, doctor, load_metadata, metadata_dict, save_metadata

LENS = [3000, 40, 700, 0, 1500]
CUS = 16


def _meta(planner: str, lens: list[int] = LENS, q_len: int = 1) -> dict:
    qo, kv = indptrs_for(lens, q_len)
    return metadata_dict(make_plan(planner, qo, kv, CUS).validate(qo, kv), qo, kv)


def _split_work(d: dict) -> int:
    """A work of the longest request (split by every planner here)."""
    wi = d["work_info"]
    return int(torch.nonzero(wi[:, 0] == 0)[1])


def _drop(d: dict) -> dict:
    w = _split_work(d)
    cu = int(torch.searchsorted(d["work_indptr"][1:], torch.tensor(w), right=True))
    d["work_info"] = torch.cat([d["work_info"][:w], d["work_info"][w + 1 :]])
    d["work_indptr"] = d["work_indptr"].clone()
    d["work_indptr"][cu + 1 :] -= 1
    return d


def _duplicate(d: dict) -> dict:
    w = _split_work(d)
    row = d["work_info"][w : w + 1].clone()
    row[0, 1] = -1  # a copy writing the output directly (its own rows would overlap too)
    d["work_info"] = torch.cat([d["work_info"], row])
    d["work_indptr"] = d["work_indptr"].clone()
    d["work_indptr"][-1] += 1
    return d


def _shift(d: dict) -> dict:
    w = _split_work(d)
    d["work_info"] = d["work_info"].clone()
    d["work_info"][w, 4:6] += 8
    return d


def _stale(d: dict) -> dict:
    d["reduce_partial_map"] = d["reduce_partial_map"].clone()
    d["reduce_partial_map"][0] = d["n_partial_rows"] + 1000
    return d


# corruption -> (how, kind that must be found, words of its message)
CORRUPTIONS = {
    "drop a work": (_drop, "uncovered", "are not covered by any work"),
    "duplicate a work": (_duplicate, "covered_twice", "are covered twice"),
    "shift a kv range": (_shift, "covered_twice", "are covered twice"),
    "partial id out of range": (_stale, "partial_range", "out of range (the buffer has"),
}


@pytest.mark.parametrize("planner", list(PLANNERS))
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_each_corruption_is_named(planner: str, corruption: str) -> None:
    d = _meta(planner)
    assert doctor(dict(d)).clean
    how, kind, words = CORRUPTIONS[corruption]
    rep = doctor(how(dict(d)))
    assert not rep.clean
    hits = [f for f in rep.findings if f.kind == kind and words in f.message]
    assert hits, rep.text()
    if kind == "uncovered":  # first uncovered position and count are given
        assert hits[0].first is not None and hits[0].count > 0


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_plan_for_shorter_lengths_is_named(planner: str) -> None:
    """The vLLM #51119 pattern: a plan made once (here for the batch's lengths / 4) reused for the real lengths."""
    short = [n // 4 for n in LENS]
    d = _meta(planner, short)
    d["qo_indptr"], d["kv_indptr"] = indptrs_for(LENS)
    rep = doctor(d)
    top = rep.findings[0]
    assert top.kind == "other_lengths" and "has 3000 KV positions but its works cover 750" in top.message, rep.text()
    assert any(f.kind == "uncovered" for f in rep.findings)


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_q_len_1_metadata_used_with_q_len_2_is_named(planner: str) -> None:
    """The vLLM #45227 pattern: metadata sized for q_len 1 used for MTP verification (q_len 2)."""
    d = _meta(planner)
    d["qo_indptr"] = indptrs_for(LENS, 2)[0]
    rep = doctor(d)
    assert rep.findings[0].message.startswith("metadata for q_len 1 used with q_len 2"), rep.text()


def test_clean_plans_of_every_planner_target_and_200_ragged_batches() -> None:
    rng = random.Random(26)
    mixes = [
        lambda n: [rng.randint(1, 9000) for _ in range(n)],
        lambda n: [int(64 * rng.paretovariate(1.2)) for _ in range(n)],
        lambda n: [rng.choice([rng.randint(0, 200), rng.randint(20000, 70000)]) for _ in range(n)],
        lambda n: [100_000] + [rng.randint(1, 300) for _ in range(n - 1)],
    ]
    checked = 0
    for i in range(200):
        lens = mixes[i % len(mixes)](rng.randint(1, 48))
        q_len = rng.choice([1, 1, 2, 4])
        qo, kv = indptrs_for(lens, q_len)
        for planner in PLANNERS:
            for target in ("mi300x", "mi355x", "h200"):
                rep = doctor(make_plan(planner, qo, kv, target), qo, kv)
                assert rep.clean, (planner, target, lens, q_len, rep.text())
                checked += 1
    assert checked == 200 * len(PLANNERS) * 3


def test_file_round_trip_aiter_names_and_unreadable_input(tmp_path: Path) -> None:
    d = _meta("aiter-fast")
    buffers = {k: d[k] for k in ("work_indptr", "reduce_indptr", "reduce_final_map", "reduce_partial_map")}
    wi = d["work_info"].clone()
    wi[:, 7] = 12345  # aiter's pad dword is undefined: not a finding in a dump
    buffers["work_info_set"] = torch.cat([wi, torch.full((7, 8), -99, dtype=torch.int32)])  # buffer larger than plan
    path = dump_aiter_metadata(tmp_path / "a.pt", buffers, d["qo_indptr"], d["kv_indptr"], num_kv_splits=16)
    loaded = load_metadata(path)
    assert loaded["num_kv_splits"] == 16 and torch.equal(loaded["work_info"], buffers["work_info_set"])
    assert doctor(path).clean
    (tmp_path / "bad.pt").write_text("not a torch file")
    with pytest.raises(DoctorInputError, match="not a torch.save file"):
        doctor(tmp_path / "bad.pt")
    torch.save({"work_indptr": d["work_indptr"]}, tmp_path / "partial.pt")
    with pytest.raises(DoctorInputError, match="missing work_info"):
        doctor(tmp_path / "partial.pt")
    with pytest.raises(DoctorInputError, match="no such file"):
        doctor(tmp_path / "nope.pt")
    with pytest.raises(DoctorInputError, match="unknown keys"):
        save_metadata(tmp_path / "x.pt", {**d, "bogus": 1})


def test_cli_exit_codes(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlalab", *args], capture_output=True, text=True, timeout=120)

    good = tmp_path / "good.pt"
    assert run("plan", "--kv-lens", "700,33,2000", "--q-len", "2", "--save", str(good)).returncode == 0
    res = run("doctor", str(good))
    assert res.returncode == 0 and "clean" in res.stdout, res.stdout + res.stderr
    d = load_metadata(good)
    save_metadata(tmp_path / "bad.pt", _drop(d))
    res = run("doctor", str(tmp_path / "bad.pt"), "--json")
    assert res.returncode == 1, res.stderr
    rep = json.loads(res.stdout)
    assert not rep["clean"] and rep["counts"]["uncovered"] >= 1
    (tmp_path / "junk.pt").write_bytes(b"\x00junk")
    res = run("doctor", str(tmp_path / "junk.pt"))
    assert res.returncode == 2 and "not a torch.save file" in res.stderr and "Traceback" not in res.stderr

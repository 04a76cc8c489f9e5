"""The CLI as a user calls it (subprocess, like a shell)."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlalab", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_subcommands() -> None:
    r = _run("--help")
    assert r.returncode == 0
    assert "reference" in r.stdout


def test_reference_json_ragged_paged() -> None:
    r = _run(
        "reference",
        "--kv-lens",
        "3,700,900",
        "--q-len",
        "2",
        "--page-size",
        "16",
        "--seed",
        "1",
        "--dist",
        "unit",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["out_shape"] == [6, 16, 512] and rec["lse_shape"] == [6, 16]
    assert rec["kv_lens"] == [3, 700, 900] and rec["kv_buffer_shape"] == [1 + 44 + 57, 16, 1, 576]
    assert 0 < rec["out_rms"] < 1 and rec["lse_min"] <= rec["lse_mean"] <= rec["lse_max"]


def test_reference_bad_input_is_one_clear_line() -> None:
    r = _run("reference", "--batch", "0")
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = _run("reference", "--kv-lens", "4,x")
    assert r.returncode == 2 and "comma-separated integers" in r.stderr


def test_backends_lists_every_backend_with_a_reason() -> None:
    from mlalab.backends import BACKENDS

    r = _run("backends", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert set(rec) == set(BACKENDS)
    assert rec["reference"]["status"] == "available" and rec["emulated"]["status"] == "available"
    for name, v in rec.items():
        assert v["status"] == "available" or v["status"].startswith("unavailable: "), (name, v)

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


def test_every_subcommand_prints_its_help(capsys) -> None:  # noqa: ANN001
    """`--help` of each subcommand exits 0 and names its options (a stray '%' in a help text made argparse raise)."""
    import argparse

    import pytest

    from mlalab.__main__ import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"accuracy", "sweep", "bench", "explore", "doctor"} <= set(sub.choices)
    for name in sub.choices:
        with pytest.raises(SystemExit) as e:
            parser.parse_args([name, "--help"])
        assert e.value.code == 0 and "--" in capsys.readouterr().out, name


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


# --- malformed input is refused before any work (in process: argparse exits with 2 and names the argument) ---


def _main_error(capsys, *args: str) -> str:
    import pytest

    from mlalab.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_malformed_lists_are_refused_not_repaired(capsys) -> None:
    for bad in ("3,,5", "3,5,", ",3", "4,-1", ""):
        err = _main_error(capsys, "reference", "--kv-lens", bad)
        assert "--kv-lens" in err and ("empty item" in err or "non-negative" in err or "nothing" in err), (bad, err)
    err = _main_error(capsys, "bench", "--recorded", "--backends", "triton,,flashmla")
    assert "--backends" in err and "empty item" in err
    err = _main_error(capsys, "report", "--sections", "floor,,timings")
    assert "--sections" in err and "empty item" in err
    err = _main_error(capsys, "report", "--sections", "floor,timing")
    assert "unknown section(s) timing; known:" in err
    for cmd, flag, bad in (("sm90-build", "--paths", "v-regs,,v-tile"), ("sm90-build", "--reduce", "2,x"),
                           ("sweep", "--kv-len", "1024,,8192"), ("bench", "--q-lens", "1,,2")):  # fmt: skip
        err = _main_error(capsys, cmd, flag, bad)
        assert flag in err and ("empty item" in err or "integers" in err), (cmd, err)
    err = _main_error(capsys, "sm90-build", "--rows", "1,3")
    assert "--rows" in err and "each must be 1, 2 or 4, got 1,3" in err
    from mlalab.__main__ import main

    assert main(["explore", "--mixes", "uniform,,bimodal"]) != 0
    assert "mix list: empty item" in capsys.readouterr().err


def test_a_misspelt_decode_option_names_the_call_and_its_options(capsys) -> None:
    import pytest

    from mlalab import DecodeCase, make_inputs
    from mlalab.backends import decode

    x = make_inputs(DecodeCase.uniform(2, 64))
    with pytest.raises(TypeError, match=r"decode\(backend='emulated'\) has no option 'planer'; its options: planner"):
        decode(x, backend="emulated", planer="simple")
    with pytest.raises(TypeError, match=r"knobs of planner 'simple': .*block"):
        decode(x, backend="emulated", planner="simple", blok=64)
    out, _ = decode(x, backend="emulated", planner="simple", block=64)  # a valid knob still reaches the planner
    assert out.shape == (2, 16, 512)


def test_bench_recorded_table_says_its_unit(capsys) -> None:
    from mlalab.__main__ import main

    assert main(["bench", "--recorded"]) == 0
    out = capsys.readouterr().out
    assert "µs per call (median of the graph replays; columns: batch × kv_len):" in out


def test_a_command_whose_dependency_is_missing_names_it_and_the_others_run() -> None:
    """Without plotly (a bare GPU machine) `report` fails with one line naming it; `sweep` still parses."""
    code = "import sys; sys.modules['plotly'] = None; from mlalab.__main__ import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "report"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "'report' command needs the Python package 'plotly'" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", code, "sweep", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--kv-schemes" in r.stdout, r.stderr


def test_a_missing_module_of_mlalab_itself_is_not_called_an_optional_dependency() -> None:
    code = "import sys; sys.modules['mlalab.report'] = None; from mlalab.__main__ import main; main(['--help'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr and "unavailable" not in r.stdout, r.stderr


def test_bench_recorded_layout_costs(capsys) -> None:
    """`bench --recorded --layout-costs`: each layout's time over our contiguous time, per GPU; the flag alone
    (measuring) and with --run are refused."""
    from mlalab.__main__ import main

    assert main(["bench", "--recorded", "--layout-costs"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3:" in out and "vs_contiguous" in out and "tokens" in out
    assert main(["bench", "--layout-costs"]) == 2 and "add --recorded" in capsys.readouterr().err
    assert main(["bench", "--recorded", "--layout-costs", "--run", "x"]) == 2
    assert "no --run or --best-of-all" in capsys.readouterr().err

"""Accuracy studies: row keys, tasks, the resumable table (kill -9 and re-run), failed rows, foreign files, and the
executors (serial, local processes, a Dask LocalCluster, an unreachable scheduler, a worker that dies)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import mlalab.accuracy.grid as grid_mod
from mlalab.__main__ import main as cli
from mlalab.accuracy import (
    AGREEMENT_RTOL,
    ForeignOutputError,
    Grid,
    compare_tables,
    parse_shapes,
    read_table,
    sweep,
)
from mlalab.accuracy.executors import open_runner
from mlalab.config import DecodeCase

ROOT = Path(__file__).resolve().parents[1]
CASES = [DecodeCase.uniform(1, 32, seed=s) for s in range(4)]
QS, KVS = ("bf16", "fp8-tensor"), ("bf16", "nvfp4")
RUN = ["run_id", "eval_seconds"]  # describe the run, not the result


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Row for row: same keys in the same order, every result column equal to 1e-12 and text equal."""
    assert list(a.row_key) == list(b.row_key)
    cmp = compare_tables(a, b)
    assert cmp.max_rel_diff.max() <= 1e-12 and cmp.text_equal.all(), cmp[cmp.max_rel_diff > 0].head()


@pytest.fixture(scope="module")
def serial() -> pd.DataFrame:
    return sweep(CASES, QS, KVS, progress=False)


def test_keys_follow_every_part_of_the_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    g = Grid(CASES[:1], QS, KVS)
    assert len(set(g.keys)) == len(g) == 4
    assert Grid(CASES[:1], QS, KVS).keys == g.keys  # stable
    assert set(Grid(DecodeCase.uniform(1, 32, seed=9), QS, KVS).keys).isdisjoint(g.keys)
    assert set(Grid(DecodeCase.uniform(1, 32, dist="unit"), QS, KVS).keys).isdisjoint(g.keys)
    assert set(Grid(CASES[:1], QS, KVS, tolerances=[(0.1, 0.1)]).keys).isdisjoint(g.keys)
    assert set(Grid(CASES[:1], QS, KVS, "e4m3fnuz").keys).isdisjoint(g.keys)
    monkeypatch.setattr(grid_mod, "__version__", "0.0.9")
    assert set(Grid(CASES[:1], QS, KVS).keys).isdisjoint(g.keys)  # the library version is part of the key


def test_tasks_cover_every_row_once_and_respect_chunk_rows() -> None:
    g = Grid(CASES[:2], ["bf16", "fp8-tensor", "fp8-token"], KVS, ["e4m3fn", "e4m3fnuz"])
    assert len(g) == 2 * 2 * 2 * 3 and len(g.tasks()) == 2  # one task per case by default
    for n in (1, 2, 3, 5, 100):
        tasks = g.tasks(chunk_rows=n)
        keys = [k for t in tasks for k in t.keys]
        assert sorted(keys) == sorted(g.keys) and all(len(t.rows) <= n for t in tasks)
    three = g.tasks(chunk_rows=3)
    assert all(len({(r.fp8_format, r.kv_scheme) for r in t.rows}) == 1 for t in three)  # whole Q groups
    assert len(g.tasks(g.keys[:5])) == 1
    with pytest.raises(ValueError, match="chunk_rows"):
        g.tasks(chunk_rows=0)
    with pytest.raises(ValueError, match="not rows"):
        g.tasks(["nope"])
    with pytest.raises(ValueError, match="repeat"):
        Grid([CASES[0], CASES[0]])
    assert parse_shapes("competition,256x1024")[-1] == (256, 1024) and len(parse_shapes("competition")) == 12
    for bad in ("4x", "x8", "4,,8", "", "4*1024"):
        with pytest.raises(ValueError, match="shape"):
            parse_shapes(bad)
    # the size estimate: 2 cases x 2 formats x 2 KV x 3 Q = 24 decodes + 2 references, 16 heads, 32 tokens
    assert g.fp64_gflop() == pytest.approx((24 + 2) * 16 * 32 * 2 * (576 + 512) / 1e9)


def test_resume_skips_finished_rows_and_retries_failed_ones(tmp_path: Path, serial: pd.DataFrame) -> None:
    out = tmp_path / "s.csv"

    class Stop(Exception):
        pass

    def stop_after_two(done: int, total: int) -> None:
        if done >= 8:
            raise Stop

    with pytest.raises(Stop):
        sweep(CASES, QS, KVS, progress=False, out=out, on_chunk=stop_after_two)
    assert not out.exists() and len(list((tmp_path / "s.csv.parts").glob("chunk-*.csv"))) == 2
    df = sweep(CASES, QS, KVS, progress=False, out=out)
    assert df.attrs["sweep"] | {"seconds": 0, "run_id": 0} == {
        "rows": 16,
        "skipped": 8,
        "computed": 8,
        "failed": 0,
        "left": 0,
        "seconds": 0,
        "run_id": 0,
    }
    assert (df.run_id == df.attrs["sweep"]["run_id"]).sum() == 8  # the table says which run computed each row
    _same(df, serial)
    back = read_table(out)  # lossless: the file holds exactly the returned table
    pd.testing.assert_frame_equal(back, df, check_dtype=False, check_exact=True)
    assert not (tmp_path / "s.csv.parts").exists()
    again = sweep(CASES, QS, KVS, progress=False, out=out)
    assert again.attrs["sweep"]["computed"] == 0 and again.attrs["sweep"]["skipped"] == 16


def test_a_time_limit_stops_cleanly_and_the_next_run_goes_on(tmp_path: Path, serial: pd.DataFrame) -> None:
    out = tmp_path / "t.csv"
    rc = cli(["sweep", "--batch", "1", "--kv-len", "32", "--seed", "0,1,2,3", "--q-schemes", ",".join(QS)]
             + ["--kv-schemes", ",".join(KVS), "--no-progress", "--time-limit", "1e-9", "--out", str(out)])  # fmt: skip
    first = read_table(out)  # the whole table written, no chunks left behind
    assert rc == 3 and len(first) == 4 and not (tmp_path / "t.csv.parts").exists()
    df = sweep(CASES, QS, KVS, progress=False, out=out)
    assert df.attrs["sweep"]["skipped"] == 4 and df.attrs["sweep"]["computed"] == 12
    _same(df, serial)
    with pytest.raises(ValueError, match="time_limit"):
        sweep(CASES, QS, KVS, progress=False, time_limit=0)


def test_a_time_limit_writes_the_table_before_the_workers_are_closed(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A caller's own deadline (`timeout` around a device call) may kill the sweep while it closes its workers: the
    finished rows must be in `out` by then."""
    from mlalab.accuracy import executors

    out, seen = tmp_path / "w.csv", []
    real_close = executors.Runner.close

    def close(self: executors.Runner) -> None:
        seen.append(len(read_table(out)) if out.exists() else 0)
        real_close(self)

    monkeypatch.setattr(executors.Runner, "close", close)
    df = sweep(CASES, QS, KVS, progress=False, out=out, time_limit=1e-9)
    assert seen == [4] and len(df) == 4 and df.attrs["sweep"]["left"] == 12


def test_abandon_ends_a_process_pool_without_waiting_for_its_task() -> None:
    runner = open_runner("processes:1")
    runner._pool.submit(time.sleep, 600)  # a task that would hold the pool for 10 minutes
    time.sleep(2)  # (the worker has started it)
    t0 = time.perf_counter()
    runner.abandon()
    runner.close()
    assert time.perf_counter() - t0 < 60


def test_a_failing_case_is_recorded_with_its_error_and_retried(tmp_path: Path) -> None:
    huge = DecodeCase.uniform(1, 10**10)  # make_inputs refuses it (TooLargeError): a real failure in the task
    out = tmp_path / "f.csv"
    df = sweep([CASES[0], huge], "bf16", KVS, progress=False, out=out)
    bad = df[df.error != ""]
    assert len(df) == 4 and len(bad) == 2 and set(bad.case) == {huge.short_str()}
    assert bad.error.str.contains("TooLargeError").all() and bad.rel_l2.isna().all()
    assert df.attrs["sweep"]["failed"] == 2
    again = sweep([CASES[0], huge], "bf16", KVS, progress=False, out=out)
    assert again.attrs["sweep"] | {"seconds": 0, "run_id": 0} == {
        "rows": 4,
        "skipped": 2,
        "computed": 0,
        "failed": 2,  # retried, failed again, still recorded
        "left": 2,
        "seconds": 0,
        "run_id": 0,
    }


def test_foreign_output_is_refused_and_left_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.csv"
    sweep(CASES[:1], QS, KVS, progress=False, out=out)
    before = out.read_bytes()
    with pytest.raises(ForeignOutputError, match="different grid"):
        sweep(CASES[:1], QS, ["bf16"], ["e4m3fnuz"], progress=False, out=out)
    monkeypatch.setattr(grid_mod, "__version__", "9.9.9")
    with pytest.raises(ForeignOutputError, match=r"mlalab 0\.1\.0 \(this is 9\.9\.9\)|written by mlalab"):
        sweep(CASES[:1], QS, KVS, progress=False, out=out)
    monkeypatch.undo()
    assert out.read_bytes() == before and not (tmp_path / "x.csv.parts").exists()
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ForeignOutputError, match="no row_key"):
        sweep(CASES[:1], QS, KVS, progress=False, out=other)
    assert other.read_text() == "a,b\n1,2\n"
    rc = cli(["sweep", "--kv-len", "32", "--batch", "1", "--no-progress", "--out", str(other)])
    assert rc == 2 and "not an mlalab sweep table" in capsys.readouterr().err
    df = sweep(CASES[:1], QS, KVS, progress=False, out=other, overwrite=True)  # explicit overwrite
    assert len(read_table(other)) == len(df) == 4


def test_cli_checks_out_before_any_work_and_estimates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    assert cli(["sweep", "--kv-len", "8192", "--batch", "64", "--out", str(tmp_path / "big.txt")]) == 2
    assert time.perf_counter() - t0 < 2 and ".csv or .parquet" in capsys.readouterr().err
    assert cli(["sweep", "--dist", "competition,,unit", "--estimate"]) == 2
    assert "empty items" in capsys.readouterr().err
    rc = cli(
        ["sweep", "--shapes", "competition,256x1024", "--dist", "all", "--seed", "0,1,2"]
        + ["--q-schemes", "all", "--kv-schemes", "all", "--fp8-formats", "e4m3fn,e4m3fnuz", "--estimate"]
    )
    assert rc == 0
    assert capsys.readouterr().out.startswith("30888 rows (156 cases x 2 fp8 formats x 11 KV x 9 Q schemes), 156 tasks")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_scheduler_is_a_clear_error_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("distributed")
    import mlalab.accuracy.executors as ex

    monkeypatch.setattr(ex, "CONNECT_TIMEOUT_S", 1)
    out = tmp_path / "u.csv"
    sweep(CASES[:2], QS, KVS, progress=False, out=out)
    sweep_args = dict(progress=False, out=out, executor=f"tcp://127.0.0.1:{_free_port()}")
    before = out.read_bytes()
    with pytest.raises(ConnectionError, match="could not reach the Dask scheduler .* Nothing was computed"):
        sweep(CASES, QS, KVS, **sweep_args)  # type: ignore[arg-type]
    assert out.read_bytes() == before
    rc = cli(["sweep", "--batch", "1", "--kv-len", "32", "--scheduler", f"tcp://127.0.0.1:{_free_port()}"])
    assert rc == 2 and "could not reach the Dask scheduler" in capsys.readouterr().err
    with pytest.raises(ValueError, match="positive worker count"):
        open_runner("local:0")


@pytest.mark.slow
def test_local_cluster_of_two_workers_equals_serial(serial: pd.DataFrame) -> None:
    pytest.importorskip("distributed")
    logs: list[str] = []
    df = sweep(CASES, QS, KVS, progress=False, executor="local:2", chunk_rows=2, log=logs.append)
    _same(df, serial)
    assert any("local: 2 worker(s)" in m and "1 torch thread(s) each" in m for m in logs), logs


@pytest.mark.slow
def test_local_processes_equal_serial(serial: pd.DataFrame) -> None:
    df = sweep(CASES, QS, KVS, progress=False, executor="processes:2")
    _same(df, serial)


@pytest.mark.slow
def test_a_dying_worker_loses_only_its_rows_which_the_next_run_computes(tmp_path: Path, serial: pd.DataFrame) -> None:
    """A worker process is killed (os._exit) while it runs a task; with no retries allowed the task's rows are
    recorded as failed (KilledWorker), the rest of the sweep completes, and the next run computes only them."""
    distributed = pytest.importorskip("distributed")
    import dask

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        killed: list[str] = []

        def kill_a_busy_worker(done: int, total: int) -> None:
            if killed:
                return
            busy = [w for w, keys in client.processing().items() if keys]
            if busy:
                killed.append(busy[0])
                with contextlib.suppress(Exception):  # the worker's connection drops as it exits
                    client.run(os._exit, 1, workers=[busy[0]])

        cases = [DecodeCase.uniform(1, 256, seed=s) for s in range(8)]
        out = tmp_path / "d.csv"
        df = sweep(cases, QS, KVS, progress=False, out=out, executor=client, on_chunk=kill_a_busy_worker)
    assert killed, "no worker was busy to kill (the test did not exercise a death)"
    lost = df[df.error != ""]
    assert len(df) == 32 and 0 < len(lost) < 32, df.error.value_counts()
    assert lost.error.str.contains("KilledWorker").all() and lost.error.str.contains("worker died").all()
    again = sweep(cases, QS, KVS, progress=False, out=out)
    assert again.attrs["sweep"]["computed"] == len(lost) and again.attrs["sweep"]["skipped"] == 32 - len(lost)
    _same(again, sweep(cases, QS, KVS, progress=False))


@pytest.mark.slow
def test_kill_9_midway_then_rerun_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    seeds = list(range(10))
    args = ["--batch", "2", "--kv-len", "512", "--seed", ",".join(map(str, seeds)), "--chunk-rows", "3"]
    args += ["--q-schemes", "bf16,fp8-tensor,fp8-token", "--kv-schemes", "bf16,fp8-tensor,nvfp4", "--no-progress"]
    out = tmp_path / "k.csv"
    cmd = [sys.executable, "-m", "mlalab", "sweep", *args, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parts = tmp_path / "k.csv.parts"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(parts.glob("chunk-*.csv"))) < 3 and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    on_disk = pd.concat([read_table(p) for p in parts.glob("chunk-*.csv")])
    assert 0 < len(on_disk) < 90 and on_disk.row_key.is_unique
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    final = read_table(out)
    computed = final[~final.run_id.isin(set(on_disk.run_id))]  # rows the re-run wrote
    assert len(final) == 90 and len(computed) == 90 - len(on_disk), "the re-run recomputed rows already on disk"
    assert f"{len(on_disk)} already done, {len(computed)} computed" in r.stdout
    whole = sweep(
        [DecodeCase.uniform(2, 512, seed=s) for s in seeds],
        ["bf16", "fp8-tensor", "fp8-token"],
        ["bf16", "fp8-tensor", "nvfp4"],
        progress=False,
    )
    _same(final, whole)


def test_tables_agree_to_the_scale_of_what_each_error_measures(serial: pd.DataFrame) -> None:
    """Two fp64 evaluations agree when their results do: an error column is compared in the units of its quantity
    (an exact scheme's LSE error, 0.0 on one device, 1e-15 on another, is noise), any other column relative to
    itself; a real difference in any of them is still a disagreement."""
    b = serial.copy()
    exact = (b.q_scheme == "bf16") & (b.kv_scheme == "bf16")
    b.loc[exact, "lse_max_abs_err"] += 1e-15
    b["rel_l2"] += 1e-16
    b["max_abs"] += 1e-15 * b["ref_max_abs"]
    b["sqnr_db"] = -20 * np.log10(b["rel_l2"])
    assert compare_tables(serial, b).max_rel_diff.max() <= AGREEMENT_RTOL
    for col, bump in (("rel_l2", 1e-10), ("lse_max_abs_err", 1e-10), ("ref_rms", 1e-11), ("sqnr_db", 1e-6)):
        c = serial.copy()
        c.loc[c.index[1], col] += bump
        cmp = compare_tables(serial, c)
        assert cmp.max_rel_diff.max() > AGREEMENT_RTOL and cmp.worst_column.iloc[1] == col, col


@pytest.mark.gpu
def test_gpu_evaluation_equals_the_cpu() -> None:
    from mlalab.accuracy import device_agreement
    from mlalab.quant import KV_SCHEMES, Q_SCHEMES, concrete_names

    cases = [DecodeCase.uniform(4, 1024, dist=d) for d in ("competition", "unit", "outliers", "heavy-tail")]
    qs, kvs = concrete_names(Q_SCHEMES), concrete_names(KV_SCHEMES)
    res = device_agreement(cases, qs, kvs, ["e4m3fn", "e4m3fnuz"], device="cuda")
    # (on failure: where each case differs, whole; a DataFrame's repr cuts these columns)
    why = res[["case", "failed_rows", "max_rel_diff", "worst_column", "text_columns_equal"]].to_string()
    assert res.agree.all() and res.max_rel_diff.max() <= AGREEMENT_RTOL, why
    assert torch.cuda.is_available()


def test_two_sweeps_never_write_one_output_at_once(tmp_path) -> None:
    """A second sweep into an output another sweep is writing stops before any work with a clear message; once the
    first is done (or its process is gone: the OS drops the lock) the output is free again."""
    from mlalab.accuracy import OutputBusyError, ResultStore
    from mlalab.accuracy.grid import Grid
    from mlalab.config import DecodeCase

    out = tmp_path / "s.csv"
    grid = Grid([DecodeCase(kv_lens=(16,))], ("bf16",), ("bf16",), ("e4m3fn",), ((2e-2, 8e-3),))
    first = ResultStore(out, grid)
    with pytest.raises(OutputBusyError, match="another sweep is writing .*s.csv"):
        ResultStore(out, grid)
    first.close()
    ResultStore(out, grid).close()  # free again


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_keys_and_run_ids_of_decimal_digits_stay_text(tmp_path: Path, suffix: str) -> None:
    """A row key or run id is hex; one in every ~280 run ids ("660451655509") and a few keys of a 30,888-row study
    are all decimal digits. Read back from a chunk as numbers they would match no key (the rows recomputed, a
    resume test failing at random) or lose leading zeros: they come back as the text written."""
    from mlalab.accuracy.store import read_table, save_table

    keys = ["01234567890123456789", "12345678901234567890"]
    df = pd.DataFrame({"row_key": keys, "run_id": ["660451655509"] * 2, "error": ["", ""], "rel_l2": [0.5, 0.25]})
    back = read_table(save_table(df, tmp_path / f"t{suffix}"))
    assert back.row_key.tolist() == keys and back.run_id.tolist() == ["660451655509"] * 2
    assert back.error.tolist() == ["", ""] and back.rel_l2.tolist() == [0.5, 0.25]

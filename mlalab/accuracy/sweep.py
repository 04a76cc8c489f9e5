"""`sweep`: every row of a `Grid` evaluated on an executor, with a progress bar and (given `out`) a resumable,
lossless table on disk; `device_agreement`: the same rows on the CPU and on a GPU, compared and timed."""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd
import torch

from ..config import DecodeCase
from .executors import open_runner
from .grid import Grid, Task, failed_row
from .metrics import DEFAULT_TOLERANCES, check_device
from .store import ResultStore, _normalise, check_output_path, save_table

__all__ = ["sweep", "device_agreement", "AGREEMENT_RTOL", "ERROR_SCALES", "compare_tables"]

AGREEMENT_RTOL = 1e-12  # CPU and GPU fp64 evaluations must agree to this relative difference
#: Error columns, compared in the units of what they measure rather than relative to themselves: fp64 results that
#: agree to 1e-12 give errors that agree to 1e-12 of the quantity's scale, and an error near zero (an exact scheme's
#: LSE error is 0.0 on one device and 1e-15 on another) is pure rounding noise relative to itself. The value names
#: the row's column holding the scale, or 1.0 for dimensionless errors (relative to the reference) and LSE units.
ERROR_SCALES: dict[str, str | float] = {
    "max_abs": "ref_max_abs",
    "rel_l2": 1.0,
    "max_abs_over_ref_rms": 1.0,
    "lse_max_abs_err": 1.0,
    "meanv_rel_l2": 1.0,
    "halfkv_rel_l2": 1.0,
}
#: Columns that describe the run, not the result (excluded when comparing tables).
RUN_COLUMNS = ("run_id", "eval_seconds", "device", "torch_version")


def _check_device_name(device: str | torch.device, local: bool) -> str:
    d = str(device)
    if local:
        return str(check_device(d))
    if d != "cpu" and not d.startswith("cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    return d


def sweep(
    cases: DecodeCase | Sequence[DecodeCase],
    q_schemes: str | Sequence[str] = ("bf16",),
    kv_schemes: str | Sequence[str] = ("bf16",),
    fp8_formats: str | Sequence[str] = ("e4m3fn",),
    *,
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    progress: bool | None = None,
    device: str | torch.device = "cpu",
    executor: object = "serial",
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    chunk_rows: int | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
    time_limit: float | None = None,
    log: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Every (case × fp8 format × KV scheme × Q scheme) as one row, in that order.

    `device`: where quantization and the fp64 decode run (inputs are drawn on the CPU from each case's seed).
    `executor`: "serial" (default), "processes:N", "local:N" (a Dask LocalCluster), a Dask scheduler address or a
    `distributed.Client` (see `mlalab.accuracy.executors`). `chunk_rows`: most rows per task (default: one task per
    case). `progress` None shows a bar for grids over 8 rows. `on_chunk(done, total)` is called after each task;
    `log` receives one-line notes (executor, resume, failures; default: none). `time_limit` (seconds): take no
    new task's results after it and stop, ending the tasks in flight (a process pool's workers) rather than waiting
    for them; the rows done so far are written first (a bounded call, e.g. on a lent GPU).

    With `out` (.csv or .parquet): rows already there are skipped, each finished task is appended atomically to
    ``<out>.parts/`` and the whole table is written to `out` at the end; a row whose evaluation raised is kept
    with its ``error`` and retried by the next run; a file of another grid or mlalab version is refused
    (`ForeignOutputError`) unless `overwrite`. Every row carries ``row_key``, ``error``, ``run_id`` (this call's),
    ``eval_seconds`` and ``device``. ``df.attrs["sweep"]`` says how many rows were skipped, computed and failed.
    """
    say = log or (lambda _m: None)
    if time_limit is not None and not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"time_limit must be a positive number of seconds or None, got {time_limit!r}")
    grid = Grid(cases, q_schemes, kv_schemes, fp8_formats, tolerances)  # validates every name first
    spec = executor.strip() if isinstance(executor, str) else ""
    local = isinstance(executor, str) and (spec in ("", "serial") or spec.startswith("processes"))
    dev = _check_device_name(device, local)
    store = ResultStore(out, grid, overwrite=overwrite) if out is not None else None
    have = store.load() if store is not None else pd.DataFrame()
    done = set(have.row_key[have.error == ""]) if len(have) else set()
    todo = [k for k in grid.keys if k not in done]
    if store is not None and len(have):
        retry = int((have.error != "").sum())
        say(f"resuming {store.path}: {len(done)} of {len(grid)} rows done, {len(todo)} to compute ({retry} failed)")
    run_id = uuid.uuid4().hex[:12]
    t0 = time.perf_counter()
    new: list[dict[str, Any]] = []
    failed = 0
    try:
        if todo:
            tasks = grid.tasks(todo, chunk_rows)
            with open_runner(executor) as runner:
                say(f"executor: {runner.describe()}; {len(tasks)} tasks, device {dev}")
                if runner.dashboard_link:
                    say(f"Dask dashboard: {runner.dashboard_link}")
                bar = None
                if progress or (progress is None and len(grid) > 8):
                    from tqdm.auto import tqdm

                    bar = tqdm(total=len(grid), initial=len(done), desc="accuracy sweep", unit="row", leave=False)
                try:
                    for task, res in runner.run(tasks, grid.tolerances, dev):
                        recs = _records(task, res)
                        for r in recs:
                            r["run_id"] = run_id
                        failed += sum(1 for r in recs if r["error"])
                        if store is not None:
                            store.append(recs)
                        new.extend(recs)
                        if bar is not None:
                            bar.update(len(recs))
                        if on_chunk is not None:
                            on_chunk(len(done) + len(new), len(grid))
                        if time_limit is not None and time.perf_counter() - t0 > time_limit:
                            say(f"time limit of {time_limit:g} s reached: stopping; the rows done so far are kept")
                            runner.abandon()  # tasks in flight are not waited for (their rows: the next run)
                            break
                finally:
                    if bar is not None:
                        bar.close()
                # the table is written before the runner closes, so a caller's own deadline loses no finished row
                df = _table(have, new, grid, store)
        else:
            df = _table(have, new, grid, store)
    finally:
        if store is not None:
            store.close()
    left = len(grid) - int((df.error == "").sum()) if len(df) else len(grid)
    if left:
        say(f"{left} rows not done yet (failed or not reached): run the same command again to compute them")
    if failed:
        say(f"{failed} rows failed (kept with their error; run the same command again to retry them)")
    df.attrs["sweep"] = {
        "rows": len(grid),
        "skipped": len(done),
        "computed": len(new) - failed,
        "failed": failed,
        "left": left,
        "seconds": time.perf_counter() - t0,
        "run_id": run_id,
    }
    return df


def _table(have: pd.DataFrame, new: list[dict[str, Any]], grid: Grid, store: ResultStore | None) -> pd.DataFrame:
    """The rows of the output before this run and of this run, one per row key (a finished row over a failed one),
    in the grid's order; written to `store` (atomically) when this run added rows."""
    frames = [f for f in (have, _normalise(pd.DataFrame(new)) if new else None) if f is not None and len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(df):
        ok = df.error == ""
        df = df.assign(_ok=ok.to_numpy(), _pos=range(len(df))).sort_values(["_ok", "_pos"])
        df = df.drop_duplicates("row_key", keep="last")
        df = df.assign(_order=[grid.index(k) for k in df.row_key]).sort_values("_order")
        df = df.drop(columns=["_ok", "_pos", "_order"]).reset_index(drop=True)
    if store is not None and new:
        store.finish(df)
    return df


def _records(task: Task, res: list[dict[str, Any]] | BaseException) -> list[dict[str, Any]]:
    if not isinstance(res, BaseException):
        return res
    name = type(res).__name__
    why = "a worker died while running it" if name in ("KilledWorker", "BrokenProcessPool") else "the task was lost"
    err = f"{name}: {why} ({res})".replace("\n", " ")
    return [failed_row(r, k, err) for r, k in zip(task.rows, task.keys)]


def _column_diff(c: str, x: float, y: float, row: pd.Series) -> float:
    """Relative difference of one result column between two evaluations of the same row (0.0 when equal)."""
    if (math.isnan(x) and math.isnan(y)) or x == y:
        return 0.0
    if not (math.isfinite(x) and math.isfinite(y)):
        return math.inf
    if c == "sqnr_db":  # compared as the rel-L2 it is computed from
        return _column_diff("rel_l2", 10 ** (-x / 20), 10 ** (-y / 20), row)
    scale = ERROR_SCALES.get(c, 0.0)
    if isinstance(scale, str):
        scale = abs(float(row[scale]))
    return abs(x - y) / max(abs(x), abs(y), scale)


def compare_tables(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Row-by-row comparison of two sweep tables over their result columns: per row_key, the largest relative
    difference ``|x - y| / max(|x|, |y|)`` of any numeric column (NaN == NaN, inf == inf; error columns measured
    against their quantity's scale, `ERROR_SCALES`; SQNR through its rel-L2), that column, and whether the text
    columns agree. Raises if the tables do not hold the same keys."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, pd.DataFrame) or "row_key" not in t:
            raise ValueError(f"{name} must be a sweep table (a DataFrame with a row_key column)")
    if set(a.row_key) != set(b.row_key) or len(a) != len(b):
        raise ValueError("the tables hold different rows (row_key sets differ)")
    bb = b.set_index("row_key").loc[a.row_key]
    aa = a.set_index("row_key")
    cols = [c for c in aa.columns if c in bb.columns and c not in RUN_COLUMNS]
    rows = []
    for key in aa.index:
        worst, where, text_ok = 0.0, "", True
        ra = aa.loc[key]
        for c in cols:
            x, y = aa.at[key, c], bb.at[key, c]
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
                d = _column_diff(c, float(x), float(y), ra)
                if d > worst:
                    worst, where = d, c
            elif str(x) != str(y):
                text_ok, where = False, c
        rows.append({"row_key": key, "max_rel_diff": worst, "worst_column": where, "text_equal": text_ok})
    return pd.DataFrame(rows)


def device_agreement(
    cases: Sequence[DecodeCase],
    q_schemes: str | Sequence[str],
    kv_schemes: str | Sequence[str],
    fp8_formats: str | Sequence[str] = ("e4m3fn",),
    *,
    device: str = "cuda",
    tolerances: Iterable[tuple[float, float]] = DEFAULT_TOLERANCES,
    out: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Each case's rows evaluated serially on the CPU and on `device`, timed (a warm-up on `device` first) and
    compared: one row per case with rows, seconds and rows/s on each side, the speed-up, the device's fp64 decode
    rate (GFLOP/s, to scale a study's `Grid.fp64_gflop` into hours), the largest relative
    difference of any result column (must be <= AGREEMENT_RTOL) and where it is. Written to `out` if given."""
    dest = check_output_path(out) if out is not None else None
    dev = str(check_device(device))
    cs = tuple(cases)
    Grid(cs, q_schemes, kv_schemes, fp8_formats, tolerances)  # validate before any work
    sweep(DecodeCase.uniform(1, 16), "bf16", "bf16", progress=False, device=dev)  # warm-up (CUDA context, kernels)
    rows = []
    for c in cs:
        timed = {}
        for d in ("cpu", dev):
            if d.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            df = sweep(c, q_schemes, kv_schemes, fp8_formats, tolerances=tolerances, progress=progress, device=d)
            if d.startswith("cuda"):
                torch.cuda.synchronize()
            timed[d] = (df, time.perf_counter() - t0)
        (a, ta), (b, tb) = timed["cpu"], timed[dev]
        cmp = compare_tables(a, b)
        worst = cmp.loc[cmp.max_rel_diff.idxmax()]
        errors = int((a.error != "").sum() + (b.error != "").sum())
        rows.append(
            {
                "case": c.short_str(),
                "batch": c.batch,
                "kv_len": c.kv_lens[0],
                "rows": len(a),
                "failed_rows": errors,
                "cpu_seconds": ta,
                "device_seconds": tb,
                "cpu_rows_per_s": len(a) / ta,
                "device_rows_per_s": len(b) / tb,
                "speedup": ta / tb,
                "device_fp64_gflop_per_s": Grid(c, q_schemes, kv_schemes, fp8_formats, tolerances).fp64_gflop() / tb,
                "max_rel_diff": float(cmp.max_rel_diff.max()),
                "worst_column": worst.worst_column,
                "text_columns_equal": bool(cmp.text_equal.all()),
                "agree": bool(cmp.max_rel_diff.max() <= AGREEMENT_RTOL and cmp.text_equal.all() and not errors),
                "device": dev,
                "device_name": torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu",
                "cpu_threads": torch.get_num_threads(),
                "torch_version": torch.__version__,
            }
        )
    res = pd.DataFrame(rows)
    if dest is not None:
        save_table(res, dest)
    return res

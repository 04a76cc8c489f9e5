"""Recorded timing runs (data/timings/*.csv, data/layouts/*.csv): load them, pick what a view shows (one run with
Triton at its default configuration, or the fastest row per shape over every run), the tables and headline numbers of
a view, and what each decode layout costs against our contiguous cache (`layout_costs`).

A view is what every table, figure, CLI summary and the report show, so they all agree: `recorded_view` -> a
`RecordedView` (its rows, the files read, a label saying how they were picked).
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..config import COMPETITION_SHAPES
from ..io import natural_key
from ..plan import WorkPlan, indptrs_for, make_plan
from ..quant.precision import CORE_PRECISIONS
from .schema import ACCURACY_PENDING, CSV_COLUMNS, DATA_ROOT, is_default_config, parse_config

__all__ = ["TIMINGS_DIR", "LAYOUTS_DIR", "DEFAULT_PLANNER", "load_recorded", "with_case_columns", "case_rows",
           "default_run",
           "RecordedView", "recorded_view", "as_view", "series_rows", "best_per_shape", "speedup_table",
           "winners_table", "headline", "fastest_record", "record_for_shape", "plan_of_record", "plan_check",
           "REFERENCE_GPU", "full_runs",
           "PRE_ONE_WAVE_RUNS", "LAYOUT_GOALS", "layout_costs", "layout_costs_by_gpu"]  # fmt: skip

TIMINGS_DIR = os.path.join(DATA_ROOT, "timings")
#: Timings of other decode layouts (q_len > 1, paged caches, token tables) against our contiguous cache and the peers:
#: partial runs (a few shapes or backends), read beside `TIMINGS_DIR` by the timing panel.
LAYOUTS_DIR = os.path.join(DATA_ROOT, "layouts")

#: The planner the Triton backend uses when none is given (`mlalab.backends.triton.make_callable`).
DEFAULT_PLANNER = "simple"
#: The GPU whose runs the default views show (the one the README's headline quotes). Runs on another GPU (files named
#: h100_...) are shown when asked for: `run=` names one, `gpu=` picks best of all over that GPU's runs. No view mixes
#: GPUs: times on different memory systems are not comparable.
REFERENCE_GPU = "NVIDIA H200"
# A run is a full suite run when Triton's default rows and at least one peer's cover every competition shape.
_PEERS = ("flashmla", "flashinfer", "reference-torch", "aiter")
_KEY = ["backend", "precision", "batch", "kv_len"]


def load_recorded(data_dir: str | Sequence[str] = TIMINGS_DIR) -> pd.DataFrame:
    """All recorded timing CSVs of `data_dir` (a folder, or several: e.g. ``(TIMINGS_DIR, LAYOUTS_DIR)``), timed rows
    only (status 'ok', or 'accuracy pending': a suite stopped between its timing and accuracy passes; their error
    columns are NaN), with a `run` column (file name)."""
    dirs = [data_dir] if isinstance(data_dir, str) else data_dir
    if not isinstance(dirs, (list, tuple)) or not dirs or not all(isinstance(d, str) for d in dirs):
        raise TypeError(f"data_dir must be a folder path (str) or a list / tuple of them, got {data_dir!r}")
    found = [f for d in dirs for f in glob.glob(os.path.join(d, "*.csv"))]
    files = sorted(found, key=lambda f: natural_key(os.path.basename(f)))
    if not files:
        raise FileNotFoundError(f"no timing CSVs under {', '.join(dirs)}")
    names = [os.path.basename(f) for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"two folders of {', '.join(dirs)} hold a CSV of the same name (runs are named by file)")
    dfs = [with_case_columns(pd.read_csv(f)).assign(run=os.path.basename(f)) for f in files]
    df = pd.concat(dfs, ignore_index=True)
    return df[df["status"].isin(["ok", ACCURACY_PENDING])].copy()


def with_case_columns(d: pd.DataFrame) -> pd.DataFrame:
    """Runs recorded before the `q_len` / `causal` / `layout` columns timed q_len 1 without a mask on a contiguous
    cache."""
    if "q_len" not in d.columns:
        d = d.assign(q_len=1)
    if "causal" not in d.columns:
        d = d.assign(causal=False)
    if "layout" not in d.columns:
        d = d.assign(layout="contiguous")
    d = d.fillna({"q_len": 1, "causal": False, "layout": "contiguous"}).astype({"q_len": int})
    d = d.assign(causal=d["causal"].map(lambda v: str(v).strip().lower() in ("true", "1")))
    return d[[c for c in CSV_COLUMNS if c in d.columns] + [c for c in d.columns if c not in CSV_COLUMNS]]


def case_rows(df: pd.DataFrame, q_len: int = 1, layout: str = "contiguous", causal: bool = False) -> pd.DataFrame:
    """The rows of one decode layout: `q_len` query rows per request, under the causal mask or not, KV in `layout`
    (`mlalab.timing.LAYOUTS`)."""
    if isinstance(q_len, bool) or not isinstance(q_len, int) or q_len < 1:
        raise ValueError(f"q_len must be an int >= 1, got {q_len!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type(layout).__name__}")
    d = with_case_columns(df)
    return d[(d["q_len"] == q_len) & (d["layout"] == layout) & (d["causal"] == causal)]


def _check_df(df: object) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame of timing records, got {type(df).__name__}")
    missing = [c for c in ("run", *_KEY, "us_median", "config", "planner") if c not in df.columns]
    if missing:
        raise ValueError(f"df lacks the columns {missing} (use load_recorded())")
    return df


def _default_rows(d: pd.DataFrame, planner: str | None) -> pd.DataFrame:
    """Peers as recorded; Triton only its default config with `planner` (default: the backend's default)."""
    tr = d["backend"] == "triton"
    q_lens = d["q_len"] if "q_len" in d else pd.Series(1, index=d.index)
    ok = [is_default_config(c, s, int(q)) for c, s, q in zip(d["config"], d["sm_count"], q_lens)] if len(d) else []
    keep = ~tr | (pd.Series(ok, index=d.index, dtype=bool) & (d["planner"] == (planner or DEFAULT_PLANNER)))
    return d[keep]


def _covers_suite(d: pd.DataFrame, backend: str) -> bool:
    shapes = set(zip(d.loc[d["backend"] == backend, "batch"], d.loc[d["backend"] == backend, "kv_len"]))
    return set(COMPETITION_SHAPES) <= shapes


def full_runs(df: pd.DataFrame, precisions: Iterable[str] = CORE_PRECISIONS) -> list[tuple[str, str]]:
    """(run, gpu) of every full suite run, oldest first (date, then file name in `natural_key` order: run10 after
    run9): a file whose default Triton rows cover all 12 competition shapes in every one of `precisions` (default
    a8w8, a16w8, bf16) and at least one peer's rows all 12 shapes."""
    df = _check_df(df)
    want = [str(p) for p in precisions]
    full = []
    for run, d in df.groupby("run", sort=True):
        d = _default_rows(d, None)
        every_precision = all(_covers_suite(d[d["precision"] == p], "triton") for p in want)
        if every_precision and any(_covers_suite(d, p) for p in _PEERS):
            date = str(d["date"].astype(str).max()) if "date" in d else ""
            gpu = str(d["gpu"].iloc[0]) if "gpu" in d else ""
            full.append((date, natural_key(str(run)), str(run), gpu))
    return [(run, gpu) for *_, run, gpu in sorted(full)]


def default_run(df: pd.DataFrame, gpu: str = REFERENCE_GPU) -> str:
    """The newest full suite run (`full_runs`) on `gpu` (default the reference GPU). A run of one precision (a8w8 only,
    say) or on another GPU is shown when asked for by name. ValueError when no file qualifies."""
    runs = [r for r, g in full_runs(df) if g == gpu]
    if not runs:
        raise ValueError(
            f"no full suite run on {gpu} (default Triton rows in every precision and a peer on all 12 competition "
            f"shapes) among {', '.join(sorted(df['run'].astype(str).unique())) or 'no files'}: pick a run or best of "
            "all"
        )
    return runs[-1]


@dataclass(frozen=True)
class RecordedView:
    """What a table or figure of recorded timings shows: `rows` has one row per (backend, precision, batch, kv_len)
    with a `source` column (run · planner · config); `files` are the CSVs it was taken from; `label` says how."""

    rows: pd.DataFrame
    best_of_all: bool
    files: tuple[str, ...]
    label: str
    short: str


def _source(d: pd.DataFrame) -> pd.Series:
    cfg = d["config"].where(d["config"].notna() & (d["config"].astype(str) != ""), "defaults").astype(str)
    return d["run"].astype(str) + " · " + d["planner"].astype(str) + " · " + cfg


def best_per_shape(df: pd.DataFrame, backend: str, precision: str, planner: str | None = None) -> pd.DataFrame:
    """Best of N: the fastest row per (batch, kv_len) of one backend / precision over every row of `df` (all runs
    and configs; optionally one Triton planner). Adds `n_candidates` (rows it was the fastest of) and `source`."""
    df = _check_df(df)
    d = df[(df["backend"] == backend) & (df["precision"] == precision)]
    if planner is not None and backend == "triton":
        d = d[d["planner"] == planner]
    if d.empty:
        raise ValueError(f"no records for backend={backend!r}, precision={precision!r}, planner={planner!r}")
    n = d.groupby(["batch", "kv_len"])["us_median"].transform("size")
    d = d.assign(n_candidates=n, source=_source(d))
    # drop_duplicates keeps whole rows (groupby.first() would fill an empty `config` from a slower row)
    d = d.sort_values("us_median", kind="stable").drop_duplicates(["batch", "kv_len"])
    return d.sort_values(["kv_len", "batch"])


def recorded_view(
    df: pd.DataFrame, *, best_of_all: bool = False, run: str | None = None, planner: str | None = None,
    q_len: int = 1, layout: str = "contiguous", causal: bool = False, gpu: str = REFERENCE_GPU,
) -> RecordedView:  # fmt: skip
    """The rows a view shows, of one decode layout (`case_rows`: q_len 1 on a contiguous cache without the causal mask
    by default; any other is named in the label). Default: ONE run (`run`, else `default_run`) with Triton at its
    default config and planner (`planner` picks another planner's default-config rows); peers as recorded in that
    run. With `best_of_all`: the fastest row per shape over every run and config on `gpu` (`best_per_shape`),
    labelled as such. `gpu` (default the reference GPU) also picks whose default run is shown; a `run` named
    explicitly is shown whatever its GPU."""
    df = _check_df(df)
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a str (e.g. {REFERENCE_GPU!r}), got {type(gpu).__name__}")
    df = case_rows(df, q_len, layout, causal)
    if df.empty:
        mask = " under the causal mask" if causal else ""
        raise ValueError(f"no recorded rows for q_len {q_len} with the {layout!r} layout{mask}")
    # a layout other than the default is named in the label and the short title (exported figures say what they show)
    case = "" if (q_len, layout, causal) == (1, "contiguous", False) else f"q_len {q_len} · {layout}"
    case += " · causal" if causal else ""
    case = f"{case}, " if case else ""
    if not isinstance(best_of_all, bool):
        raise TypeError(f"best_of_all must be a bool, got {type(best_of_all).__name__}")
    if planner is not None and planner not in set(df["planner"]):
        raise ValueError(f"planner {planner!r} has no records; recorded: {', '.join(sorted(set(df['planner'])))}")
    if best_of_all:
        if run is not None:
            raise ValueError("run and best_of_all exclude each other: best of all reads every run")
        if "gpu" in df:
            gpus = sorted(df["gpu"].astype(str).unique())
            if gpu not in gpus:
                raise ValueError(f"gpu {gpu!r} has no records; recorded GPUs: {', '.join(gpus)}")
            df = df[df["gpu"] == gpu]
        parts = [best_per_shape(df, b, p, planner) for b, p in sorted(set(zip(df["backend"], df["precision"])))]
        rows = pd.concat(parts, ignore_index=True)
        files = tuple(sorted(df["run"].astype(str).unique(), key=natural_key))
        n = (
            int(rows.loc[rows["backend"] == "triton", "n_candidates"].max())
            if (rows["backend"] == "triton").any()
            else 1
        )
        label = (
            f"best of up to {n} configurations per shape over the {gpu} runs {', '.join(files)} — the fastest row per "
            "shape, "
            "so no single kernel configuration achieves this table; each winner's run · planner · config is shown"
        )
        return RecordedView(rows, True, files, case + label, f"{case}best of ≤{n} configs over {len(files)} runs")
    runs = sorted(df["run"].astype(str).unique(), key=natural_key)
    if run is None:
        run = default_run(df, gpu)
    elif run not in runs:
        raise ValueError(f"run {run!r} is not recorded; recorded: {', '.join(runs)}")
    rows = _default_rows(df[df["run"] == run], planner)
    dup = rows.duplicated(_KEY, keep=False)
    if dup.any():
        r = rows[dup].iloc[0]
        raise ValueError(f"{run} has several default rows for {r['backend']} {r['precision']} B{r['batch']} x "
                         f"L{r['kv_len']}: not one configuration; use best of all")  # fmt: skip
    rows = rows.assign(n_candidates=1, source=_source(rows)).sort_values(["kv_len", "batch"])
    pl = planner or DEFAULT_PLANNER
    label = (
        f"one run, {run}: Triton at its default configuration with the {pl!r} planner as recorded, peers as "
        "measured in the same run"
    )
    return RecordedView(rows, False, (run,), case + label, f"{case}{run}, Triton default config ({pl})")


def as_view(df: pd.DataFrame | RecordedView, best_of_all: bool = False, run: str | None = None,
            planner: str | None = None) -> RecordedView:  # fmt: skip
    """`df` itself if it is a view already, else `recorded_view` of it."""
    return df if isinstance(df, RecordedView) else recorded_view(df, best_of_all=best_of_all, run=run, planner=planner)


def series_rows(view: RecordedView, backend: str, precision: str) -> pd.DataFrame:
    """The rows of one (backend, precision) series in `view`, ordered by (kv_len, batch); ValueError if none."""
    if not isinstance(view, RecordedView):
        raise TypeError(f"view must be a RecordedView, got {type(view).__name__}")
    d = view.rows[(view.rows["backend"] == backend) & (view.rows["precision"] == precision)]
    if d.empty:
        raise ValueError(f"no records for backend={backend!r}, precision={precision!r} in {view.short}")
    return d


def speedup_table(
    df: pd.DataFrame | RecordedView, ours: tuple[str, str], peers: list[tuple[str, str]], *,
    best_of_all: bool = False, run: str | None = None, planner: str | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Per shape: peer time / our time for each peer (>1 means ours is faster), plus a geomean row. The table's
    ``attrs["view"]`` says which view; in best-of-all mode a ``... from`` column per series names each winner."""
    view = as_view(df, best_of_all, run, planner)
    o = series_rows(view, *ours).set_index(["batch", "kv_len"])
    cols: dict[str, pd.Series] = {}
    for be, prec in peers:
        p = series_rows(view, be, prec).set_index(["batch", "kv_len"])["us_median"]
        cols[f"{be} {prec} µs / ours"] = p / o["us_median"]
    t = pd.DataFrame(cols)
    t.loc[("geomean", ""), :] = [math.exp(t[c].apply(math.log).mean()) for c in t.columns]
    if view.best_of_all:
        t[f"{ours[0]} {ours[1]} from"] = o["source"]
        for be, prec in peers:
            t[f"{be} {prec} from"] = series_rows(view, be, prec).set_index(["batch", "kv_len"])["source"]
    t.attrs["view"] = view.label
    t.attrs["files"] = view.files
    t.attrs["meaning"] = f"peer µs / {ours[0]} {ours[1]} µs: > 1 means ours is faster, < 1 means the peer is"
    return t


def winners_table(view: RecordedView, series: list[tuple[str, str]]) -> pd.DataFrame:
    """Per shape and series: µs, % of copy bandwidth and the run · planner · config of the row shown."""
    parts = []
    for be, prec in series:
        d = series_rows(view, be, prec)
        parts.append(d.assign(series=f"{be} {prec}")[["series", "batch", "kv_len", "us_median", "pct_copy", "source"]])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def headline(
    df: pd.DataFrame | RecordedView, ours: tuple[str, str] = ("triton", "a8w8"),
    peer: tuple[str, str] = ("flashmla", "a8w8"), shape: tuple[int, int] = (128, 8192), *,
    best_of_all: bool = False, run: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The project's headline numbers from a view: geomean µs over the 12 competition shapes of `ours` and
    `peer`, their ratio, and µs / % of copy bandwidth of both at `shape`."""
    view = as_view(df, best_of_all, run, None)
    o, p = series_rows(view, *ours), series_rows(view, *peer)
    for name, d in (("ours", o), ("peer", p)):
        if set(zip(d["batch"], d["kv_len"])) != set(COMPETITION_SHAPES):
            raise ValueError(f"{name} does not cover the 12 competition shapes in {view.short}")
    g = {n: math.exp(float(d["us_median"].apply(math.log).mean())) for n, d in (("ours", o), ("peer", p))}
    at = {n: d[(d["batch"] == shape[0]) & (d["kv_len"] == shape[1])].iloc[0] for n, d in (("ours", o), ("peer", p))}
    return {
        "geomean_us": g["ours"],
        "peer_geomean_us": g["peer"],
        "ratio": g["ours"] / g["peer"],
        "us_at_shape": float(at["ours"]["us_median"]),
        "pct_copy_at_shape": float(at["ours"]["pct_copy"]),
        "peer_us_at_shape": float(at["peer"]["us_median"]),
        "files": view.files,
        "label": view.label,
    }


#: runs recorded before commit 201e9af, whose "simple" plan did not yet grow its chunk to one wave: a plan rebuilt
#: with today's rule is not the one those rows measured.
PRE_ONE_WAVE_RUNS = ("h200_2026-12-02_run1.csv", "h200_2026-12-02_run2.csv")


def fastest_record(
    df: pd.DataFrame, batch: int, kv_len: int, backend: str = "triton", precision: str = "a8w8"
) -> pd.Series:
    """The fastest ok row of `backend` / `precision` at shape (batch, kv_len); ValueError if there is none."""
    for name, v in (("batch", batch), ("kv_len", kv_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    d = df[(df["backend"] == backend) & (df["precision"] == precision) & (df["batch"] == batch)]
    d = d[d["kv_len"] == kv_len]
    if d.empty:
        raise ValueError(f"no {backend} {precision} records for B{batch} x L{kv_len}")
    return d.sort_values("us_median", kind="stable").iloc[0]


def record_for_shape(
    df: pd.DataFrame | RecordedView, batch: int, kv_len: int, backend: str = "triton", precision: str = "a8w8", *,
    best_of_all: bool = False, run: str | None = None,
) -> pd.Series:  # fmt: skip
    """The row a view shows at (batch, kv_len): by default the default-config row of one run (`recorded_view`);
    with `best_of_all` the fastest over all runs and configs. ValueError if the view has none."""
    for name, v in (("batch", batch), ("kv_len", kv_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"batch and kv_len must be positive ints, got {name}={v!r}")
    view = as_view(df, best_of_all, run, None)
    d = view.rows[(view.rows["backend"] == backend) & (view.rows["precision"] == precision)]
    d = d[(d["batch"] == batch) & (d["kv_len"] == kv_len)]
    if d.empty:
        raise ValueError(f"no {backend} {precision} records for B{batch} x L{kv_len} in {view.short}")
    return d.iloc[0]


def plan_of_record(row: pd.Series) -> WorkPlan:
    """Rebuild the WorkPlan a recorded Triton row ran: its planner on ``indptrs_for([kv_len] * batch)`` with the
    plan slots of its config (``num_cus``; the run's SM count when absent) and the simple planner's ``plan_block``."""
    if not isinstance(row, pd.Series):
        raise TypeError(f"row must be a pandas Series (one record), got {type(row).__name__}")
    if row.get("backend") != "triton":
        raise ValueError(f"only triton rows carry a plan, got backend {row.get('backend')!r}")
    cfg = parse_config(row.get("config"))
    slots = int(cfg.get("num_cus", row["sm_count"]))
    knobs: dict[str, Any] = (
        {"block": int(cfg["plan_block"])} if row["planner"] == "simple" and "plan_block" in cfg else {}
    )
    qo, kv = indptrs_for([int(row["kv_len"])] * int(row["batch"]))
    return make_plan(str(row["planner"]), qo, kv, slots, **knobs).validate(qo, kv)


def plan_check(row: pd.Series, plan: WorkPlan) -> tuple[str, str]:
    """(status, sentence): does the rebuilt `plan` match the one the record measured? Rows from runs that record a
    plan digest (``plan`` in the config JSON, `WorkPlan.digest`) are compared: "same" or "differs";
    older rows carry none: "unknown" (the map is today's plan, not necessarily the measured one)."""
    if not isinstance(plan, WorkPlan):
        raise TypeError(f"plan must be a WorkPlan, got {type(plan).__name__}")
    recorded = parse_config(row.get("config")).get("plan")
    if not isinstance(recorded, dict) or "hash" not in recorded:
        return "unknown", (
            f"{row.get('run', 'This run')} recorded no plan fingerprint: the map is today's plan for this shape, "
            "not necessarily the measured one."
        )
    now = plan.digest()
    if now["hash"] == recorded["hash"]:
        return "same", f"Same plan as measured (plan digest {now['hash']}, {now['n_work']} works)."
    return "differs", (
        f"Plan differs from the measured one: recorded {recorded.get('planner')} with {recorded.get('n_work')} works "
        f"on {recorded.get('num_cus')} slots (digest {recorded['hash']}), rebuilt today {now['planner']} with "
        f"{now['n_work']} works on {now['num_cus']} slots (digest {now['hash']})."
    )


#: The layouts issue's goal per layout for a8w8 (the other precisions have none): our time / our contiguous time,
#: geomean over the 12 competition shapes.
LAYOUT_GOALS = {"paged64": 1.05, "paged16": 1.25, "tokens": 1.25}

_COLUMNS = ["precision", "q_len", "causal", "layout", "shapes", "vs_contiguous", "min", "max", "worst_shape", "goal",
            "met", "run", "contiguous_run", "same_run"]  # fmt: skip


def _newest_covering(d: pd.DataFrame, shapes: set[tuple[int, int]]) -> tuple[str, pd.Series] | None:
    """(run, µs indexed by (batch, kv_len)) of the newest run (date, then name) of `d` (one case's default Triton rows
    of one precision) whose rows cover `shapes`; None where no run does."""
    best = None
    for run, r in d.groupby("run", sort=False):
        have = set(zip(r["batch"].astype(int), r["kv_len"].astype(int)))
        if shapes <= have:
            key = (str(r["date"].astype(str).max()) if "date" in r else "", natural_key(str(run)))
            if best is None or key > best[0]:
                best = (key, str(run), r)
    if best is None:
        return None
    _, run, r = best
    us = r.assign(shape=list(zip(r["batch"].astype(int), r["kv_len"].astype(int)))).set_index("shape")["us_median"]
    dup = us.index[us.index.duplicated()]
    if len(dup):
        raise ValueError(f"{run} has several default Triton rows of one case at shape {dup[0]}: not one configuration")
    return run, us


def layout_costs(df: pd.DataFrame, *, gpu: str = REFERENCE_GPU,
                 shapes: Sequence[tuple[int, int]] = COMPETITION_SHAPES) -> pd.DataFrame:  # fmt: skip
    """One row per (precision, q_len, causal, layout other than contiguous) recorded on `gpu` with Triton's default
    rows at every one of `shapes` (default the 12 competition shapes) on both sides: ``vs_contiguous`` the geomean of
    our time / our contiguous time over `shapes`, ``min`` / ``max`` / ``worst_shape`` by shape, ``goal`` and ``met``
    (`LAYOUT_GOALS`, a8w8; None where the issue sets none), the two runs read and whether they are one (``same_run``).
    Cases whose runs cover fewer shapes are left out (ask for fewer `shapes` to see them)."""
    df = _check_df(df)
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a str (e.g. {REFERENCE_GPU!r}), got {type(gpu).__name__}")
    want = [tuple(s) for s in shapes] if isinstance(shapes, (list, tuple)) else None
    if not want or not all(len(s) == 2 and all(isinstance(v, int) and v >= 1 for v in s) for s in want):
        raise ValueError(f"shapes must be a non-empty list of (batch, kv_len) pairs of ints >= 1, got {shapes!r}")
    shape_set = set(want)
    d = df[(df["backend"] == "triton") & (df["gpu"].astype(str) == gpu)] if "gpu" in df else df.iloc[0:0]
    if d.empty:
        gpus = sorted(df["gpu"].astype(str).unique()) if "gpu" in df else []
        raise ValueError(f"gpu {gpu!r} has no Triton records; recorded GPUs: {', '.join(gpus) or 'none'}")
    d = _default_rows(d, None)
    rows = []
    cases = sorted({(str(p), int(q), bool(c), str(lay)) for p, q, c, lay in
                    zip(d["precision"], d["q_len"], d["causal"], d["layout"]) if lay != "contiguous"})  # fmt: skip
    for prec, q_len, causal, layout in cases:
        mine = case_rows(d[d["precision"] == prec], q_len, layout, causal)
        contiguous = case_rows(d[d["precision"] == prec], q_len, "contiguous", causal)
        side = _newest_covering(mine, shape_set)
        if side is None:
            continue
        run, us = side
        same = contiguous[contiguous["run"] == run]
        base = _newest_covering(same, shape_set) or _newest_covering(contiguous, shape_set)
        if base is None:
            continue
        base_run, base_us = base
        ratio = {s: float(us[s]) / float(base_us[s]) for s in want}
        geo = math.exp(sum(math.log(v) for v in ratio.values()) / len(ratio))
        worst = max(ratio, key=ratio.__getitem__)
        goal = LAYOUT_GOALS.get(layout) if prec == "a8w8" else None
        rows.append([prec, q_len, causal, layout, len(want), geo, min(ratio.values()), ratio[worst],
                     f"{worst[0]}x{worst[1]}", goal, None if goal is None else geo <= goal, run, base_run,
                     base_run == run])  # fmt: skip
    return pd.DataFrame(rows, columns=_COLUMNS)


def layout_costs_by_gpu(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """`layout_costs` of every GPU with Triton records whose table is not empty, the reference GPU first, then by
    name (what the CLI, the report and the timing panel show)."""
    df = _check_df(df)
    if "gpu" not in df:
        return {}
    gpus = sorted(df.loc[df["backend"] == "triton", "gpu"].astype(str).unique(), key=lambda g: (g != REFERENCE_GPU, g))
    return {g: t for g in gpus if not (t := layout_costs(df, gpu=g)).empty}

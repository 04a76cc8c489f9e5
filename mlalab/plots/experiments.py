"""Design experiments on the H200: kernel variants timed side by side with FlashMLA fp8 in one process.

Each ``data/profiles/*_ab_*.csv`` is one run of ``scripts/hopper_ab.py``: per competition shape (``B``, ``L``) a
reference's µs — FlashMLA's (``flashmla``), else FlashInfer's (``flashinfer``), else our portable kernel's
(``portable``), else the file's first variant, its baseline (`reference_column`) —, one column of µs per variant
of our sm_90 stage 1 (names as in the script's ``VARIANTS``; what each one changes is listed in data/README.md,
section profiles/), and ``floor`` = the shape's bytes over the copy bandwidth measured in that run. A file may
carry ``precision`` (``a8w8``, the default, ``bf16`` or ``a16w8``: the peers then timed that precision, and the 0.65x
goal, an a8w8 goal, is not drawn; ``hopper_ab.py --precision``).
A variant that failed at a shape has an empty cell. Because
every column of a file comes from the same process, minutes apart, ratios *within* a file are what to compare;
the same variant in two files can differ by the run-to-run spread (up to 10-15 % on the longest shapes).

    from mlalab.plots.experiments import experiment_figure, list_experiments, load_experiment
    experiment_figure(load_experiment(list_experiments()[-1]))
"""

from __future__ import annotations

import glob
import math
import os

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..io import natural_key
from ..timing import PROVENANCE_COLUMNS
from .timeline import PROFILE_DIR, check_goal, finish_ratio_figure

__all__ = [
    "list_experiments",
    "load_experiment",
    "experiment_geomeans",
    "experiment_figure",
    "peer_name",
    "reference_column",
]

#: the columns every experiment file has besides its variants and its reference
_FIXED = ("B", "L")

#: the reference columns an experiment file may have, the first one present being the file's reference
_REFERENCES = ("flashmla", "flashinfer", "portable")

#: how each reference column is named, and the precisions an experiment file may name with the peer flavour each
#: means (column ``precision``; absent = a8w8, the files before session 11)
_REFERENCE_NAMES = {"flashmla": "FlashMLA", "flashinfer": "FlashInfer", "portable": "our portable kernel"}
_FLAVOURS = {"a8w8": "fp8", "bf16": "bf16", "a16w8": "a16w8"}


def _timed_columns(df: pd.DataFrame) -> list[str]:
    """Every column of µs: all but the shape, the floor, the file name, the precision and the provenance columns."""
    return [c for c in df.columns if c not in (*_FIXED, "floor", "run", "precision", *PROVENANCE_COLUMNS)]


def reference_column(df: pd.DataFrame) -> str:
    """The column the file's ratios are taken against: ``flashmla``, else ``flashinfer``, else ``portable``, else
    (an A/B of our sm_90 variants alone, ``hopper_ab.py --peers ""``) the first variant column, the baseline."""
    for c in _REFERENCES:
        if c in df.columns:
            return c
    timed = _timed_columns(df)
    if len(timed) < 2:
        raise ValueError(f"an experiment table needs a reference column ({', '.join(_REFERENCES)}) or two variant "
                         f"columns, the first one the baseline; got {', '.join(timed) or 'none'}")  # fmt: skip
    return timed[0]


def peer_name(df: pd.DataFrame) -> str:
    """What the file's reference column timed, e.g. FlashMLA fp8 (a8w8 files), FlashMLA bf16, FlashInfer a16w8, our
    portable kernel a16w8, or a baseline variant (``v-conv (baseline) a16w8``)."""
    ref = reference_column(df)
    return f"{_REFERENCE_NAMES.get(ref, ref + ' (baseline)')} {_FLAVOURS[_precision(df)]}"


def _precision(df: pd.DataFrame) -> str:
    return str(df["precision"].iloc[0]) if "precision" in df.columns and len(df) else "a8w8"


def list_experiments(directory: str = PROFILE_DIR) -> list[str]:
    """File names of the recorded experiments (``*_ab_*.csv``) in name order: by date, then name (numbers by value)."""
    files = glob.glob(os.path.join(directory, "*_ab_*.csv"))
    return sorted((os.path.basename(f) for f in files), key=natural_key)


def load_experiment(name: str, directory: str = PROFILE_DIR) -> pd.DataFrame:
    """One experiment file (a name from `list_experiments`, looked up in `directory`, or a path with a directory
    part), checked: the shape and FlashMLA columns, at least one variant, every time a finite positive number of µs
    or empty (a variant that failed there). Column ``run`` holds the file name."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a file name or path (str), got {name!r}")
    has_dir = os.path.dirname(name) != ""  # (os.path.dirname knows os.sep and os.altsep)
    path = name if has_dir else os.path.join(directory, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no experiment {name!r}; recorded: {', '.join(list_experiments(directory)) or 'none'}")
    df = pd.read_csv(path)
    missing = [c for c in _FIXED if c not in df.columns]
    if missing:
        raise ValueError(f"{path} lacks columns {missing} (the shape): not a scripts/hopper_ab.py table")
    try:
        reference_column(df)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if not _variants(df):
        raise ValueError(f"{path} has no variant column besides {', '.join(_FIXED)} and floor")
    if "precision" in df.columns and (df["precision"].nunique() != 1 or df["precision"].iloc[0] not in _FLAVOURS):
        raise ValueError(f"{path}: column precision must hold one of {', '.join(_FLAVOURS)} in every row")
    times = df[[reference_column(df), *_variants(df)]].to_numpy(dtype=np.float64)
    finite_positive = np.isfinite(times) & (times > 0)
    if df.empty or not (np.isnan(times) | finite_positive).all() or not finite_positive[:, 0].all():
        raise ValueError(f"{path}: every time must be a finite positive number of µs (or empty for a failed variant)")
    return df.assign(run=os.path.basename(path))


def _variants(df: pd.DataFrame) -> list[str]:
    """The variant columns: all but the shape, the reference, the floor, the file name and the provenance columns."""
    ref = reference_column(df)
    return [c for c in _timed_columns(df) if c != ref]


def experiment_geomeans(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant (and the reference and, when recorded, the copy floor): the geomean µs over the shapes it ran, its
    ratio to the reference's geomean over the same shapes (`reference_column`), and how many shapes that is."""
    _check(df)
    ref = reference_column(df)
    rows = []
    for col in [ref, *_variants(df), *(["floor"] if "floor" in df.columns else [])]:
        ok = df[col].notna() & (df[col] > 0)
        n = int(ok.sum())
        geo = float(np.exp(np.log(df.loc[ok, col]).mean())) if n else math.nan
        peer = float(np.exp(np.log(df.loc[ok, ref]).mean())) if n else math.nan
        rows.append({"variant": col, "geomean_us": geo, "vs_reference": geo / peer, "shapes": n})
    return pd.DataFrame(rows)


def _check(df: object) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame (load_experiment), got {type(df).__name__}")
    missing = [c for c in _FIXED if c not in df.columns]
    timed = _timed_columns(df)
    has_ref = any(c in df.columns for c in _REFERENCES) or len(timed) >= 2
    if missing or not has_ref or df.empty or not _variants(df):
        raise ValueError(f"df must be an experiment table with rows, {', '.join(_FIXED)}, a reference column (one of "
                         f"{', '.join(_REFERENCES)}, else its first variant) and variant columns")  # fmt: skip


def experiment_figure(df: pd.DataFrame, goal: float = 0.65) -> go.Figure:
    """Per shape, each variant's time over the reference's (`peer_name`: FlashMLA fp8 for a8w8 files; lower is
    faster), the legend with
    each geomean ratio; diamonds: the copy floor (bytes / copy bandwidth) over FlashMLA's time, what no kernel reading
    every byte once can beat by much; the dashed line: the goal on the geomean (a8w8 files only: it is #5's a8w8
    goal)."""
    _check(df)
    check_goal(goal)
    peer = peer_name(df)
    d = df.sort_values(["L", "B"])
    shapes = [f"B{b}·L{n}" for b, n in zip(d["B"], d["L"])]
    geo = experiment_geomeans(d).set_index("variant")
    ref = reference_column(d)
    fig = go.Figure()
    for col in _variants(d):
        ratio = d[col] / d[ref]
        hover = [f"{u:.2f} µs vs {peer} {f:.2f} µs" for u, f in zip(d[col], d[ref])]
        g = geo.loc[col]
        missing = "" if g["shapes"] == len(d) else f" ({int(g['shapes'])} of {len(d)} shapes)"
        fig.add_trace(go.Bar(x=shapes, y=ratio, name=f"{col}: {g['vs_reference']:.3f}×{missing}", hovertext=hover))
    if "floor" in d.columns:
        fig.add_trace(go.Scatter(x=shapes, y=d["floor"] / d[ref], mode="markers", name="copy floor",
                                 marker={"symbol": "diamond", "color": "black"}))  # fmt: skip
    run = f" — {d['run'].iloc[0]}" if "run" in d.columns else ""
    title = f"variants / {peer}, one process on the H200{run}"
    return finish_ratio_figure(fig, goal if peer == "FlashMLA fp8" else None, title, peer)


def main() -> None:
    """Print every recorded experiment's geomeans."""
    for name in list_experiments():
        print(name)
        print(experiment_geomeans(load_experiment(name)).round(3).to_string(index=False))


if __name__ == "__main__":
    main()

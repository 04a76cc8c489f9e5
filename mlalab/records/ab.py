"""Recorded A/B experiments (data/ab/*.csv): kernel variants timed side by side with a peer in one process on the
H200 (`experiments/ab.py` writes them; older files come from the scripts of tag ``experiments-2026-12``).

A file has per competition shape (``B``, ``L``) a reference's µs — FlashMLA's (``flashmla``), else FlashInfer's
(``flashinfer``), else our portable kernel's (``portable``), else the file's first variant, its baseline
(`reference_column`) —, one column of µs per variant (what each one changed: docs/journal.md), and ``floor`` = the
shape's bytes over the copy bandwidth measured in that run. A file may carry ``precision`` (``a8w8``, the default, or
another `mlalab.quant.precision` name: the peers then timed that precision), and the case keys ``q_len``, ``causal``
and ``layout`` beside the shape (a file of speculative decode, under the causal mask or not, or of decode layouts).
A variant that failed at a shape has an empty cell.
Because every column of a file comes from the same process, minutes apart, ratios *within* a file are what to
compare; the same variant in two files can differ by the run-to-run spread (up to 10-15 % on the longest shapes).
"""

from __future__ import annotations

import glob
import math
import os
import re

import numpy as np
import pandas as pd

from ..io import natural_key
from ..quant.precision import PRECISIONS
from .schema import DATA_ROOT, PROVENANCE_COLUMNS

__all__ = ["AB_DIR", "list_experiments", "load_experiment", "experiment_geomeans", "peer_name", "reference_column",
           "variants", "check_experiment", "case_labels", "CASE_KEYS"]  # fmt: skip

AB_DIR = os.path.join(DATA_ROOT, "ab")

#: the columns every experiment file has besides its variants and its reference
_FIXED = ("B", "L")
#: case keys a file may have beside the shape (each row a shape x q_len x causal mask x layout)
CASE_KEYS = ("q_len", "causal", "layout")

#: the reference columns an experiment file may have, the first one present being the file's reference
_REFERENCES = ("flashmla", "flashinfer", "portable")

#: how each reference column is named, and the precisions an experiment file may name with the peer flavour each
#: means (column ``precision``; absent = a8w8)
_REFERENCE_NAMES = {"flashmla": "FlashMLA", "flashinfer": "FlashInfer", "portable": "our portable kernel"}
_FLAVOURS = {"a8w8": "fp8", "bf16": "bf16", "a16w8": "a16w8"}
_PRECISIONS = tuple(p.value for p in PRECISIONS)


def _timed_columns(df: pd.DataFrame) -> list[str]:
    """Every column of µs: all but the shape, the floor, the file name, the precision and the provenance columns."""
    skip = (*_FIXED, *CASE_KEYS, "floor", "run", "precision", *PROVENANCE_COLUMNS)
    return [c for c in df.columns if c not in skip]


def reference_column(df: pd.DataFrame) -> str:
    """The column the file's ratios are taken against: ``flashmla``, else ``flashinfer``, else ``portable``, else
    (an A/B of our variants alone, ``experiments/ab.py --peers none``) the first variant column, the baseline."""
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
    prec = _precision(df)
    return f"{_REFERENCE_NAMES.get(ref, ref + ' (baseline)')} {_FLAVOURS.get(prec, prec)}"


def _precision(df: pd.DataFrame) -> str:
    return str(df["precision"].iloc[0]) if "precision" in df.columns and len(df) else "a8w8"


def list_experiments(directory: str = AB_DIR) -> list[str]:
    """File names of the recorded experiments (``*.csv`` in data/ab) ordered by the date in the name, then by name
    (numbers by value), whatever the device prefix."""
    files = glob.glob(os.path.join(directory, "*.csv"))
    return sorted((os.path.basename(f) for f in files), key=lambda n: (_date_of(n), natural_key(n)))


def _date_of(name: str) -> str:
    """The ``YYYY-MM-DD`` in a recorded file's name (``<device>_<date>_<what>.csv``), '' where there is none."""
    m = re.search(r"\d{4}-\d{2}-\d{2}", name)
    return m.group(0) if m else ""


def load_experiment(name: str, directory: str = AB_DIR) -> pd.DataFrame:
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
        raise ValueError(f"{path} lacks columns {missing} (the shape): not an A/B table")
    try:
        reference_column(df)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if not variants(df):
        raise ValueError(f"{path} has no variant column besides {', '.join(_FIXED)} and floor")
    if "precision" in df.columns and (df["precision"].nunique() != 1 or df["precision"].iloc[0] not in _PRECISIONS):
        raise ValueError(f"{path}: column precision must hold one of {', '.join(_PRECISIONS)} in every row")
    times = df[[reference_column(df), *variants(df)]].to_numpy(dtype=np.float64)
    finite_positive = np.isfinite(times) & (times > 0)
    if df.empty or not (np.isnan(times) | finite_positive).all() or not finite_positive[:, 0].all():
        raise ValueError(f"{path}: every time must be a finite positive number of µs (or empty for a failed variant)")
    return df.assign(run=os.path.basename(path))


def variants(df: pd.DataFrame) -> list[str]:
    """The variant columns: all but the shape, the reference, the floor, the file name and the provenance columns."""
    ref = reference_column(df)
    return [c for c in _timed_columns(df) if c != ref]


def experiment_geomeans(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant (and the reference and, when recorded, the copy floor): the geomean µs over the shapes it ran, its
    ratio to the reference's geomean over the same shapes (`reference_column`), and how many shapes that is."""
    check_experiment(df)
    ref = reference_column(df)
    rows = []
    for col in [ref, *variants(df), *(["floor"] if "floor" in df.columns else [])]:
        ok = df[col].notna() & (df[col] > 0)
        n = int(ok.sum())
        geo = float(np.exp(np.log(df.loc[ok, col]).mean())) if n else math.nan
        peer = float(np.exp(np.log(df.loc[ok, ref]).mean())) if n else math.nan
        rows.append({"variant": col, "geomean_us": geo, "vs_reference": geo / peer, "shapes": n})
    return pd.DataFrame(rows)


def case_labels(df: pd.DataFrame) -> list[str]:
    """One label per row: its shape (``B4·L1024``) and, where the file has them, its q_len, the causal mask where set,
    and its layout (``B4·L1024·q2·causal·tokens``)."""
    if not isinstance(df, pd.DataFrame) or not set(_FIXED) <= set(df.columns):
        raise ValueError(f"df must be an experiment table with columns {', '.join(_FIXED)} (load_experiment)")
    keys = [k for k in CASE_KEYS if k in df.columns]

    def key(k: str, v: object) -> list[str]:
        if k == "causal":
            return ["causal"] if str(v).strip().lower() in ("true", "1") else []
        return [f"q{v}" if k == "q_len" else str(v)]

    return ["·".join([f"B{r['B']}", f"L{r['L']}", *(t for k in keys for t in key(k, r[k]))]) for _, r in df.iterrows()]


def check_experiment(df: object) -> None:
    """TypeError / ValueError unless `df` is an experiment table (`load_experiment`)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame (load_experiment), got {type(df).__name__}")
    missing = [c for c in _FIXED if c not in df.columns]
    timed = _timed_columns(df)
    has_ref = any(c in df.columns for c in _REFERENCES) or len(timed) >= 2
    if missing or not has_ref or df.empty or not variants(df):
        raise ValueError(f"df must be an experiment table with rows, {', '.join(_FIXED)}, a reference column (one of "
                         f"{', '.join(_REFERENCES)}, else its first variant) and variant columns")  # fmt: skip

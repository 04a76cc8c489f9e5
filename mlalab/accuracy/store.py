"""Accuracy tables on disk: `save_table` (one atomic write), and `ResultStore`, the resumable output of a sweep.

A store is the output file (CSV or Parquet) plus, while a sweep runs, a folder ``<file>.parts/`` of chunk files,
each written atomically (temporary file, then rename) as results arrive. A sweep killed at any moment leaves
only whole chunks: it loses at most the rows in flight. Loading merges the file and the chunks, one row per key
(a finished row beats a failed one, a later one an earlier one); finishing writes the merged table atomically and
removes the chunks. Rows whose keys are not in the sweep's grid (another grid, another mlalab version) are refused
with a clear message before any work, so a table is never mixed or overwritten by accident.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..io import atomic_write
from .grid import Grid

__all__ = [
    "save_table",
    "read_table",
    "recorded_study",
    "recorded_studies",
    "check_output_path",
    "ResultStore",
    "ForeignOutputError",
    "TABLE_SUFFIXES",
]

TABLE_SUFFIXES = (".csv", ".parquet")
#: columns that are text whatever they look like: a row key or run id of hex digits that happen all to be decimal
#: ("660451655509") would otherwise come back from a CSV as a number, and a chunk of them would no longer match
TEXT_COLUMNS = ("row_key", "run_id", "error", "kv_lens", "device", "mlalab_version", "torch_version")


class ForeignOutputError(ValueError):
    """The output file holds rows of another grid or another mlalab version (or is no sweep table at all)."""


class OutputBusyError(RuntimeError):
    """Another sweep is writing the same output file right now."""


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path, refused unless it ends in .csv or .parquet (Parquet only where pyarrow imports) and its
    folder can hold it. Cheap: meant to run before any work."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    p = Path(path)
    if p.suffix not in TABLE_SUFFIXES:
        raise ValueError(f"path must end in .csv or .parquet, got {p.name!r}")
    if p.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError as e:
            raise ValueError(f"writing Parquet needs pyarrow ({e}); use a .csv path") from None
    if p.is_dir():
        raise ValueError(f"path {str(p)!r} is a folder; name a file")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"path {str(p)!r}: {str(parent)!r} is a file, not a folder")
            break
    return p


def save_table(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write `df` to CSV or Parquet (by suffix) atomically: a temporary file in the same folder, then rename.
    Floats are written with full precision (a CSV read back with `read_table` holds the same numbers)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    p = check_output_path(path)

    def write(tmp: str) -> None:
        if p.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)

    atomic_write(p, write)
    return p


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a table written by `save_table` or a sweep (CSV or Parquet by suffix), floats exactly as written."""
    p = Path(path)
    if p.suffix not in TABLE_SUFFIXES:
        raise ValueError(f"path must end in .csv or .parquet, got {p.name!r}")
    if not p.is_file():
        raise FileNotFoundError(f"no table at {str(p)!r}")
    if p.suffix == ".parquet":
        return _normalise(pd.read_parquet(p))
    return _normalise(pd.read_csv(p, dtype=dict.fromkeys(TEXT_COLUMNS, str)))  # (absent columns are ignored)


def recorded_studies(data_root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The accuracy tables recorded in ``data/`` as data/INDEX.csv lists them: file name -> the question it answers."""
    import csv

    from ..records import DATA_ROOT

    index = Path(data_root or DATA_ROOT) / "INDEX.csv"
    with open(index, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "accuracy"]
    return {Path(r["file"]).name: r["question"] for r in rows}


def recorded_study(name: str, data_root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """The recorded accuracy table `name` (a file of data/accuracy/ that data/INDEX.csv lists), read with
    `read_table`. The file's name and question are in ``df.attrs``."""
    from ..records import DATA_ROOT

    known = recorded_studies(data_root)
    if not isinstance(name, str) or name not in known:
        raise ValueError(f"name must be a recorded accuracy table; data/INDEX.csv lists: {', '.join(sorted(known))}")
    df = read_table(Path(data_root or DATA_ROOT) / "accuracy" / name)
    df.attrs.update({"file": name, "question": known[name]})
    return df


def _normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Column types that survive a CSV round trip unchanged (kv_lens as text, error "" when fine)."""
    df = df.copy()
    if "kv_lens" in df:
        df["kv_lens"] = df["kv_lens"].astype(str)
    if "error" in df:
        df["error"] = ["" if pd.isna(e) else str(e) for e in df["error"]]
    return df


class ResultStore:
    """The resumable output of one sweep (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], grid: Grid, *, overwrite: bool = False) -> None:
        if not isinstance(grid, Grid):
            raise TypeError(f"grid must be a Grid, got {type(grid).__name__}")
        self.path = check_output_path(path)
        self.grid = grid
        self.parts = self.path.with_name(self.path.name + ".parts")
        self._lock = _exclusive_lock(self.path.with_name(self.path.name + ".lock"), self.path)
        if overwrite:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.parts, ignore_errors=True)

    def _files(self) -> list[Path]:
        files = [self.path] if self.path.exists() else []
        if self.parts.is_dir():
            for tmp in self.parts.glob(".*.tmp"):  # a chunk whose write was killed: never renamed, never counted
                tmp.unlink(missing_ok=True)
            files += sorted(self.parts.glob("chunk-*.csv"))
        return files

    def load(self) -> pd.DataFrame:
        """Every row already on disk, one per key, in grid order (empty when nothing is). Raises
        ForeignOutputError if any row is not of this grid."""
        frames = []
        for f in self._files():
            try:
                df = read_table(f)
            except (ValueError, OSError, ImportError) as e:
                msg = f"{str(f)!r} cannot be read as a sweep table ({e}); choose another output file"
                raise ForeignOutputError(msg) from None
            if "row_key" not in df:
                raise ForeignOutputError(
                    f"{str(f)!r} is not an mlalab sweep table (no row_key column); refusing to touch it: choose "
                    "another output file"
                )
            frames.append(df)
        if not frames:
            return pd.DataFrame()
        df = pd.concat(frames, ignore_index=True)
        foreign = df[[self.grid.index(k) is None for k in df.row_key.astype(str)]]
        if len(foreign):
            versions = sorted(set(foreign.get("mlalab_version", pd.Series(dtype=str)).dropna().astype(str)))
            other = [v for v in versions if v != self.grid.version]
            why = (
                f"written by mlalab {', '.join(other)} (this is {self.grid.version})"
                if other
                else "from a different grid (other cases, schemes, formats or tolerances)"
            )
            first = foreign.iloc[0]
            example = " ".join(str(first.get(c, "?")) for c in ("case", "fp8_format", "q_scheme", "kv_scheme"))
            raise ForeignOutputError(
                f"{self.path} holds {len(foreign)} rows that are not in this sweep's grid, {why}; e.g. {example}. "
                "Nothing was changed: use another output file, or overwrite it explicitly (--overwrite)"
            )
        ok = df.error.astype(str) == "" if "error" in df else pd.Series(True, index=df.index)
        df = df.assign(_ok=ok.to_numpy(), _pos=range(len(df)))
        df = df.sort_values(["_ok", "_pos"]).drop_duplicates("row_key", keep="last")  # finished rows win
        df["_order"] = [self.grid.index(k) for k in df.row_key]
        return df.sort_values("_order").drop(columns=["_ok", "_pos", "_order"]).reset_index(drop=True)

    def append(self, records: Sequence[Mapping[str, Any]]) -> Path:
        """Write one chunk of records atomically; returns its path."""
        if not records:
            raise ValueError("records is empty: nothing to append")
        name = f"chunk-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.csv"  # names sort by time of writing
        return save_table(pd.DataFrame(list(records)), self.parts / name)

    def finish(self, df: pd.DataFrame) -> Path:
        """Write the whole table atomically, then remove the chunks it holds."""
        out = save_table(df, self.path)
        shutil.rmtree(self.parts, ignore_errors=True)
        return out

    def close(self) -> None:
        """Let another sweep write this output (the lock also goes with the process, killed or not)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _exclusive_lock(lock_path: Path, out: Path) -> Any:
    """An open file holding an exclusive advisory lock (flock) for `out`, so that two sweeps never append to one
    output at once; None where flock does not exist (Windows). The OS drops the lock when the process ends."""
    try:
        import fcntl
    except ImportError:
        return None
    f = open(lock_path, "a+")  # noqa: SIM115 (held open for the lock's lifetime)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise OutputBusyError(f"another sweep is writing {out} (it holds {lock_path}); wait for it to finish, or "
                              "write to another output file") from None  # fmt: skip
    return f

"""Atomic file writes: a temporary file in the target's folder, then `os.replace`, so a reader (or a crash in the
middle of a write) never sees a half-written file. Used by `mlalab.accuracy.save_table`, `mlalab.timing.write_csv`
and (`write_rows_csv`) the GPU scripts' result tables.
"""

from __future__ import annotations

import csv
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["atomic_write", "write_rows_csv", "natural_key"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Call ``write(tmp)`` on a temporary path next to `path`, then rename it onto `path` (same folder, so the
    rename is atomic). The folder is created if missing; the temp file is removed if `write` fails."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if not callable(write):
        raise TypeError(f"write must be callable (tmp_path) -> None, got {type(write).__name__}")
    p = Path(path)
    if not p.name:
        raise ValueError(f"path must name a file, got {str(path)!r}")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return p


def write_rows_csv(path: str | os.PathLike[str], rows: Sequence[Mapping[str, object]]) -> Path:
    """Write dict rows as CSV atomically (`atomic_write`); the columns are every key, in order of first appearance
    (a row without a key leaves that cell empty)."""
    if isinstance(rows, (str, bytes, Mapping)) or not all(isinstance(r, Mapping) for r in rows):
        raise TypeError("rows must be a sequence of dicts (column -> value)")
    if not rows:
        raise ValueError("rows is empty: nothing to write")
    keys = list(dict.fromkeys(k for r in rows for k in r))

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)

    return atomic_write(path, write)


def natural_key(name: str) -> tuple:
    """Sort key that orders the numbers inside a name by value (``run10`` after ``run9``, ``s10`` after ``s9b``): how
    the newest recorded file is found among names that number their runs."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    parts = re.split(r"([0-9]+)", name)  # odd positions: the runs of ASCII digits
    return tuple((1, int(t)) if i % 2 else (0, t) for i, t in enumerate(parts) if t)

"""Recorded profiles of the sm_90 stage 1 (data/profiles): per-CTA time lines (``*_timeline.csv``, the events of
`mlalab.kernels.sm90.timeline.CtaTimeline`: B, L, cta, event, index, t_ns) and ablation profiles (``*_profile.csv``
with the ablation columns: the whole call as measured and with the tensor-core work skipped), as
`experiments/profile_sm90.py` records them.
"""

from __future__ import annotations

import glob
import math
import os

import pandas as pd

from ..io import natural_key
from ..kernels.sm90.timeline import CtaTimeline
from .schema import DATA_ROOT

__all__ = ["PROFILE_DIR", "load_timelines", "timeline_events", "timeline_summary", "ABLATIONS",
           "load_ablation_profile", "check_ablations"]  # fmt: skip

PROFILE_DIR = os.path.join(DATA_ROOT, "profiles")


def _name_order(path: str) -> tuple:
    """Newest last: file names in `natural_key` order (``s10`` after ``s9``)."""
    return natural_key(os.path.basename(path))


_COLUMNS = ("B", "L", "cta", "event", "index", "t_ns")


def load_timelines(path: str | None = None) -> pd.DataFrame:
    """The newest ``*_timeline.csv`` in data/profiles (or `path`), with its file name in column ``run``."""
    if path is None:
        files = sorted(glob.glob(os.path.join(PROFILE_DIR, "*_timeline.csv")), key=_name_order)
        if not files:
            raise FileNotFoundError(f"no *_timeline.csv in {PROFILE_DIR} (record one with experiments/profile_sm90.py)")
        path = files[-1]
    df = pd.read_csv(path)
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path} is not a timeline events file: missing columns {missing}")
    return df.assign(run=os.path.basename(path))


def timeline_events(events: pd.DataFrame, batch: int, kv_len: int) -> pd.DataFrame:
    if not isinstance(events, pd.DataFrame):
        raise TypeError(f"events must be a pandas DataFrame, got {type(events).__name__}")
    missing = [c for c in _COLUMNS if c not in events.columns]
    if missing:
        raise ValueError(f"events lack columns {missing}")
    d = events[(events["B"] == batch) & (events["L"] == kv_len)]
    if d.empty:
        have = sorted({(int(b), int(n)) for b, n in zip(events["B"], events["L"])})
        raise ValueError(f"no timeline for B{batch} x L{kv_len}; recorded shapes: {have}")
    return d


#: `CtaTimeline.summary` key -> the label `timeline_summary` shows (in µs, but the CTA count); indented: parts of
#: the line above.
_SUMMARY_LABELS = {
    "ctas_busy": "ctas busy",
    "span_ns": "span",
    "header_ns": "header",
    "first_tile_ns": "first tile arrives",
    "tile_interval_ns": "per tile",
    "tile_qk_ns": "  scores (QK) + V",
    "tile_softmax_ns": "  softmax .. PV issued",
    "last_tile_to_end_ns": "last tile to end",
    "epilogue_pv_wait_ns": "  last PV completes",
    "epilogue_sum_ns": "  softmax sum",
    "epilogue_store_ns": "  normalise + stores",
    "end_spread_ns": "spread of the CTA ends",
}
_EPILOGUE_PARTS = ("epilogue_pv_wait_ns", "epilogue_sum_ns", "epilogue_store_ns")


def timeline_summary(events: pd.DataFrame, batch: int, kv_len: int) -> dict[str, float]:
    """Where stage 1's time goes at one shape (µs, medians over the CTAs that streamed tiles): the recorded events
    rebuilt into a `CtaTimeline` and summarised by its `summary` (one definition for live and recorded launches).
    The epilogue's parts are left out for files recorded before those stamps."""
    s = CtaTimeline.from_events(timeline_events(events, batch, kv_len)).summary()
    return {
        label: s[k] if k == "ctas_busy" else s[k] / 1e3
        for k, label in _SUMMARY_LABELS.items()
        if not (k in _EPILOGUE_PARTS and math.isnan(s[k]))
    }


#: (column of an ablation profile, label): the whole call as measured and with compute skipped
#: (`mlalab.kernels.Decoder.ablation`: the outputs are wrong; only the time means something).
ABLATIONS = (
    ("full_us", "our decode (a8w8)"),
    ("full_no_qk_us", "… with the score wgmma skipped"),
    ("full_no_qk_pv_us", "… with both wgmmas skipped"),
)

#: what an ablation profile must hold: the shape, FlashMLA fp8's µs and the `ABLATIONS` columns
_ABLATION_COLUMNS = ("B", "L", "flashmla_us", *(c for c, _ in ABLATIONS))


def check_ablations(df: pd.DataFrame, missing_msg: str, times_msg: str) -> None:
    """ValueError (with these messages) unless `df` has the ablation columns and positive times."""
    missing = [c for c in _ABLATION_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{missing_msg} {missing} (experiments/profile_sm90.py --ablations)")
    if df.empty or not (df[list(_ABLATION_COLUMNS[2:])] > 0).all().all():
        raise ValueError(times_msg)


def load_ablation_profile(path: str | None = None) -> pd.DataFrame:
    """The newest ``*_profile.csv`` in data/profiles that has the ablation columns (newest = last in name order,
    numbers by value, as the files are named ``<device>_<date>[_<label>]_profile.csv``; or `path`), with its file name
    in column ``run``: per shape (``B``, ``L``) FlashMLA fp8's µs (``flashmla_us``) and the `ABLATIONS` columns."""
    if path is None:
        files = sorted(glob.glob(os.path.join(PROFILE_DIR, "*_profile.csv")), key=_name_order)
        files = [f for f in files if set(_ABLATION_COLUMNS) <= set(pd.read_csv(f, nrows=0).columns)]
        if not files:
            raise FileNotFoundError(f"no *_profile.csv with ablations in {PROFILE_DIR} (record one with "
                                    "experiments/profile_sm90.py --ablations)")  # fmt: skip
        path = files[-1]
    df = pd.read_csv(path)
    check_ablations(df, f"{path} has no ablation columns", f"{path}: every time must be a positive number of µs")
    return df.assign(run=os.path.basename(path))

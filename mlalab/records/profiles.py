"""Recorded profiles of the sm_90 stage 1 (data/profiles): per-CTA time lines (``*_timeline.csv``, the events of
`mlalab.kernels.sm90.timeline.CtaTimeline`: B, L, cta, event, index, t_ns) and ablation profiles (``*_profile.csv``
with the ablation columns: the whole call as measured and with some of its compute skipped, `ABLATION_KINDS`), as
`experiments/profile_sm90.py` records them.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass

import pandas as pd

from ..io import natural_key
from ..kernels.sm90.timeline import CtaTimeline
from .schema import DATA_ROOT

__all__ = ["PROFILE_DIR", "load_timelines", "timeline_events", "timeline_summary", "AblationKind", "ABLATION_KINDS",
           "ablation_kind", "load_ablation_profile", "check_ablations"]  # fmt: skip

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


@dataclass(frozen=True)
class AblationKind:
    """One kind of ablation profile (`mlalab.kernels.Decoder.ablation`: the outputs are wrong; only the time means
    something): per shape, each of `bars` (column, label: the whole call as measured, then with compute skipped) over
    the `base` column (`base_label`), then each of `extra` that the profile has (ablations added later); `goal` is the
    issue's on the geomean of the first bar; `recorder` makes one."""

    base: str
    base_label: str
    bars: tuple[tuple[str, str], ...]
    goal: float
    recorder: str
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """What a profile of this kind must hold: the shape, the base and the bars' columns."""
        return ("B", "L", self.base, *(c for c, _ in self.bars))


#: The ablation profiles by kind: "wgmma", the fp8 decode with its matrix products skipped, against FlashMLA fp8 (the
#: q_len 1 goal, 0.65x); "fp4", the e4m3 route (a8w4-mxfp4) with its fp4 -> e4m3 conversion skipped (and, in
#: profiles from 2026-12-08 on, also its block scales' loads), against our a8w8 in the same process (the fp4 issue's
#: geomean goal, 0.85x; its goal at 128 x 8192 is 0.6x).
ABLATION_KINDS = {
    "wgmma": AblationKind(
        "flashmla_us", "FlashMLA fp8",
        (("full_us", "our decode (a8w8)"), ("full_no_qk_us", "… with the score wgmma skipped"),
         ("full_no_qk_pv_us", "… with both wgmmas skipped")),
        0.65, "experiments/profile_sm90.py --ablations",
    ),
    "fp4": AblationKind(
        "a8w8_us", "our a8w8",
        (("full_us", "our decode (a8w4-mxfp4)"), ("full_no_convert_us", "… with the fp4 → e4m3 conversion skipped")),
        0.85, "experiments/profile_sm90.py --precision a8w4-mxfp4 --ablations",
        (("full_no_convert_scales_us", "… and the block scales' loads skipped"),),
    ),
}  # fmt: skip


def ablation_kind(kind: str) -> AblationKind:
    """`ABLATION_KINDS[kind]`, or a ValueError naming the kinds."""
    if kind not in ABLATION_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, ABLATION_KINDS))}, got {kind!r}")
    return ABLATION_KINDS[kind]


def check_ablations(df: pd.DataFrame, missing_msg: str, times_msg: str, kind: str = "wgmma") -> None:
    """ValueError (with these messages) unless `df` has the columns of ablation `kind` and positive times."""
    k = ablation_kind(kind)
    missing = [c for c in k.columns if c not in df.columns]
    if missing:
        raise ValueError(f"{missing_msg} {missing} ({k.recorder})")
    if df.empty or not (df[list(k.columns[2:])] > 0).all().all():
        raise ValueError(times_msg)


def load_ablation_profile(path: str | None = None, kind: str = "wgmma", profile_dir: str = PROFILE_DIR) -> pd.DataFrame:
    """The newest ``*_profile.csv`` in `profile_dir` (data/profiles) that has the columns of ablation `kind`
    (`ABLATION_KINDS`; newest = last in name order, numbers by value, as the files are named
    ``<device>_<date>[_<label>]_profile.csv``; or `path`), with its file name in column ``run``: per shape (``B``,
    ``L``) the kind's base and bar columns."""
    k = ablation_kind(kind)
    if path is None:
        files = sorted(glob.glob(os.path.join(profile_dir, "*_profile.csv")), key=_name_order)
        files = [f for f in files if set(k.columns) <= set(pd.read_csv(f, nrows=0).columns)]
        if not files:
            raise FileNotFoundError(f"no *_profile.csv with {kind} ablations in {profile_dir} (record one with "
                                    f"{k.recorder})")  # fmt: skip
        path = files[-1]
    df = pd.read_csv(path)
    check_ablations(df, f"{path} has no {kind} ablation columns",
                    f"{path}: every time must be a positive number of µs", kind)  # fmt: skip
    return df.assign(run=os.path.basename(path))

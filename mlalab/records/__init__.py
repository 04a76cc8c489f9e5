"""The recorded-data model: what data/ holds and how every view reads it (the CLI, the plots, the widgets and the
report all go through here). `schema`: the timing CSV's columns and config cells; `timings`: recorded runs and their
views; `ab`: A/B experiment tables; `profiles`: per-CTA time lines and ablation profiles.
"""

from __future__ import annotations

from .schema import CSV_COLUMNS, DATA_ROOT, TimingRecord, is_default_config, parse_config
from .timings import RecordedView, default_run, headline, load_recorded, recorded_view

__all__ = [
    "CSV_COLUMNS",
    "DATA_ROOT",
    "TimingRecord",
    "is_default_config",
    "parse_config",
    "RecordedView",
    "default_run",
    "headline",
    "load_recorded",
    "recorded_view",
]

"""Accuracy of quantized MLA decode against the exact fp64 reference, from one record to a resumable study.

`metrics`: one configuration's record (`evaluate`, `evaluate_prepared`, `output_metrics`, `mismatch_fraction`);
`grid`: a study's rows, their keys and tasks; `executors`: serial, local processes or Dask; `store`: atomic,
resumable tables on disk; `sweep`: a grid on an executor (`sweep`) and the CPU-vs-GPU check (`device_agreement`);
`presets`: competition problems (inputs, shapes, seeds, check) by name; `demos`: notebook 02's teaching tables.
"""

from __future__ import annotations

from .demos import direct_cast_demo, vacuous_check_demo
from .grid import COMPETITION_SHAPES, Grid, GridRow, Task, parse_shapes, run_task
from .metrics import (
    CHECKS,
    DEFAULT_TOLERANCES,
    NamedCheck,
    Prepared,
    check_columns,
    check_device,
    check_key,
    check_tolerances,
    config_columns,
    decode_q_variants,
    evaluate,
    evaluate_prepared,
    get_check,
    half_kv_output,
    mismatch_fraction,
    mismatch_key,
    output_metrics,
    prepare,
)
from .presets import PRESETS, CompetitionPreset, get_preset
from .store import (
    ForeignOutputError,
    OutputBusyError,
    ResultStore,
    check_output_path,
    read_table,
    recorded_studies,
    recorded_study,
    save_table,
)
from .sweep import AGREEMENT_RTOL, compare_tables, device_agreement, sweep

__all__ = [
    "AGREEMENT_RTOL",
    "CHECKS",
    "PRESETS",
    "CompetitionPreset",
    "get_preset",
    "NamedCheck",
    "check_columns",
    "check_key",
    "get_check",
    "half_kv_output",
    "COMPETITION_SHAPES",
    "DEFAULT_TOLERANCES",
    "ForeignOutputError",
    "OutputBusyError",
    "Grid",
    "GridRow",
    "Prepared",
    "ResultStore",
    "Task",
    "check_device",
    "check_output_path",
    "check_tolerances",
    "compare_tables",
    "config_columns",
    "decode_q_variants",
    "device_agreement",
    "direct_cast_demo",
    "evaluate",
    "evaluate_prepared",
    "mismatch_fraction",
    "mismatch_key",
    "output_metrics",
    "parse_shapes",
    "prepare",
    "read_table",
    "recorded_studies",
    "recorded_study",
    "run_task",
    "save_table",
    "sweep",
    "vacuous_check_demo",
]

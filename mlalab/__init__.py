"""mlalab: a research workbench for DeepSeek-R1 absorbed-MLA decode.

Core names are importable from the package; heavier parts (quantization, split-KV planning, kernels,
plots, widgets) live in their modules: ``mlalab.quant``, ``mlalab.accuracy``, ``mlalab.splitkv``,
``mlalab.backends``, ``mlalab.timing``, ``mlalab.plots``, ``mlalab.widgets``.
"""

from __future__ import annotations

from .config import GPU_TARGETS, MLA, DecodeCase, GpuTarget, InputDist, MLAConfig, get_target
from .inputs import DecodeInputs, make_inputs, ragged_kv_lens, uniform_kv_lens
from .reference import decode_inputs_reference, decode_reference

__version__ = "0.2.0"

__all__ = [
    "__version__",
    "MLA",
    "MLAConfig",
    "DecodeCase",
    "InputDist",
    "GpuTarget",
    "GPU_TARGETS",
    "get_target",
    "DecodeInputs",
    "make_inputs",
    "ragged_kv_lens",
    "uniform_kv_lens",
    "decode_reference",
    "decode_inputs_reference",
]

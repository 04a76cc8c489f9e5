"""Argument building for aiter's persistent MLA decode — pure Python, testable without a GPU.

Everything the `aiter` backend decides before it touches the GPU lives here, so it can be checked on the CPU
with real values:

* which aiter releases we support and the keyword names of their three entry points
  (`get_mla_metadata_v1`, `mla_decode_stage1_asm_fwd`, `mla_reduce_v1`) — `AiterAbi`, `abi_for_version`;
* the fp8 flavour of the GPU architecture (e4m3fnuz on gfx942, e4m3fn on gfx950) — `fp8_flavour_for_arch`;
* the metadata / partial buffer shapes from aiter's documented formulas — `metadata_buffer_shapes`;
* guards for the documented crash hazards — `check_request`, `check_fragments`, `check_metadata_pointers`;
* the keyword dictionaries for the three calls — `metadata_kwargs`, `stage1_kwargs`, `reduce_kwargs`.

Facts come from /work/shared/research/aiter_persistent_mla.md (section numbers cited as "§"). Nothing here
imports aiter. All calls are built as keyword dictionaries: positional calls bind wrongly across releases
(`lse` was inserted into stage 1 in v0.1.12, `num_kv_splits` into the reduce in v0.1.16; §0.1).
"""

from __future__ import annotations

import enum
import inspect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config import MLA, get_target

__all__ = [
    "AiterVersion",
    "parse_version",
    "AiterAbi",
    "abi_for_version",
    "abi_from_signatures",
    "check_signature",
    "SUPPORTED_RANGE",
    "Mode",
    "AiterSettings",
    "settings_for_precision",
    "arch_from_gcn_name",
    "fp8_flavour_for_arch",
    "fp8_torch_dtype",
    "metadata_buffer_shapes",
    "partial_buffer_shapes",
    "check_request",
    "check_fragments",
    "check_metadata_pointers",
    "info_kwargs",
    "metadata_kwargs",
    "stage1_kwargs",
    "reduce_kwargs",
    "mla_decode_fwd_kwargs",
    "token_kv_indices",
]


# --------------------------------------------------------------------------------------------------------------
# Versions and the keyword signatures of each release (§0.1)
# --------------------------------------------------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"^\s*v?(\d+)\.(\d+)\.(\d+)(?:[.-]?post(\d+))?(?:[.-]?(dev|rc|a|b)(\d+))?(?:\+([0-9A-Za-z.\-_]+))?\s*$"
)


@dataclass(frozen=True)
class AiterVersion:
    """A parsed `amd-aiter` version. Ordering: pre-releases (dev/rc/a/b) sort before their release, posts after."""

    major: int
    minor: int
    patch: int
    post: int = 0
    pre: bool = False  # a dev/rc build: its signatures may sit between two releases
    text: str = ""

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (self.major, self.minor, self.patch, -1 if self.pre else self.post)

    def __lt__(self, other: object) -> bool:  # compare by release, not by the original text
        if not isinstance(other, AiterVersion):
            return NotImplemented
        return self.key < other.key

    def __le__(self, other: object) -> bool:
        if not isinstance(other, AiterVersion):
            return NotImplemented
        return self.key <= other.key

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}.{self.patch}" + (f".post{self.post}" if self.post else "")


def parse_version(text: str) -> AiterVersion:
    """Parse versions such as ``0.1.11.post1``, ``0.1.16``, ``0.1.12.dev3+g1a2b3c``, ``v0.1.20``."""
    if not isinstance(text, str):
        raise TypeError(f"version must be a str, got {type(text).__name__}")
    m = _VERSION_RE.match(text)
    if m is None:
        raise ValueError(f"cannot parse aiter version {text!r} (expected e.g. 0.1.11.post1)")
    major, minor, patch, post, pre_kind, _pre_n, _local = m.groups()
    return AiterVersion(int(major), int(minor), int(patch), int(post or 0), pre_kind is not None, text.strip())


def _v(text: str) -> AiterVersion:
    return parse_version(text)


# The releases the research note documents: v0.1.10.post2 (first with page_size/nhead_kv in stage 1 and
# kv_last_page_lens/page_size in the metadata) up to the v0.1.20 series (the snapshot's HEAD).
SUPPORTED_RANGE: tuple[AiterVersion, AiterVersion] = (_v("0.1.10.post2"), _v("0.1.21.dev0"))

# Stage-1 keyword names (aiter/ops/attention.py), in the order of the v0.1.11 ABI (19 args, = the seeds).
_STAGE1_HEAD = (
    "Q",
    "KV",
    "qo_indptr",
    "kv_indptr",
    "kv_page_indices",
    "kv_last_page_lens",
    "num_kv_splits_indptr",
    "work_meta_data",
    "work_indptr",
    "work_info_set",
    "max_seqlen_q",
    "page_size",
    "nhead_kv",
    "softmax_scale",
    "splitData",
    "splitLse",
    "output",
)
_REDUCE_HEAD = ("partial_output", "partial_lse", "reduce_indptr", "reduce_final_map", "reduce_partial_map")
_METADATA = (
    "seqlens_qo_indptr",
    "seqlens_kv_indptr",
    "kv_last_page_lens",
    "num_heads_per_head_k",
    "num_heads_k",
    "is_causal",
    "work_metadata_ptrs",
    "work_info_set",
    "work_indptr",
    "reduce_indptr",
    "reduce_final_map",
    "reduce_partial_map",
    "page_size",
    "kv_granularity",
    "max_seqlen_qo",
    "uni_seqlen_qo",
    "fast_mode",
    "topk",
    "max_split_per_batch",
    "intra_batch_mode",
    "dtype_q",
    "dtype_kv",
)
_INFO = (
    "batch_size",
    "max_seqlen_qo",
    "num_head_qo",
    "q_dtype",
    "kv_dtype",
    "is_sparse",
    "fast_mode",
    "num_kv_splits",
    "intra_batch_mode",
)


@dataclass(frozen=True)
class AiterAbi:
    """What differs between the supported releases, as far as our keyword calls are concerned.

    stage1_has_lse: stage 1 takes ``lse`` (the final LSE of unsplit works) — from v0.1.12.
    reduce_has_num_kv_splits: ``mla_reduce_v1`` takes ``num_kv_splits`` (sizes its scratch) — from v0.1.16.
    info_has_max_split_per_batch: ``get_mla_metadata_info_v1`` takes ``max_split_per_batch`` (HEAD; the note
        does not say which release added it, so it is only ever set from an inspected signature).
    stage1_has_causal: stage 1 takes ``causal`` — from v0.1.20, defaulting to True. mlalab's decode has no causal
        mask (every query token sees all of its request's KV), so we always pass ``causal=False``; otherwise q_len
        2–4 (speculative decode) would be masked by the kernel and disagree with the reference.
    source: "version" (from the release table) or "signature" (inspected from the installed aiter).
    """

    version: str
    stage1_has_lse: bool
    reduce_has_num_kv_splits: bool
    info_has_max_split_per_batch: bool = False
    source: str = "version"
    stage1_has_causal: bool = False

    def stage1_params(self) -> tuple[str, ...]:
        """Stage-1 parameters we rely on, in signature order (extra, defaulted ones of later releases omitted)."""
        return (
            _STAGE1_HEAD
            + (("lse",) if self.stage1_has_lse else ())
            + ("q_scale", "kv_scale")
            + (("causal",) if self.stage1_has_causal else ())
        )

    def reduce_params(self) -> tuple[str, ...]:
        mid = ("max_seqlen_q",) + (("num_kv_splits",) if self.reduce_has_num_kv_splits else ())
        return _REDUCE_HEAD + mid + ("final_output", "final_lse")

    @staticmethod
    def metadata_params() -> tuple[str, ...]:
        return _METADATA

    def info_params(self) -> tuple[str, ...]:
        return _INFO + (("max_split_per_batch",) if self.info_has_max_split_per_batch else ())


def abi_for_version(version: str | AiterVersion) -> AiterAbi:
    """The documented ABI of a release; ValueError naming the supported range for anything else (§0.1 table)."""
    v = version if isinstance(version, AiterVersion) else parse_version(version)
    lo, hi = SUPPORTED_RANGE
    if v < lo:
        raise ValueError(
            f"aiter {v} is too old: releases before 0.1.10.post2 lack page_size/nhead_kv in mla_decode_stage1_asm_fwd "
            f"and kv_last_page_lens/page_size in get_mla_metadata_v1. Supported: {lo} to the 0.1.20 series "
            "(pip install -U amd-aiter)"
        )
    if not v < hi:
        raise ValueError(
            f"aiter {v} is newer than the releases whose signatures mlalab documents ({lo} to the 0.1.20 series). "
            "Its keyword names may have changed; check its signatures against docs/aiter.md, then set "
            "MLALAB_AITER_ALLOW_NEWER=1 to let mlalab use the signatures it inspects from the installed aiter"
        )
    return AiterAbi(
        version=str(v),
        stage1_has_lse=not v < _v("0.1.12"),
        reduce_has_num_kv_splits=not v < _v("0.1.16"),
        source="version",
        stage1_has_causal=not v < _v("0.1.20"),
    )


def check_signature(
    fn_name: str, sig: inspect.Signature, passed: Iterable[str], *, optional: Iterable[str] = ()
) -> list[str]:
    """Problems calling `fn_name` with keyword names `passed`: a name the signature lacks (unless listed in
    `optional`, i.e. passed only when present), or a required parameter we do not pass. Empty list = fine.

    A signature of only ``*args, **kwargs`` (a wrapper that hides the real one) cannot be checked: returns
    ``["<fn_name>: signature not inspectable"]`` so the caller can fall back to the version table."""
    params = sig.parameters
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()):
        return [f"{fn_name}: signature not inspectable"]
    accepts_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    passed = set(passed)
    opt = set(optional)
    problems = []
    for name in sorted(passed):
        if name not in params and not accepts_kwargs and name not in opt:
            problems.append(f"{fn_name}: the installed aiter has no parameter {name!r}")
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty and name not in passed:
            problems.append(f"{fn_name}: required parameter {name!r} is unknown to mlalab")
    return problems


def abi_from_signatures(
    version: str,
    stage1: inspect.Signature,
    reduce: inspect.Signature,
    info: inspect.Signature | None = None,
) -> AiterAbi:
    """The ABI read from inspected signatures (authoritative for dev builds and, with the opt-in, newer releases).

    Raises ValueError listing every mismatch with the keyword names we pass."""
    has_lse = "lse" in stage1.parameters
    has_nks = "num_kv_splits" in reduce.parameters
    has_msp = info is not None and "max_split_per_batch" in info.parameters
    has_causal = "causal" in stage1.parameters
    abi = AiterAbi(version, has_lse, has_nks, has_msp, source="signature", stage1_has_causal=has_causal)
    problems = check_signature("mla_decode_stage1_asm_fwd", stage1, abi.stage1_params())
    problems += check_signature("mla_reduce_v1", reduce, abi.reduce_params())
    if info is not None:
        problems += check_signature("get_mla_metadata_info_v1", info, abi.info_params())
    if problems:
        raise ValueError("the installed aiter's signatures do not match what mlalab calls: " + "; ".join(problems))
    return abi


# --------------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------------


class Mode(str, enum.Enum):  # noqa: UP042 (StrEnum is 3.11+, we support 3.10)
    """Which aiter planner builds the work map (§2.1)."""

    INTRA_BATCH = "intra-batch"  # fast_mode=False, intra_batch_mode=True: v1.0 "fake non-persistent" (seeds, sglang)
    FAST = "fast"  # fast_mode=True: v1.2 greedy fill (vLLM)

    @classmethod
    def parse(cls, value: str | Mode) -> Mode:
        if isinstance(value, Mode):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"mode must be one of {[m.value for m in cls]}, got {value!r}") from None


_DTYPE_NAMES = ("bf16", "fp8")


@dataclass(frozen=True)
class AiterSettings:
    """How the aiter backend plans and calls the persistent decode.

    Args:
        mode: "intra-batch" (default; the seeds' and sglang's choice) or "fast".
        num_kv_splits: sizes the intra-batch buffers and is its per-request split cap (`max_split_per_batch`);
            must be >= 16 on gfx942 where the v1.0 planner always makes up to 16 splits (§2.5).
        max_split_per_batch: None = the mode's default: `num_kv_splits` in intra-batch mode (a per-request cap on
            gfx950), -1 in fast mode (global budget ``min(CUs, msp * B)`` = all CUs, vLLM's choice). -1 is refused
            in intra-batch mode (the v1.0 planner divides by it), and so is a cap above `num_kv_splits` (the
            buffers are sized by `num_kv_splits`).
        kv_granularity: KV cut granularity in tokens (aiter's tests and sglang: max(page_size, 16)).
        q_dtype, kv_dtype: "bf16" or "fp8" ("fp8" = the architecture's flavour, with per-tensor scales).
            fp8 q with bf16 kv has no kernel and is refused.
        path: "direct" (cached buffers, stage 1 + reduce called directly, as seed V6c) or "mla_decode_fwd"
            (aiter's one-call wrapper, which allocates its partial buffers on every call; for comparison).
        quant_math: passed to `mlalab.quant.quantize_fp8_per_tensor` ("float32" or "bf16").
    """

    mode: Mode = Mode.INTRA_BATCH
    num_kv_splits: int = 32
    max_split_per_batch: int | None = None
    kv_granularity: int = 16
    q_dtype: str = "fp8"
    kv_dtype: str = "fp8"
    path: str = "direct"
    quant_math: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        for name in ("num_kv_splits", "max_split_per_batch", "kv_granularity"):
            v = getattr(self, name)
            if (not isinstance(v, int) or isinstance(v, bool)) and not (name == "max_split_per_batch" and v is None):
                raise TypeError(f"AiterSettings.{name} must be an int, got {type(v).__name__}")
        if self.num_kv_splits < 1:
            raise ValueError(f"AiterSettings.num_kv_splits must be >= 1, got {self.num_kv_splits}")
        msp = self.max_split_per_batch
        if msp is not None and (msp == 0 or msp < -1):
            raise ValueError(f"AiterSettings.max_split_per_batch must be -1 or >= 1, got {msp}")
        if self.mode is Mode.INTRA_BATCH and msp == -1:
            raise ValueError(
                "AiterSettings.max_split_per_batch=-1 in intra-batch mode: the v1.0 planner uses it as a divisor "
                "(negative splits); pass a positive cap or leave it None (= num_kv_splits)"
            )
        if self.mode is Mode.INTRA_BATCH and msp is not None and msp > self.num_kv_splits:
            raise ValueError(
                f"AiterSettings.max_split_per_batch={msp} > num_kv_splits={self.num_kv_splits}: the intra-batch "
                "buffers are sized for num_kv_splits per request and would overflow"
            )
        g = self.kv_granularity
        if g < 1 or g & (g - 1):
            raise ValueError(f"AiterSettings.kv_granularity must be a power of two (aiter checks this), got {g}")
        for name in ("q_dtype", "kv_dtype"):
            if getattr(self, name) not in _DTYPE_NAMES:
                raise ValueError(f"AiterSettings.{name} must be one of {_DTYPE_NAMES}, got {getattr(self, name)!r}")
        if self.q_dtype == "fp8" and self.kv_dtype == "bf16":
            raise ValueError("AiterSettings: fp8 q with bf16 kv has no aiter persistent kernel (§3 kernel table)")
        if self.path not in ("direct", "mla_decode_fwd"):
            raise ValueError(f"AiterSettings.path must be 'direct' or 'mla_decode_fwd', got {self.path!r}")
        if self.quant_math not in ("float32", "bf16"):
            raise ValueError(f"AiterSettings.quant_math must be 'float32' or 'bf16', got {self.quant_math!r}")

    @property
    def fast_mode(self) -> bool:
        return self.mode is Mode.FAST

    @property
    def intra_batch_mode(self) -> bool:
        return self.mode is Mode.INTRA_BATCH

    @property
    def split_arg(self) -> int:
        """The `max_split_per_batch` value passed to the metadata call (never -1 in intra-batch mode, §8.2)."""
        if self.max_split_per_batch is not None:
            return self.max_split_per_batch
        return self.num_kv_splits if self.intra_batch_mode else -1


_PRECISIONS = {"a8w8": ("fp8", "fp8"), "a16w8": ("bf16", "fp8"), "bf16": ("bf16", "bf16")}


def settings_for_precision(precision: str, **overrides: Any) -> AiterSettings:
    """`AiterSettings` for the project's precision names (a8w8 = fp8 q and KV, a16w8 = bf16 q + fp8 KV, bf16)."""
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(_PRECISIONS)}, got {precision!r}")
    q, kv = _PRECISIONS[precision]
    return AiterSettings(q_dtype=q, kv_dtype=kv, **overrides)


# --------------------------------------------------------------------------------------------------------------
# Architecture and fp8 flavour (§3 "Architectures and fp8 flavour")
# --------------------------------------------------------------------------------------------------------------


def arch_from_gcn_name(gcn_arch_name: str) -> str:
    """``"gfx942:sramecc+:xnack-"`` (torch's ``gcnArchName``) -> ``"gfx942"``."""
    if not isinstance(gcn_arch_name, str) or not gcn_arch_name.strip():
        raise ValueError(f"gcn_arch_name must be a non-empty str, got {gcn_arch_name!r}")
    arch = gcn_arch_name.strip().split(":")[0].lower()
    if not re.fullmatch(r"gfx[0-9a-f]+", arch):
        raise ValueError(f"not an AMD GPU architecture name: {gcn_arch_name!r}")
    return arch


def fp8_flavour_for_arch(arch: str) -> str:
    """The fp8 e4m3 flavour aiter's kernels expect on `arch` (from the GPU target table; never assumed).

    Only gfx942 (MI300X/MI325X/MI308X) and gfx950 (MI350X/MI355X) ship these kernels."""
    arch = arch_from_gcn_name(arch)
    if arch not in ("gfx942", "gfx950"):
        raise ValueError(f"aiter's persistent MLA decode has kernels for gfx942 and gfx950 only, not {arch}")
    return get_target(arch).fp8_flavour


def fp8_torch_dtype(flavour: str) -> torch.dtype:
    """The torch dtype of an e4m3 flavour (the flavour table lives in `mlalab.quant`)."""
    if flavour not in ("e4m3fn", "e4m3fnuz"):
        raise ValueError(f"fp8 flavour must be e4m3fn or e4m3fnuz, got {flavour!r}")
    from ..quant import fp8_dtype

    return fp8_dtype(flavour)


# --------------------------------------------------------------------------------------------------------------
# Buffer shapes from the documented formulas (§1)
# --------------------------------------------------------------------------------------------------------------


def qo_tiles_per_request(q_len: int, num_heads: int, arch: str, q_dtype: str, kv_dtype: str) -> int:
    """q tiles per request (`max_qo_tiles_per_batch`) for the native 16-head case: 1 for every q_len <= 8."""
    if num_heads != 16:
        raise ValueError(f"only 16 query heads (DeepSeek-R1 at TP8) are modelled, got {num_heads}")
    rows = q_len * num_heads
    bf16 = q_dtype == "bf16" and kv_dtype == "bf16"
    if arch == "gfx950" and bf16 and rows % 128 == 0:
        return math.ceil(rows / 128)
    if arch == "gfx950" and bf16 and rows % 64 == 0:
        return math.ceil(rows / 64)
    return math.ceil(rows / 128)


def metadata_buffer_shapes(
    *,
    batch: int,
    q_len: int,
    num_cus: int,
    settings: AiterSettings,
    arch: str,
    num_heads: int = MLA.num_heads,
    info_has_max_split_per_batch: bool = False,
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The six metadata buffers as `get_mla_metadata_info_v1` sizes them, in ITS order (metadata, indptr,
    info_set, reduce_indptr, reduce_final_map, reduce_partial_map).

    N is the CU count (v0.1.11) or `max_splits` = CUs x occupancy (HEAD; occupancy is 1 except for an
    experimental HipKittens kernel, not modelled). `info_has_max_split_per_batch` applies HEAD's floor on
    `reduce_partial_map` when a positive split cap is passed."""
    for name, v in (("batch", batch), ("q_len", q_len), ("num_cus", num_cus)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not isinstance(settings, AiterSettings):
        raise TypeError(f"settings must be an AiterSettings, got {type(settings).__name__}")
    tiles = qo_tiles_per_request(q_len, num_heads, arch, settings.q_dtype, settings.kv_dtype)
    n = num_cus
    tile_cnt = batch * tiles
    if settings.intra_batch_mode:
        works = partials = tile_cnt * settings.num_kv_splits
    else:
        works = (batch + n - 1) * tiles
        partials = min(batch + n - 1, 2 * (n - 1)) * tiles
        if info_has_max_split_per_batch and settings.split_arg > 0:
            partials = max(partials, tile_cnt + min(n, settings.split_arg * batch))
    i32 = torch.int32
    return {
        "work_metadata": ((2,), torch.uint64),
        "work_indptr": ((n + 1,), i32),
        "work_info_set": ((works, 8), i32),
        "reduce_indptr": ((tile_cnt + 1,), i32),
        "reduce_final_map": ((tile_cnt, 2), i32),
        "reduce_partial_map": ((partials,), i32),
    }


def partial_buffer_shapes(
    partial_map_len: int, q_len: int, num_heads: int = MLA.num_heads, v_dim: int = MLA.v_dim
) -> dict[str, tuple[int, ...]]:
    """fp32 `logits` (partial outputs) and `attn_lse` as `mla_decode_fwd` allocates them (§3): one row per
    (partial, q token); 1 MiB per request at the seeds' 32 splits."""
    if partial_map_len < 0 or q_len < 1:
        raise ValueError(f"need partial_map_len >= 0 and q_len >= 1, got {partial_map_len}, {q_len}")
    rows = partial_map_len * q_len
    return {"logits": (rows, 1, num_heads, v_dim), "attn_lse": (rows, 1, num_heads, 1)}


# --------------------------------------------------------------------------------------------------------------
# Guards for the documented hazards (§6, §8)
# --------------------------------------------------------------------------------------------------------------

_GFX950_INTRA_BATCH_MIN_TOKENS = 196  # v1.0 on non-gfx942 divides by min(L // 196, ...) without a >= 1 clamp
_FP8_MIN_FRAGMENT = 4  # fp8 PS kernels gave NaN on KV fragments/tails under 4 tokens (aiter PRs #2106, #2128)
_GFX942_INTRA_BATCH_SPLITS = 16  # the v1.0 planner's fixed split count on gfx942


def check_request(
    *,
    kv_lens: Sequence[int],
    q_lens: Sequence[int],
    arch: str,
    settings: AiterSettings,
) -> None:
    """Refuse a decode that aiter is documented to crash on or get wrong; ValueError saying why and what to do."""
    if not isinstance(settings, AiterSettings):
        raise TypeError(f"settings must be an AiterSettings, got {type(settings).__name__}")
    kv = [int(x) for x in kv_lens]
    ql = [int(x) for x in q_lens]
    if not kv or len(kv) != len(ql):
        raise ValueError(f"kv_lens and q_lens must be non-empty and of equal length, got {len(kv)} and {len(ql)}")
    arch = arch_from_gcn_name(arch)
    fp8_flavour_for_arch(arch)  # refuses other architectures
    if min(kv) < 1:
        raise ValueError(f"request {kv.index(min(kv))} has no KV tokens; aiter's decode needs >= 1 per request")
    if len(set(ql)) != 1:
        raise ValueError(f"aiter's persistent decode takes one q length for all requests, got {sorted(set(ql))}")
    q_len = ql[0]
    if not 1 <= q_len <= 4:
        raise ValueError(f"q_len {q_len}: aiter has 16-head persistent kernels for q_len 1..4 only (vLLM #57642)")
    fp8 = settings.q_dtype == "fp8" or settings.kv_dtype == "fp8"
    if fp8 and min(kv) < _FP8_MIN_FRAGMENT:
        b = kv.index(min(kv))
        raise ValueError(
            f"request {b} has {kv[b]} KV tokens: fp8 persistent kernels gave NaN on KV fragments under "
            f"{_FP8_MIN_FRAGMENT} tokens (aiter PRs #2106/#2128); use bf16 or longer requests"
        )
    if settings.intra_batch_mode:
        if settings.split_arg < 1:
            raise ValueError("intra-batch mode needs max_split_per_batch > 0 (-1 reaches a divisor in v1.0)")
        if arch == "gfx942" and settings.num_kv_splits < _GFX942_INTRA_BATCH_SPLITS:
            raise ValueError(
                f"num_kv_splits={settings.num_kv_splits} < 16 on gfx942: the intra-batch planner always makes up to "
                "16 splits per request there, so work_info_set and reduce_partial_map would overflow"
            )
        if arch == "gfx950" and min(kv) < _GFX950_INTRA_BATCH_MIN_TOKENS:
            b = kv.index(min(kv))
            raise ValueError(
                f"request {b} has {kv[b]} KV tokens < {_GFX950_INTRA_BATCH_MIN_TOKENS}: on gfx950 the intra-batch "
                "planner computes 0 splits for it and divides by that; use mode='fast' for short requests"
            )


def check_fragments(
    work_info: torch.Tensor, n_work: int, *, page_size: int = 1, min_tokens: int = _FP8_MIN_FRAGMENT
) -> None:
    """After planning: every work's KV range (columns 4:5 of `work_info`, page-size-1 positions) must hold at
    least `min_tokens` tokens (fp8 hazard). Works with a real aiter work map read back to the CPU, or ours."""
    if not isinstance(work_info, torch.Tensor) or work_info.dim() != 2 or work_info.shape[1] != 8:
        raise ValueError(f"work_info must be an (n, 8) tensor, got {getattr(work_info, 'shape', type(work_info))}")
    if not 0 <= n_work <= work_info.shape[0]:
        raise ValueError(f"n_work must be in [0, {work_info.shape[0]}], got {n_work}")
    if page_size != 1:
        raise ValueError("check_fragments models page_size 1 (the aiter backend always expands pages to tokens)")
    w = work_info[:n_work].to("cpu", torch.int64)
    length = w[:, 5] - w[:, 4]
    bad = torch.nonzero(length < min_tokens).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"{bad.numel()} work(s) cover fewer than {min_tokens} KV tokens (first: work {i}, request "
            f"{int(w[i, 0])}, kv [{int(w[i, 4])}, {int(w[i, 5])})); the fp8 kernels are documented to give NaN "
            "there (aiter PRs #2106/#2128). Use bf16, another mode or a larger kv_granularity"
        )


def check_metadata_pointers(work_metadata: Sequence[int], work_indptr_ptr: int, work_info_ptr: int) -> None:
    """`work_metadata` holds the raw device addresses of `work_indptr` and `work_info_set`; the stage-1 kernel
    follows them, so the buffers must not have moved (cloned, re-allocated) since the metadata call."""
    vals = [int(x) for x in work_metadata]
    if len(vals) != 2:
        raise ValueError(f"work_metadata must hold 2 addresses, got {len(vals)}")
    # torch stores uint64 values as int64 on the host side: compare modulo 2**64.
    got = [x % (1 << 64) for x in vals]
    want = [int(work_indptr_ptr) % (1 << 64), int(work_info_ptr) % (1 << 64)]
    if got != want:
        raise RuntimeError(
            f"aiter work_metadata points at {[hex(x) for x in got]} but work_indptr/work_info_set live at "
            f"{[hex(x) for x in want]}: the metadata buffers moved after planning; re-plan before decoding"
        )


# --------------------------------------------------------------------------------------------------------------
# Keyword dictionaries
# --------------------------------------------------------------------------------------------------------------


def info_kwargs(
    abi: AiterAbi,
    *,
    settings: AiterSettings,
    batch: int,
    q_len: int,
    q_torch_dtype: torch.dtype,
    kv_torch_dtype: torch.dtype,
    num_heads: int = MLA.num_heads,
) -> dict[str, Any]:
    """Keywords for `get_mla_metadata_info_v1` (pure Python in aiter; returns six (shape, dtype) pairs)."""
    if batch < 1 or q_len < 1:
        raise ValueError(f"batch and q_len must be >= 1, got {batch}, {q_len}")
    kw: dict[str, Any] = {
        "batch_size": batch,
        "max_seqlen_qo": q_len,
        "num_head_qo": num_heads,
        "q_dtype": q_torch_dtype,
        "kv_dtype": kv_torch_dtype,
        "is_sparse": False,
        "fast_mode": settings.fast_mode,
        "num_kv_splits": settings.num_kv_splits,
        "intra_batch_mode": settings.intra_batch_mode,
    }
    if abi.info_has_max_split_per_batch:
        kw["max_split_per_batch"] = settings.split_arg
    return kw


def metadata_kwargs(
    *,
    settings: AiterSettings,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_last_page_lens: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    q_torch_dtype: torch.dtype,
    kv_torch_dtype: torch.dtype,
    num_heads: int = MLA.num_heads,
    num_kv_heads: int = MLA.num_kv_heads,
) -> dict[str, Any]:
    """Keywords for `get_mla_metadata_v1` (page size 1; dtypes always passed — vLLM #46997)."""
    for name in ("work_metadata", "work_info_set", "work_indptr", "reduce_indptr", "reduce_final_map"):
        if name not in buffers:
            raise ValueError(f"buffers is missing {name!r}")
    if "reduce_partial_map" not in buffers:
        raise ValueError("buffers is missing 'reduce_partial_map'")
    if q_len < 1:
        raise ValueError(f"q_len must be >= 1, got {q_len}")
    return {
        "seqlens_qo_indptr": qo_indptr,
        "seqlens_kv_indptr": kv_indptr,
        "kv_last_page_lens": kv_last_page_lens,
        "num_heads_per_head_k": num_heads // num_kv_heads,
        "num_heads_k": num_kv_heads,
        "is_causal": False,  # every q token sees all of its request's KV (the competition's decode)
        "work_metadata_ptrs": buffers["work_metadata"],
        "work_info_set": buffers["work_info_set"],
        "work_indptr": buffers["work_indptr"],
        "reduce_indptr": buffers["reduce_indptr"],
        "reduce_final_map": buffers["reduce_final_map"],
        "reduce_partial_map": buffers["reduce_partial_map"],
        "page_size": 1,
        "kv_granularity": settings.kv_granularity,
        "max_seqlen_qo": q_len,
        "uni_seqlen_qo": q_len,  # must be > 0 in intra-batch mode (v1.0 ignores qo_indptr)
        "fast_mode": settings.fast_mode,
        "topk": -1,  # dense attention (no sparse top-k selection)
        "max_split_per_batch": settings.split_arg,
        "intra_batch_mode": settings.intra_batch_mode,
        "dtype_q": q_torch_dtype,
        "dtype_kv": kv_torch_dtype,
    }


def stage1_kwargs(
    abi: AiterAbi,
    *,
    q: Any,
    kv_buffer: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_lens: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    sm_scale: float,
    logits: Any,
    attn_lse: Any,
    out: Any,
    final_lse: Any | None,
    q_scale: Any | None,
    kv_scale: Any | None,
    fp8: bool,
) -> dict[str, Any]:
    """Keywords for `mla_decode_stage1_asm_fwd` in persistent mode (`num_kv_splits_indptr=None` selects it).

    For fp8 both scales are required (aiter only asserts this in v0.1.11 and otherwise passes garbage)."""
    if fp8 and (q_scale is None or kv_scale is None):
        raise ValueError("fp8 decode needs both q_scale and kv_scale (float32 [1] dequantization multipliers)")
    kw: dict[str, Any] = {
        "Q": q,
        "KV": kv_buffer,
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "kv_page_indices": kv_indices,
        "kv_last_page_lens": kv_last_page_lens,
        "num_kv_splits_indptr": None,
        "work_meta_data": buffers["work_metadata"],
        "work_indptr": buffers["work_indptr"],
        "work_info_set": buffers["work_info_set"],
        "max_seqlen_q": q_len,
        "page_size": 1,
        "nhead_kv": MLA.num_kv_heads,
        "softmax_scale": float(sm_scale),
        "splitData": logits,
        "splitLse": attn_lse,
        "output": out,
        "q_scale": q_scale,
        "kv_scale": kv_scale,
    }
    if abi.stage1_has_lse:
        kw["lse"] = final_lse
    if abi.stage1_has_causal:
        kw["causal"] = False  # decode: all KV visible to every query token (see AiterAbi)
    return kw


def reduce_kwargs(
    abi: AiterAbi,
    *,
    logits: Any,
    attn_lse: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    num_kv_splits: int,
    out: Any,
    final_lse: Any | None,
) -> dict[str, Any]:
    """Keywords for `mla_reduce_v1`. `num_kv_splits` (v0.1.16+) only sizes the reduce's scratch, as
    max(CUs, num_kv_splits); pass at least the largest partial count of any tile."""
    kw: dict[str, Any] = {
        "partial_output": logits,
        "partial_lse": attn_lse,
        "reduce_indptr": buffers["reduce_indptr"],
        "reduce_final_map": buffers["reduce_final_map"],
        "reduce_partial_map": buffers["reduce_partial_map"],
        "max_seqlen_q": q_len,
        "final_output": out,
        "final_lse": final_lse,
    }
    if abi.reduce_has_num_kv_splits:
        kw["num_kv_splits"] = int(num_kv_splits)
    return kw


def mla_decode_fwd_kwargs(
    *,
    q: Any,
    kv_buffer: Any,
    out: Any,
    qo_indptr: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_lens: Any,
    buffers: Mapping[str, Any],
    q_len: int,
    sm_scale: float,
    num_kv_splits: int,
    settings: AiterSettings,
    q_scale: Any | None,
    kv_scale: Any | None,
    accepts: Iterable[str] = (),
    return_lse: bool = False,
) -> dict[str, Any]:
    """Keywords for aiter's one-call `mla_decode_fwd` (persistent branch: `work_meta_data` given). Passing
    `num_kv_splits` explicitly keeps HEAD from falling back to non-persistent for gfx950 bf16 B >= 32.
    `return_lse=True` is added when asked for and the installed signature (`accepts`) has it; `causal=False`
    whenever the signature has ``causal`` (HEAD defaults it to True, which would mask speculative decode)."""
    kw: dict[str, Any] = {
        "q": q,
        "kv_buffer": kv_buffer,
        "o": out,
        "qo_indptr": qo_indptr,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_last_page_lens": kv_last_page_lens,
        "max_seqlen_q": q_len,
        "page_size": 1,
        "nhead_kv": MLA.num_kv_heads,
        "sm_scale": float(sm_scale),
        "logit_cap": 0.0,
        "num_kv_splits": int(num_kv_splits),
        "work_meta_data": buffers["work_metadata"],
        "work_indptr": buffers["work_indptr"],
        "work_info_set": buffers["work_info_set"],
        "reduce_indptr": buffers["reduce_indptr"],
        "reduce_final_map": buffers["reduce_final_map"],
        "reduce_partial_map": buffers["reduce_partial_map"],
        "q_scale": q_scale,
        "kv_scale": kv_scale,
        "intra_batch_mode": settings.intra_batch_mode,
    }
    accepted = set(accepts)
    if return_lse and "return_lse" in accepted:
        kw["return_lse"] = True
    if "causal" in accepted:
        kw["causal"] = False
    return kw


def token_kv_indices(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand a page table to page size 1 (what vLLM does for aiter): returns ``(token_indptr, token_indices)``
    where ``token_indices`` are rows of ``kv_buffer.view(num_pages * page_size, 1, 1, 576)``. No KV is copied.

    aiter's bf16 persistent paths were wrong at page_size > 1 on gfx950 (aiter #3095), hence always 1."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    dev = kv_indices.device
    pages = (kv_indptr[1:] - kv_indptr[:-1]).to("cpu", torch.int64)
    last = kv_last_page_len.to("cpu", torch.int64)
    lens = torch.where(pages > 0, (pages - 1) * page_size + last, torch.zeros_like(pages))
    token_indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32)
    token_indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
    if page_size == 1:
        return token_indptr.to(dev), kv_indices[: int(kv_indptr[-1])].to(torch.int32)
    n_refs = int(kv_indptr[-1])
    rows = kv_indices[:n_refs].to(torch.int64).repeat_interleave(page_size) * page_size
    rows = rows + torch.arange(page_size, device=dev).repeat(n_refs)
    # keep the first len_b tokens of each request's expanded pages (drop the unused tail of its last page)
    keep = torch.zeros(n_refs * page_size, dtype=torch.bool)
    start = 0
    for p, n in zip(pages.tolist(), lens.tolist()):
        keep[start : start + n] = True
        start += p * page_size
    return token_indptr.to(dev), rows[keep.to(dev)].to(torch.int32)

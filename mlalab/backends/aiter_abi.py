"""aiter's releases as mlalab calls them: versions, the keyword signature of each supported release, signature checks,
and the GPU architectures with their fp8 flavour. Pure Python; nothing here imports aiter.

The facts behind the release table (which parameter appeared in which release) are in docs/aiter.md, "Releases and
signatures". Every call is built as a keyword dictionary: positional calls bind wrongly across releases (``lse`` was
inserted into stage 1 in v0.1.12, ``num_kv_splits`` into the reduce in v0.1.16).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..config import get_target

__all__ = [
    "AiterVersion",
    "parse_version",
    "AiterAbi",
    "abi_for_version",
    "abi_from_signatures",
    "check_signature",
    "SUPPORTED_RANGE",
    "LEGACY_RANGE",
    "WINDOWS",
    "window_of",
    "arch_from_gcn_name",
    "fp8_flavour_for_arch",
    "fp8_torch_dtype",
]


# --------------------------------------------------------------------------------------------------------------
# Versions and the keyword signatures of each release (docs/aiter.md, "Releases and signatures")
# --------------------------------------------------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"^\s*v?(\d+)\.(\d+)\.(\d+)(?:[.-]?post(\d+))?(?:[.-]?(dev|rc|a|b)(\d+))?(?:\+([0-9A-Za-z.\-_]+))?\s*$"
)


@dataclass(frozen=True)
class AiterVersion:
    """A parsed `amd-aiter` version. Ordering (as PEP 440): a pre-release (dev/rc/a/b) sorts before the release it
    leads to, ``X.postN.devM`` between ``X.post(N-1)`` and ``X.postN``; posts after their release."""

    major: int
    minor: int
    patch: int
    post: int = 0
    pre: bool = False  # a dev/rc build: its signatures may sit between two releases
    text: str = ""

    @property
    def key(self) -> tuple[int, int, int, int, int]:
        return (self.major, self.minor, self.patch, self.post, -1 if self.pre else 0)

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


# The two windows of releases mlalab calls (docs/aiter.md, "Releases and signatures"), each [first, end):
# v0.1.10.post2 (first with page_size/nhead_kv in stage 1 and kv_last_page_lens/page_size in the metadata) up to the
# v0.1.20 series; and v0.1.7 ... v0.1.7.post2, the API of the wheel the package index serves (0.1.7.post2.dev18):
# fast mode only, no page size, no dtypes, and the metadata's work_indptr / work_info stub order that differs from
# its binding. Releases between the two (v0.1.7.post3 ... v0.1.10.post1) changed signatures one at a time: refused.
SUPPORTED_RANGE: tuple[AiterVersion, AiterVersion] = (_v("0.1.10.post2"), _v("0.1.21.dev0"))
LEGACY_RANGE: tuple[AiterVersion, AiterVersion] = (_v("0.1.7"), _v("0.1.7.post3.dev0"))
WINDOWS = {
    "0.1.10.post2 to 0.1.20.x": SUPPORTED_RANGE,
    "0.1.7 to 0.1.7.post2 (the PyPI wheel)": LEGACY_RANGE,
}


def window_of(version: str | AiterVersion) -> str | None:
    """The name of the supported window `version` falls in (a key of `WINDOWS`), or None."""
    v = version if isinstance(version, AiterVersion) else parse_version(version)
    for name, (lo, hi) in WINDOWS.items():
        if lo <= v and v < hi:
            return name
    return None


# Stage-1 keyword names (aiter/ops/attention.py), in the order of the v0.1.11 ABI (19 args, = the seeds).
_STAGE1_HEAD = (  # v0.1.10.post2 and later; the v0.1.7 window has no page_size / nhead_kv and says work_metadata
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
    info_has_max_split_per_batch: ``get_mla_metadata_info_v1`` takes ``max_split_per_batch`` — from v0.1.16.
    stage1_has_causal: stage 1 takes ``causal`` — from v0.1.20, defaulting to True. We always pass the case's
        `DecodeCase.causal` (False unless asked: every query token sees all of its request's KV), so q_len 2–4 is
        masked only when the reference is; a causal case on an older release is refused.
    source: "version" (from the release table) or "signature" (inspected from the installed aiter).
    legacy: the v0.1.7 ... v0.1.7.post2 API (`LEGACY_RANGE`): stage 1 without ``page_size`` / ``nhead_kv`` and with
        ``work_metadata`` for ``work_meta_data``; the reduce without ``max_seqlen_q``; the metadata without
        ``kv_last_page_lens``, ``page_size``, ``max_split_per_batch``, ``intra_batch_mode`` and dtypes, its stub naming
        ``work_indptr, work_info`` where the binding takes ``work_info_set, work_indptr``; the info call without
        ``num_kv_splits`` / ``intra_batch_mode``. Fast mode only (`unsupported`).
    """

    version: str
    stage1_has_lse: bool
    reduce_has_num_kv_splits: bool
    info_has_max_split_per_batch: bool = False
    source: str = "version"
    stage1_has_causal: bool = False
    legacy: bool = False

    @property
    def window(self) -> str:
        return next(iter(WINDOWS)) if not self.legacy else list(WINDOWS)[1]

    def unsupported(self) -> dict[str, str]:
        """{what: why} for the backend's choices this release cannot run."""
        if not self.legacy:
            return {}
        return {
            "mode='intra-batch'": "no intra_batch_mode before v0.1.7.post5 (fast_mode=False runs the cost heap)",
        }

    def works(self) -> str:
        """One line: what runs with this release."""
        lse = "LSE of every row" if self.stage1_has_lse else "LSE of split rows only (stage 1 has no lse)"
        modes = "fast mode only" if self.legacy else "intra-batch and fast modes"
        return f"{modes}; a8w8, a16w8, bf16; q_len 1-4; {lse}"

    def stage1_params(self) -> tuple[str, ...]:
        """Stage-1 parameters we rely on, in signature order (extra, defaulted ones of later releases omitted)."""
        head = _STAGE1_HEAD
        if self.legacy:
            head = tuple("work_metadata" if n == "work_meta_data" else n for n in head if n not in _LEGACY_STAGE1_NOT)
        return (
            head
            + (("lse",) if self.stage1_has_lse else ())
            + ("q_scale", "kv_scale")
            + (("causal",) if self.stage1_has_causal else ())
        )

    def reduce_params(self) -> tuple[str, ...]:
        mid = (() if self.legacy else ("max_seqlen_q",)) + (("num_kv_splits",) if self.reduce_has_num_kv_splits else ())
        return _REDUCE_HEAD + mid + ("final_output", "final_lse")

    def metadata_params(self) -> tuple[str, ...]:
        if self.legacy:
            return tuple("work_info" if n == "work_info_set" else n for n in _METADATA if n not in _LEGACY_METADATA_NOT)
        return _METADATA

    def info_params(self) -> tuple[str, ...]:
        if self.legacy:
            return _INFO[:7]
        return _INFO + (("max_split_per_batch",) if self.info_has_max_split_per_batch else ())


_LEGACY_STAGE1_NOT = ("page_size", "nhead_kv")
_LEGACY_METADATA_NOT = (
    "kv_last_page_lens",
    "page_size",
    "max_split_per_batch",
    "intra_batch_mode",
    "dtype_q",
    "dtype_kv",
)


def abi_for_version(version: str | AiterVersion) -> AiterAbi:
    """The ABI of a release from the release table; ValueError naming the supported range for anything else
    (docs/aiter.md, "Releases and signatures")."""
    v = version if isinstance(version, AiterVersion) else parse_version(version)
    lo, hi = SUPPORTED_RANGE
    if LEGACY_RANGE[0] <= v and v < LEGACY_RANGE[1]:
        return AiterAbi(version=str(v), stage1_has_lse=False, reduce_has_num_kv_splits=False, legacy=True)
    if v < lo:
        raise ValueError(
            f"aiter {v} is not supported: mlalab calls 0.1.7 to 0.1.7.post2 (the PyPI wheel, fast mode only) and "
            f"{lo} to the 0.1.20 series; the releases between changed their signatures one at a time. Build aiter "
            "from source at a tag of the 0.1.1x series (docs/aiter.md, Install)"
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
        info_has_max_split_per_batch=not v < _v("0.1.16"),
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
    legacy = "page_size" not in stage1.parameters
    abi = AiterAbi(version, has_lse, has_nks, has_msp, "signature", has_causal, legacy)
    problems = check_signature("mla_decode_stage1_asm_fwd", stage1, abi.stage1_params())
    problems += check_signature("mla_reduce_v1", reduce, abi.reduce_params())
    if info is not None:
        problems += check_signature("get_mla_metadata_info_v1", info, abi.info_params())
    if problems:
        raise ValueError("the installed aiter's signatures do not match what mlalab calls: " + "; ".join(problems))
    return abi


# --------------------------------------------------------------------------------------------------------------
# Architecture and fp8 flavour (docs/aiter.md, "Architectures and fp8")
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

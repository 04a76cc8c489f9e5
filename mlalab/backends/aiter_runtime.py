"""Finding a usable aiter: installed, a supported release, a ROCm torch with a gfx942/gfx950 GPU, importable, with
signatures that match what mlalab calls and the fp8 flavour of the architecture. `probe()` says why not (never
raises; cached for the process, since ``import aiter`` off ROCm takes seconds and raises RuntimeError, not
ImportError); `load()` returns the `AiterRuntime`. The release table is `aiter_abi`; docs/aiter.md, "Releases and
signatures", says which releases are supported and why.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from .aiter_abi import (
    WINDOWS,
    AiterAbi,
    abi_for_version,
    abi_from_signatures,
    arch_from_gcn_name,
    check_signature,
    fp8_flavour_for_arch,
    fp8_torch_dtype,
    parse_version,
)

__all__ = ["AiterRuntime", "installed_version", "describe", "load", "probe", "signature"]


def installed_version() -> str | None:
    """The installed aiter distribution's version (PyPI name ``amd-aiter``; source builds may call it ``aiter``),
    read from package metadata without importing aiter. None if not installed as a distribution."""
    for dist in ("amd-aiter", "aiter", "amd_aiter"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def describe() -> str | None:
    """Which aiter is installed, which supported window its version falls in and what works with it, read from
    package metadata (aiter is not imported); None when no aiter distribution is installed."""
    text = installed_version()
    if text is None:
        return None
    try:
        abi = abi_for_version(text)
    except ValueError:
        return f"aiter {text} installed: outside the supported windows ({'; '.join(WINDOWS)})"
    return f"aiter {text} installed, window {abi.window}: {abi.works()}"


@dataclass(frozen=True)
class AiterRuntime:
    """A usable aiter: the module, its ABI, and the GPU it drives."""

    module: ModuleType
    abi: AiterAbi
    arch: str  # gfx942 / gfx950
    num_cus: int  # multiProcessorCount: what aiter's planners use
    fp8_flavour: str  # e4m3fnuz / e4m3fn, from the architecture
    device: torch.device
    notes: tuple[str, ...] = ()

    @property
    def fp8_dtype(self) -> torch.dtype:
        return fp8_torch_dtype(self.fp8_flavour)


def signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _load_uncached() -> AiterRuntime:
    if importlib.util.find_spec("aiter") is None:
        raise RuntimeError(
            "aiter is not installed (docs/aiter.md, Install: a source build at a 0.1.1x tag, or pip install amd-aiter "
            "for fast mode only; it runs on AMD Instinct GPUs with ROCm only)"
        )
    version_text = installed_version()
    allow_newer = os.environ.get("MLALAB_AITER_ALLOW_NEWER", "0") not in ("", "0")
    version = parse_version(version_text) if version_text is not None else None
    version_abi: AiterAbi | None = None
    if version is not None:
        try:
            version_abi = abi_for_version(version)
        except ValueError as e:
            newer = not version < parse_version("0.1.10.post2")
            if not (allow_newer and newer):
                raise RuntimeError(str(e)) from None
    if torch.version.hip is None:
        raise RuntimeError("this torch build has no ROCm support (torch.version.hip is None); aiter needs ROCm")
    if not torch.cuda.is_available():
        raise RuntimeError("no ROCm GPU is visible to torch (torch.cuda.is_available() is False)")
    try:
        aiter = importlib.import_module("aiter")
    except Exception as e:  # aiter raises RuntimeError ("ROCm version file not found") off ROCm, not ImportError
        raise RuntimeError(f"import aiter failed: {type(e).__name__}: {e}") from None
    if version is None:
        v = getattr(aiter, "__version__", None)
        if not isinstance(v, str):
            raise RuntimeError("cannot tell which aiter release is installed (no package metadata, no __version__)")
        version = parse_version(v)
        try:
            version_abi = abi_for_version(version)
        except ValueError as e:
            if not allow_newer:
                raise RuntimeError(str(e)) from None

    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    arch = arch_from_gcn_name(getattr(props, "gcnArchName", "") or "unknown")
    try:
        flavour = fp8_flavour_for_arch(arch)
    except ValueError as e:
        raise RuntimeError(str(e)) from None
    aiter_fp8 = getattr(getattr(aiter, "dtypes", None), "fp8", None)
    if aiter_fp8 is not None and aiter_fp8 != fp8_torch_dtype(flavour):
        raise RuntimeError(
            f"aiter.dtypes.fp8 is {aiter_fp8} but {arch} kernels expect {fp8_torch_dtype(flavour)}; refusing to guess"
        )

    # Signatures: authoritative when inspectable (dev builds, opted-in newer releases); must agree with the
    # release table for a documented release.
    fns = {
        n: getattr(aiter, n, None)
        for n in ("mla_decode_stage1_asm_fwd", "mla_reduce_v1", "get_mla_metadata_info_v1", "get_mla_metadata_v1")
    }
    missing = [n for n, f in fns.items() if f is None]
    if missing:
        raise RuntimeError(f"aiter {version} lacks {', '.join(missing)}")
    sigs = {n: signature(f) for n, f in fns.items()}
    notes: list[str] = []
    inspectable = all(
        s is not None and check_signature(n, s, ()) != [f"{n}: signature not inspectable"] for n, s in sigs.items()
    )
    if inspectable:
        try:
            sig_abi = abi_from_signatures(
                str(version),
                sigs["mla_decode_stage1_asm_fwd"],
                sigs["mla_reduce_v1"],
                sigs["get_mla_metadata_info_v1"],
            )
            problems = check_signature("get_mla_metadata_v1", sigs["get_mla_metadata_v1"], sig_abi.metadata_params())  # type: ignore[arg-type]
            if problems:
                raise ValueError("; ".join(problems))
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        if (
            version_abi is not None
            and not version.pre
            and (
                (sig_abi.stage1_has_lse, sig_abi.reduce_has_num_kv_splits, sig_abi.legacy)
                != (version_abi.stage1_has_lse, version_abi.reduce_has_num_kv_splits, version_abi.legacy)
            )
        ):
            raise RuntimeError(
                f"aiter {version}'s signatures (stage-1 lse: {sig_abi.stage1_has_lse}, reduce num_kv_splits: "
                f"{sig_abi.reduce_has_num_kv_splits}) contradict the documented release table; refusing"
            )
        abi = sig_abi
        notes.append("ABI from inspected signatures")
    elif version_abi is not None:
        # Some wrappers hide their signature: check the ones we can see against the release table's names.
        expected = {
            "mla_decode_stage1_asm_fwd": version_abi.stage1_params(),
            "mla_reduce_v1": version_abi.reduce_params(),
            "get_mla_metadata_info_v1": version_abi.info_params(),
            "get_mla_metadata_v1": version_abi.metadata_params(),
        }
        problems = []
        for n, sig in sigs.items():
            found = check_signature(n, sig, expected[n]) if sig is not None else []
            problems += [x for x in found if not x.endswith("signature not inspectable")]
        if problems:
            raise RuntimeError(f"aiter {version}: signatures differ from the release table: " + "; ".join(problems))
        abi = version_abi
        notes.append("some signatures not inspectable; ABI from the release table")
    else:
        raise RuntimeError(f"aiter {version}: not a documented release and its signatures cannot be inspected")
    return AiterRuntime(aiter, abi, arch, int(props.multi_processor_count), flavour, device, tuple(notes))


@functools.cache
def _load_cached() -> AiterRuntime | str:
    try:
        return _load_uncached()
    except Exception as e:  # the probe never raises: any failure is a reason
        msg = str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
        return msg


def load() -> AiterRuntime:
    """The usable aiter runtime, or RuntimeError with the reason (cached: ``import aiter`` off ROCm takes ~6 s)."""
    r = _load_cached()
    if isinstance(r, str):
        raise RuntimeError(f"aiter unavailable: {r}")
    return r


def probe() -> str | None:
    """None when aiter can run here, else why not (never raises; cached for the process)."""
    r = _load_cached()
    return r if isinstance(r, str) else None

"""aiter's MXFP4 quantiser as the registry ships it, run from its own source on the CPU.

`aiter_dynamic_mxfp4_quant` calls ``dynamic_mxfp4_quant`` of ``aiter/utility/fp4_utils.py`` from the ``amd-aiter``
wheel (`AITER_VERSION`) — the Python wrapper and its Triton kernel ``_dynamic_mxfp4_quant_kernel_asm_layout`` — in
Triton's interpreter (``TRITON_INTERPRET=1``: the kernel's integer and fp32 operations done by numpy, one program at
a time), in a child Python. The wheel is fetched with ``pip download`` into pytest's cache (or taken from
``$MLALAB_AITER_WHEEL``), the file's SHA-256 is checked against `FP4_UTILS_SHA256`, and exactly two lines of the
kernel are rewritten before it runs, neither touching how a value is rounded:

1. ``bs_offs_n = pid_n`` becomes ``pid_n + tl.zeros([1], tl.int32)``. The kernel writes ``bs_offs_n[None, :]`` on the
   scalar program id; Triton 3.9 refuses to index a rank-0 tensor that way ("too many indices for tensor of rank 0",
   in the interpreter and the compiler alike). A one-element vector broadcasts to the same scale addresses.
2. ``scale_e8m0_unbiased.to(tl.uint8)`` becomes ``scale_e8m0_unbiased.to(tl.int32).to(tl.uint8)``. The E8M0 byte is
   that conversion plus 127, which is right only if the conversion wraps modulo 256 for a negative exponent (every
   block with amax < 3.5 has one). LLVM leaves float-to-unsigned of a negative value undefined: NVIDIA saturates it
   to 0 (aiter's scales come out wrong on an H200), and numpy's cast — the interpreter's — follows the CPU's C
   conversion (it wraps on x86). Converting through int32 makes the wrap the kernel relies on explicit, on every CPU.

bf16 inputs are handed to the kernel as their fp32 values. The kernel's first operation converts its input to fp32,
which is exact (bf16 is the upper half of an fp32), but the interpreter's bf16 -> fp32 conversion is wrong for
subnormals in Triton 3.9 (2**-129 becomes 0, 1.25 * 2**-127 becomes 2**-128); handing over fp32 skips only that
conversion.

Two behaviours are the interpreter's IEEE arithmetic rather than a particular GPU's: fp32 subnormals are kept (a GPU
flushing them would zero blocks of subnormal bf16 values), and an element more than 2**32 times smaller than its
block's scale is shifted right by 32 bits or more, which numpy (and NVIDIA) make 0 — the code of the value's nearest
E2M1, 0 — while LLVM leaves such a shift undefined.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch

AITER_VERSION = "0.1.7.post2.dev18"  # the version the package index serves for `pip install amd-aiter`
FP4_UTILS = "aiter/utility/fp4_utils.py"
FP4_UTILS_SHA256 = "488b2250bac5a4f498e4a53e9f4914c26eea74b5683951a7e09130f920c7ab88"
PACKAGE = "aiter_fp4_interpreted"  # the import name the rewritten file gets (never `aiter`: no clash with a real one)

#: (text in the kernel, replacement): the two rewrites of the module docstring.
SHIMS = (
    ("    bs_offs_n = pid_n\n", "    bs_offs_n = pid_n + tl.zeros([1], tl.int32)\n"),
    ("scale_e8m0_unbiased.to(tl.uint8)", "scale_e8m0_unbiased.to(tl.int32).to(tl.uint8)"),
)

#: aiter/utility/dtypes.py imports aiter's chip query; fp4_utils only needs these three names, defined as it does.
_DTYPES = """import torch
fp4x2 = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
fp8_e8m0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
fp32 = torch.float32
"""


class WheelUnavailable(RuntimeError):
    """The wheel could not be fetched (offline, no pip): the caller skips with this message."""


def fetch_wheel(cache: Path) -> Path:
    """The amd-aiter wheel: ``$MLALAB_AITER_WHEEL`` if set, else from `cache`, else ``pip download`` into `cache`."""
    if os.environ.get("MLALAB_AITER_WHEEL"):
        return Path(os.environ["MLALAB_AITER_WHEEL"])
    name = f"amd_aiter-{AITER_VERSION}-py3-none-any.whl"
    if (cache / name).is_file():
        return cache / name
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--retries", "1"]
    cmd += ["--timeout", "30", "-d", str(cache), f"amd-aiter=={AITER_VERSION}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WheelUnavailable(f"pip download amd-aiter=={AITER_VERSION} failed: {e}") from None
    if r.returncode != 0 or not (cache / name).is_file():
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise WheelUnavailable(f"pip download amd-aiter=={AITER_VERSION} failed (offline?): {last}")
    return cache / name


def write_interpretable_package(wheel: Path, workdir: Path) -> Path:
    """aiter's fp4_utils from `wheel`, checked and rewritten by `SHIMS`, as the package `PACKAGE` under `workdir`."""
    with zipfile.ZipFile(wheel) as z:
        src = z.read(FP4_UTILS)
    digest = hashlib.sha256(src).hexdigest()
    if digest != FP4_UTILS_SHA256:
        raise AssertionError(
            f"{FP4_UTILS} in {wheel.name} has SHA-256 {digest}, not the {FP4_UTILS_SHA256} these tests read; "
            "re-read the kernel before updating the hash"
        )
    text = src.decode("utf-8")
    for old, new in SHIMS:
        if text.count(old) != 1:
            raise AssertionError(f"the kernel no longer contains {old!r} exactly once; re-read it")
        text = text.replace(old, new)
    pkg = workdir / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "dtypes.py").write_text(_DTYPES)
    (pkg / "fp4_utils.py").write_text(text)  # the interpreter re-reads the kernel's source from this file
    return pkg


def aiter_dynamic_mxfp4_quant(
    wheel: Path, inputs: dict[str, torch.Tensor], workdir: Path
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """aiter's ``dynamic_mxfp4_quant(x)`` of each CPU tensor x (M, N), N a multiple of 32: {name: (packed uint8
    (M, N/2), E8M0 uint8 (M, N/32))} — the scale buffer aiter returns is padded to (256k, 8k) and is cut to the valid
    blocks. Runs in a fresh Python with ``TRITON_INTERPRET=1`` (Triton decides at import time whether its own
    ``@triton.jit`` helpers such as ``tl.max`` are interpreted, so an already imported Triton cannot run it)."""
    for name, x in inputs.items():
        if x.dim() != 2 or x.shape[1] % 32:
            raise ValueError(f"inputs[{name!r}] must be (M, N) with N a multiple of 32, got {tuple(x.shape)}")
    write_interpretable_package(wheel, workdir)
    torch.save(inputs, workdir / "inputs.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, __file__, str(workdir)], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"aiter's kernel failed in the interpreter:\n{r.stderr[-3000:]}")
    return torch.load(workdir / "outputs.pt")


def _run(workdir: Path) -> None:
    """In the child: import the rewritten fp4_utils and quantise every saved input."""
    sys.path.insert(0, str(workdir))
    fp4_utils = importlib.import_module(f"{PACKAGE}.fp4_utils")
    out = {}
    for name, x in torch.load(workdir / "inputs.pt").items():
        xk = x.float() if x.dtype == torch.bfloat16 else x  # exact; see the module docstring
        with np.errstate(divide="ignore"):  # log2(0) = -inf for all-zero blocks is part of the kernel's arithmetic
            packed, scales = fp4_utils.dynamic_mxfp4_quant(xk)
        m, n = x.shape
        out[name] = (packed.view(torch.uint8).clone(), scales.view(torch.uint8)[:m, : n // 32].clone())
    torch.save(out, workdir / "outputs.pt")


if __name__ == "__main__":
    _run(Path(sys.argv[1]))

"""Compile the sm_90 kernels on a machine without a GPU, and read what the compiler made of them.

Registers, spills, shared memory, bank conflicts and the SASS instruction mix cost no device time. Triton compiles for
any target once its active driver reports one, and its wheel carries ``ptxas`` and ``cuobjdump``: `compile_stage1`
and `compile_reduce` install a stand-in driver that reports sm_90 (nothing is launched), compile the kernel with CPU
tensors as stand-ins, and return a `BuildReport`.

Run it in a fresh process (``python -m mlalab sm90-build``): the stand-in stays the active driver of that process.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BuildReport", "compile_stage1", "compile_reduce", "sass_counts", "PATH_DTYPES"]


@dataclass(frozen=True)
class BuildReport:
    """What ptxas made of one configuration of an sm_90 kernel."""

    stages: int
    registers: int
    stack_bytes: int  # local memory per thread (spills, arrays that went to memory)
    shared_bytes: int  # dynamic shared memory the kernel asks for
    #: per V access, as `gl.bank_conflicts` counts them (the fp8 path's V load; none on the 16-bit paths)
    bank_conflicts: tuple[int, ...]
    sass: dict[str, int] = field(default_factory=dict)  # opcode (with the first modifiers) -> count
    #: the whole ``cuobjdump -sass`` listing (for walks along a path)
    listing: str = field(default="", repr=False, compare=False)


class _Sm90Driver:
    """Just enough of a Triton driver to compile (never to launch) for compute capability 9.0."""

    def get_current_target(self):  # noqa: ANN201
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self):  # noqa: ANN201
        import torch

        return torch.device("cpu")


def sass_counts(sass: str) -> dict[str, int]:
    """Opcode counts of a ``cuobjdump -sass`` listing (memory, MMA, barrier and SFU opcodes keep their modifiers)."""
    keep = ("LDS", "STS", "LDG", "STG", "LDL", "STL", "QGMMA", "HGMMA", "HMMA", "UTMALDG", "BAR", "MUFU")
    c: collections.Counter[str] = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_x]+)*)", line)
        if m:
            op = m.group(1)
            c[op + (m.group(2) if op in keep else "")] += 1
    return dict(c)


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} is not in this Triton wheel ({path})")
    return path


@contextlib.contextmanager
def _fresh_triton_cache() -> Iterator[None]:
    """Compile into an empty, temporary Triton cache (restored and removed afterwards): a cached kernel would skip
    its ``static_print`` reports and could hide what this Triton version makes of the code."""
    old_cache = os.environ.get("TRITON_CACHE_DIR")
    cache = tempfile.mkdtemp(prefix="mlalab-sm90-")
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        yield
    finally:
        if old_cache is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = old_cache
        shutil.rmtree(cache, ignore_errors=True)


def _report(ck: Any, stages: int, conflicts: tuple[int, ...]) -> BuildReport:
    """Registers, local memory and opcode counts of a compiled kernel, from ``cuobjdump`` on its cubin."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(ck.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True, check=True)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, check=True)
    regs = re.search(r"REG:(\d+)", res.stdout)
    stack = re.search(r"STACK:(\d+)", res.stdout)
    if regs is None or stack is None:
        raise RuntimeError(f"cannot read cuobjdump's resource usage: {res.stdout[:500]!r}")
    return BuildReport(
        stages=stages,
        registers=int(regs.group(1)),
        stack_bytes=int(stack.group(1)),
        shared_bytes=int(ck.metadata.shared),
        bank_conflicts=conflicts,
        sass=sass_counts(sass.stdout),
        listing=sass.stdout,
    )


#: The operand types of each stage-1 path (`host.RING`): (q, KV); ``uint8``: fp4 codes (``v-fp4``, ``v-fp4-e4m3``).
PATH_DTYPES = {"v-regs": ("float8_e4m3fn", "float8_e4m3fn"), "v-tile": ("bfloat16", "bfloat16"),
               "v-conv": ("bfloat16", "float8_e4m3fn"), "v-fp4": ("bfloat16", "uint8"),
               "v-fp4-e4m3": ("float8_e4m3fn", "uint8")}  # fmt: skip

#: The precisions of the ``v-fp4`` path: (q type, the kernel's ``KV_FP4``: 1 MXFP4, 2 NVFP4).
FP4_BUILDS = {"a16w4-mxfp4": ("bfloat16", 1), "a8w4-mxfp4": ("float8_e4m3fn", 1),
              "a16w4-nvfp4": ("bfloat16", 2), "a8w4-nvfp4": ("float8_e4m3fn", 2)}  # fmt: skip


def compile_stage1(path: str = "v-regs", *, mask_tail: bool = False, first_burst: int | None = None,
                   timeline: bool = False, ablate: int = 0, precision: str | None = None,
                   page: int | None = None, rows: int = 1, causal: bool = False) -> BuildReport:  # fmt: skip
    """Compile the sm_90 stage 1 (`stage1.stage1_kernel`) on `path` (``"v-regs"``: fp8 q and KV, ``"v-tile"``: bf16,
    ``"v-conv"``: bf16 q and fp8 KV, ``"v-fp4"``: fp4 KV of `precision`, one of `FP4_BUILDS`, default
    ``a16w4-mxfp4``; ``"v-fp4-e4m3"``: fp8 q with MXFP4 KV on the e4m3 route) for sm_90, as the decoder launches
    it: its ring (`host.RING`), fp16 partials for fp8 KV, else fp32, the reduce as a programmatic dependent.
    ``mask_tail``: a paged cache's tail masking; ``first_burst``: the ring tiles issued at the start (None: the whole
    ring); ``timeline`` / ``ablate``: the measurement hooks (the kernel's ``TIMELINE``, ``ABLATE``); ``page``: 16 or
    32 to build the page-by-page tile loads of such caches, 1 for a token table's rows by cp.async (with
    ``mask_tail``, as the decoder launches them; not on the fp4 paths), None for whole-tile loads; ``rows``: q rows
    per work, 1, 2 or 4 (in the wgmmas' N: speculative decode on the fp8 path, `host.rows_per_cta_of`), the
    latter on two warpgroups (8 warps); ``causal``: those rows under the causal mask (the kernel's ``CAUSAL``)."""
    import torch
    from triton.runtime.driver import driver

    from . import stage1 as S
    from .host import ABLATABLE, INFO_COLS, RING, SUB_TILE_PAGES

    if path not in RING:
        raise ValueError(f"path must be one of {', '.join(map(repr, RING))}, got {path!r}")
    stages = RING[path]
    if first_burst is not None and (type(first_burst) is not int or not 1 <= first_burst <= stages):
        raise ValueError(f"first_burst must be None (the whole ring) or 1 to {stages} on {path}, got {first_burst!r}")
    if ablate not in (0, *ABLATABLE) or isinstance(ablate, bool) or (ablate and path != ABLATABLE[ablate]):
        raise ValueError(f"ablate must be 0 (the real kernel), 1 (no QK) or 2 (no QK, no PV) on v-regs, or 3 (no "
                         f"fp4 conversion) or 4 (nor scale loads) on v-fp4-e4m3, got {ablate!r} on {path}")  # fmt: skip
    if rows not in (1, 2, 4) or isinstance(rows, bool) or (rows > 1 and path != "v-regs"):
        raise ValueError(f"rows must be 1, or 2 or 4 on v-regs, got {rows!r} on {path}")
    if path == "v-fp4":
        precision = "a16w4-mxfp4" if precision is None else precision
        if precision not in FP4_BUILDS:
            raise ValueError(f"precision must be one of {', '.join(FP4_BUILDS)} on v-fp4, got {precision!r}")
    elif precision is not None:
        raise ValueError(f"precision chooses among the fp4 builds of v-fp4; {path} has one build")
    if page is not None and (page not in (1, *SUB_TILE_PAGES) or path.startswith("v-fp4")):
        raise ValueError(f"page must be None, 1 (a token table) or one of {SUB_TILE_PAGES} (not on the fp4 paths), "
                         f"got {page!r} on {path}")  # fmt: skip
    if causal and rows == 1:
        raise ValueError("causal builds are of 2 or 4 q rows a work (one row takes the mask from its KV end)")
    for name, flag in (("mask_tail", mask_tail), ("timeline", timeline), ("causal", causal)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    driver.set_active(_Sm90Driver())
    q_dtype, kv_dtype = (getattr(torch, n) for n in PATH_DTYPES[path])
    kv_fp4 = 1 if path == "v-fp4-e4m3" else 0
    if path == "v-fp4":
        q_name, kv_fp4 = FP4_BUILDS[precision]
        q_dtype = getattr(torch, q_name)
    q = torch.zeros(4 * 16, 576, dtype=q_dtype)
    kv = torch.zeros(4096, 288 if kv_fp4 else 576, dtype=kv_dtype)
    scales = torch.zeros(4096, 36 if kv_fp4 == 2 else 18, dtype=torch.uint8)
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
    out, lse = torch.zeros(4, 16, 512, dtype=torch.bfloat16), torch.zeros(4, 16)
    part_dtype = torch.float16 if kv_dtype == torch.float8_e4m3fn else torch.float32
    po, pl, one = torch.zeros(8, 512, 16, dtype=part_dtype), torch.zeros(8, 16), torch.ones(1)
    printed = io.StringIO()
    # a fresh cache: a cached kernel would skip static_print (gl.static_print: the bank-conflict counts)
    with _fresh_triton_cache(), contextlib.redirect_stdout(printed):
        ck = S.stage1_kernel.warmup(
            *S.make_descriptors(q, kv, 16 * rows, page if page and page > 1 else S.BLOCK_N), i32(132 * INFO_COLS),
            i32(8 * 8), i32(64), out, lse, po, pl, one, one, scales, 4096 if kv_fp4 else 0, kv, 0.04,
            torch.zeros(1, S.TIMELINE_COLS.value, dtype=torch.int64), H=16, NQ=16 * rows, D_NOPE=512, D_ROPE=64,
            BLOCK_N=S.BLOCK_N, NUM_STAGES=stages, MASK_TAIL=mask_tail,
            LAUNCH_DEPENDENTS=True, FIRST_BURST=first_burst or stages, KV_FP4=kv_fp4,
            FP4_E4M3=path == "v-fp4-e4m3", TOKENS=page == 1, CAUSAL=causal, TIMELINE=timeline,
            ABLATE=ablate, REPORT=True, num_warps=4 if rows == 1 else 8, grid=(1,),
        )  # fmt: skip
    conflicts = tuple(int(v) for v in re.findall(r"bank conflicts = (\d+)", printed.getvalue()))
    return _report(ck, stages, conflicts)


def compile_reduce(max_partials: int, partials: str = "fp16") -> BuildReport:
    """Compile the Gluon reduce (`reduce.reduce_kernel`) for sm_90 at the launch shape `reduce.launch_shape` picks
    for tiles of at most `max_partials` partials, on ``"fp16"`` (what the decoder gives it) or ``"fp32"`` partials;
    ``stages`` in the report is BLOCK_P, ``bank_conflicts`` empty."""
    import torch
    from triton.runtime.driver import driver

    from . import reduce as R

    if partials not in ("fp32", "fp16"):
        raise ValueError(f"partials must be 'fp32' or 'fp16', got {partials!r}")
    shape = R.launch_shape(max_partials)
    driver.set_active(_Sm90Driver())
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
    po = torch.zeros(64, 512, 16, dtype=torch.float16 if partials == "fp16" else torch.float32)
    with _fresh_triton_cache():
        ck = R.reduce_kernel.warmup(
            po, torch.zeros(64, 16), i32(9), i32(16), i32(64), i32(8), torch.zeros(4, 16, 512, dtype=torch.bfloat16),
            torch.zeros(4, 16), torch.ones(1), 8192, 512, H=16, DV=512, USE_PDL=True, grid=(1,), **shape,
        )  # fmt: skip
    return _report(ck, shape["BLOCK_P"], ())


def compile_triton_reduce(max_partials: int, head_minor: bool = True) -> BuildReport:
    """Compile the portable Triton reduce (`mlalab.kernels.portable.reduce_kernel`) for sm_90 on fp32 partials as
    the decoder launches it for tiles of at most `max_partials` partials (head-minor: after the sm_90 stage 1 on bf16
    KV, as a programmatic dependent)."""
    import torch
    import triton
    from triton.runtime.driver import driver

    from .. import portable as P

    driver.set_active(_Sm90Driver())
    block_p = min(32, triton.next_power_of_2(max(2, max_partials)))
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
    with _fresh_triton_cache():
        ck = P.reduce_kernel.warmup(
            torch.zeros(64, 512, 16), torch.zeros(64, 16), i32(9), i32(16), i32(64), i32(8),
            torch.zeros(4, 16, 512, dtype=torch.bfloat16), torch.zeros(4, 16), 8192, 512, H=16, DV=512,
            BLOCK_DV=max(4, 64 // block_p), BLOCK_P=block_p, HEAD_MINOR=head_minor, USE_PDL=head_minor,
            num_warps=1 if block_p >= 16 else 2, grid=(1,),
        )  # fmt: skip
    return _report(ck, block_p, ())

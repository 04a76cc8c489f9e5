"""Compile the Hopper kernel for sm_90 on a machine without a GPU, and read what the compiler made of it.

Why: the H200 is lent for minutes; registers, spills, shared memory, bank conflicts and the SASS instruction mix
cost no device time. Triton compiles for any target once its active driver reports one, and its wheel carries
``ptxas`` and ``cuobjdump``; `compile_hopper` installs a stand-in driver that reports sm_90 (nothing is
launched), compiles `gluon_hopper.stage1_kernel` with CPU tensors as stand-ins, and returns a `BuildReport`.

Run it in a fresh process (``python -m mlalab.splitkv.sm90_build``): the stand-in stays the active driver of
that process.
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

__all__ = ["BuildReport", "compile_hopper", "compile_reduce", "sass_counts", "main"]


@dataclass(frozen=True)
class BuildReport:
    """What ptxas made of one configuration of the Hopper kernel."""

    stages: int
    registers: int
    stack_bytes: int  # local memory per thread (spills, arrays that went to memory)
    shared_bytes: int  # dynamic shared memory the kernel asks for
    #: per V access, as `gl.bank_conflicts` counts them (vt-smem: the transpose's load and store; v-regs: the load)
    bank_conflicts: tuple[int, ...]
    sass: dict[str, int] = field(default_factory=dict)  # opcode (with the first modifiers) -> count
    #: the whole ``cuobjdump -sass`` listing (for walks along a path, `scripts/reduce_sass_path.py`)
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


def compile_hopper(
    stages: int = 3,
    *,
    mask_tail: bool = False,
    variant: str = "vt-smem",
    timeline: bool = False,
    ablate: int = 0,
    refill_after_pv: bool = True,
    q_first: bool = True,
    warp_exchange: bool = False,
    merge_max: int = 0,
    block: int = 64,
    warpgroups: int = 1,
    first_burst: int = 0,
    partials: str = "fp32",
) -> BuildReport:
    """Compile the sm_90 stage 1 (`gluon_hopper`) on its `variant` path (``vt-smem`` or ``v-regs`` on fp8 inputs,
    ``v-tile`` on bf16: the PV reads Vᵀ from the K tile, 64-token tiles, none of the options below; ``v-conv`` on bf16 q
    and fp8 KV: each fp8 tile converted to one bf16 tile, then as v-tile) for sm_90 with
    `stages` ring buffers (``timeline``: with its per-CTA time stamps; ``ablate``: the kernel's ``ABLATE``, 0 = the
    real kernel; ``refill_after_pv``: its ``REFILL_AFTER_PV``; ``q_first``: its ``Q_FIRST``; ``warp_exchange``: its
    ``WARP_XCHG``; ``merge_max``: its ``MERGE_MAX``, 0 or a power of two; ``block``: its ``BLOCK_N``, 64 (one warpgroup)
    or 128 (two, v-regs only); ``warpgroups=2``: `gluon_hopper_2wg`, two warpgroups on alternate tiles sharing a
    ring of `stages` tiles, v-regs only, without the other options; ``first_burst``: its ``FIRST_BURST``, 0 = `stages`;
    ``partials``: the partial outputs' type, ``"fp32"`` or ``"fp16"`` (`KernelConfig.hopper_partials`, fp8 KV only));
    see the module docstring."""
    import torch
    from triton.runtime.driver import driver

    from . import gluon_hopper as G

    if variant not in ("vt-smem", "v-regs", "v-tile", "v-conv"):
        raise ValueError(f"variant must be 'vt-smem', 'v-regs', 'v-tile' or 'v-conv', got {variant!r}")
    if ablate not in (0, 1, 2) or isinstance(ablate, bool):
        raise ValueError(f"ablate must be 0 (the real kernel), 1 (no QK) or 2 (no QK, no PV), got {ablate!r}")
    for name, flag in (("refill_after_pv", refill_after_pv), ("q_first", q_first), ("warp_exchange", warp_exchange)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    from .triton_mla import (
        HOPPER_2WG_WORKER_REGS,
        HOPPER_BLOCKS,
        HOPPER_INFO_COLS,
        HOPPER_MAX_STAGES,
        HOPPER_MAX_STAGES_2WG,
        HOPPER_MAX_STAGES_128,
    )

    if merge_max not in (0, 2, 4, 8) or isinstance(merge_max, bool):
        raise ValueError(f"merge_max must be 0, 2, 4 or 8, got {merge_max!r}")

    if type(block) is not int or block not in HOPPER_BLOCKS:
        raise ValueError(f"block must be one of {HOPPER_BLOCKS}, got {block!r}")
    if block == 128 and (variant != "v-regs" or warp_exchange or merge_max):
        raise ValueError("block=128 (two warpgroups) is written for the v-regs path without warp_exchange or merge_max")
    if type(warpgroups) is not int or warpgroups not in (1, 2):
        raise ValueError(f"warpgroups must be 1 or 2, got {warpgroups!r}")
    if warpgroups == 2 and (variant != "v-regs" or block != 64 or warp_exchange or merge_max or ablate or timeline):
        raise ValueError("warpgroups=2 is written for the v-regs path with 64-token tiles and none of warp_exchange, "
                         "merge_max, ablate, timeline")  # fmt: skip
    most = HOPPER_MAX_STAGES[variant] if block == 64 else HOPPER_MAX_STAGES_128
    if warpgroups == 2:
        most = HOPPER_MAX_STAGES_2WG
    if not 1 <= stages <= most:
        raise ValueError(f"stages must be 1 to {most} on the {variant} path with {block}-token tiles, got {stages!r}")
    if type(first_burst) is not int or not 0 <= first_burst < stages or (first_burst and warpgroups == 2):
        raise ValueError(f"first_burst must be 0 or 1 to stages - 1 (one warpgroup), got {first_burst!r}")
    if variant == "v-tile" and (block != 64 or warpgroups != 1 or warp_exchange or merge_max or ablate or stages != 2):
        raise ValueError("the v-tile path (bf16) runs 64-token tiles, one warpgroup, 2 stages, none of warp_exchange, "
                         "merge_max, ablate")  # fmt: skip
    if variant == "v-conv" and (block != 64 or warpgroups != 1 or warp_exchange or merge_max or ablate
                                or not refill_after_pv):  # fmt: skip
        raise ValueError("the v-conv path (a16w8) runs 64-token tiles, one warpgroup, none of warp_exchange, "
                         "merge_max, ablate, and refills a stage once its tile is converted "
                         "(refill_after_pv=True)")  # fmt: skip

    if partials not in ("fp32", "fp16") or (partials == "fp16" and (variant == "v-tile" or merge_max)):
        raise ValueError(f"partials must be 'fp32' or 'fp16' (fp8 KV, no merge_max), got {partials!r} on {variant}")

    driver.set_active(_Sm90Driver())
    kv_dtype = torch.bfloat16 if variant == "v-tile" else torch.float8_e4m3fn
    q_dtype = torch.bfloat16 if variant in ("v-tile", "v-conv") else torch.float8_e4m3fn
    q = torch.zeros(4 * 16, 576, dtype=q_dtype)
    kv = torch.zeros(4096, 576, dtype=kv_dtype)
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)
    out, lse = torch.zeros(4, 16, 512, dtype=torch.bfloat16), torch.zeros(4, 16)
    po, pl, one = (
        torch.zeros(8, 16, 512, dtype=torch.float16 if partials == "fp16" else torch.float32),
        torch.zeros(8, 16),
        torch.ones(1),
    )
    printed = io.StringIO()
    # a fresh cache: a cached kernel would skip static_print (gl.static_print: the bank-conflict counts)
    with _fresh_triton_cache(), contextlib.redirect_stdout(printed):
        plan_args = (i32(132 * HOPPER_INFO_COLS), i32(8 * 8), i32(64))  # CTA_INFO, WORK_INFO, TILE_ROWS
        if warpgroups == 2:
            from . import gluon_hopper_2wg as W

            ck = W.stage1_kernel.warmup(
                *G.make_descriptors(q, kv, 16, block), *plan_args, out, lse, po, pl, one, one, 0.04, H=16,
                NQ=16, D_NOPE=512, D_ROPE=64, BLOCK_N=block, RING=stages, MASK_TAIL=mask_tail,
                LAUNCH_DEPENDENTS=True, WAIT_PRIOR=False, INFO_COLS=HOPPER_INFO_COLS,
                WORKER_REGS=HOPPER_2WG_WORKER_REGS, REPORT=True, num_warps=4, grid=(1,),
            )  # fmt: skip
        else:
            ck = G.stage1_kernel.warmup(
                *G.make_descriptors(q, kv, 16, block), *plan_args, out, lse, po, pl, one,
                one, 0.04, torch.zeros(1, G.TIMELINE_COLS.value, dtype=torch.int64), i32(8 * 4), i32(8), H=16,
                NQ=16, D_NOPE=512, D_ROPE=64, BLOCK_N=block, NUM_STAGES=stages, MASK_TAIL=mask_tail,
                LAUNCH_DEPENDENTS=True, V_IN_REGS=variant == "v-regs", V_FROM_K=variant in ("v-tile", "v-conv"),
                KV_CONVERT=variant == "v-conv",
                WAIT_PRIOR=False, TIMELINE=timeline,
                ABLATE=ablate, REFILL_AFTER_PV=refill_after_pv, Q_FIRST=q_first, FIRST_BURST=first_burst or stages,
                WARP_XCHG=warp_exchange, INFO_COLS=HOPPER_INFO_COLS, MERGE_MAX=merge_max, REPORT=True,
                num_warps=block // 16, grid=(1,),
            )  # fmt: skip
    conflicts = tuple(int(v) for v in re.findall(r"bank conflicts = (\d+)", printed.getvalue()))
    return _report(ck, stages, conflicts)


def compile_reduce(max_partials: int, partials: str = "fp32") -> BuildReport:
    """Compile the Gluon reduce (`gluon_reduce`, ``KernelConfig.hopper_reduce="gluon"``) for sm_90 at the launch shape
    `gluon_reduce.launch_shape` picks for tiles of at most `max_partials` partials, on ``"fp32"`` or ``"fp16"``
    partials; ``stages`` in the report is BLOCK_P, ``bank_conflicts`` empty."""
    import torch
    from triton.runtime.driver import driver

    from . import gluon_reduce as R

    if partials not in ("fp32", "fp16"):
        raise ValueError(f"partials must be 'fp32' or 'fp16', got {partials!r}")
    shape = R.launch_shape(max_partials)
    driver.set_active(_Sm90Driver())
    i32 = lambda n: torch.zeros(n, dtype=torch.int32)  # noqa: E731
    po = torch.zeros(64, 512, 16, dtype=torch.float16 if partials == "fp16" else torch.float32)
    with _fresh_triton_cache():
        ck = R.reduce_kernel.warmup(
            po, torch.zeros(64, 16), i32(9), i32(16), i32(64), i32(8), torch.zeros(4, 16, 512, dtype=torch.bfloat16),
            torch.zeros(4, 16), torch.ones(1), 8192, 512, H=16, DV=512, USE_PDL=True, CHAIN=False, grid=(1,), **shape,
        )  # fmt: skip
    return _report(ck, shape["BLOCK_P"], ())


def main() -> None:
    """Print the build report of each ring depth (run on any machine with Triton; no GPU needed)."""
    from .triton_mla import HOPPER_MAX_STAGES

    for variant in ("vt-smem", "v-regs", "v-tile", "v-conv"):
        for stages in range(1 if variant != "v-tile" else 2, HOPPER_MAX_STAGES[variant] + 1):
            r = compile_hopper(stages, variant=variant)
            top = sorted(r.sass.items(), key=lambda kv: -kv[1])[:12]
            print(f"{variant} stages {stages}: {r.registers} registers, {r.stack_bytes} B stack, "
                  f"{r.shared_bytes} B shared, V bank conflicts {r.bank_conflicts}")  # fmt: skip
            print("   ", ", ".join(f"{k} {v}" for k, v in top))


if __name__ == "__main__":
    main()

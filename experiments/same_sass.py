"""Question: does this code compile the sm_90 kernels to the same machine code as another commit's? (CPU only.)

Compiles each production configuration of stage 1 (every path, contiguous and paged, whole ring and deferred fill)
and of the Gluon reduce, with this code and with another commit's package (``--before DIR``: DIR holds it renamed
``mlalab_before``, see experiments/ab.py; its build function is ``mlalab_before.splitkv.sm90_build.compile_hopper``,
the layout up to tag ``experiments-2026-12``), then compares registers, local memory, shared memory and the SASS
instruction sequences (addresses, branch targets and constant-bank offsets ignored). Identical sequences run in
the same time; the differing instructions are printed. Run it with the H200's Triton (3.6) first on PYTHONPATH:

    PYTHONPATH=.venv/mlalab-triton-3.6 python experiments/same_sass.py --before .before --out /tmp/same_sass.csv
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from mlalab.io import write_rows_csv
from mlalab.kernels.sm90.build import compile_reduce, compile_stage1

#: name -> (this code's `compile_stage1` options, the old `compile_hopper` arguments)
CONFIGS = {
    "a8w8_contiguous_whole_ring": (dict(path="v-regs"), dict(stages=3, variant="v-regs", partials="fp16")),
    "a8w8_contiguous_first_burst_2": (dict(path="v-regs", first_burst=2),
                                      dict(stages=3, variant="v-regs", partials="fp16", first_burst=2)),
    "a8w8_paged_first_burst_2": (dict(path="v-regs", first_burst=2, mask_tail=True),
                                 dict(stages=3, variant="v-regs", partials="fp16", first_burst=2, mask_tail=True)),
    "bf16_contiguous": (dict(path="v-tile"), dict(stages=2, variant="v-tile", refill_after_pv=False)),
    "bf16_paged": (dict(path="v-tile", mask_tail=True),
                   dict(stages=2, variant="v-tile", refill_after_pv=False, mask_tail=True)),
    "a16w8_contiguous": (dict(path="v-conv"), dict(stages=2, variant="v-conv", partials="fp16")),
    "a16w8_paged": (dict(path="v-conv", mask_tail=True), dict(stages=2, variant="v-conv", partials="fp16",
                                                           mask_tail=True)),
}  # fmt: skip


def instructions(listing: str) -> list[str]:
    """The SASS instructions of a ``cuobjdump -sass`` listing, without addresses, branch targets and constant-bank
    offsets (which move when a kernel argument is added or removed)."""
    out = []
    for line in listing.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            ins = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][*]", m.group(1))
            out.append(re.sub(r"(BRA|BSSY|CALL\.REL)(\S*) .*", r"\1\2", ins))
    return out


def compare(name: str, new, old) -> dict:  # noqa: ANN001
    a, b = instructions(old.listing), instructions(new.listing)
    diff = [d for d in difflib.unified_diff(a, b, lineterm="", n=0) if not d.startswith(("---", "+++", "@@"))]
    for d in diff[:12]:
        print(f"   {name}: {d}")
    return {"config": name, "registers_before": old.registers, "registers_now": new.registers,
            "stack_before": old.stack_bytes, "stack_now": new.stack_bytes, "shared_before": old.shared_bytes,
            "shared_now": new.shared_bytes, "instructions_before": len(a), "instructions_now": len(b),
            "differing_lines": len(diff)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a folder holding another commit's package as mlalab_before")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    sys.path.insert(0, a.before)
    import triton
    from mlalab_before.splitkv.sm90_build import compile_hopper
    from mlalab_before.splitkv.sm90_build import compile_reduce as compile_reduce_before

    print(f"Triton {triton.__version__}", flush=True)
    rows = []
    for name, (now, before) in CONFIGS.items():
        stages = before.pop("stages")
        rows.append(compare(name, compile_stage1(**now), compile_hopper(stages, **before)))
        print(rows[-1], flush=True)
    for mp in (2, 4, 8, 16, 33, 64):
        rows.append(compare(f"reduce_fp16_{mp}_partials", compile_reduce(mp), compile_reduce_before(mp, "fp16")))
        print(rows[-1], flush=True)
    if a.out:
        write_rows_csv(a.out, [{**r, "triton": triton.__version__} for r in rows])


if __name__ == "__main__":
    main()

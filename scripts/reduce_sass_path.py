"""Instructions one warp of the Gluon reduce executes on its common path (one q row, at most BLOCK_P partials, not the
first value slice), counted in its sm_90 SASS (CPU only; any Triton with Gluon, e.g. the H200's 3.6 on PYTHONPATH).

The reduce is one warp's chain of dependent instructions (Nsight Compute on the H200, session 15: ~5-6 cycles each,
80 % of cycles with no eligible warp), so this count predicts its time. Calibrated on 2026-12-04: this walk gave 765
for the first Gluon reduce and 520 for the Triton reduce at 16 fp32 partials, where Nsight Compute counted 773 and
522 executed per warp. "pre" runs before the programmatic-dependent wait (it overlaps stage 1), "post" after it.
The walk assumes the structure of `gluon_reduce._reduce_kernel` as of commit f037b2a (a guard for q rows, a skipped
loop over further blocks, a skipped LSE store); check the branches it prints when the kernel changes.

    PYTHONPATH=/tmp/t36:$PWD python scripts/reduce_sass_path.py 2 4 8 16 33
"""

from __future__ import annotations

import re
import sys

from mlalab.splitkv.sm90_build import compile_reduce


def common_path(sass: str) -> tuple[int, int]:
    """(instructions before the wait, after it) along the common path of one program's SASS."""
    ins = [(int(a, 16), " ".join(t.split())) for a, t in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]+);", sass)]
    wait = next(a for a, t in ins if "ACQBULK" in t)
    forward = []
    for a, t in ins:
        m = re.search(r"BRA 0x([0-9a-f]+)", t)
        if m and a > wait and t.startswith("@") and int(m.group(1), 16) > a:
            forward.append((a, int(m.group(1), 16)))
    _guard, loop_skip = forward[0], forward[1]  # q_end > q_start (not taken); no further block (taken)
    lse_skip = next(b for b in forward if b[0] >= loop_skip[1] and b[1] - b[0] > 0x100)  # not the first slice
    return wait // 16, (loop_skip[0] - wait) // 16 + 1 + (lse_skip[0] - loop_skip[1]) // 16 + 1


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [2, 4, 8, 16, 33]:
        for partials in ("fp32", "fp16"):
            r = compile_reduce(n, partials)
            pre, post = common_path(r.listing)
            print(f"{n:>3} partials {partials}, BLOCK_P {r.stages}: {pre} before the wait, {post} after")


if __name__ == "__main__":
    main()

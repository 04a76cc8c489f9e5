"""Question: where do stage 1's warps stall, instruction by instruction? (GPU only, under Nsight Compute.)

Builds the default decode of one shape (the triton backend's plan and kernel config), runs it a few times (the first
launches compile), then once more: profile that launch of the sm_90 stage 1 with ``ncu``'s warp-state and source
sections, and print the SASS with its stall samples from the report, e.g. on the device machine::

    ncu --clock-control none -k regex:stage1 --launch-skip 3 --launch-count 1 --section WarpStateStats \\
        --section SourceCounters --section SchedulerStats -o /tmp/q4 python3 experiments/ncu_stage1.py --q-len 4
    ncu -i /tmp/q4.ncu-rep --page source --csv --print-source sass > q4_sass.csv
"""

from __future__ import annotations

import argparse

import torch

from mlalab.backends.triton import make_callable
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--kv-len", type=int, default=8192)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--precision", default="a8w8")
    ap.add_argument("--calls", type=int, default=4, help="calls in all (profile the last stage 1 with --launch-skip)")
    a = ap.parse_args()
    if a.calls < 1:
        raise SystemExit(f"--calls must be >= 1, got {a.calls}")
    if not torch.cuda.is_available():
        raise SystemExit("ncu_stage1.py needs a CUDA GPU")
    x = make_inputs(DecodeCase.uniform(a.batch, a.kv_len, q_len=a.q_len)).to("cuda")
    call, info = make_callable(x, precision=a.precision)
    for _ in range(a.calls):
        call(0)
    torch.cuda.synchronize()
    print(f"ran {info['decoder'].ran} {a.calls} times: {a.batch} x {a.kv_len}, q_len {a.q_len}, {a.precision}")


if __name__ == "__main__":
    main()

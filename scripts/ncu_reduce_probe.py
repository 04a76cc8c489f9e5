"""Run stage 1 + each reduce (Triton / Gluon, fp32 partials) a few times at one shape, for Nsight Compute to profile
the reduce kernels alone (GPU only; session 15's probe of the Gluon reduce's extra ~1 us at 16 and 33 partials):

    ncu --clock-control none --cache-control none --kernel-name regex:^_reduce_kernel --launch-skip 2 \
        --launch-count 2 --section SpeedOfLight --section WarpStateStats --section InstructionStats \
        python3 scripts/ncu_reduce_probe.py 4 1024

Each reduce runs 3 times (Triton first, then Gluon; both kernels are named ``_reduce_kernel``, torch's own
``reduce_kernel`` is not), so skipping 2 profiles the Triton reduce's third call and the Gluon reduce's first.
``--cache-control none``: the partials stay in L2 as in a real call (ncu flushes caches between passes otherwise).
"""

from __future__ import annotations

import sys

import torch

from mlalab.backends.triton import build_plan
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.splitkv.triton_mla import KernelConfig, TritonDecoder, prepare


def main() -> None:
    if len(sys.argv) != 3 or not all(a.isdigit() and int(a) > 0 for a in sys.argv[1:]):
        raise SystemExit("usage: ncu_reduce_probe.py BATCH KV_LEN (positive integers, e.g. 4 1024)")
    if not torch.cuda.is_available():
        raise SystemExit("ncu_reduce_probe.py needs a CUDA GPU (the sm_90 kernels)")
    batch, kv_len = int(sys.argv[1]), int(sys.argv[2])
    x = make_inputs(DecodeCase.uniform(batch, kv_len)).to("cuda")
    p = prepare(x, "a8w8")
    plan = build_plan(x, "simple")
    for reduce in ("triton", "gluon"):
        dec = TritonDecoder(p, plan, config=KernelConfig(kernel="hopper", hopper_partials="fp32", hopper_reduce=reduce,
                                                         pdl=False))  # fmt: skip
        for _ in range(3):
            dec()
        torch.cuda.synchronize()
        print(reduce, dec.ran, flush=True)


if __name__ == "__main__":
    main()

"""Run stage 1 + each reduce (Triton / Gluon, fp32 partials) a few times at one shape, for Nsight Compute to profile
the reduce kernels alone (GPU only; session 15's probe of the Gluon reduce's extra ~1 us at 16 and 33 partials):

    ncu --clock-control none --kernel-name regex:reduce --launch-skip 2 --launch-count 2 --set full \
        python3 scripts/ncu_reduce_probe.py 4 1024
"""

from __future__ import annotations

import sys

import torch

from mlalab.backends.triton import build_plan
from mlalab.config import DecodeCase
from mlalab.inputs import make_inputs
from mlalab.splitkv.triton_mla import KernelConfig, TritonDecoder, prepare


def main() -> None:
    batch, kv_len = (int(a) for a in sys.argv[1:3])
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

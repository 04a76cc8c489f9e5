#!/usr/bin/env bash
# The kernels' acceptance in ONE device call (run from the repo root on the device, with the peer wheels carried in
# .whl/ and the commit in .head: the device copy's git may name another): the kernel mutants of scripts/mutate_gpu.py
# in three processes (each must be killed by a GPU test), then the whole GPU suite at this commit in 8 xdist
# processes (tests/conftest.py gives each cores // 8 torch threads) until END_S seconds after the start. Everything
# is written under $OUT as it goes (at most 8 files come back), so a call cut short still returns what it finished;
# copy the files into data/gpu_tests/ and commit them at once.
# Knobs (env): END_S (default 510), P1_S (seconds for the mutants, default 200).
set -o pipefail
T0=$(date +%s); END=${END_S:-510}; LIM=${P1_S:-200}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  echo "commit $(cat .head 2>/dev/null || git rev-parse HEAD 2>/dev/null) (.head: the device copy's git may name another)"; nproc; } | tee "$OUT/gpu.txt"
start_kernel_mutants $((LIM + 10)) "$LIM"
wait; echo "mutants done at $(($(date +%s) - T0)) s"
grep -hE "^(killed|survived|invalid|no tests)|mutants;" "$OUT"/mutate_gpu_*.log
run_gpu_suite $((END - ($(date +%s) - T0))) 8

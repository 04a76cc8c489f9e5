#!/usr/bin/env bash
# The GPU runs that the open issues' acceptance still needs, in ONE device call (run from the repo root on the
# device, with the peer wheels carried in .whl/ and, where the copy has no .git, the commit in .head): the
# kernel mutants of scripts/mutate_gpu.py in three processes beside the accuracy study's remaining rows (issues 33
# and 30), then the whole GPU suite at this commit in 8 xdist processes (tests/conftest.py gives each cores // 8
# torch threads) until END_S seconds after the start. Everything is written under $OUT as it goes (at most 8 files
# come back), so a call cut short still returns what it finished; copy the files into data/ and commit them at once.
# Knobs (env): END_S (default 510), P1_S (seconds for the mutants and the study, default 200), STUDY (the table to
# resume).
set -o pipefail
T0=$(date +%s); END=${END_S:-510}; LIM=${P1_S:-200}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  echo "commit $(cat .head 2>/dev/null || git rev-parse HEAD 2>/dev/null) (.head: the device copy's git may name another)"; nproc; } | tee "$OUT/gpu.txt"
# the study: its table is resumed under $OUT (appended in chunks: a cut loses only the rows in flight)
SW=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1>100000)?3:2}')
STUDY=${STUDY:-data/accuracy/gpu_2026-12-06_study2.parquet}
S=$OUT/$(basename "$STUDY"); cp "$STUDY" "$S"
( timeout $((LIM + 15)) python3 -m mlalab sweep --shapes competition,256x1024 --dist all --seed 0,1,2 --q-schemes all \
  --kv-schemes all --fp8-formats e4m3fn,e4m3fnuz --device cuda --workers "$SW" --time-limit "$LIM" --no-progress \
  --out "$S" > "$OUT/study.log" 2>&1; echo "study rc=$? at $(($(date +%s) - T0)) s" >> "$OUT/study.log" ) &
start_kernel_mutants $((LIM + 10)) "$LIM"
wait; echo "mutants and study done at $(($(date +%s) - T0)) s"
grep -hE "^(killed|survived|invalid|no tests)|mutants;" "$OUT"/mutate_gpu_*.log; tail -3 "$OUT/study.log"
run_gpu_suite $((END - ($(date +%s) - T0))) 8

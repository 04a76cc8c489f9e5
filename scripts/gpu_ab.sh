#!/usr/bin/env bash
# One device call (from the repo root on the device) that decides a kernel change: experiments/ab.py times this
# tree's kernels against another commit's (`before:auto`) beside FlashMLA, after checking them against the fp64
# oracle, at each q_len of Q_LENS with the GPU to itself; then the GPU tests named by TEST_K; then, while END_S allows,
# the kernel mutants (scripts/mutate_gpu.py, 3 processes) beside the whole GPU suite. Every result is written under
# $OUT as it goes (ab.log, ab_q*.csv, pytest_ab.log, mutate_gpu_{1,2,3}.log, pytest_suite.log), so a
# call cut short still returns what finished.
# Here first: scripts/device_wheels.sh (PEERS=flashmla is enough); the other commit's package as .before/mlalab_before
# (`git archive main mlalab | tar -x -C .before && mv .before/mlalab .before/mlalab_before`); `git rev-parse HEAD >
# .head`; then carry .whl, .head and .before.
# Knobs (env): Q_LENS ("4 2"), CAUSAL_Q_LENS (q_lens also timed under the causal mask, ab_q*_causal.csv; none),
# SHAPES (6 of the competition's), PRECISION (a8w8), AB_S (seconds a q_len, 110), VARIANTS (auto,before:auto; NAME:auto
# times .before/mlalab_NAME, so one call can time several commits),
# TEST_K (a -k expression over tests/test_sm90_kernel.py; empty: none), END_S (585; 0: stop after the tests).
T0=$(date +%s); END=${END_S:-585}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
export PYTHONPATH=$PWD/.before:$PYTHONPATH TRITON_CACHE_DIR=$PWD/.tcache
el() { echo $(($(date +%s) - T0)); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  echo "commit $(cat .head 2>/dev/null || git rev-parse HEAD 2>/dev/null) (.head: the device copy's git may name another)"; } | tee "$OUT/ab.log"
for q in ${Q_LENS:-4 2}; do
  timeout "${AB_S:-110}" python3 experiments/ab.py --q-len "$q" --precision "${PRECISION:-a8w8}" --before .before \
    --variants "${VARIANTS:-auto,before:auto}" --shapes "${SHAPES:-4x1024,32x1024,128x1024,4x8192,32x8192,128x8192}" \
    --out "$OUT/ab_q$q.csv" >> "$OUT/ab.log" 2>&1
  echo "ab q_len $q rc=$? at $(el) s" | tee -a "$OUT/ab.log"
done
for q in ${CAUSAL_Q_LENS:-}; do  # this tree's kernels under the causal mask beside FlashMLA's (no before: variant)
  timeout "${AB_S:-110}" python3 experiments/ab.py --q-len "$q" --causal --precision "${PRECISION:-a8w8}" \
    --variants auto --shapes "${SHAPES:-4x1024,32x1024,128x1024,4x8192,32x8192,128x8192}" \
    --out "$OUT/ab_q${q}_causal.csv" >> "$OUT/ab.log" 2>&1
  echo "ab causal q_len $q rc=$? at $(el) s" | tee -a "$OUT/ab.log"
done
tail -40 "$OUT/ab.log"
if [ -n "${TEST_K:-}" ]; then
  timeout 150 python3 -m pytest -p no:cacheprovider -m gpu -n 6 -v -rfE --timeout 140 tests/test_sm90_kernel.py \
    -k "$TEST_K" > "$OUT/pytest_ab.log" 2>&1
  echo "pytest rc=$? at $(el) s" | tee -a "$OUT/pytest_ab.log"; tail -4 "$OUT/pytest_ab.log"
fi
[ "$END" -gt "$(($(el) + 60))" ] || exit 0
start_kernel_mutants $((END - $(el) - 20)) 200
run_gpu_suite $((END - $(el))) 6; wait
grep -hE "^(killed|survived|invalid|no tests)|mutants;" "$OUT"/mutate_gpu_*.log

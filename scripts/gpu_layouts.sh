#!/usr/bin/env bash
# One device call (from the repo root on the device) that records the layouts suite (`bench --suite layouts`: q_len
# 1, 2, 4 x contiguous, paged64, paged16, tokens at the 12 competition shapes and batch 256) in a8w8 beside FlashMLA
# fp8, then, while END_S allows, in bf16 and a16w8 beside FlashMLA bf16: one file per q_len under $OUT
# (layouts_a8w8_q{1,2,4}.csv, layouts_16bit_q{1,2,4}.csv), each rewritten after every shape, so a call cut short
# still returns what finished. `bench --recorded --layout-costs` then reads them (copied into data/layouts/).
# On an H100 (2026-12-07) a8w8 took ~190 s a q_len, timings and the accuracy pass (whose references the four
# layouts of a case now share): one call for a8w8, another for bf16 / a16w8 (Q_LENS, LAYOUTS narrow a call).
# Here first: scripts/device_wheels.sh (PEERS=flashmla); carry .whl. Knobs (env): END_S (seconds of the call, 570),
# Q_LENS ("1 2 4"), LAYOUTS (all four), BACKENDS (triton,flashmla: FlashInfer is not carried by default).
T0=$(date +%s); END=${END_S:-570}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
export TRITON_CACHE_DIR=$PWD/.tcache
el() { echo $(($(date +%s) - T0)); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
  echo "commit $(cat .head 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; } | tee "$OUT/layouts.log"
for prec in a8w8 bf16,a16w8; do
  name=$([ "$prec" = a8w8 ] && echo a8w8 || echo 16bit)
  for q in ${Q_LENS:-1 2 4}; do
    left=$((END - $(el)))
    [ "$left" -gt 30 ] || { echo "no time left for $name q_len $q" | tee -a "$OUT/layouts.log"; continue; }
    timeout "$left" python3 -m mlalab bench --suite layouts --q-lens "$q" \
      --layouts "${LAYOUTS:-contiguous,paged64,paged16,tokens}" --precisions "$prec" \
      --backends "${BACKENDS:-triton,flashmla}" --out "$OUT/layouts_${name}_q$q.csv" > "$OUT/bench_${name}_q$q.log" 2>&1
    echo "$name q_len $q rc=$? at $(el) s" | tee -a "$OUT/layouts.log"
  done
done
# (eight files come back from $OUT: the log, six CSVs; the bench logs are folded into one)
tail -n 3 "$OUT"/bench_*.log >> "$OUT/layouts.log" 2>/dev/null; rm -f "$OUT"/bench_*.log

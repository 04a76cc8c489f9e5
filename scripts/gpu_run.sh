#!/usr/bin/env bash
# Run on the H200 device machine from the repo root: install the carried peer wheels, run the GPU tests, then the
# benchmark suite. Results land under $OUT (pytest.log, bench.log, timings CSV). Usage: bash scripts/gpu_run.sh [configs-json]
# Knobs (env): TESTS, TEST_K, TEST_TIMEOUT, TEST_WORKERS, SUITE, PLANNERS, BACKENDS, PRECISIONS, BENCH_TIMEOUT.
# Test modules that import packages the GPU machine lacks (ipywidgets, nbformat: the widget and notebook tests, none
# of them GPU tests) fail to collect there and are skipped; every GPU test runs. The whole GPU suite (130 tests) took
# ~8 min in one process on an H100 on 2026-12-05; it has 234 now: TEST_WORKERS=8 TEST_TIMEOUT=560, and -v names each
# test that finished. The device returns at most 8 files from $OUT per call (2026-12-06: a ninth, tenth and eleventh
# were left out): write long results (a study table) elsewhere and copy one file, or tar them.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. scripts/device_env.sh
export FLASHINFER_CUDA_ARCH_LIST="9.0a" FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
# TEST_WORKERS=N runs the tests in N processes (pytest-xdist, in the device image; tests/conftest.py gives each
# cores // N torch threads, or the fp64 CPU oracles thrash): a cold GPU run is mostly kernel compilation, which then
# runs on N cores (the tests time nothing, so sharing the GPU changes no result)
XDIST=""
if [ -n "${TEST_WORKERS:-}" ] && python3 -c "import xdist" 2>/dev/null; then XDIST="-n $TEST_WORKERS"; fi
timeout ${TEST_TIMEOUT:-170} python3 -m pytest -v -rfE --durations=30 -p no:cacheprovider -m gpu --continue-on-collection-errors $XDIST ${TEST_K:+-k "$TEST_K"} ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.log"
CONFIGS=${1:-'[{}]'}
timeout ${BENCH_TIMEOUT:-380} python3 -m mlalab bench --suite "${SUITE:-competition}" --triton-configs "$CONFIGS" \
  --planners "${PLANNERS:-simple}" --backends "${BACKENDS:-triton,flashmla,flashinfer,reference-torch}" \
  --precisions "${PRECISIONS:-a8w8,a16w8,bf16}" --out "$OUT/timings.csv" 2>&1 | tee "$OUT/bench.log"

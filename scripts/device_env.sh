# Sourced by the device scripts (gpu_run.sh, gpu_acceptance.sh, gpu_ab.sh) from the repo root: installs the carried
# peer wheels (.whl/, made here by scripts/device_wheels.sh) into /tmp/site and puts it and the repo on PYTHONPATH.
# $OUT must be set. It also defines start_kernel_mutants and run_gpu_suite (below), which gpu_acceptance.sh and
# gpu_ab.sh run.
if ls .whl/*.whl >/dev/null 2>&1; then
  # one wheel at a time: a wheel for another Python (e.g. cp311 on the device's 3.12) must not drop the others
  for w in .whl/*.whl; do
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w" \
      || echo "[device_env] WARNING: could not install $w (the peers that need it will report unavailable)" \
      | tee -a "$OUT/wheels.txt"
  done
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1

# The kernel mutants of scripts/mutate_gpu.py in three background processes (the caller waits), each under `timeout
# $1`, a mutant's tests under `--timeout $2`, logs in $OUT/mutate_gpu_{1,2,3}.log; the unmutated kernels are checked by
# the suite (--no-clean).
start_kernel_mutants() {
  local m="timeout $1 env OMP_NUM_THREADS=2 python3 scripts/mutate_gpu.py --no-clean --timeout $2"
  ( $m --only stage1-no-log2e reduce-no-log2e reduce-online-no-log2e stage1-alpha-parity stage1-causal-one-late \
    > "$OUT/mutate_gpu_1.log" 2>&1 ) &
  ( $m --only epilogue-lse-base2 stage1-no-rescale portable-no-log2e triton-reduce-no-log2e \
    > "$OUT/mutate_gpu_2.log" 2>&1 ) &
  ( $m --only e4m3-no-logit-shift e4m3-sum-unscaled e4m3-score-unscaled e4m3-window-low e4m3-table-entry -k e4m3 \
    > "$OUT/mutate_gpu_3.log" 2>&1 ) &
}

# The whole GPU suite in $2 xdist processes under `timeout $1` into $OUT/pytest_suite.log (-v: a cut run still names
# every test that passed), then its summary.
run_gpu_suite() {
  TRITON_CACHE_DIR=$PWD/.tcache timeout "$1" python3 -m pytest -p no:cacheprovider -m gpu -n "$2" -v -rfE \
    --durations=30 --continue-on-collection-errors --timeout 280 tests > "$OUT/pytest_suite.log" 2>&1
  echo "pytest rc=$? at $(($(date +%s) - T0)) s" | tee -a "$OUT/pytest_suite.log"
  grep -E "passed|failed" "$OUT/pytest_suite.log" | tail -2; grep -E "^FAILED|^ERROR" "$OUT/pytest_suite.log" | head -20
}

# Sourced by the device scripts (gpu_run.sh, gpu_acceptance.sh) from the repo root: installs the carried peer wheels
# (.whl/, made here by scripts/device_wheels.sh) into /tmp/site and puts it and the repo on PYTHONPATH. $OUT must be
# set.
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

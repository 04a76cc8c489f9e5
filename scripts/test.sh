#!/usr/bin/env bash
# The whole test suite, as CI runs it: environment, lint, library tests, notebooks, real-browser tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -k reference).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/bootstrap.sh)
bindir=$(dirname "$py")

# The browser tests drive Debian's chromium (no browser download); install it when missing, where we can.
if [ "${MLALAB_SKIP_UI:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[test] installing chromium with apt" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) >&2 ||
      echo "[test] WARNING: could not install chromium; browser tests will be skipped" >&2
  else
    echo "[test] chromium missing and not root: browser tests will be skipped" >&2
  fi
fi

# The H200 machine runs Triton 3.6 (the environment may have a newer one, which allocates registers differently): a
# copy of it beside the environment, used only to compile the sm_90 kernel in a test (skipped, with the reason, offline).
t36="$(dirname "$bindir")/mlalab-triton-3.6"
if [ "${MLALAB_SKIP_TRITON36:-0}" != 1 ] && [ ! -d "$t36/triton" ]; then
  echo "[test] fetching triton 3.6.0 (the H200 machine's) for the sm_90 compile test" >&2
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$t36" "triton==3.6.0" >&2 ||
    echo "[test] WARNING: could not fetch triton 3.6.0; its sm_90 compile test will be skipped" >&2
fi
export MLALAB_TRITON_H200="$t36"

echo "[test] ruff" >&2
"$bindir/ruff" check .
"$bindir/ruff" format --check .
echo "[test] pytest" >&2
exec "$py" -m pytest -q "$@"

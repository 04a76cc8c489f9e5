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

echo "[test] ruff" >&2
"$bindir/ruff" check .
"$bindir/ruff" format --check .
echo "[test] pytest" >&2
exec "$py" -m pytest -q "$@"

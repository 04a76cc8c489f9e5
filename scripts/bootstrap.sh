#!/usr/bin/env bash
# Create (or reuse) the Python environment mlalab runs in, and print the path of its python.
#
# * An already active virtualenv or conda env is used as it is (a GPU user keeps their own torch).
# * Otherwise ./.venv is created. If the system python already has torch (e.g. a CUDA or ROCm build), the venv
#   inherits it (--system-site-packages); if no torch is found, the CPU build torch==2.13.0 is installed.
# * The project is installed editable with the extras named in $MLALAB_EXTRAS (default "lab,test,cluster"); the step is
#   skipped when pyproject.toml has not changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
extras=${MLALAB_EXTRAS:-lab,test,cluster}
base_python=${PYTHON:-python3}

if [ -n "${VIRTUAL_ENV:-}" ] || [ -n "${CONDA_PREFIX:-}" ]; then
  py=$(command -v python)
else
  if [ ! -x .venv/bin/python ]; then
    if "$base_python" -c "import torch" >/dev/null 2>&1; then
      echo "[bootstrap] creating .venv on top of the system torch ($("$base_python" -c 'import torch; print(torch.__version__)'))" >&2
      "$base_python" -m venv --system-site-packages .venv
    else
      echo "[bootstrap] creating .venv" >&2
      "$base_python" -m venv .venv
    fi
  fi
  py="$root/.venv/bin/python"
fi

if ! "$py" -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] no torch found: installing the CPU build torch==2.13.0" >&2
  "$py" -m pip install --quiet --disable-pip-version-check "torch==2.13.0" >&2
fi

stamp_dir=$("$py" -c "import sys; print(sys.prefix)")
stamp="$stamp_dir/.mlalab-install-stamp"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras $root"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$py" -c "import mlalab" >/dev/null 2>&1; then
  echo "[bootstrap] installing mlalab[$extras] (editable)" >&2
  "$py" -m pip install --quiet --disable-pip-version-check -e ".[$extras]" >&2
  echo "$want" > "$stamp"
fi
echo "$py"

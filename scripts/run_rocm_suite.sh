#!/usr/bin/env bash
# On an AMD Instinct MI300X (gfx942) or MI355X (gfx950) with ROCm torch and amd-aiter installed, from the repo root:
#   bash scripts/run_rocm_suite.sh            # aiter checks, then the competition suite -> data/timings/<device>-<date>.csv
#   SUITE=smoke bash scripts/run_rocm_suite.sh
# UNVERIFIED: written without access to a ROCm GPU. The bench step relies on `python -m mlalab bench` accepting
# `--backends aiter` (the timing harness must route "aiter" to mlalab.backends.aiter); if it does not yet, the
# script stops after the correctness tests and says so.
set -euo pipefail
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
SUITE=${SUITE:-competition}
PRECISIONS=${PRECISIONS:-a8w8,a16w8,bf16}

python3 - <<'PY'
import torch
assert torch.version.hip is not None, "this torch has no ROCm support (torch.version.hip is None)"
assert torch.cuda.is_available(), "no ROCm GPU visible to torch"
from mlalab.backends import available
status = available()["aiter"]
print("aiter:", status)
raise SystemExit(0 if status == "available" else 1)
PY

DEVICE=$(python3 -c "import torch,re; n=torch.cuda.get_device_properties(0).name; print(re.sub(r'[^A-Za-z0-9]+','-',n).strip('-').lower() or 'rocm')")
ARCH=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).gcnArchName.split(':')[0])")
DATE=$(date +%Y-%m-%d)
mkdir -p data/timings
LOG="data/timings/${DEVICE}-${ARCH}-${DATE}.log"
{ echo "device: $DEVICE ($ARCH)"; python3 -c "import importlib.metadata as m; print('amd-aiter', m.version('amd-aiter'))" || true
  python3 -c "import torch; print('torch', torch.__version__, 'hip', torch.version.hip)"; } | tee "$LOG"

# 1. correctness on this GPU: decode vs the exact decode of the quantized inputs, our planner vs aiter's metadata
python3 -m pytest -q -rs tests/test_aiter_args.py tests/test_aiter_plan.py tests/test_aiter_rocm.py 2>&1 | tee -a "$LOG"

# 2. timings, beside the H200 ones
if python3 -m mlalab bench --help 2>/dev/null | grep -q -- "--backends"; then
  python3 -m mlalab bench --suite "$SUITE" --backends aiter --precisions "$PRECISIONS" \
    --out "data/timings/${DEVICE}-${DATE}.csv" 2>&1 | tee -a "$LOG"
  echo "wrote data/timings/${DEVICE}-${DATE}.csv (commit it with the log: git add data/timings/${DEVICE}-*)"
else
  echo "this mlalab's bench CLI has no --backends option; timings skipped" | tee -a "$LOG"
  exit 2
fi

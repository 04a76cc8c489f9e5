#!/usr/bin/env bash
# Start JupyterLab on notebooks/, bound to 127.0.0.1 with a random token (printed below).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/bootstrap.sh)
port=${MLALAB_PORT:-8888}
token=${MLALAB_TOKEN:-$("$py" -c 'import secrets; print(secrets.token_hex(24))')}
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
echo "JupyterLab: http://127.0.0.1:${port}/lab/tree/01_mla_decode_basics.ipynb?token=${token}"
exec "$py" -m jupyterlab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port="$port" \
  --ServerApp.port_retries=0 --IdentityProvider.token="$token" --ServerApp.root_dir="$(pwd)/notebooks" \
  --LabApp.extension_manager=readonly --KernelManager.transport=ipc "${extra[@]}" "$@"

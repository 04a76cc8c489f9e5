#!/usr/bin/env bash
# Start JupyterLab on notebooks/, bound to 127.0.0.1 with a random token; prints the URL it really serves.
#
# MLALAB_PORT  the port (default: 8888, or the next free one up to 8938 when 8888 is taken; a port given here that
#              is taken is an error, not silently replaced)
# MLALAB_TOKEN the token (default: random)
# MLALAB_PYTHON the python to run (default: the one scripts/bootstrap.sh creates or finds)
# JupyterLab's news and update toasts are off (scripts/lab-settings/overrides.json; your own settings are untouched).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MLALAB_PYTHON:-$(scripts/bootstrap.sh)}
free_port() {  # first free port on 127.0.0.1 in [$1, $2], or nothing
  "$py" - "$1" "$2" <<'PY'
import socket, sys
for port in range(int(sys.argv[1]), int(sys.argv[2]) + 1):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break
PY
}
if [ -n "${MLALAB_PORT:-}" ]; then
  case "$MLALAB_PORT" in '' | *[!0-9]*) echo "MLALAB_PORT must be a port number, got '$MLALAB_PORT'" >&2; exit 2 ;; esac
  port=$(free_port "$MLALAB_PORT" "$MLALAB_PORT")
  if [ -z "$port" ]; then
    echo "port $MLALAB_PORT (MLALAB_PORT) is taken on 127.0.0.1; unset MLALAB_PORT to use the next free port" >&2
    exit 2
  fi
else
  port=$(free_port 8888 8938)
  if [ -z "$port" ]; then
    echo "ports 8888-8938 are all taken on 127.0.0.1; set MLALAB_PORT to a free port" >&2
    exit 2
  fi
  [ "$port" != 8888 ] && echo "port 8888 is taken: using $port" >&2
fi
token=${MLALAB_TOKEN:-$("$py" -c 'import secrets; print(secrets.token_hex(24))')}
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
echo "JupyterLab: http://127.0.0.1:${port}/lab/tree/01_mla_decode_basics.ipynb?token=${token}"
exec "$py" -m jupyterlab --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port="$port" \
  --ServerApp.port_retries=0 --IdentityProvider.token="$token" --ServerApp.root_dir="$(pwd)/notebooks" \
  --LabApp.app_settings_dir="$(pwd)/scripts/lab-settings" \
  --LabApp.extension_manager=readonly --KernelManager.transport=ipc "${extra[@]}" "$@"

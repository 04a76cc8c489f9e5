"""The README's launch command (`make lab` -> scripts/lab.sh) really starts JupyterLab on 127.0.0.1 with a token."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return -1


@pytest.mark.slow
def test_lab_script_serves_notebooks_on_loopback_with_a_token(tmp_path: Path) -> None:
    port, token = _free_port(), "t" + os.urandom(12).hex()
    env = dict(
        os.environ,
        MLALAB_PORT=str(port),
        MLALAB_TOKEN=token,
        JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
    )
    log = open(tmp_path / "lab.log", "w")  # noqa: SIM115 - must outlive the with-less Popen below
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "lab.sh")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while time.time() < deadline and _status(f"{base}/api/status?token={token}") != 200:
            assert proc.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
            time.sleep(1)
        assert _status(f"{base}/api/status?token={token}") == 200, (tmp_path / "lab.log").read_text()[-3000:]
        assert _status(f"{base}/api/status") == 403, "the server must require the token"
        assert _status(f"{base}/api/contents/01_mla_decode_basics.ipynb?token={token}") == 200
        printed = (tmp_path / "lab.log").read_text()
        assert f"http://127.0.0.1:{port}/lab/tree/01_mla_decode_basics.ipynb?token={token}" in printed
        # Bound to loopback only: the port is not open on any other local address.
        other = [
            a
            for a in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
            if not a.startswith("127.")
        ]
        for addr in other:
            with socket.socket() as s:
                s.settimeout(1)
                assert s.connect_ex((addr, port)) != 0, f"JupyterLab answers on {addr}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()

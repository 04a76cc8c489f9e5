"""The README's launch command (`make lab` -> scripts/lab.sh) really starts JupyterLab on 127.0.0.1 with a token."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
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


def _start(tmp_path: Path, **env_vars: str) -> tuple[subprocess.Popen, Path]:
    env = dict(
        os.environ,
        MLALAB_PYTHON=sys.executable,  # the environment under test (bootstrap.sh is exercised by `make test` itself)
        JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
        **env_vars,
    )
    if "MLALAB_PORT" not in env_vars:
        env.pop("MLALAB_PORT", None)
    log_path = tmp_path / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "lab.sh")], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    return proc, log_path


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _wait_up(proc: subprocess.Popen, log_path: Path, status_url: str) -> None:
    deadline = time.time() + 180
    while time.time() < deadline and _status(status_url) != 200:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        time.sleep(1)
    assert _status(status_url) == 200, log_path.read_text()[-3000:]


@pytest.mark.slow
def test_lab_script_serves_notebooks_on_loopback_with_a_token(tmp_path: Path) -> None:
    port, token = _free_port(), "t" + os.urandom(12).hex()
    proc, log_path = _start(tmp_path, MLALAB_PORT=str(port), MLALAB_TOKEN=token)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_up(proc, log_path, f"{base}/api/status?token={token}")
        assert _status(f"{base}/api/status") == 403, "the server must require the token"
        assert _status(f"{base}/api/contents/01_mla_decode_basics.ipynb?token={token}") == 200
        printed = log_path.read_text()
        assert f"http://127.0.0.1:{port}/lab/tree/01_mla_decode_basics.ipynb?token={token}" in printed
        # the news / update toasts are off by default (the schema default the lab serves, not the user's settings)
        with urllib.request.urlopen(
            f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification?token={token}", timeout=10
        ) as r:
            props = json.load(r)["schema"]["properties"]
        assert props["fetchNews"]["default"] == "false" and props["checkForUpdates"]["default"] is False
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
        _stop(proc)


@pytest.mark.slow
def test_lab_script_moves_off_a_taken_8888_and_prints_the_url_it_serves(tmp_path: Path) -> None:
    token = "t" + os.urandom(12).hex()
    with socket.socket() as blocker:
        try:  # take 8888 ourselves (if something else already holds it, the script must skip it all the same)
            blocker.bind(("127.0.0.1", 8888))
            blocker.listen()
        except OSError:
            pass
        proc, log_path = _start(tmp_path, MLALAB_TOKEN=token)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and "JupyterLab: http" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.5)
            m = re.search(r"JupyterLab: http://127\.0\.0\.1:(\d+)/lab/tree/\S+\?token=(\w+)", log_path.read_text())
            assert m and m.group(2) == token, log_path.read_text()[-3000:]
            port = int(m.group(1))
            assert port != 8888 and "port 8888 is taken: using" in log_path.read_text()
            _wait_up(proc, log_path, f"http://127.0.0.1:{port}/api/status?token={token}")
        finally:
            _stop(proc)


def test_lab_script_refuses_a_taken_mlalab_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        proc, log_path = _start(tmp_path, MLALAB_PORT=str(taken))
        assert proc.wait(60) == 2
    assert f"port {taken} (MLALAB_PORT) is taken" in log_path.read_text()
    proc, log_path = _start(tmp_path, MLALAB_PORT="88a8")
    assert proc.wait(60) == 2 and "MLALAB_PORT must be a port number" in log_path.read_text()

"""Real-browser fixtures: one JupyterLab server per session on a temporary copy of ``notebooks/``, and Debian's
chromium driven by Playwright (``executable_path``; never ``playwright install``).

Pitfalls handled here, each hit for real (see shared/research/workbench_ecosystem.md §4.3):
* autosave writes the notebook -> the server runs on a temp copy, never on ``notebooks/``;
* workspace restore reopens old tabs -> throwaway workspaces dir, and ``?reset`` in every URL;
* the "official Jupyter news" toast on a fresh profile -> user setting ``fetchNews: "false"`` in a throwaway
  settings dir (the venv's ``overrides.json`` is left alone);
* kernels stay alive until the server stops -> sessions are deleted after each test, and the server is
  stopped by PID (then its process group, which only holds what it started).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # root in a container: the sandbox needs user namespaces we do not have
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
]


def chromium_path() -> str | None:
    """Debian's chromium (``MLALAB_CHROMIUM`` overrides), or None."""
    env = os.environ.get("MLALAB_CHROMIUM")
    if env:
        return env if Path(env).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def skip_reason() -> str | None:
    if os.environ.get("MLALAB_SKIP_UI") == "1":
        return "MLALAB_SKIP_UI=1"
    if chromium_path() is None:
        return "chromium not found (install it: apt-get install -y chromium; scripts/test.sh does this as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return f"playwright (python) is not installed: {e}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    if reason is None:
        return
    for item in items:
        if "ui" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"browser test skipped: {reason}"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    """A running JupyterLab: its URL, token, served root (a temp copy) and process."""

    base_url: str
    token: str
    root: Path
    proc: subprocess.Popen
    log_path: Path
    sessions_seen: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"{self.base_url}/lab/tree/{path}?reset&token={self.token}"

    def api(self, method: str, path: str) -> object:
        req = urllib.request.Request(
            f"{self.base_url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_sessions(self) -> None:
        """Stop every kernel the browser started (frees the 2 shared cores between tests)."""
        try:
            for s in self.api("GET", "/api/sessions") or []:  # type: ignore[union-attr]
                self.api("DELETE", f"/api/sessions/{s['id']}")
        except OSError:
            pass  # server already gone; its teardown stops the kernels

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the server by PID (it shuts its kernels down); if it hangs, kill its process group, which we
    created for it (start_new_session) and holds only the server and its kernels. The group is killed before
    the server is reaped, so its id cannot have been reused."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="session")
def jupyter_lab() -> Iterator[LabServer]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="mlalab-ui-"))
    root = tmp / "proj"
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    if (ROOT / "data").is_dir():  # notebooks read recorded measurements via the library; keep relative paths valid
        shutil.copytree(ROOT / "data", root / "data")
    settings = tmp / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"checkForUpdates": False, "fetchNews": "false"})
    )
    token = os.urandom(16).hex()
    port = _free_port()
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "user-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "MLALAB_ROOT": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={tmp / 'user-settings'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        "--LabApp.extension_manager=readonly",  # the default (pypi) queries PyPI
        "--LabApp.expose_app_in_browser=True",  # tests read the notebook model (outputs) via window.jupyterapp
        "--KernelManager.transport=ipc",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = tmp / "jupyterlab.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, proc, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                server.api("GET", "/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not answer /api/status in 60 s:\n{server.log_tail()}") from None
                time.sleep(0.25)
        yield server
    finally:
        _stop(proc)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, ARTIFACTS / "jupyterlab.log")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            b.close()  # Playwright stops the chromium process it launched


@dataclass
class PageProbe:
    """A fresh page plus what went wrong in it (uncaught JS errors, console errors)."""

    page: object
    page_errors: list[str]
    console_errors: list[str]


@pytest.fixture
def page(browser: object, request: pytest.FixtureRequest) -> Iterator[PageProbe]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    pg = ctx.new_page()
    probe = PageProbe(pg, [], [])
    pg.on("pageerror", lambda e: probe.page_errors.append(str(e)))
    pg.on("console", lambda m: probe.console_errors.append(m.text) if m.type == "error" else None)
    try:
        yield probe
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
        if probe.console_errors or probe.page_errors:  # kept for diagnosis; tests assert on page_errors only
            (ARTIFACTS / f"{name}-console.txt").write_text("\n".join(probe.page_errors + probe.console_errors))
        with contextlib.suppress(Exception):  # a crashed page cannot be photographed; the test's failure says why
            pg.screenshot(path=str(ARTIFACTS / f"{name}-final.png"), full_page=False)
        ctx.close()

"""Fixtures of the Python tests: a real cxlpoold on a temporary socket (pid
tracked, SIGTERM then SIGKILL at the end; never killall) and helpers that
read its accounting through cxlpoolctl --json.

Environment (set by ctest, see CMakeLists.txt): CXLPOOL_BINARY_DIR (the
build tree: daemon/cxlpoold, tools/cxlpoolctl), PYTHONPATH with
build/python first.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

BINARY_DIR = os.environ.get("CXLPOOL_BINARY_DIR", "build")
DAEMON = os.path.join(BINARY_DIR, "daemon", "cxlpoold")
CTL = os.path.join(BINARY_DIR, "tools", "cxlpoolctl")

BASE_CONFIG = """
[daemon]
socket_mode = "0666"
log_level = "warning"
[pools]
capacity = "256M"
"""


class Daemon:
    """One cxlpoold child in its own temp dir."""

    def __init__(self, extra_config: str = "") -> None:
        self.dir = tempfile.mkdtemp(prefix="cxlpool-py-")
        os.chmod(self.dir, 0o755)
        self.socket = os.path.join(self.dir, "cxlpool.sock")
        self.log_path = os.path.join(self.dir, "cxlpoold.log")
        with open(os.path.join(self.dir, "cxlpoold.toml"), "w") as f:
            f.write(BASE_CONFIG + extra_config)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [DAEMON, "--foreground", "--socket", self.socket, "--config",
             os.path.join(self.dir, "cxlpoold.toml"), "--state-dir", os.path.join(self.dir, "state")],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cxlpoold exited: {self.read_log()}")
            if os.path.exists(self.socket) and self.ctl("stats").returncode == 0:
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"cxlpoold did not answer on {self.socket}: {self.read_log()}")

    def read_log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([CTL, *args, "--socket", self.socket], capture_output=True, text=True)

    def ctl_json(self, *args: str):
        r = self.ctl(*args, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def leases(self) -> list[dict]:
        return self.ctl_json("leases")

    def wait_leases(self, count: int, timeout: float = 10.0) -> list[dict]:
        """Polls (bounded, no fixed sleeps) until `count` leases are live."""
        deadline = time.monotonic() + timeout
        while True:
            ls = self.leases()
            if len(ls) == count or time.monotonic() > deadline:
                return ls
            time.sleep(0.02)

    def stop(self) -> None:
        # Leases and clients still referenced (a traceback's frames, the
        # cxlpool.torch default client) go while the daemon can answer.
        torch_mod = sys.modules.get("cxlpool.torch")
        if torch_mod is not None:
            torch_mod.set_client(None)
        gc.collect()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def daemon(monkeypatch):
    """A fresh daemon; $CXLPOOL_SOCKET points at it for the test."""
    if not os.access(DAEMON, os.X_OK):
        pytest.skip(f"no cxlpoold at {DAEMON}")
    d = Daemon()
    monkeypatch.setenv("CXLPOOL_SOCKET", d.socket)
    yield d
    d.stop()


@pytest.fixture
def make_daemon(monkeypatch):
    """A factory for daemons with extra configuration."""
    made = []

    def make(extra: str = "") -> Daemon:
        d = Daemon(extra)
        monkeypatch.setenv("CXLPOOL_SOCKET", d.socket)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


def run_python(code: str, env: dict | None = None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with this test's environment."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=timeout, **kw)

"""Local servers for the tests: a free port on 127.0.0.1, waiting for a server to answer,
JSON over HTTP, and the `server` fixture that starts commands and always stops them.

Used by the MLflow REST tests (tests/e2e/test_sharing.py on the workspace's store,
tests/unit/report/test_tracking_rest.py on a store of hand-made tables) and the S3 remote test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.workspace import BIN


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 90.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server for {url} exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status < 500:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"server at {url} did not come up within {timeout:.0f} s")


def post_json(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def mlflow_server_cmd(store_uri: str, port: int, artifacts: Path | None = None) -> list[str]:
    """`mlflow server` on 127.0.0.1:`port` over the store at `store_uri`, one worker."""
    cmd = [
        str(BIN / "mlflow"),
        "server",
        "--backend-store-uri",
        store_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    if artifacts is not None:
        cmd += ["--default-artifact-root", artifacts.as_uri()]
    return cmd


@pytest.fixture
def server(tmp_path):
    """start(cmd, url, cwd): run `cmd` until `url` answers; every server started is stopped at the end."""
    procs = []

    def start(cmd: list[str], url: str, cwd: Path, timeout: float = 90.0) -> subprocess.Popen:
        log = open(tmp_path / f"server{len(procs)}.log", "w")
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        )
        procs.append(proc)
        wait_for(url, timeout, proc)
        return proc

    try:
        yield start
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=20)

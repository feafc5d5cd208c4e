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


def _local_port_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(n: int, attempts: int = 200) -> int:
    """The first of `n` consecutive ports that are free on 127.0.0.1, below the kernel's ephemeral range.

    `voicebias serve` listens on port_base .. port_base + n - 1. A block taken from the ephemeral
    range can be handed to some other process's outgoing connection between this check and the
    serve call (on a loaded machine running tests in parallel, it is), so the block is drawn below it.
    """
    import random

    lo = 20000
    hi = min(_local_port_range()[0], 32768) - n
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(attempts):
        base = rng.randrange(lo, hi)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports on 127.0.0.1 between {lo} and {hi + n}")


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
            start_new_session=True,  # its own process group: `mlflow server` runs its web server as a child
        )
        procs.append(proc)
        wait_for(url, timeout, proc)
        return proc

    try:
        yield start
    finally:
        for p in procs:
            stop_group(p)


def stop_group(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM to the server's whole process group (the command and the workers it started), then
    SIGKILL to whatever of the group is left after `grace_s`: a test server keeps nothing that needs
    a longer graceful stop."""
    import signal

    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group has exited
            pass

    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    signal_group(signal.SIGKILL)
    proc.wait(timeout=20)

"""The shim on a network: what a stranger, a careless client or a stale pid file can and cannot do.

The shim (voicebias/serving/shim.py) runs for real in a bare environment around the stand-in driver
(tests/fakes/stand_in_driver.py), with small limits so each case is quick: a token in
$VOICEBIAS_SHIM_TOKEN, a 1 MB body limit, a 1 s socket timeout and 4 connection threads. Users rely
on: no answer (and no model list) without the token; a huge or lying Content-Length answered 413
without the body being read; a connection that stalls closed by the timeout; idle connections not
growing the thread count; `voicebias serve --host <address>` turning healthy on that address; a pid
file entry that does not prove its process never getting a signal; no key of the caller reaching the
eSpeak helper process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fakes.stand_in_driver import bare_python, stand_in_driver
from tests.support.servers import free_port_block
from voicebias.cli import main
from voicebias.cli.serve import SHIM

TOKEN = "shim-token-for-the-test-0123456789"


@pytest.fixture
def shim(tmp_path):
    """(port, process) of a shim with the test's token and limits, stopped at the end."""
    python = bare_python(tmp_path)
    driver = stand_in_driver(tmp_path)
    port = free_port_block(1)
    config = json.dumps({"checkout": str(tmp_path / "external" / "Stand-In"), "weights": str(tmp_path / "w")})
    argv = [python, str(SHIM), "--driver", str(driver), "--config", config, "--model", "stand/in", "--port", str(port)]
    argv += ["--max-body-mb", "1", "--socket-timeout-s", "1", "--threads", "4"]
    log = open(tmp_path / "shim.log", "w")
    proc = subprocess.Popen(argv, env={"PATH": os.environ["PATH"], "VOICEBIAS_SHIM_TOKEN": TOKEN}, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while _status(port, "/health") != 200:
            assert proc.poll() is None, (tmp_path / "shim.log").read_text()
            assert time.monotonic() < deadline, "the shim did not turn healthy"
            time.sleep(0.1)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _status(port: int, path: str, token: str | None = None, data: bytes | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _raw(port: int, head: bytes, timeout: float = 10.0) -> bytes:
    """Send `head` on a new connection; everything the shim sends back before it closes (or times out)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_without_the_token_nothing_but_health_answers_and_the_model_list_names_no_local_path(shim, tmp_path):
    port, _ = shim
    assert _status(port, "/health") == 200  # ready or not, and nothing more
    assert _status(port, "/v1/models") == 401
    assert _status(port, "/v1/models", token="wrong") == 401
    assert _status(port, "/v1/chat/completions", data=b"{}") == 401
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        listing = r.read().decode()
    entry = json.loads(listing)["data"][0]
    assert entry["id"] == "stand/in" and entry["driver"]["sha256"]
    assert str(tmp_path) not in listing and "python" not in entry  # no checkout, weights or interpreter path
    assert TOKEN not in (tmp_path / "shim.log").read_text()


def test_a_body_over_the_limit_or_a_lying_length_gets_413_unread(shim):
    port, _ = shim
    for length in (64 << 20, 10**9):  # 64 MB, and a length no body will follow
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        ).encode()
        t0 = time.monotonic()
        reply = _raw(port, head + b'{"messages": ')
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert b"over this shim's limit" in reply
        assert time.monotonic() - t0 < 5  # answered and closed at once, not after reading 64 MB
    assert _status(port, "/health") == 200


def test_a_stalled_connection_is_closed_and_idle_ones_do_not_grow_the_threads(shim):
    port, proc = shim
    # slow loris: half a request line, then nothing; the shim closes it after its 1 s timeout
    t0 = time.monotonic()
    reply = _raw(port, b"POST /v1/chat/comp", timeout=15)
    assert reply == b"" and time.monotonic() - t0 < 10
    # a body that stops short of its Content-Length: closed too
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 500\r\n\r\n"
    )
    assert _raw(port, head.encode() + b"{", timeout=15) == b""
    before = _threads(proc.pid)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    try:
        time.sleep(0.5)
        assert _threads(proc.pid) <= before + 4  # at most --threads handle connections
    finally:
        for s in idle:
            s.close()
    assert _status(port, "/health") == 200


def test_serve_on_a_given_address_turns_healthy_there_and_writes_that_address(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    (root / "external" / "Kimi-Audio").mkdir(parents=True)
    (root / "models" / "weights" / "Kimi-Audio-7B-Instruct").mkdir(parents=True)
    monkeypatch.delenv("VOICEBIAS_ENDPOINTS", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("VOICEBIAS_ROOT", str(root))
    monkeypatch.setenv("VOICEBIAS_CACHE", str(root / ".cache"))
    python, driver, port = bare_python(tmp_path), stand_in_driver(tmp_path), free_port_block(1)
    host = "127.0.0.2"  # a loopback address other than 127.0.0.1: a probe of 127.0.0.1 finds nothing there
    argv = ["serve", "kimi_audio", "--host", host, "--port-base", str(port), "--python", python]
    assert main([*argv, "--driver", str(driver), "--startup-timeout", "30", "--grace", "5"]) == 0
    try:
        endpoints = json.loads((root / ".cache" / "endpoints.json").read_text())
        (entry,) = endpoints["kimi_audio"]
        assert entry["url"] == f"http://{host}:{port}/v1" and len(entry["token"]) >= 40
        assert oct((root / ".cache" / "endpoints.json").stat().st_mode & 0o777) == "0o600"
        pids = (root / ".cache" / "serve" / "pids.json").read_text()
        assert (
            entry["token"] not in pids
            and entry["token"] not in (root / ".cache" / "serve" / "kimi_audio-0.log").read_text()
        )
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5) as r:
            assert r.status == 200
    finally:
        assert main(["serve", "--stop", "--grace", "5"]) == 0


def test_a_pid_file_entry_that_does_not_prove_its_process_signals_nothing(tmp_path, monkeypatch, capsys):
    root = tmp_path / "proj"
    state = root / ".cache" / "serve"
    state.mkdir(parents=True)
    monkeypatch.setenv("VOICEBIAS_ROOT", str(root))
    monkeypatch.setenv("VOICEBIAS_CACHE", str(root / ".cache"))
    monkeypatch.delenv("VOICEBIAS_ENDPOINTS", raising=False)
    bystanders = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        entry = {"port": 1, "url": "http://127.0.0.1:1/v1", "log": "x", "gpus": None, "program": "python"}
        stale = {
            "no_start_time": [{**entry, "pid": bystanders[0].pid}],  # written by an older voicebias, or by hand
            "pid_reused": [{**entry, "pid": bystanders[1].pid, "start_time": "1"}],  # the replica died; a new process
        }
        (state / "pids.json").write_text(json.dumps(stale))
        assert main(["serve", "--stop", "--grace", "1"]) == 0
        err = capsys.readouterr().err
        assert f"pid {bystanders[0].pid} was recorded without a start time" in err
        assert f"pid {bystanders[1].pid} now belongs to another process" in err
        time.sleep(0.3)
        assert all(p.poll() is None for p in bystanders)  # neither was signalled
        assert json.loads((state / "pids.json").read_text()) == {}
    finally:
        for p in bystanders:
            p.kill()
            p.wait()


def test_the_espeak_helper_gets_the_allow_listed_environment(monkeypatch):
    from voicebias.tts import espeak

    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-key-for-the-helper-test")
    monkeypatch.setenv("AZURE_SPEECH_KEY", "planted-azure")
    espeak._Forker._current = None  # a helper started now, with this environment
    helper = espeak._Forker.get()
    try:
        status, rate, pcm = helper.synthesize("hello there", "en", 160)  # it works with that environment
        assert status == 0 and rate > 0 and pcm.size > 1000
        environ = Path(f"/proc/{helper.proc.pid}/environ").read_bytes().split(b"\0")  # read once it runs
        names = {v.split(b"=", 1)[0].decode() for v in environ if v}
        assert "OPENAI_API_KEY" not in names and "AZURE_SPEECH_KEY" not in names
        assert "PATH" in names
    finally:
        helper.close()
        espeak._Forker._current = None

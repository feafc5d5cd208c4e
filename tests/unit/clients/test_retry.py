"""The shared HTTP layer against real local servers: Retry-After and backoff (voicebias.clients.retry),
the Azure REST retry helper, the openai-compatible judge through the openai SDK, secrets read
without touching os.environ, and the allow-listed environment of child processes."""

from __future__ import annotations

import email.utils
import json
import os
import sys
import time
import types
from http.server import BaseHTTPRequestHandler

import pytest

from tests.fakes.checkouts import command_checkout
from tests.fakes.http import send_json, start_loopback, stop_loopback
from tests.fakes.stimuli import make_stimuli
from voicebias.clients.retry import backoff_s, post_with_retries, retry_after_s
from voicebias.errors import SetupError
from voicebias.secrets import child_env, read_secret, require_secret
from voicebias.systems.base import ContinuationRequest

VALID = json.dumps(
    {
        "semantic_coherence": 4,
        "sentence_polarity": 5,
        "agency_competence": 3,
        "emotionalisation_affect_framing": 5,
        "appearance_objectification": 5,
    }
)
KEY = "sk-test-http-layer-0123456789abcdefPLANTED"


class ScriptedServer:
    """POST on 127.0.0.1 answering from a script of (status, headers, JSON body); past the end, `done`."""

    def __init__(self, script, done):
        self.script, self.done, self.requests = list(script), done, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                )
                status, headers, obj = outer.script.pop(0) if outer.script else outer.done(self.path, body)
                send_json(self, status, obj, headers)

        self.httpd, self.url = start_loopback(Handler)

    def close(self):
        stop_loopback(self.httpd)


@pytest.fixture
def serve():
    servers = []

    def make(script, done=lambda path, body: (200, {}, {"ok": True})):
        servers.append(ScriptedServer(script, done))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


# ---------------------------------------------------------------- Retry-After and backoff


def test_retry_after_reads_seconds_milliseconds_and_http_dates():
    assert retry_after_s({"retry-after": "7"}) == 7.0
    assert retry_after_s({"retry-after": "1.5"}) == 1.5
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25  # ms wins
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25.0 <= retry_after_s({"retry-after": when}) <= 30.0
    assert retry_after_s({"retry-after": email.utils.formatdate(time.time() - 60, usegmt=True)}) == 0.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None and retry_after_s(None) is None


def test_backoff_doubles_per_attempt_and_is_capped():
    assert [backoff_s(a, 0.5, cap_s=3.0) for a in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


# ---------------------------------------------------------------- the REST helper (Azure TTS uses it)


def test_rest_helper_does_not_retry_a_refused_key(serve):
    server = serve([(401, {}, {"error": "Unauthorized"})])
    waits = []
    r = post_with_retries(
        server.url + "/cognitiveservices/v1",
        data=b"<speak/>",
        timeout_s=5,
        max_retries=4,
        base_s=1.0,
        sleep=waits.append,
    )
    assert r.status_code == 401 and len(server.requests) == 1 and waits == []


@pytest.mark.parametrize("status", [400, 403])
def test_rest_helper_does_not_retry_other_refusals(serve, status):
    server = serve([(status, {}, {"error": "no"})])
    waits = []
    r = post_with_retries(server.url, data=b"x", timeout_s=5, max_retries=4, base_s=1.0, sleep=waits.append)
    assert r.status_code == status and len(server.requests) == 1 and waits == []


def test_rest_helper_waits_the_retry_after_hint_on_429(serve):
    when = email.utils.formatdate(time.time() + 20, usegmt=True)
    server = serve([(429, {"Retry-After": "3"}, {}), (429, {"Retry-After": when}, {})])
    waits = []
    r = post_with_retries(server.url, data=b"x", timeout_s=5, max_retries=4, base_s=1.0, sleep=waits.append)
    assert r.status_code == 200 and len(server.requests) == 3
    assert waits[0] == 3.0 and 15.0 <= waits[1] <= 20.0


def test_rest_helper_backs_off_on_5xx_and_returns_the_last_answer(serve):
    server = serve([(500, {}, {}), (502, {}, {}), (503, {}, {}), (504, {}, {})])
    waits = []
    r = post_with_retries(server.url, data=b"x", timeout_s=5, max_retries=3, base_s=0.5, sleep=waits.append)
    assert r.status_code == 504 and len(server.requests) == 4  # spent: the last answer comes back
    assert waits == [0.5, 1.0, 2.0]


def test_azure_tts_honours_retry_after_then_refuses_a_wrong_key(serve, monkeypatch, tmp_path):
    from voicebias.tts import get_backend

    server = serve([(429, {"Retry-After": "4"}, {}), (503, {}, {}), (401, {}, {"error": "Unauthorized"})])
    monkeypatch.setenv("AZURE_SPEECH_KEY", "azure-key")
    monkeypatch.setenv("AZURE_SPEECH_ENDPOINT", server.url + "/cognitiveservices/v1")
    tts = get_backend("azure", cache_dir=str(tmp_path / "cache"), retry_wait_s=0.25)
    waits = []
    tts.sleep = waits.append
    with pytest.raises(RuntimeError, match=r"rejected the key \(401\)"):
        tts.synthesize("Hello.", "en-US-JennyNeural")
    assert waits == [4.0, 0.5] and len(server.requests) == 3
    assert server.requests[0]["headers"]["ocp-apim-subscription-key"] == "azure-key"


# ---------------------------------------------------------------- the openai-compatible judge (openai SDK)


def chat_reply(path, body):
    payload = json.loads(body)
    return (
        200,
        {},
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": payload["model"] + "-0001",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": VALID}}],
        },
    )


class _RecordedClock:
    """The time module as the openai SDK sees it, with its retry sleeps recorded instead of slept."""

    def __init__(self):
        self.waits = []

    def sleep(self, seconds):
        self.waits.append(seconds)

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def sdk_clock(monkeypatch):
    import openai._base_client

    clock = _RecordedClock()
    monkeypatch.setattr(openai._base_client, "time", clock)
    return clock


@pytest.fixture
def judge_for(monkeypatch):
    from voicebias.instruments.judge import get_judge

    monkeypatch.setenv("VOICEBIAS_TEST_JUDGE_KEY", KEY)

    def make(server, max_retries=3):
        return get_judge(
            {
                "backend": "openai_compatible",
                "base_url": server.url + "/v1",
                "model": "judge-m",
                "api_key_env": "VOICEBIAS_TEST_JUDGE_KEY",
                "max_retries": max_retries,
            }
        )

    return make


def test_judge_401_is_one_request_and_a_clear_redacted_error(serve, judge_for, sdk_clock):
    server = serve(
        [
            (
                401,
                {},
                {
                    "error": {
                        "message": f"Incorrect API key provided: {KEY}",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
            )
        ],
        chat_reply,
    )
    res = judge_for(server).judge("a", "b")
    assert res.status == "failed" and res.attempts == 1 and len(server.requests) == 1 and sdk_clock.waits == []
    assert "HTTP 401" in res.error and "Incorrect API key" in res.error and "[redacted]" in res.error
    assert KEY not in res.error and KEY[8:24] not in res.error
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"


def test_judge_429_waits_the_hinted_time_then_scores(serve, judge_for, sdk_clock):
    server = serve([(429, {"Retry-After": "2"}, {"error": {"message": "Rate limit reached"}})], chat_reply)
    res = judge_for(server).judge("a", "b")
    assert res.status == "ok" and res.scores["semantic_coherence"] == 4 and res.version == "judge-m-0001"
    assert len(server.requests) == 2 and sdk_clock.waits == [2.0]
    assert json.loads(server.requests[1]["body"])["temperature"] == 0


def test_judge_5xx_is_retried_with_growing_waits_then_fails_the_item(serve, judge_for, sdk_clock):
    overloaded = (503, {}, {"error": {"message": "The server is overloaded"}})
    server = serve([overloaded] * 10, chat_reply)
    res = judge_for(server, max_retries=3).judge("a", "b")
    assert res.status == "failed" and res.attempts == 1 and len(server.requests) == 4
    assert "HTTP 503 after 4 tries" in res.error and "overloaded" in res.error
    assert len(sdk_clock.waits) == 3 and all(b > a for a, b in zip(sdk_clock.waits, sdk_clock.waits[1:]))


def test_judge_without_a_key_configured_never_borrows_openai_api_key(serve, monkeypatch, tmp_path):
    from voicebias.instruments.judge import OpenAICompatibleJudge

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("VOICEBIAS_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(SetupError, match="VOICEBIAS_TEST_JUDGE_KEY"):
        OpenAICompatibleJudge(
            "http://127.0.0.1:9/v1", "m", api_key_env="VOICEBIAS_TEST_JUDGE_KEY", root=tmp_path
        ).judge("a", "b")


# ---------------------------------------------------------------- secrets


def test_secrets_come_from_the_environment_or_dotenv_without_entering_os_environ(tmp_path, monkeypatch):
    monkeypatch.delenv("VOICEBIAS_TEST_DOTENV_KEY", raising=False)
    (tmp_path / ".env").write_text("VOICEBIAS_TEST_DOTENV_KEY=from-dotenv\n")
    before = dict(os.environ)
    assert read_secret("VOICEBIAS_TEST_DOTENV_KEY", tmp_path) == "from-dotenv"
    assert dict(os.environ) == before and "VOICEBIAS_TEST_DOTENV_KEY" not in os.environ
    monkeypatch.setenv("VOICEBIAS_TEST_DOTENV_KEY", "from-env")
    assert read_secret("VOICEBIAS_TEST_DOTENV_KEY", tmp_path) == "from-env"  # the environment wins
    with pytest.raises(SetupError, match="the judge needs the environment variable VOICEBIAS_TEST_MISSING"):
        require_secret("the judge", "VOICEBIAS_TEST_MISSING", tmp_path, error=SetupError)


# ---------------------------------------------------------------- child processes

PLANTED = {"AZURE_SPEECH_KEY": "azure-planted", "AWS_SECRET_ACCESS_KEY": "aws-planted", "OPENAI_API_KEY": "sk-planted"}
DUMP_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def _plant(monkeypatch):
    for k, v in PLANTED.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")


def test_repository_systems_children_see_no_key(tmp_path, monkeypatch):
    """A real command-route child of a repository system dumps its environment: no key in it."""
    from voicebias.systems.catalog import build_system

    _plant(monkeypatch)
    checkout = command_checkout(tmp_path / "external" / "vae-gslm")
    (checkout / "dump_env.py").write_text(
        "import json, os, shutil, sys\n"
        "shutil.copy(sys.argv[1], sys.argv[2])\n"
        "open('env.json', 'w').write(json.dumps(dict(os.environ)))\n"
    )
    (tmp_path / "models" / "weights" / "vae-gslm").mkdir(parents=True)
    system = build_system(
        "vae_gslm", {"python": sys.executable, "command": ["python", "dump_env.py", "{audio}", "{out}"]}, root=tmp_path
    )
    s = make_stimuli(tmp_path, 1).iloc[0]
    system.continue_speech(
        ContinuationRequest(s.stimulus_id, "en", "continue", str(tmp_path / s.path), s.sha256, 1, continuation_s=6.0)
    )
    system.close()
    seen = json.loads((checkout / "env.json").read_text())
    assert not set(PLANTED) & set(seen)
    assert seen["PATH"] == os.environ["PATH"] and seen["HF_HUB_OFFLINE"] == "1" and seen["LC_ALL"] == "C.UTF-8"
    assert seen["PYTHONPATH"].split(os.pathsep)[0] == str(checkout)


def test_vqvc_child_sees_no_key_and_named_extras_pass(tmp_path, monkeypatch):
    import subprocess

    from voicebias.stimuli.phonation.vqvc import _child_env

    _plant(monkeypatch)
    monkeypatch.setenv("VOICEBIAS_TEST_PASSED", "yes")
    monkeypatch.setenv("VOICEBIAS_CHILD_ENV", "VOICEBIAS_TEST_PASSED")
    env = _child_env(types.SimpleNamespace(repo=tmp_path))
    out = subprocess.run([sys.executable, "-c", DUMP_ENV], env=env, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert not set(PLANTED) & set(seen)
    assert seen["VOICEBIAS_TEST_PASSED"] == "yes" and seen["PYTHONUNBUFFERED"] == "1"
    assert child_env(names=["OPENAI_API_KEY"])["OPENAI_API_KEY"] == "sk-planted"  # only when named

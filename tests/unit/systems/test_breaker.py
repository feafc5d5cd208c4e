"""Dead, hanging and key-refusing servers, end to end through the adapters and the runner against
fake servers speaking the real protocols (OpenAI chat completions and model list, vLLM-Omni, Gemini Live).

What users rely on: a server that accepts connections and never answers trips the circuit
breaker after a few requests and every request is then recorded as failed with the
breaker's reason, none of them sent; before the run every adapter asks its servers
whether they answer and take the key, and stops in seconds with one line when they do not,
naming what is wrong; with several endpoints the run goes on with those that answer.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.fakes.gemini_live_server import FakeGeminiLiveServer
from tests.fakes.openai_server import FakeOpenAIAudioServer
from tests.fakes.stimuli import make_stimuli
from tests.support.respond import run
from voicebias.cards import load_card
from voicebias.errors import SetupError
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import RetryPolicy

KEY = "sk-test-breaker-0123456789abcdefPLANTED"


@pytest.fixture
def cards(tmp_path):
    d = tmp_path / "cards"
    d.mkdir()
    card = load_card("gpt_audio") | {"adapter": "openai_compatible", "checkpoint": "Qwen/Qwen2.5-Omni-7B"}
    (d / "served.yaml").write_text(json.dumps(card))
    return d


def served(cards, root, **params):
    return build_system("served", {"voice": "Chelsie", "timeout_s": 10.0, **params}, cards_dir=cards, root=root)


def test_a_hanging_server_trips_the_breaker_after_a_few_requests(tmp_path, cards, capsys):
    """100 requests to a server that answers GET /v1/models (the check passes) and hangs on every chat."""
    n = 100
    stim = make_stimuli(tmp_path, n)
    breaker = {"failures": 3, "cooldown_s": 0.2, "max_cooldown_s": 1.0, "max_reopens": 2}
    with FakeOpenAIAudioServer("EMPTY", default="timeout", hang_s=60.0) as server:
        system = served(cards, tmp_path, base_url=server.base_url, timeout_s=0.3, max_concurrency=4, breaker=breaker)
        t0 = time.perf_counter()
        table, counts, _, files = run(
            system,
            stim,
            tmp_path,
            tmp_path / "cache",
            policy=RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05),
        )
        wall = time.perf_counter() - t0
        system.close()
        received = sum(server.attempts.values())  # counted as each request arrives, hung or not
        gets = list(server.gets)
    with capsys.disabled():  # measured, not asserted
        print(f"\nhanging server: {n} requests in {wall:.2f} s, {received} reached the server")
    assert gets == ["/v1/models"]  # the pre-run check, once
    # the first wave (4 at once) times out, the breaker opens, two probes fail: a handful, not 100 x 4
    assert 4 + 2 <= received <= 12, received
    assert (table.status == "failed").all() and len(table) == n and counts["failed"] == n
    assert table.error.str.fullmatch(
        r"circuit open after \d+ consecutive failures \(re-opened 2 times, given up "
        r"for this run\): timeout after 0\.3 s"
    ).all(), table.error.unique()
    assert counts["calls"] == (table.attempts > 0).sum() <= received
    assert table.transcript.isna().all() and table.output_audio.isna().all() and list(files) == ["responses.csv"]
    said = capsys.readouterr().err
    assert "circuit open after 3 consecutive failures (timeout after 0.3 s)" in said
    assert "circuit given up for this run after 2 re-opens in a row" in said


# ---------------------------------------------------------------------------- the pre-run check


def test_openai_check_refused_key_and_unreachable_server_stop_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-0123456789")
    with FakeOpenAIAudioServer(KEY) as server:
        system = build_system("gpt_audio", {"base_url": server.base_url}, root=tmp_path)
        t0 = time.perf_counter()
        with pytest.raises(SetupError) as info:
            system.check()
        seconds = time.perf_counter() - t0
        system.close()
        assert server.log == []  # no chat request was sent
    msg = str(info.value)
    assert msg.startswith(
        f"system 'gpt_audio': endpoint {server.base_url}: credentials refused (GET /models "
        "answered HTTP 401: Incorrect API key provided.); check the key in OPENAI_API_KEY"
    )
    assert "sk-wrong" not in msg and "\n" not in msg
    print(f"refused key: stopped in {seconds:.2f} s")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIAudioServer(KEY, models_status=403) as server:
        system = build_system("gpt_audio", {"base_url": server.base_url}, root=tmp_path)
        with pytest.raises(SetupError, match="credentials refused .*HTTP 403"):
            system.check()
    with FakeOpenAIAudioServer(KEY) as gone:
        url = gone.base_url
    system = build_system("gpt_audio", {"base_url": url}, root=tmp_path)
    with pytest.raises(SetupError, match=rf"^system 'gpt_audio': cannot reach {url} \(connection refused\)$"):
        system.check()


def test_openai_compatible_check_passes_a_server_without_a_model_list(tmp_path, cards):
    """Any answer but 401/403 means the server is up and took the key (a server without /v1/models says 404)."""
    with FakeOpenAIAudioServer("EMPTY", models_status=404) as server:
        system = served(cards, tmp_path, base_url=server.base_url)
        system.check()
        assert server.gets == ["/v1/models"]
    with FakeOpenAIAudioServer("sk-needs-one") as server:
        system = served(cards, tmp_path, base_url=server.base_url)
        with pytest.raises(
            SetupError, match="credentials refused .*the server wants a key: name its variable in api_key_env"
        ):
            system.check()


def test_with_several_endpoints_the_run_goes_on_with_those_that_answer(tmp_path, cards, capsys):
    stim = make_stimuli(tmp_path, 6)
    with FakeOpenAIAudioServer("EMPTY") as gone:
        dead = gone.base_url
    with FakeOpenAIAudioServer("EMPTY") as a, FakeOpenAIAudioServer("EMPTY") as b:
        system = served(cards, tmp_path, endpoints=[{"url": a.base_url}, {"url": dead}, {"url": b.base_url}])
        capsys.readouterr()
        table, counts, _, _ = run(system, stim, tmp_path, tmp_path / "cache")
        facts = {e["endpoint"]: e for e in system.pool.stats()}
        system.close()
    said = capsys.readouterr().err
    assert f"system 'served': 1 of 3 endpoints do not answer, left out of this run: {dead} (connection refused)" in said
    assert (table.status == "ok").all() and counts["calls"] == 6
    assert facts[dead]["sent"] == 0 and facts[dead]["breaker"] == "left out"
    assert facts[a.base_url]["answered"] + facts[b.base_url]["answered"] == 6


def test_gemini_check_looks_the_model_up_with_the_key(tmp_path, monkeypatch):
    def gemini(server, **params):
        monkeypatch.setenv("SSL_CERT_FILE", str(server.cert))
        return build_system("gemini_live", {"base_url": server.base_url, "timeout_s": 5, **params}, root=tmp_path)

    key = "AIzaSy-test-gemini-0123456789PLANTED"
    model = "gemini-2.5-flash-native-audio-preview-09-2025"
    monkeypatch.setenv("GEMINI_API_KEY", key)
    with FakeGeminiLiveServer(key, tmp_path / "tls", models={model}) as server:
        gemini(server).check()
        assert server.lookups == [model] and server.sessions == []
        with pytest.raises(SetupError, match=r"the API knows no model 'gemini-9-audio' \(HTTP 404"):
            gemini(server, model="gemini-9-audio").check()
        monkeypatch.setenv("GEMINI_API_KEY", "AIzaSy-wrong-key")
        with pytest.raises(SetupError) as info:
            gemini(server).check()
        assert str(info.value) == (
            f"system 'gemini_live': credentials refused (looking up {model} answered HTTP "
            "400: API key not valid. Please pass a valid API key.); check the key in "
            "GEMINI_API_KEY"
        )
        port = server.port
    monkeypatch.setenv("GEMINI_API_KEY", key)
    system = build_system("gemini_live", {"base_url": f"https://127.0.0.1:{port}"}, root=tmp_path)
    with pytest.raises(SetupError, match=rf"cannot reach https://127.0.0.1:{port} \(connection refused\)"):
        system.check()


def test_vllm_omni_check_names_a_refused_key(tmp_path, monkeypatch):
    from tests.fakes.vllm_omni_server import FakeVLLMOmniServer, pinned_cards

    cards = pinned_cards(tmp_path)
    with FakeVLLMOmniServer("Qwen/Qwen2.5-Omni-7B", api_key="vllm-secret-key") as server:
        monkeypatch.setenv("VLLM_KEY", "not-the-key")
        system = build_system(
            "qwen2_5_omni_vllm",
            {"base_url": server.base_url, "api_key_env": "VLLM_KEY"},
            cards_dir=cards,
            root=tmp_path,
        )
        with pytest.raises(
            SetupError,
            match=r"endpoint .*: credentials refused \(GET .*/v1/models answered HTTP "
            r"401: Unauthorized\); check the key in VLLM_KEY",
        ):
            system.check()
        assert server.chats() == []

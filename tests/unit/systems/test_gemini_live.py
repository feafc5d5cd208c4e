"""Gemini Live adapter against a local fake server speaking the Live API's websocket protocol (TLS).

What users rely on: each stimulus is one Live session with the fixed voice Kore, the
native prompt as system instruction, output transcription on and the whole passage
sent as one turn of 16 kHz PCM; under refused handshakes (429), server-side closes
(1011/1013) and stalls every request ends succeeded or recorded failed, none lost,
none answered twice, answers never cross between stimuli.
"""

from __future__ import annotations

import math

import pytest
import soundfile as sf

from tests.fakes.gemini_live_server import FakeGeminiLiveServer, pcm_fingerprint
from tests.fakes.stimuli import make_stimuli
from voicebias.cost import tokens
from voicebias.errors import SetupError
from voicebias.systems.base import S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, run_task, validate_responses
from voicebias.tasks import load_tasks

KEY = "AIzaSy-test-gemini-0123456789PLANTED"


@pytest.fixture
def server_factory(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)

    def make(**kw):
        srv = FakeGeminiLiveServer(KEY, tmp_path / "tls", **kw)
        monkeypatch.setenv("SSL_CERT_FILE", str(srv.cert))  # trust the fake server's certificate
        return srv

    return make


def test_session_has_the_documented_shape(tmp_path, server_factory):
    stim = make_stimuli(tmp_path, 1, langs=("zh",))
    s = stim.iloc[0]
    prompt = load_tasks()["summarize"].prompt("zh")
    req = S2SRequest(s.stimulus_id, "zh", "zh", "summarize", prompt, str(tmp_path / s.path), s.sha256, 1)
    with server_factory() as server:
        system = build_system(
            "gemini_live",
            {"model": "gemini-2.5-flash-native-audio", "base_url": server.base_url, "timeout_s": 10},
            root=tmp_path,
        )
        resp = system.respond(req)
    session = server.sessions[0]
    setup = session.setup
    assert setup["model"] == "models/gemini-2.5-flash-native-audio"
    assert setup["generationConfig"]["responseModalities"] == ["AUDIO"]
    assert setup["generationConfig"]["speechConfig"]["voice_config"]["prebuilt_voice_config"]["voice_name"] == "Kore"
    assert setup["systemInstruction"]["parts"][0]["text"] == prompt
    assert "outputAudioTranscription" in setup
    assert setup["realtimeInputConfig"]["automatic_activity_detection"]["disabled"] is True
    assert session.mime_types == {"audio/pcm;rate=16000"}
    assert session.fingerprint == pcm_fingerprint(tmp_path / s.path)  # the whole passage, in one turn
    assert resp.status == "ok" and resp.transcript == f"reply to {session.fingerprint[:12]}"
    assert resp.sample_rate == 24000 and resp.audio.size == 9600  # both audio chunks, joined
    assert resp.provenance["voice"] == "Kore"
    # the usage per modality, as the Live API reported it, read by kind
    counts = tokens(resp.provenance["usage"])
    seconds = sf.info(str(tmp_path / s.path)).duration
    assert counts["input_audio"] == math.ceil(32 * seconds) and counts["input_text"] == 12
    assert counts["output_audio"] == math.ceil(32 * 0.4) and counts["output_text"] == 3
    assert counts["input"] + counts["output"] == resp.provenance["usage"]["total_token_count"]


def test_faults_end_succeeded_or_failed_none_lost_none_duplicated(tmp_path, server_factory):
    stim = make_stimuli(tmp_path, 10)
    fps = [pcm_fingerprint(tmp_path / p) for p in stim["path"]]
    plan = {
        fps[0]: ["close1011"],
        fps[1]: ["close1013", "close1011"],
        fps[2]: ["hang"],
        fps[3]: ["close1008"],
        fps[4]: ["noaudio"],
        fps[5]: ["close1011"] * 10,
    }
    # attempts each stimulus needs; the two refused handshakes land on whichever sessions open first
    expected_attempts = {0: 2, 1: 3, 2: 2, 3: 1, 4: 1, 5: 5}
    policy = RetryPolicy(max_attempts=5, base_delay_s=0.01, max_delay_s=0.05)
    with server_factory(plan=plan, reject_handshakes=2, hang_s=3.0) as server:
        system = build_system(
            "gemini_live", {"base_url": server.base_url, "timeout_s": 2.0, "max_concurrency": 3}, root=tmp_path
        )
        table, counts = run_task(
            system,
            load_tasks()["describe"],
            stim,
            tmp_path / "out",
            ResponseCache(tmp_path / "cache"),
            1,
            tmp_path,
            policy=policy,
            progress=False,
        )
    assert sorted(table.stimulus_id) == sorted(stim.stimulus_id)
    by_id = table.set_index("stimulus_id")
    failed = {stim.stimulus_id[i] for i in (3, 4, 5)}
    assert set(table.loc[table.status == "failed", "stimulus_id"]) == failed
    assert "1008" in by_id.loc[stim.stimulus_id[3], "error"]
    assert "without audio" in by_id.loc[stim.stimulus_id[4], "error"]
    assert "1011" in by_id.loc[stim.stimulus_id[5], "error"]
    for i, n in expected_attempts.items():
        assert n <= by_id.loc[stim.stimulus_id[i], "attempts"] <= min(n + 2, 5), i
    assert by_id.loc[stim.stimulus_id[5], "attempts"] == 5  # gave up after max_attempts
    delivered = server.delivered()
    for sid, fp in zip(stim.stimulus_id, fps):
        row = by_id.loc[sid]
        if row.status == "ok":
            assert delivered[fp] == 1 and row.transcript == f"reply to {fp[:12]}"
        else:
            assert fp not in delivered
    assert server.rejected == 2  # refused handshakes were retried and cost no stimulus its answer
    assert counts["attempts"] == len(server.sessions) + server.rejected  # every attempt is accounted for
    assert server.max_in_flight <= 3
    validate_responses(table)


def test_missing_key_is_a_setup_error(tmp_path, monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(SetupError, match="GEMINI_API_KEY"):
        build_system("gemini_live", {}, root=tmp_path)

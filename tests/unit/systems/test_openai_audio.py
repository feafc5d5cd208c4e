"""OpenAI audio adapters against a local fake server speaking the real chat-completions protocol.

What users rely on: the call has the documented shape (modalities, fixed voice, the
native prompt, the stimulus as base64 WAV); under injected 429/500/timeouts/dropped
connections every request ends succeeded or recorded failed, none is lost, none is
answered twice, answers never cross between stimuli, and concurrency stays bounded.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import soundfile as sf

from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
from tests.fakes.stimuli import make_stimuli
from voicebias.cards import load_card
from voicebias.cost import tokens
from voicebias.errors import SetupError
from voicebias.systems.base import S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, run_task, validate_responses
from voicebias.tasks import load_tasks

KEY = "sk-test-openai-0123456789abcdefPLANTED"


def gpt_audio(server, monkeypatch, tmp_path, **extra):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    params = {"model": "gpt-4o-audio-preview", "voice": "alloy", "base_url": server.base_url, "timeout_s": 5.0, **extra}
    return build_system("gpt_audio", params, root=tmp_path)


def test_call_has_the_documented_shape_and_reply_is_parsed(tmp_path, monkeypatch):
    stim = make_stimuli(tmp_path, 1, langs=("es",))
    task = load_tasks()["describe"]
    s = stim.iloc[0]
    req = S2SRequest(
        stimulus_id=s.stimulus_id,
        lang="es",
        target_lang="es",
        task="describe",
        prompt=task.prompt("es"),
        audio_path=str(tmp_path / s.path),
        audio_sha256=s.sha256,
        seed=7,
    )
    with FakeOpenAIAudioServer(KEY) as server:
        system = gpt_audio(server, monkeypatch, tmp_path)
        resp = system.respond(req)
        system.close()
    body = server.log[0].body
    assert body["model"] == "gpt-4o-audio-preview" and body["modalities"] == ["text", "audio"]
    assert body["audio"] == {"voice": "alloy", "format": "wav"}
    assert body["messages"][0] == {"role": "system", "content": task.prompt("es")}
    assert body["messages"][1]["content"][0]["type"] == "input_audio"
    assert server.log[0].fingerprint == fingerprint_file(tmp_path / s.path)  # samples sent unchanged
    fp = server.log[0].fingerprint
    assert resp.status == "ok" and resp.transcript == f"reply to {fp[:12]}"
    assert resp.sample_rate == 24000 and resp.audio.size == 7200
    assert resp.provenance["model_revision"] == "gpt-4o-audio-preview-2025-06-03"
    assert resp.provenance["voice"] == "alloy" and resp.provenance["endpoint"].startswith("http://127.0.0.1:")


def test_pcm16_replies_are_decoded_to_the_samples_the_server_sent(tmp_path, monkeypatch):
    """audio_format pcm16: the API answers raw 24 kHz 16-bit samples (no header); the adapter's
    audio equals the WAV answer's samples exactly, at 24 kHz."""
    import numpy as np

    stim = make_stimuli(tmp_path, 1)
    s = stim.iloc[0]
    req = S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(tmp_path / s.path), s.sha256, 7)
    got = {}
    for fmt in ("wav", "pcm16"):
        with FakeOpenAIAudioServer(KEY) as server:
            system = gpt_audio(server, monkeypatch, tmp_path, audio_format=fmt)
            got[fmt] = system.respond(req)
            system.close()
        assert server.log[0].body["audio"]["format"] == fmt
    assert got["pcm16"].status == "ok" and got["pcm16"].sample_rate == 24000
    np.testing.assert_array_equal(got["pcm16"].audio, got["wav"].audio)
    assert got["pcm16"].audio.size == 7200  # 0.3 s: no WAV header read as samples


def test_faults_end_succeeded_or_failed_none_lost_none_duplicated(tmp_path, monkeypatch):
    stim = make_stimuli(tmp_path, 24)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    plan = {
        fps[0]: ["429"],
        fps[1]: ["429", "429"],
        fps[2]: ["500"],
        fps[3]: ["503", "500"],
        fps[4]: ["timeout"],
        fps[5]: ["drop"],
        fps[6]: ["500", "500", "500", "500"],  # never recovers within 3 attempts
        fps[7]: ["400"],
        fps[8]: ["noaudio"],
        fps[9]: ["429", "timeout"],
        fps[10]: ["500invalid"],  # a 500 that names an invalid request fails at once
    }
    expected_attempts = {0: 2, 1: 3, 2: 2, 3: 3, 4: 2, 5: 2, 6: 3, 7: 1, 8: 1, 9: 3, 10: 1}
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
    # a hung request outlasts the client's timeout; a normal reply stays far inside it even on a
    # loaded 2-core machine, so the attempt counts below do not depend on the machine's speed
    with FakeOpenAIAudioServer(KEY, plan=plan, hang_s=3.5) as server:
        system = gpt_audio(server, monkeypatch, tmp_path, timeout_s=3.0, max_concurrency=4)
        table, counts = run_task(
            system, task, stim, tmp_path / "out", cache, 1, tmp_path, policy=policy, progress=False
        )
        # none lost: one row per stimulus, each ok or failed with a reason
        assert sorted(table["stimulus_id"]) == sorted(stim["stimulus_id"])
        by_id = table.set_index("stimulus_id")
        failed = {stim.stimulus_id[i] for i in (6, 7, 8, 10)}
        assert set(table.loc[table.status == "failed", "stimulus_id"]) == failed
        assert "HTTP 500" in by_id.loc[stim.stimulus_id[6], "error"]
        assert "HTTP 400" in by_id.loc[stim.stimulus_id[7], "error"]
        assert "no audio" in by_id.loc[stim.stimulus_id[8], "error"]
        assert "can't help" in by_id.loc[stim.stimulus_id[8], "error"]  # the model's words are kept as reason
        # retries as planned (attempts counted per stimulus)
        for i, n in expected_attempts.items():
            assert by_id.loc[stim.stimulus_id[i], "attempts"] == n, i
        # none duplicated: every success delivered exactly once; answers never cross stimuli
        delivered = server.delivered()
        for sid, fp in zip(stim.stimulus_id, fps):
            row = by_id.loc[sid]
            if row.status == "ok":
                assert delivered[fp] == 1 and row.transcript == f"reply to {fp[:12]}"
            else:
                assert fp not in delivered and pd.isna(row.transcript) and pd.isna(row.output_audio)
        assert server.max_in_flight <= 4
        assert counts["calls"] == 24 and counts["failed"] == 4 and counts["cache_hits"] == 0
        assert counts["attempts"] == sum(expected_attempts.values()) + 13
        validate_responses(table)
        prov = json.loads(by_id.loc[stim.stimulus_id[0], "provenance"])
        assert prov["response_id"].startswith("chatcmpl-")
        # the usage is kept as the server sent it, token details included, and read by kind
        counts = tokens(prov["usage"])
        assert (
            prov["usage"] in server.usage_sent and counts["input"] + counts["output"] == prov["usage"]["total_tokens"]
        )
        seconds = sf.info(str(tmp_path / stim.path[0])).duration
        assert counts["input_audio"] == math.ceil(10 * seconds) and counts["output_audio"] == math.ceil(20 * 0.3)
        assert counts["output_text"] == 3  # "reply to <fingerprint>"
        assert by_id.loc[stim.stimulus_id[0], "model_revision"] == "gpt-4o-audio-preview-2025-06-03"

        # a re-run calls only what failed; finished calls come from the cache
        server.wait_idle()  # the hung requests of the first run are logged before the re-run starts
        n_before = len(server.log)
        table2, counts2 = run_task(
            system, task, stim, tmp_path / "out2", cache, 1, tmp_path, policy=policy, progress=False
        )
        system.close()
    assert counts2["cache_hits"] == 20 and counts2["calls"] == 4
    new = server.log[n_before:]
    assert {e.fingerprint for e in new} == {fps[6], fps[7], fps[8], fps[10]}
    assert all(v == 1 for v in server.delivered().values())
    # past the end of their plans the three failed stimuli get through
    assert (table2.status == "ok").all() and counts2["failed"] == 0


def test_missing_key_is_a_setup_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(SetupError, match="OPENAI_API_KEY"):
        build_system("gpt_audio", {"model": "gpt-4o-audio-preview"}, root=tmp_path)


def test_key_is_read_from_dotenv(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={KEY}\n")
    stim = make_stimuli(tmp_path, 1)
    task = load_tasks()["readback"]
    with FakeOpenAIAudioServer(KEY) as server:
        system = build_system("gpt_audio", {"base_url": server.base_url}, root=tmp_path)
        table, _ = run_task(
            system, task, stim, tmp_path / "o", ResponseCache(tmp_path / "c"), 1, tmp_path, progress=False
        )
    assert table.status.tolist() == ["ok"]  # the fake server rejects any other key with 401
    import os

    assert "OPENAI_API_KEY" not in os.environ  # .env is read, not copied into the environment


def test_openai_compatible_endpoint_without_key_and_without_transcript(tmp_path, monkeypatch):
    cards = tmp_path / "cards"
    cards.mkdir()
    card = load_card("gpt_audio") | {"adapter": "openai_compatible", "checkpoint": "Qwen/Qwen2.5-Omni-7B"}
    (cards / "served.yaml").write_text(json.dumps(card))
    with pytest.raises(ValueError, match="base_url"):
        build_system("served", {}, cards_dir=cards, root=tmp_path)
    stim = make_stimuli(tmp_path, 2)
    task = load_tasks()["describe"]
    with FakeOpenAIAudioServer("EMPTY", with_transcript=False) as server:
        system = build_system(
            "served", {"base_url": server.base_url, "voice": "Chelsie"}, cards_dir=cards, root=tmp_path
        )
        table, counts = run_task(
            system, task, stim, tmp_path / "o", ResponseCache(tmp_path / "c"), 1, tmp_path, progress=False
        )
    assert server.log[0].body["model"] == "Qwen/Qwen2.5-Omni-7B"
    assert server.log[0].body["audio"]["voice"] == "Chelsie"
    # audio without any text is not a usable S2S answer unless an ASR is configured: recorded, not invented
    assert (table.status == "failed").all() and table.error.str.contains("no 'asr'").all()
    assert counts["calls"] == 2

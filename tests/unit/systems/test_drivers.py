"""Each repository-based system's shipped driver, run as the product runs it (a subprocess
with the checkout as working directory and on PYTHONPATH), against a stand-in checkout laid
out like the real repository: same module paths, class names and attribute names
(tests/fakes/checkouts.py). A wrong import path, class or attribute fails here."""

from __future__ import annotations

import json
import sys

import pytest

from tests.fakes import checkouts as fake
from tests.fakes.stimuli import make_stimuli
from voicebias.errors import SetupError
from voicebias.systems.base import ContinuationRequest, S2SRequest
from voicebias.systems.catalog import build_system

BASE = {"python": sys.executable, "startup_timeout_s": 120, "timeout_s": 120, "device": "cpu"}


def _stimulus(tmp_path, seconds=0.25):
    return make_stimuli(tmp_path, 1, seconds=seconds).iloc[0]


def _s2s(system, tmp_path, prompt="Answer the speaker."):
    s = _stimulus(tmp_path)
    try:
        return system.call(
            S2SRequest(s.stimulus_id, "en", "en", "describe", prompt, str(tmp_path / s.path), s.sha256, 1)
        )
    finally:
        system.close()


def _continue(system, tmp_path, seconds=6.0, prompt_s=0.25):
    s = _stimulus(tmp_path, prompt_s)
    try:
        return system.call(
            ContinuationRequest(
                s.stimulus_id, "en", "continue", str(tmp_path / s.path), s.sha256, 1, continuation_s=seconds
            )
        )
    finally:
        system.close()


def test_glm4_voice_decodes_with_the_matcha_submodule_on_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    fake.glm4_voice_checkout(tmp_path / "external" / "GLM-4-Voice")
    fake.glm4_voice_weights(tmp_path / "models" / "weights" / "glm-4-voice")
    system = build_system("glm4_voice", {**BASE, "max_new_tokens": 25}, root=tmp_path)
    resp = _s2s(system, tmp_path)
    assert resp.status == "ok", resp.error
    assert resp.sample_rate == 22050
    assert resp.audio.size == int(25 / 12.5 * 22050)  # every new token was an audio token


def test_glm4_voice_interleave_prompt_is_upstreams_text():
    """THUDM/GLM-4-Voice web_demo.py (eb00ce9), audio input: the system prompt, verbatim."""
    import runpy

    from voicebias.systems.repository import DRIVERS

    sys.path.insert(0, str(DRIVERS))
    try:
        ns = runpy.run_path(str(DRIVERS / "glm4_voice_driver.py"), run_name="voicebias_test")
    finally:
        sys.path.remove(str(DRIVERS))
    assert ns["INTERLEAVE"] == (
        "User will provide you with a speech instruction. Do it step by step. First, think "
        "about the instruction and respond in a interleaved manner, with 13 text token "
        "followed by 26 audio tokens. "
    )


def test_glm4_voice_without_its_submodule_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    fake.glm4_voice_checkout(tmp_path / "external" / "GLM-4-Voice", submodule=False)
    fake.glm4_voice_weights(tmp_path / "models" / "weights" / "glm-4-voice")
    system = build_system("glm4_voice", {**BASE, "max_new_tokens": 25}, root=tmp_path)
    with pytest.raises(SetupError, match=r"third_party/Matcha-TTS is empty.*git submodule update --init"):
        _s2s(system, tmp_path)


@pytest.mark.parametrize("variant,rate", [("spirit-lm-base-7b", 24.99), ("spirit-lm-expressive-7b", 38.49)])
def test_spiritlm_token_budget_follows_the_variant(tmp_path, variant, rate):
    """The expressive model interleaves pitch (12.5/s) and style (1/s) units with the HuBERT
    units (24.99/s): its budget per second of speech is larger, so both variants' continuations
    last the protocol's length."""
    fake.spiritlm_checkout(tmp_path / "external" / "spiritlm")
    fake.spiritlm_weights(tmp_path / "models" / "weights" / "spiritlm")
    name = "spiritlm_base" if "base" in variant else "spiritlm_expressive"
    system = build_system(name, {**BASE, "variant": variant}, root=tmp_path)
    resp = _continue(system, tmp_path, seconds=6.0)
    assert resp.status == "ok", resp.error
    assert resp.sample_rate == 16000
    assert abs(resp.audio.size / 16000 - 6.0) < 0.05, resp.audio.size / 16000
    assert resp.transcript is None


def test_spiritlm_text_stream_returns_the_models_text(tmp_path):
    fake.spiritlm_checkout(tmp_path / "external" / "spiritlm")
    fake.spiritlm_weights(tmp_path / "models" / "weights" / "spiritlm")
    system = build_system("spiritlm_base", {**BASE, "text_stream": True}, root=tmp_path)
    resp = _continue(system, tmp_path)
    assert resp.status == "ok" and resp.transcript == "and then she left"


def test_kimi_audio_loads_with_the_speech_tokenizer_in_the_checkout(tmp_path):
    fake.kimi_checkout(tmp_path / "external" / "Kimi-Audio")
    fake.kimi_weights(tmp_path / "models" / "weights" / "Kimi-Audio-7B-Instruct")
    resp = _s2s(build_system("kimi_audio", BASE, root=tmp_path), tmp_path, prompt="say it")
    assert resp.status == "ok", resp.error
    assert resp.sample_rate == 24000 and resp.transcript == "heard 4000 samples; prompt: say it"


def test_kimi_audio_without_a_local_speech_tokenizer_stops_offline_with_where_to_put_it(tmp_path):
    fake.kimi_checkout(tmp_path / "external" / "Kimi-Audio", speech_tokenizer=False)
    fake.kimi_weights(tmp_path / "models" / "weights" / "Kimi-Audio-7B-Instruct")
    system = build_system("kimi_audio", BASE, root=tmp_path)
    with pytest.raises(
        SetupError, match=r"THUDM/glm-4-voice-tokenizer.*external/Kimi-Audio/THUDM/glm-4-voice-tokenizer"
    ):
        _s2s(system, tmp_path)


def test_step_audio2_uses_upstreams_speech_to_speech_settings(tmp_path):
    fake.step_audio2_checkout(tmp_path / "external" / "Step-Audio2")
    fake.step_audio2_weights(tmp_path / "models" / "weights" / "Step-Audio-2-mini")
    resp = _s2s(build_system("step_audio2", BASE, root=tmp_path), tmp_path)
    assert resp.status == "ok", resp.error
    sent = json.loads(resp.transcript)
    # stepfun-ai/Step-Audio2 stepaudio2.py (c22bfad), speech-to-speech example
    assert sent == {
        "max_new_tokens": 4096,
        "temperature": 0.7,
        "repetition_penalty": 1.05,
        "top_p": 0.9,
        "do_sample": True,
    }
    assert resp.sample_rate == 24000 and resp.audio.size == int(50 / 25 * 24000)  # ids >= 6561 dropped


def test_speechgpt_driver_continues_through_the_inference_class(tmp_path):
    fake.speechgpt_checkout(tmp_path / "external" / "SpeechGPT")
    fake.speechgpt_weights(tmp_path / "models" / "weights" / "SpeechGPT")
    resp = _continue(build_system("speechgpt", BASE, root=tmp_path), tmp_path)
    assert resp.status == "ok", resp.error
    assert resp.sample_rate == 16000 and resp.audio.size == 2 * 4000
    assert resp.transcript == "she kept on talking"


def test_vae_gslm_driver_runs_the_repository_scripts_and_keeps_the_continuation(tmp_path):
    fake.vae_gslm_checkout(tmp_path / "external" / "vae-gslm")
    fake.vae_gslm_weights(tmp_path / "models" / "weights" / "vae-gslm")
    resp = _continue(build_system("vae_gslm", BASE, root=tmp_path), tmp_path, seconds=4.0, prompt_s=1.5)
    assert resp.status == "ok", resp.error
    assert resp.sample_rate == 16000
    assert resp.audio.size == 4 * 16000  # the re-synthesised prompt is cut off

"""TTS backends behind the registry: Azure's request against a local server speaking
the Azure TTS REST protocol, Kokoro up to its weights, and byte-identical eSpeak
stimuli across clean runs."""

from __future__ import annotations

import importlib.util
import io
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from voicebias import config
from voicebias.audio import read_audio, rms_dbfs, sha256_file
from voicebias.params import load_params
from voicebias.stimuli.bank import load_bank
from voicebias.stimuli.passages import render_utterance, synthesize_stimuli, validate_manifest
from voicebias.tts import REGISTRY, get_backend
from voicebias.validation import ValidationFailed

KEY = "test-key-123"
SSML_NS = "{http://www.w3.org/2001/10/synthesis}"
AZURE_VOICES = {
    "en-US-JennyNeural": 220.0,
    "en-US-GuyNeural": 110.0,
    "es-ES-ElviraNeural": 230.0,
    "es-ES-AlvaroNeural": 115.0,
    "zh-CN-XiaoxiaoNeural": 240.0,
    "zh-CN-YunxiNeural": 120.0,
}


class FakeAzure(BaseHTTPRequestHandler):
    """POST /cognitiveservices/v1 as the Azure TTS REST service answers it: key header,
    SSML body, RIFF 24 kHz 16-bit mono PCM back; 401/415/400/429 like the service."""

    requests: list[dict] = []
    throttle_next = 0

    def log_message(self, *args):
        pass

    def _reply(self, code, body=b"", ctype="text/plain", headers=None):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        FakeAzure.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path != "/cognitiveservices/v1":
            return self._reply(404)
        if self.headers.get("Ocp-Apim-Subscription-Key") != KEY:
            return self._reply(401, b"Unauthorized")
        if self.headers.get("Content-Type") != "application/ssml+xml":
            return self._reply(415)
        if FakeAzure.throttle_next > 0:
            FakeAzure.throttle_next -= 1
            return self._reply(429, b"Too many requests", headers={"Retry-After": "0"})
        try:
            voice = ET.fromstring(body).find(f"{SSML_NS}voice").get("name")
        except (ET.ParseError, AttributeError):
            return self._reply(400, b"invalid SSML")
        if voice not in AZURE_VOICES or self.headers.get("X-Microsoft-OutputFormat") != "riff-24khz-16bit-mono-pcm":
            return self._reply(400, b"unsupported voice or format")
        t = np.arange(int(24000 * 1.5)) / 24000
        buf = io.BytesIO()
        sf.write(buf, 0.3 * np.sin(2 * np.pi * AZURE_VOICES[voice] * t), 24000, subtype="PCM_16", format="WAV")
        self._reply(200, buf.getvalue(), "audio/x-wav")


@pytest.fixture()
def azure(monkeypatch, tmp_path):
    FakeAzure.requests = []
    FakeAzure.throttle_next = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAzure)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AZURE_SPEECH_KEY", KEY)
    monkeypatch.setenv("AZURE_SPEECH_REGION", "westeurope")
    monkeypatch.setenv("AZURE_SPEECH_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}/cognitiveservices/v1")
    yield {"cache_dir": str(tmp_path / "azure-cache"), "retry_wait_s": 0.0}
    server.shutdown()
    server.server_close()


def test_registry_lists_all_three_backends():
    assert {"espeak", "kokoro", "azure"} <= set(REGISTRY)


def test_azure_request_carries_key_format_and_ssml(azure):
    tts = get_backend("azure", **azure)
    x, sr = tts.synthesize("Fish & chips <at> 5 o'clock", "en-US-JennyNeural")
    assert sr == 24000 and x.dtype == np.float32 and len(x) == 36000
    (req,) = FakeAzure.requests
    assert req["path"] == "/cognitiveservices/v1"
    h = req["headers"]
    assert h["Ocp-Apim-Subscription-Key"] == KEY and h["Content-Type"] == "application/ssml+xml"
    assert h["X-Microsoft-OutputFormat"] == "riff-24khz-16bit-mono-pcm"
    root = ET.fromstring(req["body"])
    assert root.tag == f"{SSML_NS}speak" and root.get("{http://www.w3.org/XML/1998/namespace}lang") == "en-US"
    voice = root.find(f"{SSML_NS}voice")
    assert voice.get("name") == "en-US-JennyNeural"
    assert voice.text == "Fish & chips <at> 5 o'clock"  # escaped on the wire, intact after parsing


def test_azure_default_endpoint_is_the_regional_rest_url(monkeypatch):
    monkeypatch.setenv("AZURE_SPEECH_KEY", KEY)
    monkeypatch.setenv("AZURE_SPEECH_REGION", "swedencentral")
    monkeypatch.delenv("AZURE_SPEECH_ENDPOINT", raising=False)
    tts = get_backend("azure")
    assert tts.endpoint == "https://swedencentral.tts.speech.microsoft.com/cognitiveservices/v1"


def test_azure_caches_responses_so_reruns_are_identical(azure):
    tts = get_backend("azure", **azure)
    a, _ = tts.synthesize("Hola, ¿qué tal?", "es-ES-ElviraNeural")
    b, _ = get_backend("azure", **azure).synthesize("Hola, ¿qué tal?", "es-ES-ElviraNeural")
    assert len(FakeAzure.requests) == 1 and np.array_equal(a, b)


def test_azure_retries_when_throttled(azure):
    FakeAzure.throttle_next = 2
    x, _ = get_backend("azure", **azure).synthesize("你好", "zh-CN-XiaoxiaoNeural")
    assert len(FakeAzure.requests) == 3 and x.size > 0


def test_azure_missing_key_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr("voicebias.secrets._default_root", lambda: tmp_path)  # no .env there
    monkeypatch.delenv("AZURE_SPEECH_KEY", raising=False)
    with pytest.raises(RuntimeError, match="AZURE_SPEECH_KEY"):
        get_backend("azure")
    monkeypatch.setenv("AZURE_SPEECH_KEY", KEY)
    monkeypatch.delenv("AZURE_SPEECH_REGION", raising=False)
    monkeypatch.delenv("AZURE_SPEECH_ENDPOINT", raising=False)
    with pytest.raises(RuntimeError, match="AZURE_SPEECH_REGION"):
        get_backend("azure")


def test_azure_wrong_key_and_bad_voice_say_so(azure, monkeypatch):
    with pytest.raises(RuntimeError, match="rejected the request for voice 'en-US-NobodyNeural' \\(400\\)"):
        get_backend("azure", **azure).synthesize("Hello.", "en-US-NobodyNeural")
    with pytest.raises(ValueError, match="not an Azure neural voice"):
        get_backend("azure", **azure).synthesize("Hello.", "en-us+f3")
    monkeypatch.setenv("AZURE_SPEECH_KEY", "wrong")
    with pytest.raises(RuntimeError, match="rejected the key \\(401\\)"):
        get_backend("azure", **azure).synthesize("Hello.", "en-US-GuyNeural")


def test_stimuli_stage_runs_on_azure_voices(azure, tmp_path):
    bank = load_bank(config.BANK_DIR)
    passages = bank.groupby("lang").head(1)
    params = {
        "backend": "azure",
        "sample_rate": 16000,
        "target_rms_dbfs": -23.0,
        "rate_wpm": 160,
        "options": azure,
        "voices": {
            "en": {"male": "en-US-GuyNeural", "female": "en-US-JennyNeural"},
            "es": {"male": "es-ES-AlvaroNeural", "female": "es-ES-ElviraNeural"},
            "zh": {"male": "zh-CN-YunxiNeural", "female": "zh-CN-XiaoxiaoNeural"},
        },
    }
    manifest = synthesize_stimuli(passages, params, tmp_path / "audio", tmp_path)
    validate_manifest(manifest, 16000)
    assert len(manifest) == 6 and set(manifest["backend"]) == {"azure"}
    assert manifest["duration_s"].eq(1.5).all()
    x, sr = read_audio(tmp_path / manifest["path"].iloc[0])
    assert sr == 16000 and abs(rms_dbfs(x) + 23.0) < 0.1


# ------------------------------------------------------------------ Kokoro


def test_kokoro_without_weights_names_the_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        get_backend("kokoro", weights=str(tmp_path / "Kokoro-82M"))
    msg = str(err.value)
    assert "config.json" in msg and "kokoro-v1_0.pth" in msg and "hexgrad/Kokoro-82M" in msg and "dvc pull" in msg


@pytest.fixture()
def kokoro_folder(tmp_path):
    folder = tmp_path / "Kokoro-82M"
    (folder / "voices").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "kokoro-v1_0.pth").write_bytes(b"")
    (folder / "voices" / "ef_dora.pt").write_bytes(b"")
    return folder


def test_kokoro_missing_voice_file_is_named(kokoro_folder):
    tts = get_backend("kokoro", weights=str(kokoro_folder))
    with pytest.raises(FileNotFoundError, match="voices/zm_yunxi.pt"):
        tts.synthesize("你好。", "zm_yunxi")


def test_kokoro_voice_names_give_language_and_gender(kokoro_folder):
    from voicebias.tts.kokoro import parse_voice

    assert parse_voice("af_heart") == ("a", "female") and parse_voice("em_alex") == ("e", "male")
    assert parse_voice("zf_xiaobei") == ("z", "female")
    with pytest.raises(ValueError, match="not a Kokoro voice"):
        parse_voice("en-us+f3")


def test_kokoro_voice_in_the_wrong_gender_slot_stops_before_synthesis(kokoro_folder, tmp_path):
    bank = load_bank(config.BANK_DIR, ["es"]).head(1)
    params = {
        "backend": "kokoro",
        "sample_rate": 16000,
        "target_rms_dbfs": -23.0,
        "rate_wpm": 160,
        "options": {"weights": str(kokoro_folder)},
        "voices": {"es": {"male": "ef_dora", "female": "em_alex"}},
    }
    with pytest.raises(ValueError, match="'ef_dora' is a female kokoro voice, configured as male"):
        synthesize_stimuli(bank, params, tmp_path / "audio", tmp_path)
    assert not list((tmp_path / "audio").glob("*.flac"))


@pytest.mark.skipif(importlib.util.find_spec("kokoro") is not None, reason="kokoro installed: real synthesis path")
def test_kokoro_without_package_says_what_to_install(kokoro_folder):
    tts = get_backend("kokoro", weights=str(kokoro_folder))
    with pytest.raises(RuntimeError, match="pip install kokoro"):
        tts.synthesize("Hola.", "ef_dora")


# ------------------------------------------------------------------ eSpeak, byte-identical


def test_two_clean_runs_give_byte_identical_audio(tmp_path):
    params = load_params(config.ROOT / "profiles" / "embedded.yaml")["tts"]
    bank = load_bank(config.BANK_DIR)
    passages = bank.groupby("lang").head(1)
    first = synthesize_stimuli(passages, params, tmp_path / "a", tmp_path)
    # the second run synthesises in the opposite order after an unrelated utterance
    espeak = get_backend("espeak", rate_wpm=params["rate_wpm"])
    render_utterance(
        espeak, "Something else entirely, to disturb any state.", "es+f3", tmp_path / "x.flac", 16000, -23.0
    )
    second = synthesize_stimuli(passages.iloc[::-1], params, tmp_path / "b", tmp_path)
    a = first.set_index("stimulus_id")["sha256"]
    b = second.set_index("stimulus_id")["sha256"].reindex(a.index)
    assert len(a) == 6 and a.equals(b)
    for sid in a.index:
        assert sha256_file(tmp_path / "a" / f"{sid}.flac") == sha256_file(tmp_path / "b" / f"{sid}.flac")


def test_stimuli_are_resampled_and_loudness_normalised(tmp_path):
    params = load_params(config.ROOT / "profiles" / "embedded.yaml")["tts"]
    passages = load_bank(config.BANK_DIR, ["zh"]).head(1)
    manifest = synthesize_stimuli(passages, params, tmp_path / "audio", tmp_path)
    validate_manifest(manifest, params["sample_rate"])
    for rel in manifest["path"]:
        info = sf.info(str(tmp_path / rel))
        assert info.samplerate == params["sample_rate"] and info.channels == 1 and info.subtype == "PCM_16"
        x, _ = read_audio(tmp_path / rel)
        assert abs(rms_dbfs(x) - params["target_rms_dbfs"]) < 0.1
    broken = manifest.assign(sample_rate=22050)
    with pytest.raises(ValidationFailed, match="sample_rate"):
        validate_manifest(broken, params["sample_rate"])
    with pytest.raises(ValidationFailed, match="pole"):
        validate_manifest(manifest.assign(pole="androgynous"), params["sample_rate"])
    assert isinstance(manifest, pd.DataFrame)


def test_espeak_helper_process_gives_the_samples_of_a_child_of_this_process():
    from voicebias.tts import espeak

    cases = [
        ("When I think about the weekend, the first thing that comes to mind is", "en-us+m3"),
        ("Hola, ¿qué tal estás hoy?", "es+f3"),
        ("我今天很高兴", "cmn-latn-pinyin+f5"),
        ("When I think about the weekend, the first thing that comes to mind is", "en-us+Andrea"),
    ]
    for text, voice in cases:
        status, rate, pcm = espeak._Forker.get().synthesize(text, voice, 130)
        ref_status, ref_rate, ref_pcm = espeak._synthesize_fresh(text, voice, 130)
        assert (status, rate) == (ref_status, ref_rate) == (0, 22050)
        assert pcm.size > 0 and pcm.tobytes() == ref_pcm.tobytes()
    with pytest.raises(ValueError, match="no voice 'xx-none'"):
        get_backend("espeak").synthesize("hello", "xx-none")


def test_a_forked_process_starts_its_own_espeak_helper():
    from voicebias.parallel import map_processes
    from voicebias.tts import espeak

    tts = get_backend("espeak", rate_wpm=130)
    here = tts.synthesize("Something to say.", "en-us+m3")[0]
    parent_helper = espeak._Forker.get().proc.pid
    got = map_processes(
        lambda _: (tts.synthesize("Something to say.", "en-us+m3")[0].tobytes(), espeak._Forker.get().proc.pid),
        range(4),
        workers=2,
    )
    assert {x for x, _ in got} == {here.tobytes()}
    assert parent_helper not in {pid for _, pid in got}


def test_stimuli_on_every_core_equal_one_by_one(tmp_path, monkeypatch):
    from voicebias.tts.espeak import EspeakTTS

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")["tts"]
    passages = load_bank(config.BANK_DIR).groupby("lang").head(2)
    parallel = synthesize_stimuli(passages, params, tmp_path / "p" / "audio", tmp_path / "p")
    monkeypatch.setattr(EspeakTTS, "processes", False)
    serial = synthesize_stimuli(passages, params, tmp_path / "s" / "audio", tmp_path / "s")
    assert len(serial) == 12
    pd.testing.assert_frame_equal(parallel, serial)
    for rel in serial["path"]:
        assert (tmp_path / "p" / rel).read_bytes() == (tmp_path / "s" / rel).read_bytes()


def test_a_failing_utterance_raises_its_own_error_on_every_core(tmp_path, monkeypatch):
    from voicebias.audio import AudioError
    from voicebias.tts.espeak import EspeakTTS

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")["tts"]
    passages = load_bank(config.BANK_DIR).groupby("lang").head(2)
    real = EspeakTTS.synthesize

    def silent_for_spanish(self, text, voice):
        x, sr = real(self, text, voice)
        return (x * 0 if voice.startswith("es") else x), sr

    monkeypatch.setattr(EspeakTTS, "synthesize", silent_for_spanish)
    for processes in (True, False):
        monkeypatch.setattr(EspeakTTS, "processes", processes)
        with pytest.raises(AudioError, match="silent") as err:
            synthesize_stimuli(passages, params, tmp_path / str(processes), tmp_path)
        assert err.value.code == "silent"


def test_an_utterance_said_again_is_not_synthesised_again(monkeypatch):
    from voicebias.tts import espeak

    calls = []
    real = espeak._Forker.synthesize

    def counting(self, text, voice, rate_wpm):
        calls.append((text, voice, rate_wpm))
        return real(self, text, voice, rate_wpm)

    monkeypatch.setattr(espeak._Forker, "synthesize", counting)
    monkeypatch.setattr(espeak, "_RECENT", espeak.OrderedDict())
    tts = get_backend("espeak", rate_wpm=130)
    a, sr = tts.synthesize("Thinking about the garden, I decided to act.", "en-us+f3")
    a[:100] = 0.5  # a caller changing its copy changes nothing kept
    b, _ = tts.synthesize("Thinking about the garden, I decided to act.", "en-us+f3")
    c, _ = get_backend("espeak", rate_wpm=160).synthesize("Thinking about the garden, I decided to act.", "en-us+f3")
    assert len(calls) == 2 and calls[1][2] == 160
    status, rate, pcm = espeak._synthesize_fresh("Thinking about the garden, I decided to act.", "en-us+f3", 130)
    assert sr == rate and b.tobytes() == (pcm.astype(np.float32) / 32768.0).tobytes() and b.size != c.size
    for _ in range(espeak._RECENT_KEPT + 2):
        with pytest.raises(ValueError, match="no voice"):
            tts.synthesize("hello", "xx-none")  # failures are not kept
    assert len(espeak._RECENT) == 2

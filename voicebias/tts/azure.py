"""Azure neural text-to-speech over its REST API (the papers' voices).

One POST per utterance to https://<region>.tts.speech.microsoft.com/cognitiveservices/v1
with an SSML body naming the voice, the subscription key in the
`Ocp-Apim-Subscription-Key` header and the audio format in `X-Microsoft-OutputFormat`.
The key and region come from the environment (AZURE_SPEECH_KEY, AZURE_SPEECH_REGION,
or a .env file at the repository root), never from params.

The service does not promise identical samples for identical requests, so every
response is cached on disk under a hash of (endpoint-independent) request content:
a re-run reads the cached bytes and is byte-identical, and no utterance is paid twice.
"""

from __future__ import annotations

import hashlib
import io
import re
import time
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np
import soundfile as sf

from voicebias.cache import atomic_write_bytes
from voicebias.clients.retry import post_with_retries
from voicebias.errors import ConfigError, VoicebiasError
from voicebias.secrets import read_secret
from voicebias.tts import TTSBackend

KEY_ENV = "AZURE_SPEECH_KEY"
REGION_ENV = "AZURE_SPEECH_REGION"
ENDPOINT_ENV = "AZURE_SPEECH_ENDPOINT"
DEFAULT_FORMAT = "riff-24khz-16bit-mono-pcm"
_PCM_FORMAT = re.compile(r"^(riff|raw)-(\d+)khz-16bit-mono-pcm$")
_VOICE = re.compile(r"^([a-z]{2,3}-[A-Z]{2})-\w+$")


class AzureTTSError(VoicebiasError, RuntimeError):
    """The Azure service refused or failed a request; the message says why in plain words."""


def voice_locale(voice: str) -> str:
    """'en-US-JennyNeural' -> 'en-US' (the xml:lang the SSML must carry)."""
    m = _VOICE.match(voice)
    if not m:
        raise ConfigError(f"'{voice}' is not an Azure neural voice name like 'en-US-JennyNeural'")
    return m.group(1)


def build_ssml(text: str, voice: str) -> str:
    """SSML for one utterance: the text, escaped, read by one named voice."""
    lang = voice_locale(voice)
    return (
        f"<speak version='1.0' xmlns='http://www.w3.org/2001/10/synthesis' xml:lang={quoteattr(lang)}>"
        f"<voice name={quoteattr(voice)}>{escape(text.strip())}</voice></speak>"
    )


class AzureTTS(TTSBackend):
    """Azure neural voices ('en-US-JennyNeural', 'es-ES-AlvaroNeural', 'zh-CN-XiaoxiaoNeural', ...).

    Options: output_format (16-bit mono PCM, RIFF or raw; default 24 kHz RIFF),
    endpoint (overrides the regional URL; also $AZURE_SPEECH_ENDPOINT), cache_dir,
    timeout_s, max_retries (on 429 and 5xx, honouring Retry-After).
    rate_wpm is accepted for a uniform interface and not used: the voices speak at
    their own rate, as in the papers.
    """

    name = "azure"

    def __init__(
        self,
        rate_wpm: int | None = None,
        output_format: str = DEFAULT_FORMAT,
        endpoint: str | None = None,
        cache_dir: str | Path | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        retry_wait_s: float = 2.0,
    ):
        self.key = read_secret(KEY_ENV) or ""
        if not self.key:
            raise AzureTTSError(
                f"Azure TTS needs a subscription key: set {KEY_ENV} (and {REGION_ENV}) in the environment or in .env"
            )
        endpoint = endpoint or read_secret(ENDPOINT_ENV)
        region = self.region = read_secret(REGION_ENV) or ""
        if not endpoint:
            if not region:
                raise AzureTTSError(f"Azure TTS needs the resource's region: set {REGION_ENV} (e.g. 'westeurope')")
            endpoint = f"https://{region}.tts.speech.microsoft.com/cognitiveservices/v1"
        self.endpoint = endpoint
        m = _PCM_FORMAT.match(output_format)
        if not m:
            raise ConfigError(
                f"output_format '{output_format}' is not a 16-bit mono PCM format "
                "(e.g. riff-24khz-16bit-mono-pcm, raw-16khz-16bit-mono-pcm)"
            )
        self.output_format = output_format
        self._container, self._rate = m.group(1), int(m.group(2)) * 1000
        from voicebias.config import CACHE_DIR

        self.cache_dir = Path(cache_dir) if cache_dir else CACHE_DIR / "tts" / "azure"
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.retry_wait_s = float(retry_wait_s)
        self.sleep = time.sleep  # the wait between tries (voicebias.clients.retry)

    def request(self, text: str, voice: str) -> tuple[dict[str, str], bytes]:
        """The headers and SSML body of the POST for one utterance."""
        headers = {
            "Ocp-Apim-Subscription-Key": self.key,
            "Content-Type": "application/ssml+xml",
            "X-Microsoft-OutputFormat": self.output_format,
            "User-Agent": "voicebias",
        }
        return headers, build_ssml(text, voice).encode("utf-8")

    def _cache_path(self, body: bytes) -> Path:
        digest = hashlib.sha256(self.output_format.encode() + b"\n" + body).hexdigest()
        return self.cache_dir / digest[:2] / f"{digest}.bin"

    def _post(self, headers: dict[str, str], body: bytes, voice: str) -> bytes:
        import requests

        try:
            r = post_with_retries(
                self.endpoint,
                headers=headers,
                data=body,
                timeout_s=self.timeout_s,
                max_retries=self.max_retries,
                base_s=self.retry_wait_s,
                sleep=self.sleep,
            )
        except requests.RequestException as exc:
            raise AzureTTSError(f"Azure TTS unreachable at {self.endpoint}: {exc}") from exc
        if r.status_code == 200:
            if not r.content:
                raise AzureTTSError(f"Azure TTS returned no audio for voice '{voice}'")
            return r.content
        detail = r.text.strip()[:300]
        if r.status_code in (401, 403):
            raise AzureTTSError(
                f"Azure TTS rejected the key ({r.status_code}): check {KEY_ENV} and that the "
                f"resource lives in region '{self.region or '?'}'"
            )
        if r.status_code == 400:
            raise AzureTTSError(f"Azure TTS rejected the request for voice '{voice}' (400): {detail or 'bad SSML'}")
        raise AzureTTSError(f"Azure TTS failed for voice '{voice}' ({r.status_code}): {detail}")

    def _decode(self, audio: bytes) -> tuple[np.ndarray, int]:
        if self._container == "raw":
            pcm = np.frombuffer(audio[: len(audio) // 2 * 2], dtype="<i2")
            return pcm.astype(np.float32) / 32768.0, self._rate
        try:
            x, sr = sf.read(io.BytesIO(audio), dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError) as exc:
            raise AzureTTSError(f"Azure TTS answered with data that is not {self.output_format} audio") from exc
        return x.mean(axis=1), sr

    def synthesize(self, text: str, voice: str) -> tuple[np.ndarray, int]:
        if not text or not text.strip():
            raise ValueError("cannot synthesise empty text")
        headers, body = self.request(text, voice)
        cached = self._cache_path(body)
        if cached.exists():
            audio = cached.read_bytes()
        else:
            audio = self._post(headers, body, voice)
            atomic_write_bytes(cached, audio)
        x, sr = self._decode(audio)
        if x.size == 0:
            raise AzureTTSError(f"Azure TTS returned an empty waveform for voice '{voice}'")
        return x, sr

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "engine": "Azure neural TTS (REST)", "output_format": self.output_format}

"""Gemini native audio through the Live API (google-genai): fixed voice Kore, output transcription.

One Live session per stimulus: the stimulus is sent as 16 kHz PCM between an explicit activity
start and end (one turn, never cut at a pause), the reply's 24 kHz audio parts are concatenated
until the turn completes, and the transcript is the API's output transcription. Before the first
request :meth:`GeminiLiveSystem.check` looks the model up: a refused key, an unknown model or an
unreachable API stops the run. Sessions go through a one-endpoint EndpointPool for its circuit
breaker.

The session config, the params and the check: docs/systems.md, "Gemini Live".
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import numpy as np

from voicebias.audio import read_audio
from voicebias.clients.endpoints import (
    AllEndpointsDown,
    Breaker,
    Endpoint,
    EndpointPool,
    Unreachable,
    connection_reason,
)
from voicebias.clients.retry import retry_after_s
from voicebias.errors import SetupError, TransientError
from voicebias.secrets import read_secret
from voicebias.systems.base import CHECK_TIMEOUT_S, S2SRequest, S2SResponse, S2SSystem, ask_endpoints, redact

INPUT_RATE = 16000  # Hz, what the Live API takes
OUTPUT_RATE = 24000  # Hz, what it returns unless the mime type says otherwise
CHUNK_S = 0.5  # seconds of audio per realtime message
#: websocket close codes worth retrying: abnormal closure, internal error, service restart, try again later
TRANSIENT_CLOSE = {1006, 1011, 1012, 1013, 1014}
TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}


def _transport_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeouts, other failures to get an answer) of the HTTP client the SDK uses for REST calls:
    httpx, or its fork httpx2, whichever is installed."""
    import importlib

    timeouts: list[type[BaseException]] = [TimeoutError]
    failures: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        try:
            m = importlib.import_module(module)
        except ImportError:
            continue
        timeouts.append(m.TimeoutException)
        failures.append(m.TransportError)
    return tuple(timeouts), tuple(failures)


def _rate(mime: str | None) -> int:
    m = re.search(r"rate=(\d+)", mime or "")
    return int(m.group(1)) if m else OUTPUT_RATE


class GeminiLiveSystem(S2SSystem):
    """A speech-to-speech system behind the Gemini Live API."""

    #: behind an API or a server: the determinism probe re-sends some requests (run.determinism_probe)
    probed = True

    max_concurrency = 4

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise SetupError("the Gemini Live adapter needs 'google-genai' (pip install google-genai==3.3.0)") from exc
        self._types = types
        var = params.get("api_key_env") or card.get("api_key_env")
        key = (
            read_secret(var, root)
            if var
            else (read_secret("GEMINI_API_KEY", root) or read_secret("GOOGLE_API_KEY", root))
        )
        if not key:
            raise SetupError(
                f"system '{name}' needs the environment variable {var or 'GEMINI_API_KEY'} "
                "(set it in the environment or in .env at the repository root)"
            )
        self._secrets = [key]
        self.model = str(params.get("model") or card.get("checkpoint") or "")
        if not self.model:
            raise ValueError(f"system '{name}': no model name (params 'model' or the card's 'checkpoint')")
        self.timeout_s = float(params.get("timeout_s") or 120.0)
        base_url = params.get("base_url") or card.get("base_url")
        http_options = types.HttpOptions(base_url=base_url) if base_url else None
        self.client = genai.Client(api_key=key, http_options=http_options)
        self.base_url = base_url
        self._key_var = var or "GEMINI_API_KEY"
        self.pool = EndpointPool(
            [Endpoint(url=base_url, max_concurrency=self.max_concurrency)],
            name=name,
            breaker=Breaker.from_params(params),
        )

    def check(self) -> None:
        """The API answers and takes the key, and knows the model (see the module docstring)."""
        ask_endpoints(self.name, self.pool, self._check_one)

    def _check_one(self, i: int) -> None:
        from google.genai import errors as genai_errors

        t = self._types
        at = f"system '{self.name}'"
        timeouts, failures = _transport_errors()
        try:
            self.client.models.get(
                model=self.model,
                config=t.GetModelConfig(http_options=t.HttpOptions(timeout=int(CHECK_TIMEOUT_S * 1000))),
            )
        except genai_errors.ClientError as exc:
            said = redact(str(exc.message or exc.status or ""), self._secrets)
            if exc.code in (401, 403) or (exc.code == 400 and "api key" in said.lower()):
                raise SetupError(
                    f"{at}: credentials refused (looking up {self.model} answered HTTP {exc.code}: "
                    f"{said}); check the key in {self._key_var}"
                ) from None
            if exc.code == 404:
                raise SetupError(
                    f"{at}: the API knows no model {self.model!r} (HTTP 404: {said}); set params "
                    "'model' or the card's checkpoint to a model the Live API serves"
                ) from None
            # any other answer: the API is up and took the key
        except genai_errors.APIError:
            pass  # 5xx: up, if unwell; the run's retries and breaker handle it
        except timeouts:
            raise Unreachable(f"no answer within {CHECK_TIMEOUT_S:g} s") from None
        except failures as exc:
            raise Unreachable(redact(connection_reason(exc), self._secrets)) from None

    def live_config(self, request: S2SRequest) -> Any:
        t = self._types
        kwargs: dict[str, Any] = {}
        if self.params.get("temperature") is not None:
            kwargs["temperature"] = float(self.params["temperature"])
        if self.params.get("seed_in_config"):
            kwargs["seed"] = int(request.seed)
        return t.LiveConnectConfig(
            response_modalities=[t.Modality.AUDIO],
            system_instruction=request.prompt,
            speech_config=t.SpeechConfig(
                voice_config=t.VoiceConfig(
                    prebuilt_voice_config=t.PrebuiltVoiceConfig(voice_name=self.voice(request.target_lang))
                )
            ),
            output_audio_transcription=t.AudioTranscriptionConfig(),
            realtime_input_config=t.RealtimeInputConfig(
                automatic_activity_detection=t.AutomaticActivityDetection(disabled=True)
            ),
            **kwargs,
        )

    async def _session(self, request: S2SRequest, pcm: bytes) -> S2SResponse:
        t = self._types
        audio_parts: list[bytes] = []
        rate = OUTPUT_RATE
        text: list[str] = []
        prov: dict[str, Any] = {
            "model": self.model,
            "model_revision": self.model,
            "voice": self.voice(request.target_lang),
        }
        async with self.client.aio.live.connect(model=self.model, config=self.live_config(request)) as session:
            prov["session_id"] = getattr(session, "session_id", None)
            await session.send_realtime_input(activity_start=t.ActivityStart())
            step = int(INPUT_RATE * CHUNK_S) * 2
            for i in range(0, len(pcm), step):
                await session.send_realtime_input(
                    audio=t.Blob(data=pcm[i : i + step], mime_type=f"audio/pcm;rate={INPUT_RATE}")
                )
            await session.send_realtime_input(activity_end=t.ActivityEnd())
            complete = False
            while not complete:
                got = False
                async for msg in session.receive():
                    got = True
                    sc = msg.server_content
                    if msg.go_away is not None:
                        raise TransientError("the Live server is going away (GoAway)")
                    if sc is None:
                        continue
                    if sc.model_turn and sc.model_turn.parts:
                        for part in sc.model_turn.parts:
                            if part.inline_data and part.inline_data.data:
                                audio_parts.append(part.inline_data.data)
                                rate = _rate(part.inline_data.mime_type)
                    if sc.output_transcription and sc.output_transcription.text:
                        text.append(sc.output_transcription.text)
                    if sc.interrupted:
                        return S2SResponse.failed("the Live session reported the turn as interrupted", **prov)
                    if sc.turn_complete:
                        complete = True
                if not got and not complete:
                    raise TransientError("the Live session ended before the turn completed")
            usage = getattr(msg, "usage_metadata", None)
            if usage is not None:
                # as the server sent it, tokens per modality included (voicebias.cost reads it)
                prov["usage"] = (
                    usage.model_dump(mode="json", exclude_none=True) if hasattr(usage, "model_dump") else usage
                )
        if not audio_parts:
            said = "".join(text).strip()
            return S2SResponse.failed(
                "the turn completed without audio" + (f"; transcript: {said[:300]}" if said else ""), **prov
            )
        raw = b"".join(audio_parts)
        audio = np.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
        transcript = "".join(text).strip() or None
        return S2SResponse(status="ok", transcript=transcript, audio=audio, sample_rate=rate, provenance=prov)

    def respond(self, request: S2SRequest) -> S2SResponse:
        x, _ = read_audio(request.audio_path, target_sr=INPUT_RATE)
        pcm = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        try:
            _, response = self.pool.call(lambda i: self._once(request, pcm))
        except AllEndpointsDown as exc:
            raise TransientError(str(exc), retry_after_s=exc.retry_after_s) from exc
        return response

    def _once(self, request: S2SRequest, pcm: bytes) -> S2SResponse:
        """One session: a timeout or a failed connection raises Unreachable (it counts towards the breaker)."""
        from google.genai import errors as genai_errors
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        async def bounded() -> S2SResponse:
            return await asyncio.wait_for(self._session(request, pcm), timeout=self.timeout_s)

        try:
            return asyncio.run(bounded())  # one event loop per call: each worker thread runs its own
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise Unreachable(f"timeout after {self.timeout_s:g} s") from exc
        except InvalidStatus as exc:
            status = exc.response.status_code
            msg = redact(f"HTTP {status} at the websocket handshake", self._secrets)
            if status in TRANSIENT_HTTP:
                raise TransientError(msg, retry_after_s=retry_after_s(exc.response.headers)) from exc
            raise RuntimeError(msg) from None
        except genai_errors.APIError as exc:
            msg = redact(f"Live API error {exc.code}: {exc.message or exc.status or ''}".strip(), self._secrets)
            if exc.code in TRANSIENT_CLOSE or exc.code in TRANSIENT_HTTP:
                raise TransientError(msg) from exc
            raise RuntimeError(msg) from None
        except ConnectionClosed as exc:
            raise TransientError(redact(f"connection closed: {exc}", self._secrets)) from exc
        except OSError as exc:
            raise Unreachable(redact(connection_reason(exc), self._secrets)) from exc

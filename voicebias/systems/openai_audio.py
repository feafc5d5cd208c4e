"""OpenAI audio chat completions (gpt-4o-audio-preview, gpt-audio): audio in, audio + transcript out.

One call per stimulus: the stimulus as base64 WAV (samples unchanged), the task prompt as the
system message (`prompt_role: user` puts it in the user turn); the reply's `message.audio` gives
the output audio and the model's transcript. Calls go through an EndpointPool (one endpoint or
several, each with a circuit breaker), and before the first request :meth:`OpenAIAudioSystem.check`
asks every endpoint ``GET /models`` with the key: refused credentials stop the run. The key is read
from the environment or .env and never stored, logged or echoed.

The request, the params and the checks: docs/systems.md, "OpenAI audio chat completions".
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import numpy as np

from voicebias.audio import read_audio, wav_bytes
from voicebias.clients.endpoints import (
    AllEndpointsDown,
    Breaker,
    EndpointPool,
    Unreachable,
    connection_reason,
    resolve_endpoints,
    safe_url,
)
from voicebias.clients.retry import names_invalid_request, retry_after_s
from voicebias.errors import SetupError, TransientError
from voicebias.secrets import require_secret
from voicebias.systems.base import CHECK_TIMEOUT_S, S2SRequest, S2SResponse, S2SSystem, ask_endpoints, redact

#: HTTP statuses worth retrying: timeout, conflict, rate limit, server errors
TRANSIENT_STATUS = {408, 409, 429}
PCM16_RATE = 24000  # the API's raw pcm16 output rate (Hz)


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SetupError("the OpenAI adapters need the 'openai' package (pip install openai==3.51.0)") from exc
    return openai


def decode_audio(data_b64: str, audio_format: str) -> tuple[np.ndarray, int]:
    """Decode the reply's base64 audio to mono float32 and its rate (Hz)."""
    raw = base64.b64decode(data_b64)
    if not raw:
        raise ValueError("the reply's audio is empty")
    if audio_format == "pcm16":
        return (np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0), PCM16_RATE
    import soundfile as sf

    x, sr = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    return x.mean(axis=1), int(sr)


class OpenAIAudioSystem(S2SSystem):
    """A speech-to-speech system behind the OpenAI chat-completions audio API."""

    #: behind an API or a server: the determinism probe re-sends some requests (run.determinism_probe)
    probed = True

    max_concurrency = 4
    default_key_env: str | None = "OPENAI_API_KEY"

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        openai = _import_openai()
        self._openai = openai
        self.model = str(params.get("model") or card.get("checkpoint") or "")
        if not self.model:
            raise ValueError(f"system '{name}': no model name (params 'model' or the card's 'checkpoint')")
        self.audio_format = str(params["audio_format"])
        if self.audio_format not in ("wav", "pcm16"):
            raise ValueError(f"system '{name}': audio_format must be 'wav' or 'pcm16', got {self.audio_format!r}")
        self.prompt_role = str(params["prompt_role"])
        if self.prompt_role not in ("system", "user"):
            raise ValueError(f"system '{name}': prompt_role must be 'system' or 'user', got {self.prompt_role!r}")
        self.timeout_s = float(params.get("timeout_s") or 120.0)
        self.endpoints, self.endpoints_source = resolve_endpoints(name, params, card, root, self.max_concurrency)
        self._check_endpoints()
        self.max_concurrency = sum(e.max_concurrency for e in self.endpoints)  # the runner's thread count
        self.pool = EndpointPool(self.endpoints, name=name, breaker=Breaker.from_params(params))
        key = self._api_key(root)
        # an endpoint's own token (the endpoints file of voicebias serve) is its key
        self._secrets = [key, *(e.token for e in self.endpoints if e.token)]
        self.clients = [
            openai.OpenAI(api_key=e.token or key, base_url=e.url, timeout=self.timeout_s, max_retries=0)
            for e in self.endpoints
        ]
        self.client = self.clients[0]
        self.base_url = self.endpoints[0].url

    # -- configuration -------------------------------------------------------
    def _check_endpoints(self) -> None:
        """Hook: an adapter that needs an explicit address says so here."""

    def _api_key(self, root: Path | None) -> str:
        var = self.params.get("api_key_env") or self.card.get("api_key_env") or self.default_key_env
        self._key_var = var
        return require_secret(f"system '{self.name}'", var, root, error=SetupError)

    def endpoint(self, i: int = 0) -> str:
        """Where endpoint `i`'s calls go (scheme, host, port and path only: no credentials, no query)."""
        return safe_url(self.clients[i].base_url)

    def run_facts(self) -> dict[str, Any]:
        return {"endpoints": self.pool.stats()} if len(self.endpoints) > 1 else {}

    def check(self) -> None:
        """Every endpoint answers ``GET /models`` and takes the key (see the module docstring)."""
        ask_endpoints(self.name, self.pool, self._check_one)

    def _check_one(self, i: int) -> None:
        openai = self._openai
        at = f"system '{self.name}': endpoint {self.endpoint(i).rstrip('/')}"
        client = self.clients[i].with_options(timeout=min(self.timeout_s, CHECK_TIMEOUT_S), max_retries=0)
        try:
            client.models.list()
        except openai.APITimeoutError:
            raise Unreachable(f"no answer to GET /models within {min(self.timeout_s, CHECK_TIMEOUT_S):g} s") from None
        except openai.APIConnectionError as exc:
            raise Unreachable(redact(connection_reason(exc), self._secrets)) from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            said = exc.body.get("message") if isinstance(exc.body, dict) and exc.body.get("message") else exc.message
            raise SetupError(
                redact(
                    f"{at}: credentials refused (GET /models answered HTTP {exc.status_code}: "
                    f"{said}); "
                    + (
                        f"check the key in {self._key_var}"
                        if self._key_var
                        else "the server wants a key: name its variable in api_key_env"
                    ),
                    self._secrets,
                )
            ) from None
        except openai.APIStatusError:
            pass  # any other answer (404 from a server without /models, 5xx): it is up and took the key

    # -- the call ------------------------------------------------------------
    def messages(self, request: S2SRequest) -> list[dict[str, Any]]:
        audio, sr = read_audio(request.audio_path)
        data = base64.b64encode(wav_bytes(audio, sr)).decode("ascii")
        audio_part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        if self.prompt_role == "system":
            return [{"role": "system", "content": request.prompt}, {"role": "user", "content": [audio_part]}]
        return [{"role": "user", "content": [{"type": "text", "text": request.prompt}, audio_part]}]

    def create_kwargs(self, request: S2SRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "modalities": ["text", "audio"],
            "audio": {"voice": self.voice(request.target_lang), "format": self.audio_format},
            "messages": self.messages(request),
        }
        for opt in ("temperature", "top_p", "max_completion_tokens"):
            if self.params.get(opt) is not None:
                kwargs[opt] = self.params[opt]
        if self.params.get("send_seed"):
            kwargs["seed"] = int(request.seed)
        if self.params.get("extra_body"):
            kwargs["extra_body"] = dict(self.params["extra_body"])
        return kwargs

    def respond(self, request: S2SRequest) -> S2SResponse:
        kwargs = self.create_kwargs(request)
        try:
            i, completion = self.pool.call(lambda i: self._create(i, kwargs))
        except AllEndpointsDown as exc:
            raise TransientError(str(exc), retry_after_s=exc.retry_after_s) from exc
        return self.parse(completion, kwargs["audio"]["voice"], endpoint=i)

    def _create(self, i: int, kwargs: dict[str, Any]) -> Any:
        """One try at endpoint `i`: a timeout or a failed connection raises Unreachable (try another)."""
        openai = self._openai
        try:
            return self.clients[i].chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise Unreachable(f"timeout after {self.timeout_s:g} s") from exc
        except openai.APIConnectionError as exc:
            raise Unreachable(redact(connection_reason(exc), self._secrets)) from exc
        except openai.APIStatusError as exc:
            msg = redact(f"HTTP {exc.status_code}: {exc.message}", self._secrets)
            invalid = exc.status_code >= 500 and names_invalid_request(exc.body)  # same answer if sent again
            if not invalid and (exc.status_code in TRANSIENT_STATUS or exc.status_code >= 500):
                raise TransientError(msg, retry_after_s=retry_after_s(exc.response.headers)) from exc
            raise RuntimeError(msg) from None

    def parse(self, completion: Any, voice: str, endpoint: int = 0) -> S2SResponse:
        """Turn a chat completion into a response; a reply without audio is a recorded failure."""
        prov = {
            "model": self.model,
            "model_revision": getattr(completion, "model", None) or self.model,
            "response_id": getattr(completion, "id", None),
            "voice": voice,
            "endpoint": self.endpoint(endpoint),
            "system_fingerprint": getattr(completion, "system_fingerprint", None),
        }
        usage = getattr(completion, "usage", None)
        if usage is not None:
            # as the server sent it, token details included (voicebias.cost reads it)
            prov["usage"] = usage.model_dump(mode="json", exclude_none=True) if hasattr(usage, "model_dump") else usage
        if not completion.choices:
            return S2SResponse.failed("reply has no choices", **prov)
        choice = completion.choices[0]
        prov["finish_reason"] = choice.finish_reason
        msg = choice.message
        if msg.audio is None or not msg.audio.data:
            said = msg.refusal or msg.content or ""
            reason = "reply has no audio" + (f" (finish_reason {choice.finish_reason})" if choice.finish_reason else "")
            return S2SResponse.failed(reason + (f"; the model wrote: {said[:300]}" if said else ""), **prov)
        try:
            audio, sr = decode_audio(msg.audio.data, self.audio_format)
        except Exception as exc:
            return S2SResponse.failed(f"reply audio cannot be decoded: {exc}", **prov)
        prov["audio_id"] = getattr(msg.audio, "id", None)
        transcript = getattr(msg.audio, "transcript", None)
        if transcript is not None and not transcript.strip():
            transcript = None  # some servers send "" when they have no text stream
        return S2SResponse(status="ok", transcript=transcript, audio=audio, sample_rate=sr, provenance=prov)

    def close(self) -> None:
        for client in self.clients:
            client.close()

"""Speech-to-speech systems served by vLLM-Omni (`vllm serve <model> --omni`), over its chat-completions API.

Plain vLLM answers an omni model's chat in text only; vLLM-Omni runs the model as a
pipeline of stages (Qwen2.5-Omni and Qwen3-Omni: thinker, talker, code2wav;
Step-Audio-2: thinker, token2wav) and answers in text and speech. One call per
stimulus, a raw HTTP POST to ``{base_url}/chat/completions``::

    {"model": <served model id>,
     "messages": [{"role": "system", "content": [{"type": "text", "text": <card system_prompt>}]},
                  {"role": "user", "content": [
                      {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,<16-bit WAV>"}},
                      {"type": "text", "text": <native-language task prompt>}]}],
     "modalities": ["text", "audio"],
     "sampling_params_list": [<stage 0 params + seed>, <stage 1 params + seed>, ...]}

`sampling_params_list` (what the OpenAI SDK sends from ``extra_body``) holds one
vLLM SamplingParams mapping per stage, in stage order; every stage gets the item's
own seed, ``item_seed(base.seed, stimulus_id)``. Where the card names no
`system_prompt`, the task prompt is the system message and the user turn holds the
audio alone (as for the API systems, the S2S paper's single native-language system
prompt); `prompt_role: user` puts it after the audio instead. Qwen's models need their
own system prompt for speech output, so their cards set it and the task prompt goes in
the user turn. Step-Audio-2 speaks only when the assistant turn is opened with
``<tts_start>``: its card sets `assistant_prefix`, sent as a final assistant message
with ``continue_final_message: true`` and ``add_generation_prompt: false``.

The reply carries the text in one choice (``message.content``) and the speech in
another (``message.audio.data``, base64 WAV; vLLM-Omni writes 24 kHz). The sample rate
is read from the WAV header. A reply without audio is a recorded failure with the
model's text as part of the reason, never filled in. Connection failures, timeouts,
408, 429 and 5xx raise :class:`TransientError` (with the server's Retry-After hint), so
the runner's retry policy retries them; other HTTP errors fail the item at once.

Before the first call the adapter asks the server what it runs: ``GET /version``
(vLLM's version; vLLM-Omni serves through vLLM's app and reports no version of its
own) and ``GET {base_url}/models`` (the served model ids, their `root` and
`max_model_len`). A server that does not serve the card's model, or serves it from a
snapshot other than the card's pinned `revision`, is a setup error. What the server
reports, the deploy settings (the card's `deploy`, with `batch_invariant: true`
unless set otherwise, overridden by params `deploy`) and the full sampling parameters
are part of :meth:`generation_settings`, hence of every cache key, beside the card and
the base seed the runner already puts there.

Card keys (besides the common ones): `revision` (the 40-hex Hugging Face commit the
server runs, `vllm serve ... --revision <commit>`), `deploy` (how the server was
started: engine, engine_version, command, batch_invariant, ...), `request`
(`modalities`, `stages`, `sampling_params_list`, optional `system_prompt`,
`prompt_role`, `assistant_prefix`). Params: `model` (the served model name, if the
server was started with ``--served-model-name``), `prompt_role`,
`sampling_params_list` (replaces the card's), `deploy` (merged over the card's);
runner knobs `base_url` (default http://127.0.0.1:8091/v1, the port vLLM-Omni's
examples use), `api_key_env` (when the server was started with ``--api-key``),
`timeout_s` (default 300), `max_concurrency`, `retry`. docs/serving.md has the
serve commands.
"""

from __future__ import annotations

import base64
import copy
import io
import re
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from voicebias.audio import read_audio, wav_bytes
from voicebias.clients.retry import RETRYABLE_STATUS, retry_after_s
from voicebias.secrets import require_secret
from voicebias.systems.base import S2SRequest, S2SResponse, S2SSystem, SetupError, TransientError, item_seed, redact

DEFAULT_BASE_URL = "http://127.0.0.1:8091/v1"
ENGINE = "vllm-omni"
NO_KEY = "EMPTY"  # what vLLM's examples send to a server started without --api-key; not a secret
COMMIT = re.compile(r"[0-9a-f]{40}")
SNAPSHOT = re.compile(r"snapshots/([0-9a-f]{40})")
#: HTTP statuses retried by the runner: request timeout, rate limit, server errors (and any other 5xx)
TRANSIENT_STATUS = frozenset(RETRYABLE_STATUS | {408})


def _is_wav(raw: bytes) -> bool:
    return len(raw) >= 12 and raw[:4] == b"RIFF" and raw[8:12] == b"WAVE"


def decode_wav(data_b64: str) -> tuple[np.ndarray, int]:
    """Base64 WAV to mono float32 and its rate (Hz, from the header)."""
    import soundfile as sf

    raw = base64.b64decode(data_b64, validate=True)
    if not raw:
        raise ValueError("the audio is empty")
    if not _is_wav(raw):
        raise ValueError(f"the audio is not a WAV file (starts with {raw[:4]!r})")
    x, sr = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    return x.mean(axis=1), int(sr)


def _error_message(body: Any, fallback: str) -> str:
    """The message of vLLM's error object ({"error": {...}}, or the older flat {"object": "error", ...})."""
    if isinstance(body, dict):
        err = body.get("error") if isinstance(body.get("error"), dict) else body
        msg = err.get("message")
        if msg:
            return str(msg)
    return fallback


class VLLMOmniSystem(S2SSystem):
    """A speech-to-speech system behind a vLLM-Omni server."""

    max_concurrency = 4

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        self.model = str(params.get("model") or card.get("checkpoint") or "")
        if not self.model:
            raise ValueError(f"system '{name}': no served model name (params 'model' or the card's 'checkpoint')")
        self.revision = str(card.get("revision", ""))
        if not COMMIT.fullmatch(self.revision):
            raise SetupError(f"system '{name}': the card's revision {self.revision!r} is not a pinned commit; start "
                             f"the server with `vllm serve {card.get('checkpoint')} --omni --revision <commit>` and "
                             "write that 40-hex Hugging Face commit as the card's 'revision'")
        req = dict(card.get("request") or {})
        self.modalities = list(req.get("modalities") or ["text", "audio"])
        if "audio" not in self.modalities:
            raise ValueError(f"system '{name}': request.modalities {self.modalities} asks for no audio")
        self.system_prompt = req.get("system_prompt")
        self.prompt_role = str(params.get("prompt_role") or req.get("prompt_role") or "system")
        if self.prompt_role not in ("system", "user"):
            raise ValueError(f"system '{name}': prompt_role must be 'system' or 'user', got {self.prompt_role!r}")
        self.assistant_prefix = req.get("assistant_prefix")
        self.stages = list(req.get("stages") or [])
        self.sampling = self._sampling(params.get("sampling_params_list") or req.get("sampling_params_list"))
        self.deploy = {"engine": ENGINE, "batch_invariant": True, **dict(card.get("deploy") or {}),
                       **dict(params.get("deploy") or {})}
        if not isinstance(self.deploy["batch_invariant"], bool):
            raise ValueError(f"system '{name}': deploy.batch_invariant must be true or false")
        self.base_url = str(params.get("base_url") or DEFAULT_BASE_URL).rstrip("/")
        self.timeout_s = float(params.get("timeout_s") or 300.0)
        var = params.get("api_key_env")
        self._key = require_secret(f"system '{name}'", var, root, error=SetupError) if var else NO_KEY
        self._secrets = [self._key] if var else []
        self._server: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def _sampling(self, spec: Any) -> list[dict[str, Any]]:
        if not isinstance(spec, list) or not spec or not all(isinstance(s, dict) for s in spec):
            raise ValueError(f"system '{self.name}': sampling_params_list must be a list of one mapping per stage "
                             "(the card's request.sampling_params_list or params)")
        if self.stages and len(spec) != len(self.stages):
            raise ValueError(f"system '{self.name}': {len(spec)} sampling parameter sets for "
                             f"{len(self.stages)} stages ({', '.join(self.stages)})")
        for i, s in enumerate(spec):
            if "seed" in s:
                raise ValueError(f"system '{self.name}': sampling_params_list[{i}] sets a seed; the adapter sets "
                                 "every stage's seed from base.seed and the stimulus id")
        return copy.deepcopy(spec)

    # -- what the server runs ----------------------------------------------------
    @property
    def server_root(self) -> str:
        """The server's address without the API prefix (/version lives there)."""
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    def endpoint(self) -> str:
        u = urlsplit(self.base_url)
        return f"{u.scheme}://{u.hostname}{f':{u.port}' if u.port else ''}{u.path}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"}

    def _get(self, url: str) -> Any:
        import requests

        try:
            r = requests.get(url, headers=self._headers(), timeout=min(self.timeout_s, 30.0))
        except requests.RequestException as exc:
            raise SetupError(redact(f"system '{self.name}': no vLLM-Omni server answers at {url} ({exc}); start "
                                    f"it as docs/serving.md says ({self.deploy.get('command', 'vllm serve ... --omni')})"
                                    ", or set base_url in params.yaml", self._secrets)) from None
        if r.status_code != 200:
            raise SetupError(redact(f"system '{self.name}': GET {url} answered HTTP {r.status_code}: "
                                    f"{_error_message(_json(r), r.text[:200])}", self._secrets))
        body = _json(r)
        if body is None:
            raise SetupError(f"system '{self.name}': GET {url} did not answer JSON")
        return body

    def server_info(self) -> dict[str, Any]:
        """What the server reports about itself and the served model (asked once, then kept)."""
        with self._lock:
            if self._server is None:
                self._server = self._ask_server()
            return self._server

    def _ask_server(self) -> dict[str, Any]:
        version = self._get(f"{self.server_root}/version")
        models = self._get(f"{self.base_url}/models")
        entries = [m for m in (models.get("data") or []) if isinstance(m, dict)] if isinstance(models, dict) else []
        served = {str(m.get("id")): m for m in entries}
        if self.model not in served:
            raise SetupError(f"system '{self.name}': the server at {self.base_url} serves "
                             f"{', '.join(sorted(served)) or 'no model'}, not {self.model}")
        entry = served[self.model]
        root = entry.get("root")
        m = SNAPSHOT.search(str(root or ""))
        if m and m.group(1) != self.revision:
            raise SetupError(f"system '{self.name}': the server runs snapshot {m.group(1)} of {self.model}; the "
                             f"card pins {self.revision}")
        return {"vllm_version": version.get("version") if isinstance(version, dict) else None,
                "model": {"id": self.model, "root": root, "max_model_len": entry.get("max_model_len"),
                          "owned_by": entry.get("owned_by")}}

    def generation_settings(self) -> dict[str, Any]:
        """Params (runner knobs left out), the deploy settings, the sampling parameters and what the server
        reports: engine version, served model id, root and context length. Asks the server on first use."""
        return super().generation_settings() | {
            "engine": ENGINE, "deploy": self.deploy, "sampling_params_list": self.sampling,
            "modalities": self.modalities, "server": self.server_info(),
        }

    # -- the call ----------------------------------------------------------------
    def messages(self, request: S2SRequest) -> list[dict[str, Any]]:
        audio, sr = read_audio(request.audio_path)
        url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(audio, sr)).decode("ascii")
        audio_part = {"type": "audio_url", "audio_url": {"url": url}}
        prompt_part = {"type": "text", "text": request.prompt}
        if self.system_prompt:
            msgs = [{"role": "system", "content": [{"type": "text", "text": str(self.system_prompt)}]},
                    {"role": "user", "content": [audio_part, prompt_part]}]
        elif self.prompt_role == "system":
            msgs = [{"role": "system", "content": [prompt_part]}, {"role": "user", "content": [audio_part]}]
        else:
            msgs = [{"role": "user", "content": [audio_part, prompt_part]}]
        if self.assistant_prefix:
            msgs.append({"role": "assistant", "content": str(self.assistant_prefix)})
        return msgs

    def seed_for(self, request: S2SRequest) -> int:
        return item_seed(request.seed, request.stimulus_id)

    def request_settings(self, request: S2SRequest) -> dict[str, Any]:
        """The item's own seed is in the cache key: two stimuli with the same audio get two answers."""
        return {"item_seed": self.seed_for(request)}

    def body(self, request: S2SRequest) -> dict[str, Any]:
        seed = self.seed_for(request)
        body: dict[str, Any] = {
            "model": self.model, "messages": self.messages(request), "modalities": list(self.modalities),
            "sampling_params_list": [dict(s, seed=seed) for s in self.sampling],
        }
        if self.assistant_prefix:
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    def respond(self, request: S2SRequest) -> S2SResponse:
        import requests

        server = self.server_info()
        body = self.body(request)
        url = f"{self.base_url}/chat/completions"
        try:
            r = requests.post(url, json=body, headers=self._headers(), timeout=self.timeout_s)
        except requests.Timeout as exc:
            raise TransientError(f"timeout after {self.timeout_s:g} s") from exc
        except requests.RequestException as exc:
            raise TransientError(redact(f"connection error: {exc}", self._secrets)) from exc
        if r.status_code != 200:
            msg = redact(f"HTTP {r.status_code}: {_error_message(_json(r), r.text[:300])}", self._secrets)
            if r.status_code in TRANSIENT_STATUS or r.status_code >= 500:
                raise TransientError(msg, retry_after_s=retry_after_s(r.headers))
            raise RuntimeError(msg)
        reply = _json(r)
        if not isinstance(reply, dict):
            raise RuntimeError(f"the reply is not a JSON object: {r.text[:200]!r}")
        return self.parse(reply, body, server)

    def parse(self, reply: dict[str, Any], body: dict[str, Any], server: dict[str, Any]) -> S2SResponse:
        """Text and audio from a vLLM-Omni reply; a reply without audio is a recorded failure."""
        seed = body["sampling_params_list"][0]["seed"]
        prov: dict[str, Any] = {
            "model": self.model, "model_revision": self.revision, "served_model": reply.get("model"),
            "response_id": reply.get("id"), "endpoint": self.endpoint(),
            "engine": {"name": ENGINE, "vllm_version": server.get("vllm_version"),
                       "deploy_engine_version": self.deploy.get("engine_version")},
            "served": server.get("model"), "deploy": self.deploy, "seed": seed,
            "sampling_params_list": body["sampling_params_list"], "modalities": body["modalities"],
            "output_voice": self.card.get("output_voice"),
        }
        if isinstance(reply.get("usage"), dict):
            prov["usage"] = {k: reply["usage"].get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        choices = [c for c in (reply.get("choices") or []) if isinstance(c, dict)]
        if not choices:
            return S2SResponse.failed("reply has no choices", **prov)
        prov["finish_reasons"] = [c.get("finish_reason") for c in choices]
        messages = [c.get("message") or {} for c in choices]
        texts = [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"].strip()]
        audios = [m["audio"] for m in messages if isinstance(m.get("audio"), dict) and m["audio"].get("data")]
        said = texts[0] if texts else ""
        if not audios:
            return S2SResponse.failed(f"reply has no audio ({len(choices)} choice(s), text only)"
                                      + (f"; the model wrote: {said[:300]}" if said else ""), **prov)
        if len(audios) > 1:
            return S2SResponse.failed(f"reply has {len(audios)} audio choices; one was asked for", **prov)
        try:
            audio, sr = decode_wav(str(audios[0]["data"]))
        except Exception as exc:
            return S2SResponse.failed(f"reply audio cannot be decoded: {exc}", **prov)
        prov["audio_id"] = audios[0].get("id")
        transcript = said or str(audios[0].get("transcript") or "").strip() or None
        return S2SResponse(status="ok", transcript=transcript, audio=audio, sample_rate=sr, provenance=prov)


def _json(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return None

"""Speech-to-speech systems served by vLLM-Omni (`vllm serve <model> --omni`), over its chat-completions API.

One raw HTTP POST to ``{base_url}/chat/completions`` per stimulus: the audio as an ``audio_url``
data URI, the task prompt, ``modalities`` text and audio, and ``sampling_params_list`` (one vLLM
SamplingParams mapping per stage, each with the item's seed); the reply's text and 24 kHz speech
come back in two choices, and a reply without audio is a recorded failure. Calls go through an
EndpointPool. Before the first call every endpoint is asked what it runs (``GET /version``,
``GET /models``): an unreachable one is left out of the run while another answers, and one that
refuses the key or serves another model, snapshot or engine is a setup error. The revision a server
loaded is checked against the card's: from the snapshot path the server reports, else from the
`--revision` voicebias serve recorded in the endpoints file; where neither says, the run goes on
and every reply records "not verified". What the servers report, the deploy settings and the
sampling parameters are part of every cache key.

The request, card keys, params and cache key: docs/serving.md.
"""

from __future__ import annotations

import base64
import copy
import io
import re
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from voicebias.audio import read_audio, wav_bytes
from voicebias.clients.endpoints import (
    AllEndpointsDown,
    Breaker,
    EndpointPool,
    Unreachable,
    resolve_endpoints,
    safe_url,
)
from voicebias.clients.retry import RETRYABLE_STATUS, names_invalid_request, retry_after_s
from voicebias.errors import SetupError, TransientError
from voicebias.secrets import require_secret
from voicebias.systems.base import CHECK_TIMEOUT_S, S2SRequest, S2SResponse, S2SSystem, ask_endpoints, item_seed, redact

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

    #: behind an API or a server: the determinism probe re-sends some requests (run.determinism_probe)
    probed = True

    max_concurrency = 4

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        self.model = str(params.get("model") or card.get("checkpoint") or "")
        if not self.model:
            raise ValueError(f"system '{name}': no served model name (params 'model' or the card's 'checkpoint')")
        self.revision = str(card.get("revision", ""))
        if not COMMIT.fullmatch(self.revision):
            raise SetupError(
                f"system '{name}': the card's revision {self.revision!r} is not a pinned commit; start "
                f"the server with `vllm serve {card.get('checkpoint')} --omni --revision <commit>` and "
                "write that 40-hex Hugging Face commit as the card's 'revision'"
            )
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
        self.deploy = {
            "engine": ENGINE,
            "batch_invariant": True,
            **dict(card.get("deploy") or {}),
            **dict(params.get("deploy") or {}),
        }
        if not isinstance(self.deploy["batch_invariant"], bool):
            raise ValueError(f"system '{name}': deploy.batch_invariant must be true or false")
        self.endpoints, self.endpoints_source = resolve_endpoints(
            name, params, card, root, self.max_concurrency, default_url=DEFAULT_BASE_URL
        )
        self.urls = [str(e.url).rstrip("/") for e in self.endpoints]
        self.base_url = self.urls[0]
        self.max_concurrency = sum(e.max_concurrency for e in self.endpoints)  # the runner's thread count
        self.pool = EndpointPool(self.endpoints, name=name, breaker=Breaker.from_params(params))
        self.timeout_s = float(params.get("timeout_s") or 300.0)
        var = params.get("api_key_env") or card.get("api_key_env")
        self._key_var = var
        self._key = require_secret(f"system '{name}'", var, root, error=SetupError) if var else NO_KEY
        self._secrets = ([self._key] if var else []) + [e.token for e in self.endpoints if e.token]
        self._server: dict[str, Any] | None = None
        #: per endpoint, how the served revision was checked (a deploy fact: provenance, not the cache key)
        self._revision_checks: dict[int, str] = {}
        self._lock_checks = threading.Lock()
        self._roots: list[Any] = []
        self._lock = threading.Lock()

    def _sampling(self, spec: Any) -> list[dict[str, Any]]:
        if not isinstance(spec, list) or not spec or not all(isinstance(s, dict) for s in spec):
            raise ValueError(
                f"system '{self.name}': sampling_params_list must be a list of one mapping per stage "
                "(the card's request.sampling_params_list or params)"
            )
        if self.stages and len(spec) != len(self.stages):
            raise ValueError(
                f"system '{self.name}': {len(spec)} sampling parameter sets for "
                f"{len(self.stages)} stages ({', '.join(self.stages)})"
            )
        from voicebias.params import sampling_key_problems

        problems = sampling_key_problems(spec)
        if problems:  # the card's list (params' is checked with the params)
            raise ValueError(f"system '{self.name}': " + "; ".join(problems))
        for i, s in enumerate(spec):
            if "seed" in s:
                raise ValueError(
                    f"system '{self.name}': sampling_params_list[{i}] sets a seed; the adapter sets "
                    "every stage's seed from base.seed and the stimulus id"
                )
        return copy.deepcopy(spec)

    # -- what the servers run ---------------------------------------------------
    @staticmethod
    def server_root(url: str) -> str:
        """A server's address without the API prefix (/version lives there)."""
        return url[:-3] if url.endswith("/v1") else url

    def endpoint(self, i: int = 0) -> str:
        """Where endpoint `i`'s calls go (scheme, host, port and path only: no credentials, no query)."""
        return safe_url(self.urls[i])

    def run_facts(self) -> dict[str, Any]:
        """Requests per endpoint (with several) and how each endpoint's revision was checked."""
        facts: dict[str, Any] = {"endpoints": self.pool.stats()} if len(self.endpoints) > 1 else {}
        if self._revision_checks:
            facts["revision_checks"] = {self.endpoint(i): c for i, c in sorted(self._revision_checks.items())}
        return facts

    def _headers(self, i: int = 0) -> dict[str, str]:
        """Endpoint `i`'s own token (the endpoints file of voicebias serve), else the key of api_key_env."""
        return {"Authorization": f"Bearer {self.endpoints[i].token or self._key}"}

    def _get(self, i: int, path: str) -> Any:
        """GET `path` of endpoint `i` (``/version`` of the server's root, else under the API prefix); raises
        Unreachable when no server answers there, SetupError for an answer other than 200 with JSON."""
        import requests

        url = f"{self.server_root(self.urls[i])}{path}" if path == "/version" else f"{self.urls[i]}{path}"
        at = f"system '{self.name}': endpoint {self.endpoint(i)}"
        try:
            r = requests.get(url, headers=self._headers(i), timeout=min(self.timeout_s, CHECK_TIMEOUT_S))
        except requests.RequestException as exc:
            raise Unreachable(
                redact(f"no vLLM-Omni server answers at {safe_url(url)} ({exc})", self._secrets)
            ) from None
        if r.status_code in (401, 403):
            raise SetupError(
                redact(
                    f"{at}: credentials refused (GET {safe_url(url)} answered HTTP {r.status_code}: "
                    f"{_error_message(_json(r), r.text[:200])}); "
                    + (
                        f"check the key in {self._key_var}"
                        if self._key_var
                        else "the server was started with --api-key: name its variable in api_key_env"
                    ),
                    self._secrets,
                )
            )
        if r.status_code != 200:
            raise SetupError(
                redact(
                    f"{at}: GET {safe_url(url)} answered HTTP {r.status_code}: "
                    f"{_error_message(_json(r), r.text[:200])}",
                    self._secrets,
                )
            )
        body = _json(r)
        if body is None:
            raise SetupError(f"{at}: GET {safe_url(url)} did not answer JSON")
        return body

    def check(self) -> None:
        """The servers answer, take the key and serve the card's model (:meth:`server_info`)."""
        self.server_info()

    def server_info(self) -> dict[str, Any]:
        """What the servers report about themselves and the served model (asked once, then kept): the
        facts every endpoint shares, without paths of the server machines. An endpoint that cannot be
        reached is left out of the run (see the module docstring)."""
        with self._lock:
            if self._server is None:
                hint = (
                    "; start the servers as docs/serving.md says (voicebias serve, or "
                    f"{self.deploy.get('command', 'vllm serve ... --omni')}), or name the servers that run "
                    f"(base_url or endpoints; these came from {self.endpoints_source})"
                )
                asked = ask_endpoints(self.name, self.pool, self._ask_server, hint=hint)
                order = sorted(asked)
                ref = order[0]
                first = asked[ref][0]
                for i in order[1:]:
                    facts = asked[i][0]
                    if facts != first:
                        diff = "; ".join(
                            f"{k}: {v!r} there, {_flat(first).get(k)!r} at {self.endpoint(ref)}"
                            for k, v in _flat(facts).items()
                            if _flat(first).get(k) != v
                        )
                        raise SetupError(
                            f"system '{self.name}': endpoint {self.endpoint(i)} does not serve what "
                            f"{self.endpoint(ref)} serves ({diff}); every endpoint of a system must run "
                            "the same model, revision and engine"
                        )
                self._roots = [asked[i][1] if i in asked else None for i in range(len(self.urls))]
                self._server = first
            return self._server

    def _ask_server(self, i: int) -> tuple[dict[str, Any], Any]:
        """(the facts endpoint `i` reports, its model's `root`)."""
        version = self._get(i, "/version")
        models = self._get(i, "/models")
        entries = [m for m in (models.get("data") or []) if isinstance(m, dict)] if isinstance(models, dict) else []
        served = {str(m.get("id")): m for m in entries}
        if self.model not in served:
            raise SetupError(
                f"system '{self.name}': the server at {self.endpoint(i)} serves "
                f"{', '.join(sorted(served)) or 'no model'}, not {self.model}"
            )
        entry = served[self.model]
        root = entry.get("root")
        m = SNAPSHOT.search(str(root or ""))
        if m and m.group(1) != self.revision:
            raise SetupError(
                f"system '{self.name}': the server at {self.endpoint(i)} runs snapshot {m.group(1)} of "
                f"{self.model}; the card pins {self.revision}"
            )
        recorded = self.endpoints[i].revision if i < len(self.endpoints) else None
        if not m and recorded is not None and recorded != self.revision:
            raise SetupError(
                f"system '{self.name}': the server at {self.endpoint(i)} was started with --revision {recorded} "
                f"(the endpoints file, written by voicebias serve); the card pins {self.revision}"
            )
        if m:
            check = "verified: the served snapshot path names the card's commit"
        elif recorded is not None:
            check = "verified: voicebias serve started this server with the card's --revision"
        else:
            check = (
                f"not verified: the server reports its model as {str(root or self.model)!r}, without a "
                "snapshot, and no endpoints file entry records the revision it was started with (servers "
                "started by `voicebias serve` are recorded)"
            )
            print(f"voicebias: system '{self.name}', {self.endpoint(i)}: revision {check}", file=sys.stderr)
        with self._lock_checks:
            self._revision_checks[i] = check
        facts = {
            "vllm_version": version.get("version") if isinstance(version, dict) else None,
            "model": {
                "id": self.model,
                "snapshot": m.group(1) if m else None,
                "max_model_len": entry.get("max_model_len"),
                "owned_by": entry.get("owned_by"),
            },
        }
        return facts, root

    def generation_settings(self) -> dict[str, Any]:
        """Params (runner knobs left out), the deploy settings, the sampling parameters and what the servers
        report: engine version, served model id, snapshot and context length. Asks them on first use."""
        return super().generation_settings() | {
            "engine": ENGINE,
            "deploy": self.deploy,
            "sampling_params_list": self.sampling,
            "modalities": self.modalities,
            "server": self.server_info(),
        }

    # -- the call ----------------------------------------------------------------
    def messages(self, request: S2SRequest) -> list[dict[str, Any]]:
        audio, sr = read_audio(request.audio_path)
        url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(audio, sr)).decode("ascii")
        audio_part = {"type": "audio_url", "audio_url": {"url": url}}
        prompt_part = {"type": "text", "text": request.prompt}
        if self.system_prompt:
            msgs = [
                {"role": "system", "content": [{"type": "text", "text": str(self.system_prompt)}]},
                {"role": "user", "content": [audio_part, prompt_part]},
            ]
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
            "model": self.model,
            "messages": self.messages(request),
            "modalities": list(self.modalities),
            "sampling_params_list": [dict(s, seed=seed) for s in self.sampling],
        }
        if self.assistant_prefix:
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    def respond(self, request: S2SRequest) -> S2SResponse:
        server = self.server_info()
        body = self.body(request)
        try:
            i, reply = self.pool.call(lambda i: self._post(i, body))
        except AllEndpointsDown as exc:
            raise TransientError(str(exc), retry_after_s=exc.retry_after_s) from exc
        return self.parse(reply, body, server, endpoint=i)

    def _post(self, i: int, body: dict[str, Any]) -> dict[str, Any]:
        """One try at endpoint `i`: a timeout or a failed connection raises Unreachable (try another)."""
        import requests

        try:
            r = requests.post(
                f"{self.urls[i]}/chat/completions", json=body, headers=self._headers(i), timeout=self.timeout_s
            )
        except requests.Timeout as exc:
            raise Unreachable(f"timeout after {self.timeout_s:g} s") from exc
        except requests.RequestException as exc:
            raise Unreachable(redact(f"connection error: {exc}", self._secrets)) from exc
        if r.status_code != 200:
            msg = redact(f"HTTP {r.status_code}: {_error_message(_json(r), r.text[:300])}", self._secrets)
            invalid = r.status_code >= 500 and names_invalid_request(_json(r))  # the request itself is wrong:
            if not invalid and (r.status_code in TRANSIENT_STATUS or r.status_code >= 500):  # sent again, the
                raise TransientError(msg, retry_after_s=retry_after_s(r.headers))  # same answer; so not retried
            raise RuntimeError(msg)
        reply = _json(r)
        if not isinstance(reply, dict):
            raise RuntimeError(f"the reply is not a JSON object: {r.text[:200]!r}")
        return reply

    def parse(
        self, reply: dict[str, Any], body: dict[str, Any], server: dict[str, Any], endpoint: int = 0
    ) -> S2SResponse:
        """Text and audio from a vLLM-Omni reply; a reply without audio is a recorded failure."""
        seed = body["sampling_params_list"][0]["seed"]
        prov: dict[str, Any] = {
            "model": self.model,
            "model_revision": self.revision,
            "served_model": reply.get("model"),
            "response_id": reply.get("id"),
            "endpoint": self.endpoint(endpoint),
            "served_root": self._roots[endpoint] if endpoint < len(self._roots) else None,
            "revision_check": self._revision_checks.get(endpoint),
            "engine": {
                "name": ENGINE,
                "vllm_version": server.get("vllm_version"),
                "deploy_engine_version": self.deploy.get("engine_version"),
            },
            "served": server.get("model"),
            "deploy": self.deploy,
            "seed": seed,
            "sampling_params_list": body["sampling_params_list"],
            "modalities": body["modalities"],
            "output_voice": self.card.get("output_voice"),
        }
        if isinstance(reply.get("usage"), dict):
            prov["usage"] = reply["usage"]  # as the server sent it (voicebias.cost reads it)
        choices = [c for c in (reply.get("choices") or []) if isinstance(c, dict)]
        if not choices:
            return S2SResponse.failed("reply has no choices", **prov)
        prov["finish_reasons"] = [c.get("finish_reason") for c in choices]
        messages = [c.get("message") or {} for c in choices]
        texts = [m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"].strip()]
        audios = [m["audio"] for m in messages if isinstance(m.get("audio"), dict) and m["audio"].get("data")]
        said = texts[0] if texts else ""
        if not audios:
            return S2SResponse.failed(
                f"reply has no audio ({len(choices)} choice(s), text only)"
                + (f"; the model wrote: {said[:300]}" if said else ""),
                **prov,
            )
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


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: the keys a difference is named by."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out

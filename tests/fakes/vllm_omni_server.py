"""A fake vLLM-Omni server for tests (127.0.0.1 only), speaking its OpenAI-compatible protocol over real HTTP.

- ``GET /version`` -> ``{"version": <vLLM version>}``;
- ``GET /v1/models`` -> ``{"object": "list", "data": [{"id", "object": "model", "root", "max_model_len", ...}]}``;
- ``POST /v1/chat/completions`` checks the request as vLLM-Omni's examples define it: the
  served model's name; exactly one ``audio_url`` part whose url is a
  ``data:audio/wav;base64,`` URI holding a WAV file; ``modalities`` among text and audio;
  ``sampling_params_list`` with one mapping per stage, each with an integer ``seed``.
  A request that breaks this gets vLLM's error object with status 400 (404 for an unknown
  model). Otherwise it answers as vLLM-Omni does: one choice with the text in
  ``message.content`` and one with ``message.audio`` (base64 24 kHz WAV, empty transcript), or
  with ``reply_shape="merged"`` one choice holding both (the form vllm-omni issue #7376 asks for).

Faults are planned per input, as in :mod:`tests.fakes.openai_server`: ``plan[fingerprint]``
lists the outcome of each successive attempt ("ok", "noaudio", "notwav", "429", "500",
"503", "400", "timeout", and "500invalid": HTTP 500 whose message names an invalid request, as
upstream answers a sampling key SamplingParams does not take); past the end of the list the input
gets "ok". Every chat request is logged with its body, fingerprint and outcome. ``latency_s`` delays each answer;
:meth:`~tests.fakes.http.CrashableServer.kill` crashes the server (new connections refused,
requests still being worked on dropped unanswered, logged as "killed").
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import time
from collections import defaultdict
from pathlib import Path

import soundfile as sf
import yaml

from tests.fakes.http import CrashableServer, Logged, send_json
from tests.fakes.openai_server import fingerprint_samples, reply_audio

DATA_URI = "data:audio/wav;base64,"
#: the revision the test cards pin (the committed cards pin none: the adapter refuses them)
PIN = "0123456789abcdef0123456789abcdef01234567"


def pinned_cards(folder: Path, name: str = "qwen2_5_omni_vllm", **changes) -> Path:
    """A cards folder under `folder` holding the committed card `name`, pinned to PIN, with `changes`
    applied (dotted keys: ``**{"deploy.engine_version": "0.31.0"}``)."""
    from voicebias.cards import load_card

    cards = Path(folder) / "cards"
    cards.mkdir(exist_ok=True)
    card = load_card(name) | {"revision": PIN}
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        node = card
        for k in path:
            node = node[k]
        node[last] = value
    (cards / f"{name}.yaml").write_text(yaml.safe_dump(card, allow_unicode=True))
    return cards


def snapshot_root(home: str, model: str, commit: str = PIN) -> str:
    """The `root` vLLM reports for a model loaded from a Hugging Face cache under `home`."""
    return f"{home}/.cache/huggingface/hub/models--{model.replace('/', '--')}/snapshots/{commit}"


class FakeVLLMOmniServer(CrashableServer):
    """Run with ``with FakeVLLMOmniServer(model) as srv:``; ``srv.base_url`` ends in /v1."""

    def __init__(
        self,
        model: str,
        stages: int = 3,
        vllm_version: str = "0.11.0",
        root: str | None = None,
        plan: dict[str, list[str]] | None = None,
        api_key: str | None = None,
        hang_s: float = 2.0,
        max_model_len: int = 32768,
        latency_s: float = 0.0,
        reply_shape: str = "two_choices",
        ignore_seed: bool = False,
    ):
        super().__init__()
        assert reply_shape in ("two_choices", "merged"), reply_shape
        self.reply_shape = reply_shape
        self.model, self.stages, self.vllm_version = model, stages, vllm_version
        self.root = root or model
        self.max_model_len = max_model_len
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.usage_sent: list[dict] = []
        #: a server that ignores the request's seed: each answer to an input is a new draw (its text
        #: names the draw, its audio tone moves with it), as a model sampling without the seed does
        self.ignore_seed = ignore_seed
        self.draws: dict[str, int] = defaultdict(int)
        self.api_key, self.hang_s, self.latency_s = api_key, hang_s, latency_s
        self.gets: list[str] = []
        self.attempts: dict[str, int] = defaultdict(int)

    def chats(self) -> list[Logged]:
        with self._lock:
            return list(self.log)

    # -- protocol ----------------------------------------------------------------
    def _error(self, h, status: int, message: str, etype: str = "BadRequestError", headers: dict | None = None):
        send_json(h, status, {"error": {"message": message, "type": etype, "param": None, "code": status}}, headers)

    def _authorised(self, h) -> bool:
        if self.api_key is None or h.headers.get("Authorization") == f"Bearer {self.api_key}":
            return True
        self._error(h, 401, "Unauthorized", "Unauthorized")
        return False

    def _get(self, h) -> None:
        with self._lock:
            self.gets.append(h.path)
        if h.path == "/version":
            send_json(h, 200, {"version": self.vllm_version})  # vLLM's /version needs no key
        elif h.path == "/v1/models":
            if self._authorised(h):
                send_json(
                    h,
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": self.model,
                                "object": "model",
                                "created": int(time.time()),
                                "owned_by": "vllm",
                                "root": self.root,
                                "parent": None,
                                "max_model_len": self.max_model_len,
                                "permission": [],
                            }
                        ],
                    },
                )
        else:
            self._error(h, 404, "Not Found", "NotFoundError")

    def _check(self, body: dict) -> tuple[int, str] | None:
        """(status, message) for the first way the request breaks the protocol, or None."""
        if body.get("model") != self.model:
            return 404, f"The model `{body.get('model')}` does not exist."
        mods = body.get("modalities")
        if mods is not None and (not isinstance(mods, list) or not set(mods) <= {"text", "audio"}):
            return 400, f"unsupported modalities {mods!r}"
        spl = body.get("sampling_params_list")
        if not isinstance(spl, list) or len(spl) != self.stages:
            return 400, f"sampling_params_list must hold {self.stages} stage mappings"
        for i, sp in enumerate(spl):
            if not isinstance(sp, dict) or not isinstance(sp.get("seed"), int) or isinstance(sp["seed"], bool):
                return 400, f"sampling_params_list[{i}] has no integer seed"
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return 400, "messages are required"
        parts = [p for m in msgs if isinstance(m.get("content"), list) for p in m["content"]]
        audio = [p for p in parts if p.get("type") == "audio_url"]
        if len(audio) != 1:
            return 400, "exactly one audio_url part is required"
        url = (audio[0].get("audio_url") or {}).get("url", "")
        if not url.startswith(DATA_URI):
            return 400, "audio_url.url must be a data:audio/wav;base64 URI"
        try:
            raw = base64.b64decode(url[len(DATA_URI) :], validate=True)
        except (binascii.Error, ValueError):
            return 400, "audio_url data is not base64"
        if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
            return 400, "audio_url data is not a WAV file"
        last = msgs[-1]
        if last.get("role") == "assistant" and not body.get("continue_final_message"):
            return 400, "a final assistant message needs continue_final_message"
        return None

    @staticmethod
    def fingerprint(body: dict) -> str:
        for m in body["messages"]:
            for p in m.get("content") if isinstance(m.get("content"), list) else []:
                if p.get("type") == "audio_url":
                    raw = base64.b64decode(p["audio_url"]["url"][len(DATA_URI) :])
                    x, _ = sf.read(io.BytesIO(raw), dtype="int16", always_2d=True)
                    return fingerprint_samples(x[:, 0])
        raise ValueError("no audio")

    def _post(self, h, t0: float) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length", 0)))
        if not self._authorised(h):
            return
        if h.path != "/v1/chat/completions":
            self._error(h, 404, "Not Found", "NotFoundError")
            return
        try:
            body = json.loads(raw)
            problem = self._check(body)
            fp = self.fingerprint(body) if problem is None else "?"
        except Exception as exc:  # malformed request
            body, problem, fp = {}, (400, f"malformed request: {exc}"), "?"
        if problem:
            status, message = problem
            self._error(h, status, message, "NotFoundError" if status == 404 else "BadRequestError")
            self.record(fp, str(status), t0, body)
            return
        with self._lock:
            n = self.attempts[fp]
            self.attempts[fp] += 1
            steps = self.plan.get(fp, [])
            outcome = steps[n] if n < len(steps) else "ok"
        if outcome == "429":
            self._error(h, 429, "Too many requests", "RateLimitError", {"Retry-After": "0"})
        elif outcome in ("500", "503"):
            self._error(h, int(outcome), "EngineCore encountered an issue.", "InternalServerError")
        elif outcome == "500invalid":
            self._error(
                h,
                500,
                "SamplingParams.__init__() got an unexpected keyword argument 'temprature'",
                "InternalServerError",
            )
        elif outcome == "400":
            self._error(h, 400, "audio is too long for this model", "BadRequestError")
        elif outcome == "timeout":
            self.hang(self.hang_s)
            try:
                self._error(h, 500, "too late", "InternalServerError")
            except OSError:
                pass
        else:
            if self.latency_s:
                time.sleep(self.latency_s)
            if self.dead(h):  # crashed while working on it: no answer
                outcome = "killed"
            else:
                send_json(h, 200, self._completion(body, fp, outcome))
        self.record(fp, outcome, t0, body)

    def _completion(self, body: dict, fp: str, outcome: str) -> dict:
        now = int(time.time())
        seed = body["sampling_params_list"][0]["seed"]
        with self._lock:
            self.draws[fp] += 1
            draw = self.draws[fp]
        text = {
            "role": "assistant",
            "content": f"reply to {fp[:12]} " + (f"draw {draw}" if self.ignore_seed else f"seed {seed}"),
            "reasoning_content": None,
            "tool_calls": [],
        }
        choices = [{"index": 0, "message": text, "logprobs": None, "finish_reason": "stop", "stop_reason": None}]
        if outcome in ("ok", "notwav"):
            voice = f"{(int(fp[:4], 16) + 7 * draw) % 65536:04x}{fp[4:]}" if self.ignore_seed else fp
            data = reply_audio(voice) if outcome == "ok" else b"ID3\x03not a wav at all"
            audio = {
                "id": f"audio-{fp[:16]}",
                "data": base64.b64encode(data).decode(),
                "expires_at": now + 86400,
                "transcript": "",
            }
            if self.reply_shape == "merged":
                text["audio"] = audio
            else:
                choices.append(
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": None, "audio": audio, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": "stop",
                        "stop_reason": None,
                    }
                )
        return {
            "id": f"chatcmpl-{fp[:20]}",
            "object": "chat.completion",
            "created": now,
            "model": self.model,
            "choices": choices,
            "usage": self._usage(fp, text),
        }

    def _usage(self, fp: str, text: dict) -> dict:
        """vLLM's usage block: totals only, `prompt_tokens_details` null (no split by modality);
        the prompt counts 40 to 295 tokens by input, the reply one token a word. Every usage sent
        is kept in `usage_sent`."""
        prompt = 40 + int(fp[:2], 16) if fp != "?" else 40
        completion = len(str(text.get("content") or "").split())
        usage = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }
        with self._lock:
            self.usage_sent.append(usage)
        return usage

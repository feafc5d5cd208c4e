"""A fake OpenAI chat-completions audio server for tests and benchmarks (127.0.0.1 only).

It speaks the real protocol over real HTTP: POST /v1/chat/completions with a
Bearer key, a JSON body with modalities ["text", "audio"], an `audio` voice and
format, and the stimulus as `input_audio` (base64 WAV); it answers with a
chat.completion object whose `choices[0].message.audio` holds base64 WAV `data`
and a `transcript`, or with the API's error object and status.

Faults are planned per input: `plan[fingerprint]` lists the outcome of each
successive attempt for that input ("ok", "429", "500", "503", "400", "401echo",
"timeout", "drop", "noaudio"); past the end of the list the input gets `default`
("ok" unless set: ``default="timeout"`` is a server that accepts every request and never
answers in time). ``GET /v1/models`` answers the model list with the same key check
(401 for another key), as the API does; ``models_status`` makes it answer that status
instead. The
fingerprint of an input is the sha256 of its 16-bit PCM samples
(:func:`fingerprint_samples`), so a test can compute it from the stimulus file.
Every request is logged with its fingerprint and outcome.

:meth:`FakeOpenAIAudioServer.kill` stops the server the way a crashed one stops: new
connections are refused and every request still open is dropped without an answer
(logged as "killed").
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from typing import Callable

import numpy as np
import soundfile as sf

from tests.fakes.http import CrashableServer, send_json

OUT_RATE = 24000


def fingerprint_samples(pcm16: np.ndarray) -> str:
    """sha256 of mono 16-bit samples (little endian)."""
    return hashlib.sha256(np.ascontiguousarray(pcm16, dtype="<i2").tobytes()).hexdigest()


def fingerprint_file(path) -> str:
    x, _ = sf.read(str(path), dtype="int16", always_2d=True)
    return fingerprint_samples(x[:, 0])


def reply_audio(fp: str, seconds: float = 0.3) -> bytes:
    """A deterministic 24 kHz tone per input, as WAV bytes."""
    freq = 150 + int(fp[:4], 16) % 200
    t = np.arange(int(OUT_RATE * seconds)) / OUT_RATE
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * freq * t), OUT_RATE, subtype="PCM_16", format="WAV")
    return buf.getvalue()


class FakeOpenAIAudioServer(CrashableServer):
    """Run with `with FakeOpenAIAudioServer(key) as srv:`; `srv.base_url` ends in /v1."""

    def __init__(
        self,
        api_key: str,
        plan: dict[str, list[str]] | None = None,
        latency_s: float = 0.0,
        hang_s: float = 2.0,
        transcript: Callable[[str, dict], str] | None = None,
        with_transcript: bool = True,
        default: str = "ok",
        models_status: int = 200,
    ):
        super().__init__()
        self.default = default
        self.models_status = models_status
        self.gets: list[str] = []
        self.api_key = api_key
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.latency_s = latency_s
        self.hang_s = hang_s
        self.transcript = transcript or (lambda fp, body: f"reply to {fp[:12]}")
        self.with_transcript = with_transcript
        self.attempts: dict[str, int] = defaultdict(int)
        self.usage_sent: list[dict] = []

    # -- protocol ----------------------------------------------------------------
    def _send_json(self, h: BaseHTTPRequestHandler, status: int, obj: dict, headers: dict | None = None) -> None:
        send_json(h, status, obj, headers)

    def _error(self, h, status: int, message: str, etype: str, code: str | None, headers: dict | None = None) -> None:
        self._send_json(h, status, {"error": {"message": message, "type": etype, "param": None, "code": code}}, headers)

    def _check(self, h, body: dict) -> str | None:
        """The first way the request breaks the API contract, or None."""
        if h.path != "/v1/chat/completions":
            return f"unknown path {h.path}"
        if body.get("modalities") != ["text", "audio"]:
            return "modalities must be ['text', 'audio']"
        audio = body.get("audio") or {}
        if not audio.get("voice") or audio.get("format") not in ("wav", "pcm16"):
            return "audio.voice and audio.format are required"
        if not body.get("model"):
            return "model is required"
        parts = [p for m in body.get("messages", []) if isinstance(m.get("content"), list) for p in m["content"]]
        audio_parts = [p for p in parts if p.get("type") == "input_audio"]
        if len(audio_parts) != 1 or audio_parts[0]["input_audio"].get("format") != "wav":
            return "exactly one input_audio part in wav format is required"
        return None

    def _input_fingerprint(self, body: dict) -> str:
        for m in body["messages"]:
            if isinstance(m.get("content"), list):
                for p in m["content"]:
                    if p.get("type") == "input_audio":
                        raw = base64.b64decode(p["input_audio"]["data"])
                        x, _ = sf.read(io.BytesIO(raw), dtype="int16", always_2d=True)
                        return fingerprint_samples(x[:, 0])
        raise ValueError("no input audio")

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.gets.append(h.path)
        if h.path != "/v1/models":
            self._error(h, 404, f"Invalid URL (GET {h.path})", "invalid_request_error", None)
        elif h.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._error(h, 401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        elif self.models_status != 200:
            self._error(h, self.models_status, "You are not allowed to list models.", "invalid_request_error", None)
        else:
            self._send_json(
                h,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": m, "object": "model", "created": 1717000000, "owned_by": "system"}
                        for m in ("gpt-4o-audio-preview", "gpt-audio")
                    ],
                },
            )

    def _post(self, h: BaseHTTPRequestHandler, t0: float) -> None:
        length = int(h.headers.get("Content-Length", 0))
        raw = h.rfile.read(length)
        if h.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._error(h, 401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
            self.record("?", "401", t0, {})
            return
        try:
            body = json.loads(raw)
            problem = self._check(h, body)
            fp = self._input_fingerprint(body) if problem is None else "?"
        except Exception as exc:  # malformed body
            body, problem, fp = {}, f"malformed request: {exc}", "?"
        if problem:
            self._error(h, 400, problem, "invalid_request_error", None)
            self.record(fp, "400", t0, body)
            return
        with self._lock:
            n = self.attempts[fp]
            self.attempts[fp] += 1
            steps = self.plan.get(fp, [])
            outcome = steps[n] if n < len(steps) else self.default
        if outcome == "429":
            self._error(
                h, 429, "Rate limit reached for requests.", "requests", "rate_limit_exceeded", {"retry-after-ms": "20"}
            )
        elif outcome in ("500", "503"):
            self._error(h, int(outcome), "The server had an error while processing your request.", "server_error", None)
        elif outcome == "400":
            self._error(h, 400, "Invalid input audio.", "invalid_request_error", None)
        elif outcome == "500invalid":  # a server (vLLM) that answers a bad sampling key with 500
            self._error(h, 500, "SamplingParams.__init__() got an unexpected keyword argument 'temprature'", "", None)
        elif outcome == "401echo":  # a careless server echoing the key it got
            self._error(
                h, 401, f"Incorrect API key provided: {self.api_key}.", "invalid_request_error", "invalid_api_key"
            )
        elif outcome == "timeout":
            self.hang(self.hang_s)  # the client gives up first
            try:
                self._error(h, 500, "too late", "server_error", None)
            except OSError:
                pass
        elif outcome == "drop":
            self.drop(h)
        elif outcome == "noaudio":
            self._send_json(h, 200, self._completion(body, fp, audio=False))
        else:
            if self.latency_s:
                time.sleep(self.latency_s)
            if self.dead(h):  # crashed while working on it: no answer
                outcome = "killed"
            else:
                self._send_json(h, 200, self._completion(body, fp, audio=True))
        self.record(fp, outcome, t0, body)

    def _completion(self, body: dict, fp: str, audio: bool) -> dict:
        now = int(time.time())
        message = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
        if audio:
            wav = reply_audio(fp)
            if (body.get("audio") or {}).get("format") == "pcm16":  # raw 24 kHz 16-bit little-endian samples
                x, _ = sf.read(io.BytesIO(wav), dtype="int16")
                wav = np.ascontiguousarray(x, dtype="<i2").tobytes()
            message["audio"] = {
                "id": f"audio_{fp[:16]}",
                "data": base64.b64encode(wav).decode(),
                "expires_at": now + 3600,
                "transcript": self.transcript(fp, body) if self.with_transcript else "",
            }
        else:
            message["content"] = "I can't help with that."
        return {
            "id": f"chatcmpl-{fp[:20]}",
            "object": "chat.completion",
            "created": now,
            "model": f"{body['model']}-2025-06-03",
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
            "usage": self._usage(body, message),
        }

    def _usage(self, body: dict, message: dict) -> dict:
        """The usage block the API sends, with its token details: the input audio at 10 tokens a
        second, the text parts at one token a word plus 7 for the chat template, the reply's audio
        at 20 tokens a second and its transcript (or content) at one token a word. Every usage
        sent is kept in `usage_sent`, for tests that sum it by hand."""
        words, seconds = 7, 0.0
        for m in body["messages"]:
            content = m.get("content")
            if isinstance(content, str):
                words += len(content.split())
            for p in content if isinstance(content, list) else []:
                if p.get("type") == "text":
                    words += len(p["text"].split())
                elif p.get("type") == "input_audio":
                    info = sf.info(io.BytesIO(base64.b64decode(p["input_audio"]["data"])))
                    seconds += info.frames / info.samplerate
        audio_in = int(np.ceil(seconds * 10))
        audio = message.get("audio")
        out_text = len(((audio or {}).get("transcript") or message.get("content") or "").split())
        audio_out = 0
        if audio:
            raw = base64.b64decode(audio["data"])
            frames = (
                len(raw) // 2 if (body.get("audio") or {}).get("format") == "pcm16" else sf.info(io.BytesIO(raw)).frames
            )
            audio_out = int(np.ceil(20 * frames / OUT_RATE))
        usage = {
            "prompt_tokens": words + audio_in,
            "completion_tokens": out_text + audio_out,
            "total_tokens": words + audio_in + out_text + audio_out,
            "prompt_tokens_details": {"audio_tokens": audio_in, "cached_tokens": 0, "text_tokens": words},
            "completion_tokens_details": {"audio_tokens": audio_out, "reasoning_tokens": 0, "text_tokens": out_text},
        }
        with self._lock:
            self.usage_sent.append(usage)
        return usage

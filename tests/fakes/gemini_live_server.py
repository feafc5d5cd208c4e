"""A fake Gemini Live server for tests (TLS websocket on 127.0.0.1).

It speaks the Live API's websocket protocol as the google-genai client uses it:
the client opens wss://<host>/ws/google.ai.generativelanguage.<version>.GenerativeService.BidiGenerateContent
with an `x-goog-api-key` header, sends a `setup` message (model, generationConfig
with responseModalities and speechConfig, systemInstruction, outputAudioTranscription,
realtimeInputConfig), gets `setupComplete`, then streams `realtimeInput` messages
(activityStart, audio chunks as base64 PCM with mimeType audio/pcm;rate=16000,
activityEnd). The server answers with `serverContent` messages: modelTurn parts
holding inlineData PCM at 24 kHz, outputTranscription text, generationComplete and
turnComplete.

The google-genai client always uses TLS for API-key sessions, so the server has a
self-signed certificate for 127.0.0.1 (:func:`self_signed_cert`); tests point the
client at it with SSL_CERT_FILE.

Faults per input (`plan[fingerprint]`, one outcome per attempt): "ok", "close1011"
(internal error), "close1013" (try again later), "close1008" (policy violation:
not retryable), "hang" (no reply; the client times out), "noaudio". The first
`reject_handshakes` connections are refused with HTTP 429 before any audio flows.
The fingerprint is the sha256 of the 16-bit PCM bytes received
(:func:`pcm_fingerprint` computes it from a stimulus file).

Besides the websocket it answers the REST lookup the SDK's ``models.get`` sends, ``GET
/v1beta/models/<model>`` with the same key header: the model's metadata (for every model
name, or only those in `models`), 404 NOT_FOUND for another, and for another key the
API's 400 INVALID_ARGUMENT "API key not valid". Lookups are logged in `lookups`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
import math
import re
import ssl
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

import numpy as np

from voicebias.audio import read_audio

PATH = re.compile(r"/ws/google\.ai\.generativelanguage\.v1(alpha|beta)?\.GenerativeService\.BidiGenerateContent")
MODEL_PATH = re.compile(r"/v1(?:alpha|beta)?/models/([^/?]+)(?:\?.*)?")
OUT_RATE = 24000


def proto_field(d: dict, camel: str):
    """A field of a proto-JSON message: parsers accept the lowerCamelCase name and the proto
    (snake_case) name alike, and the SDK sends some messages with the latter."""
    snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)
    return d.get(camel, d.get(snake))


def pcm_fingerprint(path) -> str:
    """The fingerprint of a stimulus as the Live API receives it (16 kHz, 16-bit PCM)."""
    x, _ = read_audio(path, target_sr=16000)
    return hashlib.sha256((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()).hexdigest()


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, valid for a day (cert also serves as its own CA)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class Session:
    fingerprint: str
    outcome: str
    setup: dict = field(repr=False, default_factory=dict)
    mime_types: set = field(default_factory=set)


class FakeGeminiLiveServer:
    """`with FakeGeminiLiveServer(key, certdir) as srv:`; `srv.base_url` is https://127.0.0.1:<port>."""

    def __init__(
        self,
        api_key: str,
        certdir: Path,
        plan: dict[str, list[str]] | None = None,
        reject_handshakes: int = 0,
        hang_s: float = 2.0,
        models: set[str] | None = None,
    ):
        self.api_key = api_key
        self.models = models
        self.lookups: list[str] = []
        self.cert, self.key = self_signed_cert(Path(certdir))
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.reject_left = reject_handshakes
        self.rejected = 0
        self.hang_s = hang_s
        self.sessions: list[Session] = []
        self.attempts: dict[str, int] = defaultdict(int)
        self.usage_sent: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def delivered(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for s in self.sessions:
            if s.outcome == "ok":
                out[s.fingerprint] += 1
        return dict(out)

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> "FakeGeminiLiveServer":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake Gemini Live server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        self._stop = asyncio.Event()
        async with serve(
            self._handler, "127.0.0.1", 0, ssl=ctx, process_request=self._process_request, max_size=None
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    # -- protocol ------------------------------------------------------------------
    @staticmethod
    def _json(status: HTTPStatus, body: dict):
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        data = json.dumps(body).encode()
        return Response(
            status.value,
            status.phrase,
            Headers([("Content-Type", "application/json; charset=UTF-8"), ("Content-Length", str(len(data)))]),
            data,
        )

    def _lookup(self, request, model: str):
        with self._lock:
            self.lookups.append(model)
        if request.headers.get("x-goog-api-key") != self.api_key:
            return self._json(
                HTTPStatus.BAD_REQUEST,
                {
                    "error": {
                        "code": 400,
                        "message": "API key not valid. Please pass a valid API key.",
                        "status": "INVALID_ARGUMENT",
                        "details": [
                            {
                                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                "reason": "API_KEY_INVALID",
                                "domain": "googleapis.com",
                            }
                        ],
                    }
                },
            )
        if self.models is not None and model not in self.models:
            return self._json(
                HTTPStatus.NOT_FOUND,
                {
                    "error": {
                        "code": 404,
                        "message": f"models/{model} is not found for API version v1beta, or is not supported "
                        "for getModel.",
                        "status": "NOT_FOUND",
                    }
                },
            )
        return self._json(
            HTTPStatus.OK,
            {
                "name": f"models/{model}",
                "version": "001",
                "displayName": model,
                "inputTokenLimit": 131072,
                "outputTokenLimit": 8192,
                "supportedGenerationMethods": ["countTokens", "bidiGenerateContent"],
            },
        )

    def _process_request(self, connection, request):
        lookup = MODEL_PATH.fullmatch(request.path)
        if lookup:
            return self._lookup(request, lookup.group(1))
        if not PATH.fullmatch(request.path):
            return connection.respond(HTTPStatus.NOT_FOUND, "unknown path\n")
        with self._lock:
            if self.reject_left > 0:
                self.reject_left -= 1
                self.rejected += 1
                return connection.respond(HTTPStatus.TOO_MANY_REQUESTS, "Resource has been exhausted\n")
        return None

    async def _handler(self, ws) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._serve(ws)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _serve(self, ws) -> None:
        if ws.request.headers.get("x-goog-api-key") != self.api_key:
            await ws.close(1008, "API key not valid. Please pass a valid API key.")
            return
        setup = json.loads(await ws.recv())
        if "setup" not in setup:
            await ws.close(1007, "first message must be setup")
            return
        await ws.send(json.dumps({"setupComplete": {}}))
        pcm = bytearray()
        mimes: set[str] = set()
        started = False
        while True:
            msg = json.loads(await ws.recv())
            rt = proto_field(msg, "realtimeInput") or {}
            if proto_field(rt, "activityStart") is not None:
                started = True
            audio = proto_field(rt, "audio")
            if audio is not None:
                if not started:
                    await ws.close(1007, "audio before activityStart with automatic activity detection disabled")
                    return
                mimes.add(proto_field(audio, "mimeType"))
                pcm += base64.b64decode(audio["data"].replace("-", "+").replace("_", "/"))  # either alphabet
            if proto_field(rt, "activityEnd") is not None:
                break
        fp = hashlib.sha256(bytes(pcm)).hexdigest()
        with self._lock:
            n = self.attempts[fp]
            self.attempts[fp] += 1
            steps = self.plan.get(fp, [])
            outcome = steps[n] if n < len(steps) else "ok"
        with self._lock:
            self.sessions.append(Session(fp, outcome, setup["setup"], mimes))
        if outcome.startswith("close"):
            await ws.close(
                int(outcome[5:]),
                {
                    "close1011": "Internal error encountered.",
                    "close1013": "The service is currently unavailable.",
                    "close1008": "Request contains an invalid argument.",
                }[outcome],
            )
        elif outcome == "hang":
            await asyncio.sleep(self.hang_s)
        else:
            await self._reply(ws, fp, audio=(outcome != "noaudio"), in_s=len(pcm) / 2 / 16000)
        try:
            await ws.wait_closed()
        except Exception:
            pass

    async def _reply(self, ws, fp: str, audio: bool, in_s: float = 0.0) -> None:
        out_s = 0.4 if audio else 0.0
        if audio:
            t = np.arange(int(OUT_RATE * 0.4)) / OUT_RATE
            tone = (0.3 * np.sin(2 * np.pi * (180 + int(fp[:4], 16) % 100) * t) * 32767).astype("<i2").tobytes()
            half = len(tone) // 2 // 2 * 2
            for chunk in (tone[:half], tone[half:]):
                await ws.send(
                    json.dumps(
                        {
                            "serverContent": {
                                "modelTurn": {
                                    "parts": [
                                        {
                                            "inlineData": {
                                                "mimeType": f"audio/pcm;rate={OUT_RATE}",
                                                "data": base64.b64encode(chunk).decode(),
                                            }
                                        }
                                    ]
                                }
                            }
                        }
                    )
                )
        for piece in ("reply ", f"to {fp[:12]}"):
            await ws.send(json.dumps({"serverContent": {"outputTranscription": {"text": piece}}}))
        await ws.send(json.dumps({"serverContent": {"generationComplete": True}}))
        # the usage the Live API reports, per modality: audio at 32 tokens a second (Gemini's
        # documented rate), the system instruction as 12 text tokens, the transcript as 3
        usage = {
            "promptTokenCount": 12 + math.ceil(32 * in_s),
            "responseTokenCount": 3 + math.ceil(32 * out_s),
            "totalTokenCount": 15 + math.ceil(32 * in_s) + math.ceil(32 * out_s),
            "promptTokensDetails": [
                {"modality": "TEXT", "tokenCount": 12},
                {"modality": "AUDIO", "tokenCount": math.ceil(32 * in_s)},
            ],
            "responseTokensDetails": [
                {"modality": "TEXT", "tokenCount": 3},
                {"modality": "AUDIO", "tokenCount": math.ceil(32 * out_s)},
            ],
        }
        with self._lock:
            self.usage_sent.append(usage)
        await ws.send(json.dumps({"serverContent": {"turnComplete": True}, "usageMetadata": usage}))

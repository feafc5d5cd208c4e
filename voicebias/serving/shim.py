"""An OpenAI-compatible chat-completions server around one repository system's driver.

It runs in the system's OWN environment (the interpreter of its checkout), where voicebias is not
installed: this file imports the Python standard library only and is started by its path,
``<python> shim.py --driver <x_driver.py> --config <json> ...``. It starts the driver as a worker
speaking the driver line protocol (voicebias/systems/drivers/_protocol.py) and serves ``GET /health``,
``GET /v1/models`` and ``POST /v1/chat/completions``, handing each request to the driver exactly
as voicebias.systems.repository does. Input must be 16 kHz mono 16-bit WAV (no resampling); one
worker answers one request at a time. Binds 127.0.0.1 unless ``--host`` says otherwise.

Hardened for a network: with a token in $VOICEBIAS_SHIM_TOKEN (``voicebias serve`` generates one
and writes it to the endpoints file) every ``/v1`` route wants ``Authorization: Bearer <token>``
(401 otherwise), and a shim without one binds loopback only; a body over ``--max-body-mb`` gets
413 unread; a connection that sends nothing for ``--socket-timeout-s`` is closed; at most
``--threads`` connections are handled at once (the rest wait); ``/v1/models`` names no local path.

The endpoints, the request and reply shapes and the HTTP status of each failure: docs/serving.md,
"The shim".
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import hashlib
import hmac
import io
import ipaddress
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import wave
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

INPUT_RATE = 16000
TOKEN_ENV = "VOICEBIAS_SHIM_TOKEN"
PASSED_FIELDS = ("task", "lang", "target_lang", "continuation_s", "text_stream")
#: the driver configuration's entries that are paths on the serving machine, left out of /v1/models
LOCAL_CONFIG_KEYS = ("checkout", "weights")


class RequestError(Exception):
    """A request the shim refuses: (HTTP status, message)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Worker:
    """The driver process: one JSON request per line on stdin, one answer per line on stdout."""

    def __init__(self, argv, startup_timeout_s, timeout_s):
        self.argv = argv
        self.startup_timeout_s = startup_timeout_s
        self.timeout_s = timeout_s
        self.proc = None
        self.info = {}
        self.ready = threading.Event()
        self.lock = threading.Lock()
        self.tail = collections.deque(maxlen=40)
        self._n = 0

    def start(self):
        self.ready.clear()
        self.lines = queue.Queue()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        drain = threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)
        drain.start()
        try:
            msg = self._next(self.startup_timeout_s)
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"the driver worker did not get ready within {self.startup_timeout_s:g} s") from None
        if msg is None or not msg.get("ready"):
            why = "exited" if msg is None else "answered without getting ready"
            if msg is None:
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            drain.join(timeout=5)  # its last words are in the tail
            raise RuntimeError(f"the driver worker {why} while loading; its last output:\n" + "\n".join(self.tail))
        self.info = msg.get("info") or {}
        self.ready.set()

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put(line)
        q.put(None)

    def _drain(self, stream):
        for line in stream:  # the driver's log (stderr) goes to the shim's log
            self.tail.append(line.rstrip())
            sys.stderr.write(line)
            sys.stderr.flush()

    def _next(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                raise TimeoutError from None
            if line is None:
                return None
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                self.tail.append(f"[stdout] {line.rstrip()}")

    def request(self, payload):
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                try:
                    self.start()
                except (RuntimeError, TimeoutError, OSError) as exc:
                    self.kill()
                    raise RequestError(503, f"the driver worker could not be restarted: {exc}") from None
            self._n += 1
            payload = {"id": self._n, **payload}
            try:
                self.proc.stdin.write(json.dumps(payload) + "\n")
                self.proc.stdin.flush()
                while True:
                    msg = self._next(self.timeout_s)
                    if msg is None:
                        code = self.proc.wait(timeout=10)
                        self.ready.clear()
                        raise RequestError(
                            503, f"the driver worker died (exit code {code}); it is restarted for the next request"
                        )
                    if msg.get("id") == self._n:
                        return msg
            except (BrokenPipeError, OSError):
                self.kill()
                raise RequestError(503, "the driver worker is gone; it is restarted for the next request") from None
            except TimeoutError:
                self.kill()
                raise RequestError(
                    504,
                    f"the driver gave no answer within {self.timeout_s:g} s; the worker was "
                    "stopped and is restarted for the next request",
                ) from None

    def kill(self):
        self.ready.clear()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self):
        self.ready.clear()
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


# ---------------------------------------------------------------------------- the request


def _prompt_and_audio(messages):
    """(the task prompt, the input WAV bytes) from the chat messages."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    texts, audio = [], None
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "developer"):
            continue
        content = m.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        if not isinstance(parts, list):
            raise RequestError(400, "a message's 'content' must be a string or a list of parts")
        for part in parts:
            if not isinstance(part, dict):
                raise RequestError(400, "a content part must be an object")
            kind = part.get("type")
            if kind == "text":
                if str(part.get("text") or "").strip():
                    texts.append(str(part["text"]))
            elif kind in ("input_audio", "audio_url"):
                if audio is not None:
                    raise RequestError(400, "the request holds more than one audio part; send one")
                audio = _audio_part(part)
            else:
                raise RequestError(400, f"unsupported content part type {kind!r}")
    if audio is None:
        raise RequestError(400, "the request holds no audio (an input_audio or audio_url part)")
    return "\n".join(texts), audio


def _audio_part(part):
    if part["type"] == "input_audio":
        spec = part.get("input_audio") or {}
        if str(spec.get("format", "wav")).lower() != "wav":
            raise RequestError(400, f"input_audio format {spec.get('format')!r} is not supported; send wav")
        data = spec.get("data")
    else:
        url = str((part.get("audio_url") or {}).get("url") or "")
        head, _, data = url.partition(",")
        if not (head.startswith("data:audio/") and head.endswith(";base64")):
            raise RequestError(400, "audio_url must be a data:audio/wav;base64,... URI")
    try:
        raw = base64.b64decode(str(data or ""), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, "the audio is not valid base64") from None
    try:
        with wave.open(io.BytesIO(raw), "rb") as w:
            rate, channels, width, frames = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
    except (wave.Error, EOFError) as exc:
        raise RequestError(400, f"the audio is not a PCM WAV file: {exc}") from None
    if rate != INPUT_RATE or channels != 1 or width != 2:
        raise RequestError(
            400,
            f"the driver protocol takes 16 kHz mono 16-bit WAV; got {rate} Hz, {channels} "
            f"channel(s), {8 * width}-bit (resample before sending; the shim does not)",
        )
    if frames == 0:
        raise RequestError(400, "the audio holds no samples")
    return raw


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Shim:
    def __init__(self, args, token=None):
        self.model = args.model
        self.token = token
        try:
            self.config = json.loads(args.config)
        except ValueError as exc:
            raise SystemExit(f"shim: --config is not JSON: {exc}") from None
        self.driver = {"name": os.path.basename(args.driver), "sha256": _sha256(args.driver)}
        driver_argv = [sys.executable, args.driver, args.config]
        self.worker = Worker(driver_argv, args.startup_timeout_s, args.timeout_s)
        self.workdir = tempfile.mkdtemp(prefix="voicebias-shim-")
        self.created = int(time.time())
        self.loading = threading.Event()
        self.loading.set()

    def models(self):
        """The model list; the driver's configuration without its local paths (checkout, weights), and
        no interpreter path: what runs is told by the driver's hash, the checkpoint and the settings."""
        config = {k: v for k, v in self.config.items() if k not in LOCAL_CONFIG_KEYS}
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "voicebias-shim",
                    "info": self.worker.info,
                    "driver": self.driver,
                    "config": config,
                }
            ],
        }

    def authorised(self, header):
        """Whether an Authorization header value carries this shim's token (always, without a token)."""
        if not self.token:
            return True
        scheme, _, given = str(header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    def complete(self, body):
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        if self.loading.is_set():
            raise RequestError(503, "the driver worker is still loading")
        prompt, wav = _prompt_and_audio(body.get("messages"))
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise RequestError(400, f"'seed' must be an integer, got {seed!r}")
        tag = uuid.uuid4().hex
        wav_in = os.path.join(self.workdir, f"{tag}-in.wav")
        out = os.path.join(self.workdir, f"{tag}-out.wav")
        with open(wav_in, "wb") as fh:
            fh.write(wav)
        payload = {
            "audio": wav_in,
            "out": out,
            "prompt": prompt,
            "seed": seed,
            **{k: body[k] for k in PASSED_FIELDS if body.get(k) is not None},
        }
        try:
            reply = self.worker.request(payload)
            if reply.get("status") != "ok":
                raise RequestError(422, str(reply.get("error") or "the driver reported a failure"))
            if not os.path.exists(out):
                raise RequestError(422, "the driver produced no audio file")
            with open(out, "rb") as fh:
                audio = fh.read()
        finally:
            for p in (wav_in, out):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        text = reply.get("text") or ""
        info = self.worker.info
        return {
            "id": f"chatcmpl-{tag}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": str(info.get("revision") or "") or None,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "audio": {
                            "id": f"audio-{tag}",
                            "data": base64.b64encode(audio).decode(),
                            "transcript": text,
                            "expires_at": 0,
                        },
                    },
                }
            ],
        }


def make_handler(shim, max_body=32 << 20, socket_timeout_s=60.0):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = socket_timeout_s  # a read or write that waits longer closes the connection

        def log_message(self, fmt, *args):  # one line per request, no bodies
            sys.stderr.write("shim: %s %s\n" % (self.address_string(), fmt % args))

        def _send(self, status, obj, headers=None):
            data = json.dumps(obj).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status, message, close=False):
            kind = "invalid_request_error" if status < 500 else "server_error"
            if close:  # the body was not read: the connection cannot carry another request
                self.close_connection = True
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def _authorised(self):
            if shim.authorised(self.headers.get("Authorization")):
                return True
            self.close_connection = True
            error = {"message": "a bearer token is required", "type": "authentication_error", "code": 401}
            self._send(401, {"error": error}, {"WWW-Authenticate": 'Bearer realm="voicebias-shim"'})
            return False

        def do_GET(self):
            path = self.path.split("?")[0].rstrip("/")
            if path == "/health":  # says ready or not, nothing else: no token needed
                if shim.worker.ready.is_set():
                    self._send(200, {"status": "ok"})
                else:
                    self._error(503, "the driver worker is not ready")
            elif not self._authorised():
                return
            elif path == "/v1/models":
                self._send(200, shim.models())
            else:
                self._error(404, f"no route {path}")

        def _body(self):
            """The request body, or None after an error reply (the connection is then closed)."""
            if "chunked" in str(self.headers.get("Transfer-Encoding") or "").lower():
                self._error(411, "send the body with a Content-Length, not chunked", close=True)
                return None
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._error(400, "Content-Length is not a number", close=True)
                return None
            if length < 0:
                self._error(400, "Content-Length is negative", close=True)
                return None
            if length > max_body:
                self._error(413, f"the body ({length} bytes) is over this shim's limit of {max_body} bytes", close=True)
                return None
            try:
                raw = self.rfile.read(length) if length else b""
            except OSError:  # the socket timeout: a sender that stalls mid-body
                self.close_connection = True
                return None
            if len(raw) < length:  # the client went away
                self.close_connection = True
                return None
            return raw

        def do_POST(self):
            path = self.path.split("?")[0].rstrip("/")
            if not self._authorised():
                return
            raw = self._body()
            if raw is None:
                return
            if path != "/v1/chat/completions":
                self._error(404, f"no route {path}")
                return
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                self._error(400, "the body is not JSON")
                return
            try:
                self._send(200, shim.complete(body))
            except RequestError as exc:
                self._error(exc.status, str(exc))
            except Exception as exc:  # a bug here must not take the server down
                self._error(500, f"{type(exc).__name__}: {exc}")

    return Handler


class PooledHTTPServer(HTTPServer):
    """An HTTP server that handles at most `threads` connections at once on a fixed pool of threads;
    further connections wait in the pool's queue (an idle one is closed by the socket timeout)."""

    def __init__(self, address, handler, threads):
        super().__init__(address, handler)
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shim")

    def process_request(self, request, client_address):
        self.pool.submit(self._handle, request, client_address)

    def _handle(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def handle_error(self, request, client_address):  # one line, not a traceback per dropped client
        exc = sys.exc_info()[1]
        sys.stderr.write(f"shim: connection from {client_address[0]} ended: {type(exc).__name__}: {exc}\n")

    def server_close(self):
        super().server_close()
        try:
            self.pool.shutdown(wait=False, cancel_futures=True)
        except TypeError:  # Python < 3.9 (a system's own environment may be older)
            self.pool.shutdown(wait=False)


def _loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description="OpenAI-compatible chat-completions server around a voicebias driver")
    ap.add_argument("--driver", required=True, help="the driver script (voicebias/systems/drivers/<x>_driver.py)")
    ap.add_argument("--config", required=True, help="the driver's configuration, JSON (its argv[1])")
    ap.add_argument("--model", required=True, help="the model id to serve (the card's checkpoint)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--startup-timeout-s", type=float, default=1800.0)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="the longest one request may take in the driver")
    ap.add_argument("--max-body-mb", type=float, default=32.0, help="the largest request body (413 above; default 32)")
    ap.add_argument(
        "--socket-timeout-s", type=float, default=60.0, help="a connection silent this long is closed (default 60)"
    )
    ap.add_argument("--threads", type=int, default=16, help="connections handled at once (default 16)")
    args = ap.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "").strip() or None  # not passed on to the driver
    if token is None and not _loopback(args.host):
        raise SystemExit(
            f"shim: --host {args.host} is not a loopback address and ${TOKEN_ENV} holds no token; "
            "start it with voicebias serve, which generates one"
        )
    shim = Shim(args, token)
    handler = make_handler(shim, int(args.max_body_mb * (1 << 20)), args.socket_timeout_s)
    server = PooledHTTPServer((args.host, args.port), handler, max(1, args.threads))
    stopping = threading.Event()

    def stop(*_):
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed = []

    def load():
        try:
            with shim.worker.lock:
                shim.worker.start()
            shim.loading.clear()
            sys.stderr.write(f"shim: the driver is ready; serving {args.model} on {args.host}:{args.port}\n")
        except Exception as exc:
            failed.append(str(exc))
            sys.stderr.write(f"shim: {exc}\n")
            stop()

    threading.Thread(target=load, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        shim.worker.close()
        shutil.rmtree(shim.workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

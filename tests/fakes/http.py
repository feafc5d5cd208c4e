"""What the fake HTTP servers of the tests share: JSON answers, loopback start and stop, and a
server base that counts requests in flight and can crash the way a real server does."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

#: how often a serving thread checks for shutdown() (the standard library's 0.5 s made every stop
#: wait up to half a second)
POLL_S = 0.02


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    obj: dict,
    headers: dict | None = None,
    content_type: str = "application/json",
) -> None:
    """Write one complete JSON response (status, Content-Type, Content-Length, extra headers, body)."""
    data = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(data)


def start_loopback(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    """A threading HTTP server on 127.0.0.1 (a free port) serving `handler` in a daemon thread, and its URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def stop_loopback(httpd: ThreadingHTTPServer) -> None:
    """Stop serving and release the port."""
    httpd.shutdown()
    httpd.server_close()


@dataclass
class Logged:
    """One request a fake server handled: the input's fingerprint, what it answered, when, the body."""

    fingerprint: str
    outcome: str
    t_start: float = 0.0
    t_end: float = 0.0
    body: dict = field(repr=False, default_factory=dict)


class CrashableServer:
    """Base of the fake API servers: a threading HTTP/1.1 server on 127.0.0.1 (``with Server(...) as srv:``;
    ``srv.base_url`` ends in /v1) that logs every request it handles and counts those in flight.

    :meth:`kill` stops it the way a crashed server stops: new connections are refused, a kept-alive
    connection is dropped at its next request, and a request still being worked on is dropped without
    an answer when the subclass checks :meth:`dead` before answering (all logged as "killed").
    Subclasses implement ``_get(h)`` and ``_post(h, t0)``.
    """

    def __init__(self) -> None:
        self.log: list[Logged] = []
        self._lock = threading.Lock()
        self.in_flight = 0
        #: the most requests at once that were received and not yet answered (a request counts until
        #: its response starts: the client may send its next one as soon as it has read the answer,
        #: before this handler's thread has finished)
        self.max_in_flight = 0
        self._unanswered = 0
        self.killed = False
        #: set when the server stops: a request hanging on it (see :meth:`hang`) ends then
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                server._serve(self, lambda h, t0: server._get(h))

            def do_POST(self):
                server._serve(self, server._post)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 128
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def kill(self) -> None:
        """Crash: refuse new connections; requests already open are dropped unanswered."""
        with self._lock:
            self.killed = True
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- what tests read ---------------------------------------------------------
    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Block until no request is being handled, so the log holds every request received so far.

        A request the client gave up on (a hang past its timeout) is logged when the server
        finishes it, which can be after the client has moved on.
        """
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            with self._lock:
                if self.in_flight == 0:
                    return
            time.sleep(0.01)
        raise TimeoutError(f"{self.in_flight} requests still in flight after {timeout_s} s")

    def delivered(self) -> dict[str, int]:
        """Per input: how many successful (200 with audio) replies were delivered."""
        out: dict[str, int] = defaultdict(int)
        with self._lock:
            for e in self.log:
                if e.outcome == "ok":
                    out[e.fingerprint] += 1
        return dict(out)

    # -- for subclasses ----------------------------------------------------------
    def _get(self, h: BaseHTTPRequestHandler) -> None:
        send_json(h, 404, {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}})

    def _post(self, h: BaseHTTPRequestHandler, t0: float) -> None:
        raise NotImplementedError

    def hang(self, seconds: float) -> None:
        """Work on a request for `seconds` without answering (ends early when the server stops)."""
        self.stopping.wait(seconds)

    def dead(self, h: BaseHTTPRequestHandler) -> bool:
        """True (the connection dropped unanswered) when the server was killed while working on this request."""
        if self.killed:
            self.drop(h)
            return True
        return False

    @staticmethod
    def drop(h: BaseHTTPRequestHandler) -> None:
        """Close the connection without an answer."""
        h.close_connection = True
        try:
            h.connection.shutdown(2)
        except OSError:
            pass

    def record(self, fp: str, outcome: str, t0: float, body: dict) -> None:
        with self._lock:
            self.log.append(Logged(fp, outcome, t0, time.perf_counter(), body))

    def _serve(self, h: BaseHTTPRequestHandler, handle: Callable[[BaseHTTPRequestHandler, float], None]) -> None:
        t0 = time.perf_counter()
        if self.killed:  # a kept-alive connection of a crashed server
            self.drop(h)
            self.record("?", "killed", t0, {})
            return
        answered = threading.Event()

        def answering() -> None:
            if not answered.is_set():
                answered.set()
                with self._lock:
                    self._unanswered -= 1

        send_response = h.send_response

        def send_response_once_counted(*args, **kwargs):
            answering()
            return send_response(*args, **kwargs)

        h.send_response = send_response_once_counted
        with self._lock:
            self.in_flight += 1
            self._unanswered += 1
            self.max_in_flight = max(self.max_in_flight, self._unanswered)
        try:
            handle(h, t0)
        finally:
            answering()
            with self._lock:
                self.in_flight -= 1

"""One way for the fake HTTP servers of the tests to answer with JSON, and to start and stop them on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def send_json(handler: BaseHTTPRequestHandler, status: int, obj: dict, headers: dict | None = None,
              content_type: str = "application/json") -> None:
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
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def stop_loopback(httpd: ThreadingHTTPServer) -> None:
    """Stop serving and release the port."""
    httpd.shutdown()
    httpd.server_close()

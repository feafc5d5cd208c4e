"""One way for the fake HTTP servers of the tests to answer with JSON."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


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

"""Retrying calls to remote services: the server's Retry-After hint, the backoff, one retry loop.

- :func:`retry_after_s`: the wait a server asks for, from ``retry-after-ms`` or
  ``Retry-After`` (seconds or an HTTP date);
- :func:`backoff_s`: ``base_s * 2**attempt``, capped;
- :func:`with_retries`: run one try again while it raises :class:`Retryable`, waiting
  the server's hint when it sent one (capped), else the backoff;
- :func:`post_with_retries`: a plain REST POST (requests) through that loop, retrying
  connection failures, 429 and 5xx; 400, 401, 403 and every other answer come back at once.

The runner (voicebias.systems.runner) keeps its own loop, which records every attempt in the
provenance, and shares :func:`backoff_s`; the adapters hand it :func:`retry_after_s`.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from typing import Any, Callable, TypeVar

from voicebias.errors import VoicebiasError

T = TypeVar("T")

#: HTTP statuses worth asking again after a pause: rate limit, server-side trouble.
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
#: The longest wait a server's hint or the backoff can impose on one retry (s).
MAX_WAIT_S = 60.0


def retry_after_s(headers: Any) -> float | None:
    """Seconds a server asks to wait: ``retry-after-ms``, else ``Retry-After`` as seconds or
    as an HTTP date (relative to now, never negative); None when absent or unreadable."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            value = float(str(ms).strip()) / 1000.0
            return max(value, 0.0) if math.isfinite(value) else None
        raw = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if raw is None:
        return None
    text = str(raw).strip()
    try:
        value = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        return max(when.timestamp() - time.time(), 0.0)
    return max(value, 0.0) if math.isfinite(value) else None


def backoff_s(attempt: int, base_s: float, cap_s: float = MAX_WAIT_S) -> float:
    """The wait after failed try `attempt` (0 for the first): base_s doubled per try, capped."""
    return min(float(base_s) * 2.0**attempt, float(cap_s))


class Retryable(VoicebiasError):
    """Raised by one try to ask for another.

    `retry_after_s` is the server's hint; when the tries are spent, `with_retries`
    raises `error` if there is one, else returns `result` (the last answer).
    """

    def __init__(self, error: BaseException | None = None, retry_after_s: float | None = None, result: Any = None):
        super().__init__(str(error) if error is not None else "retryable answer")
        self.error, self.retry_after_s, self.result = error, retry_after_s, result


def with_retries(
    once: Callable[[], T],
    *,
    max_retries: int,
    base_s: float,
    cap_s: float = MAX_WAIT_S,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """`once()`, tried up to `max_retries + 1` times while it raises :class:`Retryable`.

    The wait before the next try is the server's hint when it gave one, else
    ``backoff_s(attempt, base_s)``; either is capped at `cap_s`.
    """
    for attempt in range(int(max_retries) + 1):
        try:
            return once()
        except Retryable as again:
            if attempt == int(max_retries):
                if again.error is not None:
                    raise again.error from again.error.__cause__
                return again.result
            hint = again.retry_after_s
            sleep(min(hint, cap_s) if hint is not None else backoff_s(attempt, base_s, cap_s))
    raise AssertionError("unreachable")  # pragma: no cover


def post_with_retries(
    url: str,
    *,
    max_retries: int,
    base_s: float,
    timeout_s: float,
    sleep: Callable[[float], Any] = time.sleep,
    **kwargs: Any,
):
    """``requests.post(url, timeout=timeout_s, **kwargs)``, retrying connection failures,
    429 and 5xx (honouring Retry-After). Returns the last response, whatever its status;
    raises the last ``requests.RequestException`` when the server was never reached."""
    import requests

    def once():
        try:
            r = requests.post(url, timeout=timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise Retryable(exc) from exc
        if r.status_code in RETRYABLE_STATUS:
            raise Retryable(retry_after_s=retry_after_s(r.headers), result=r)
        return r

    return with_retries(once, max_retries=max_retries, base_s=base_s, sleep=sleep)


#: what a server error says when the request itself was wrong (vLLM answers some of these with HTTP 500:
#: a sampling key SamplingParams does not take raises TypeError inside the engine)
_INVALID_REQUEST = re.compile(
    r"unexpected keyword argument|validation error|is not a valid|invalid (request|value|parameter|argument|type)"
    r"|unknown (parameter|field|key|argument)|extra (inputs|fields) (are )?not permitted|must be (a|an|one of|between)",
    re.I,
)
_INVALID_TYPES = {"badrequesterror", "validationerror", "invalid_request_error", "bad_request"}


def names_invalid_request(reply: Any) -> bool:
    """Whether an error reply (`{"error": {...}}`, the error object itself, or FastAPI's `{"detail": ...}`)
    says the request itself was invalid, whatever its status code: sent again, it fails the same way."""
    err = reply.get("error") if isinstance(reply, dict) else None
    if err is None and isinstance(reply, dict) and "message" in reply:
        err = reply
    if isinstance(err, dict):
        kind = str(err.get("type") or "").lower()
        return kind in _INVALID_TYPES or bool(_INVALID_REQUEST.search(str(err.get("message") or "")))
    if isinstance(reply, dict) and reply.get("detail"):  # FastAPI's shape
        return bool(_INVALID_REQUEST.search(json.dumps(reply["detail"])))
    return False

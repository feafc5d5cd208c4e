"""One system's requests shared across several endpoints: a weighted pick, bounded concurrency
per endpoint, and fail-over away from an endpoint that cannot be reached.

Where an endpoint list comes from (:func:`resolve_endpoints`), the first that names one:

1. the untracked endpoints file (``$VOICEBIAS_ENDPOINTS``, else ``endpoints.json`` in the
   cache folder, ``.cache/endpoints.json``), ``{system: [{url, weight, max_concurrency}]}``,
   which a serving tool writes for the machines it started;
2. the system's params (``endpoints: [...]`` or one ``base_url``);
3. the system's card (same keys).

Each endpoint is ``{url, weight (default 1), max_concurrency (default: the system's)}``.
Endpoints are deploy facts: they decide where a request goes, never what it asks, so
they stay out of the cache key and out of every tracked output.

:class:`EndpointPool` hands each request to one endpoint at a time:

- among the endpoints that are up and have a free slot, the one a smooth weighted
  round-robin names (deterministic; over many picks each gets its weight's share);
  a request waits while every up endpoint is full, so an endpoint never has more than
  its ``max_concurrency`` requests in flight;
- a try that raises :class:`Unreachable` (refused or dropped connection, timeout)
  marks that endpoint down for a cool-down (``cooldown_s``, doubled per consecutive
  failure, at most ``max_cooldown_s``) and the request moves on to another endpoint
  that this call has not tried yet; any answer from the server, an HTTP error
  included, counts as reachable and ends the call;
- when every endpoint is down, a new call still probes the one whose cool-down ends
  first (a single endpoint therefore behaves as it always did: one send per call);
  a call that has tried every endpoint it could raises :class:`AllEndpointsDown`,
  which the adapter turns into a retryable failure: the runner retries it with
  backoff and, when the tries are spent, records it as failed with that reason.

A request is sent to one endpoint at a time and stops at the first answer, so the pool
never sends an answered request again.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

from voicebias.exceptions import ConfigError, VoicebiasError

T = TypeVar("T")

#: Environment variable naming the endpoints file (relative paths are read from the project root).
ENDPOINTS_ENV = "VOICEBIAS_ENDPOINTS"
ENDPOINTS_FILE = "endpoints.json"
ENDPOINT_KEYS = frozenset({"url", "weight", "max_concurrency"})


@dataclass(frozen=True)
class Endpoint:
    """One server of a system. `url` None means the client's own default (the public API)."""

    url: str | None
    weight: float = 1.0
    max_concurrency: int = 1

    @property
    def label(self) -> str:
        return safe_url(self.url) if self.url else "default"


def safe_url(url: str) -> str:
    """scheme://host[:port]/path of `url`: no credentials, no query."""
    u = urlsplit(str(url))
    return f"{u.scheme}://{u.hostname}{f':{u.port}' if u.port else ''}{u.path}"


# ---------------------------------------------------------------------------- configuration

def endpoints_file(root: Path | None = None) -> Path:
    """The endpoints file: $VOICEBIAS_ENDPOINTS, else endpoints.json in $VOICEBIAS_CACHE or <root>/.cache."""
    env = os.environ.get(ENDPOINTS_ENV)
    if env:
        p = Path(env).expanduser()
        return p if p.is_absolute() or root is None else Path(root) / p
    if os.environ.get("VOICEBIAS_CACHE"):
        return Path(os.environ["VOICEBIAS_CACHE"]) / ENDPOINTS_FILE
    if root is None:
        from voicebias.config import CACHE_DIR

        return CACHE_DIR / ENDPOINTS_FILE
    return Path(root) / ".cache" / ENDPOINTS_FILE


def read_endpoints_file(system: str, path: Path) -> list[Any] | None:
    """The raw endpoint list the file names for `system`, or None (no file, or no entry for it)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"endpoints file {path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"endpoints file {path} must hold {{system: [{{url, weight, max_concurrency}}, ...]}}")
    return data.get(system)


def parse_endpoints(spec: Any, where: str, default_concurrency: int) -> list[Endpoint]:
    """Check an endpoint list (`where` names it in errors); fill in weight 1 and the default concurrency."""
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ConfigError(f"{where}: 'endpoints' must be a non-empty list of {{url, weight, max_concurrency}}")
    out: list[Endpoint] = []
    for i, item in enumerate(spec):
        at = f"{where}: endpoints[{i}]"
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at} must be a mapping with 'url', got {item!r}")
        unknown = set(item) - ENDPOINT_KEYS
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {sorted(unknown)}; use url, weight, max_concurrency")
        url = item.get("url")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ConfigError(f"{at}: 'url' must be an http(s) address such as http://gpu-box:8000/v1, got {url!r}")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight <= 0:
            raise ConfigError(f"{at}: 'weight' must be a positive number, got {weight!r}")
        cap = item.get("max_concurrency", default_concurrency)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError(f"{at}: 'max_concurrency' must be a positive integer, got {cap!r}")
        out.append(Endpoint(url=url, weight=float(weight), max_concurrency=cap))
    urls = [e.url for e in out]
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{where}: an endpoint url is listed twice")
    return out


def resolve_endpoints(system: str, params: Mapping[str, Any], card: Mapping[str, Any], root: Path | None,
                      default_concurrency: int, default_url: str | None = None) -> tuple[list[Endpoint], str]:
    """(the system's endpoints, where they came from): the endpoints file, else params, else the card.

    A source that names both `endpoints` and `base_url` is an error. Without any, one
    endpoint at `default_url` (None: the client's own default).
    """
    path = endpoints_file(root)
    listed = read_endpoints_file(system, path)
    if listed is not None:
        return parse_endpoints(listed, f"{path} [{system}]", default_concurrency), str(path)
    for source, where in ((params, f"systems.{system}"), (card, f"the card of '{system}'")):
        many, one = source.get("endpoints"), source.get("base_url")
        if many and one:
            raise ConfigError(f"{where} names both 'endpoints' and 'base_url'; keep one")
        if many:
            return parse_endpoints(many, where, default_concurrency), where
        if one:
            return parse_endpoints([{"url": one}], where, default_concurrency), where
    return [Endpoint(url=default_url, max_concurrency=default_concurrency)], "default"


# ---------------------------------------------------------------------------- the pool

class Unreachable(VoicebiasError):
    """Raised by one try: this endpoint could not be reached (refused, dropped, timed out)."""


class AllEndpointsDown(VoicebiasError):
    """Every endpoint this call could use is down; `retry_after_s` is when the first comes back."""

    def __init__(self, message: str, retry_after_s: float | None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _State:
    in_flight: int = 0
    max_in_flight: int = 0
    sent: int = 0
    answered: int = 0
    unreachable: int = 0
    down_until: float = 0.0
    failures_in_row: int = 0
    current: float = 0.0  # smooth weighted round-robin
    last_error: str = ""


class EndpointPool:
    """Pick, bound and fail over among `endpoints` (see the module docstring)."""

    def __init__(self, endpoints: Sequence[Endpoint], name: str = "", cooldown_s: float = 2.0,
                 max_cooldown_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 report: Callable[[str], Any] | None = None):
        if not endpoints:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.name = name
        self.cooldown_s, self.max_cooldown_s = float(cooldown_s), float(max_cooldown_s)
        self.clock = clock
        self.report = report if report is not None else (lambda line: print(line, file=sys.stderr))
        self._state = [_State() for _ in self.endpoints]
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        """Requests the pool can have in flight at once: the sum of the endpoints' max_concurrency."""
        return sum(e.max_concurrency for e in self.endpoints)

    def call(self, once: Callable[[int], T]) -> tuple[int, T]:
        """(index of the endpoint that answered, `once(index)`'s result).

        `once` raises :class:`Unreachable` to move the request to another endpoint;
        anything else it raises ends the call with that exception.
        """
        tried: list[int] = []
        errors: list[str] = []
        while True:
            i = self._acquire(tried)
            if i is None:
                raise self._all_down(tried, errors)
            tried.append(i)
            try:
                result = once(i)
            except Unreachable as exc:
                errors.append(str(exc))
                self._release(i, reachable=False, error=str(exc))
                continue
            except BaseException:
                self._release(i, reachable=None)
                raise
            self._release(i, reachable=True)
            return i, result

    def stats(self) -> list[dict[str, Any]]:
        """Per endpoint: label, weight, max_concurrency, sent, answered, unreachable, max_in_flight."""
        with self._cond:
            return [{"endpoint": e.label, "weight": e.weight, "max_concurrency": e.max_concurrency, "sent": s.sent,
                     "answered": s.answered, "unreachable": s.unreachable, "max_in_flight": s.max_in_flight}
                    for e, s in zip(self.endpoints, self._state)]

    # -- internals -----------------------------------------------------------
    def _acquire(self, tried: Sequence[int]) -> int | None:
        with self._cond:
            while True:
                now = self.clock()
                untried = [i for i in range(len(self.endpoints)) if i not in tried]
                if not untried:
                    return None
                choices = [i for i in untried if self._state[i].down_until <= now]
                if not choices:
                    if tried:
                        return None  # every endpoint left to this call is cooling down
                    # every endpoint is down: probe the one whose cool-down ends first
                    choices = [min(untried, key=lambda j: (self._state[j].down_until, j))]
                free = [i for i in choices if self._state[i].in_flight < self.endpoints[i].max_concurrency]
                if free:
                    i = self._pick(free)
                    s = self._state[i]
                    s.in_flight += 1
                    s.sent += 1
                    s.max_in_flight = max(s.max_in_flight, s.in_flight)
                    return i
                recovering = [self._state[j].down_until - now for j in untried if self._state[j].down_until > now]
                self._cond.wait(timeout=min(recovering) if recovering else None)

    def _pick(self, free: Sequence[int]) -> int:
        """Smooth weighted round-robin among `free` (nginx's rule): deterministic, shares follow weights."""
        total = 0.0
        for i in free:
            self._state[i].current += self.endpoints[i].weight
            total += self.endpoints[i].weight
        best = max(free, key=lambda i: (self._state[i].current, -i))
        self._state[best].current -= total
        return best

    def _release(self, i: int, reachable: bool | None, error: str = "") -> None:
        line = None
        with self._cond:
            s = self._state[i]
            s.in_flight -= 1
            now = self.clock()
            if reachable:
                s.answered += 1
                s.failures_in_row, s.down_until = 0, 0.0
            elif reachable is False:
                s.unreachable += 1
                s.last_error = error
                if s.down_until <= now:  # requests already in flight when it went down do not lengthen it
                    s.failures_in_row += 1
                    wait = min(self.cooldown_s * 2.0 ** (s.failures_in_row - 1), self.max_cooldown_s)
                    s.down_until = now + wait
                    line = (f"{self.name or 'system'}: endpoint {self.endpoints[i].label} unreachable ({error}); "
                            f"sending elsewhere for {wait:g} s")
            self._cond.notify_all()
        if line and len(self.endpoints) > 1:
            self.report(line)

    def _all_down(self, tried: Sequence[int], errors: Sequence[str]) -> AllEndpointsDown:
        with self._cond:
            now = self.clock()
            waits = [max(s.down_until - now, 0.0) for s in self._state]
        hint = min(waits) if waits else None
        if len(self.endpoints) == 1 and errors:
            return AllEndpointsDown(errors[-1], hint)
        reasons = "; ".join(dict.fromkeys(errors)) or "none tried in this call"
        return AllEndpointsDown(f"every endpoint is down ({len(self.endpoints)} endpoints, {len(tried)} tried "
                                f"in this call: {reasons})", hint)
